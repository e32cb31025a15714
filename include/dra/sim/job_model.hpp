#pragma once
// A simulated job: its state, and what its online-fitted throughput model (Pollux's, from a
// linear-speedup prior) predicts and chooses: the goodput at a size, the batch to train with.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "dra/policy/constraints.hpp"
#include "dra/policy/perf_model.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/sim/config.hpp"
#include "dra/sim/profile.hpp"
#include "dra/sim/workload.hpp"

namespace dra::sim {

/// A throughput_predictor backed by a job's online-fitted Pollux model: a world of `size` devices
/// packed on nodes of `devices_per_node`, the per-rank batch split into micro-batches with
/// accumulation above the largest measured one. Before the first measurement it predicts nothing
/// (0), and the policies hold.
class fitted_predictor final : public policy::throughput_predictor {
 public:
  fitted_predictor(const policy::perf_model& model, int devices_per_node, double max_atomic)
      : model_(&model), per_node_(devices_per_node), max_atomic_(max_atomic) {}
  double step_time_s(int world_size, double per_rank_batch) const override {
    if (!model_->fitted() || world_size < 1 || !(per_rank_batch > 0.0)) return 0.0;
    const int accum = std::max(0, static_cast<int>(std::ceil(per_rank_batch / max_atomic_ - 1e-8)) - 1);
    const int nodes = (world_size + per_node_ - 1) / per_node_;
    return model_->step_time(nodes, world_size, per_rank_batch / (accum + 1), accum);
  }

 private:
  const policy::perf_model* model_;
  int per_node_;
  double max_atomic_;
};

namespace detail {

/// Efficiency gain of AdaScale at `scale` = M / M0 with gradient statistics at M0.
inline double adascale_gain_from_stats(double sqr, double var, double scale) {
  const double denom = var / scale + sqr;
  return denom > 0.0 ? (var + sqr) / denom : 1.0;
}

inline policy::batch_limits limits_of(const application_profile& app, int candidates) {
  policy::batch_limits l;
  l.init_batch = app.init_batch();
  l.max_batch = app.max_batch();
  l.min_atomic = app.min_local_batch();
  l.max_atomic = app.max_local_batch();
  l.candidates = candidates;
  return l;
}

/// Batch split of the reference for a fixed total batch on `replicas` devices (with its batch cap).
inline policy::batch_split split_batch(const application_profile& app, double batch, int replicas) {
  return policy::split_total_batch(batch, replicas, limits_of(app, 1));
}

/// One job in the simulator: its request, where it runs, its progress and what it has measured.
struct job_state {
  job_spec spec;
  const application_profile* app = nullptr;
  double fixed_batch = 0.0;  ///< 0: the scheduler chooses the batch (cluster policies)
  int max_devices = 1;
  std::vector<int> alloc;  ///< devices per node (empty: none)
  int devices = 0;
  double atomic = 0.0;
  int accum = 0;
  double last_batch = 0.0;
  double progress = 0.0;
  int epoch = 0;
  double rescale_left = 0.0;
  bool done = false;
  bool reached_target = false;
  double completion_s = 0.0;
  double start_s = std::numeric_limits<double>::quiet_NaN();
  double attained = 0.0;  ///< device-seconds held (Tiresias/Pollux priority)
  double gpu_s = 0.0, compute_s = 0.0, busy_s = 0.0, held_s = 0.0;
  double steps = 0.0, steps_at_resize = 0.0;
  int restarts = -1;  ///< -1 until first started (the first start is not a restart)
  int max_held = 0;
  double best_metric = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<double, double>> loss_history;  ///< (epoch, loss proxy) for remaining-work fits
  double log_batch_sum = 0.0;                           ///< sum over finished epochs of log(batch)
  // Tiresias bookkeeping.
  double executed_s = 0.0;
  int queue = 0;
  double demoted_at = 0.0;
  // What the job has measured (Pollux's throughput model, fitted online) and its policy.
  std::unique_ptr<policy::perf_model> model;
  std::unique_ptr<signals::convergence_estimator> est;
  std::unique_ptr<policy::constrained_policy> policy;
  std::unique_ptr<fitted_predictor> predictor;
  // Goodput curve cache (per epoch and model version).
  int curve_epoch = -1;
  std::size_t curve_model = 0;
  std::vector<double> curve;  ///< best predicted goodput at k packed devices, k = 0..cap
  // Step time at the current placement and batch split (valid until either changes).
  bool step_cached = false;
  step_times step_cache;
};

/// The sizes of the nodes an allocation (devices per node) spans.
inline std::vector<int> compact(const std::vector<int>& alloc) {
  std::vector<int> p;
  for (int c : alloc)
    if (c > 0) p.push_back(c);
  return p;
}

/// Gradient statistics of the job's trace at a batch and epoch, with the job's noise perturbation.
inline std::pair<double, double> stats(const job_state& j, double batch, int epoch) {
  auto [sqr, var] = j.app->grad_stats(batch, epoch);
  return {sqr, var * j.spec.gns_scale};
}

/// Sets a new total batch at the same devices (no resize, no cost): the simulator applies the
/// per-job policies' batch decisions.
inline void set_batch(job_state& j, double batch) {
  const auto s = detail::split_batch(*j.app, std::clamp(batch, j.app->init_batch(), j.app->max_batch()), j.devices);
  if (s.atomic == j.atomic && s.accum == j.accum) return;
  j.atomic = s.atomic, j.accum = s.accum;
  j.step_cached = false;
  j.last_batch = j.devices * j.atomic * (j.accum + 1);
}

inline policy::grad_stats job_stats(const job_state& j) {
  const double ref_batch = j.last_batch > 0.0 ? j.last_batch : std::max(j.app->init_batch(), j.spec.batch);
  const auto [sqr, var] = stats(j, ref_batch, j.epoch);
  return {sqr, var};
}

/// Predicted best goodput at (nodes, replicas) over batch sizes (Pollux's GoodputFunction.optimize
/// with accumulation), from the job's fitted model and current gradient statistics.
inline policy::batch_choice predicted_best(const job_state& j, int nodes, int replicas, const sim_config& config) {
  const policy::batch_limits lim = detail::limits_of(*j.app, config.batch_candidates);
  const policy::grad_stats g = job_stats(j);
  auto step = [&](double atomic, int accum) { return j.model->step_time(nodes, replicas, atomic, accum); };
  if (j.fixed_batch > 0.0) {
    const auto s = detail::split_batch(*j.app, j.fixed_batch, replicas);
    const double total = replicas * s.atomic * (s.accum + 1);
    const double t = step(s.atomic, s.accum);
    return {t > 0.0 ? policy::adascale_progress_gain(g, total / lim.init_batch) / t : 0.0, s.atomic, s.accum};
  }
  return policy::best_batch(step, g, replicas, lim);
}

inline void choose_batch(job_state& j, const sim_config& config) {
  j.step_cached = false;
  policy::batch_choice c;
  const int nodes = static_cast<int>(compact(j.alloc).size());
  if (j.model->fitted()) {
    c = predicted_best(j, nodes, j.devices, config);
  } else {  // no model yet: the reference's default, max(M0, min micro-batch x replicas)
    const double b = std::max(j.app->init_batch(), j.app->min_local_batch() * j.devices);
    const auto s = detail::split_batch(*j.app, b, j.devices);
    c = {1.0, s.atomic, s.accum};
  }
  if (c.goodput > 0.0) {
    j.atomic = c.atomic, j.accum = c.accum;
  } else {  // no valid batch at this size: fall back to the fixed split of the request
    const auto s = detail::split_batch(*j.app, std::max(j.spec.batch, j.app->init_batch()), j.devices);
    j.atomic = s.atomic, j.accum = s.accum;
  }
}

}  // namespace detail
}  // namespace dra::sim
