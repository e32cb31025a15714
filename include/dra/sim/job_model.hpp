#pragma once
// A simulated job: its state (the truth: its profile and spec), the view a scheduler gets of it
// (job_view: only what a real scheduler could know), and what its online-fitted throughput model
// predicts and chooses: the goodput at a size, the batch to train with.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dra/policy/constraints.hpp"
#include "dra/policy/perf_model.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/remaining_work.hpp"
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

/// What a scheduler knows about a job: its request and declaration, its progress, what it measured.
/// Policies get this and nothing else: it holds no profile, no spec and no truth (the total work,
/// the early-stopping rule, the target, the noise of the run), so a policy cannot read them
/// (tests/cpp/test_sim.cpp checks the members at compile time). Oracle policies (`oracle_*`) are
/// handed the truth explicitly, apart from the view.
struct job_view {
  std::string name;
  std::string job_class;  ///< the model being trained (jobs of a class share history)
  double submit_s = 0.0;
  int requested_replicas = 1;
  double requested_batch = 0.0;
  double declared_epochs = std::numeric_limits<double>::quiet_NaN();  ///< NaN: declared nothing
  policy::batch_limits limits;  ///< the job's batch limits (declared, as AdaptDL jobs do)
  double fixed_batch = 0.0;     ///< 0: the scheduler chooses the batch
  int max_devices = 1;
  // Where it runs and how it got there.
  int devices = 0;
  int restarts = -1;
  double attained = 0.0;  ///< device-seconds held so far
  // Progress, as the job's data loader and optimizer count it.
  int epoch = 0;                ///< completed epochs
  double epochs_done = 0.0;     ///< fractional epochs
  double work_done = 0.0;       ///< statistical progress (AdaScale steps at the initial batch)
  double work_per_epoch = 0.0;  ///< progress in the current epoch's worth of data
  double last_batch = 0.0;
  std::vector<std::pair<double, double>> loss_history;  ///< (epoch, validation loss proxy)
  policy::grad_stats grad;  ///< the job's own estimate of its gradient statistics (noisy in the study)
  const policy::perf_model* model = nullptr;  ///< its throughput model, fitted on what it measured
  /// The remaining-work estimate at the latest decision (epochs).
  signals::work_estimate remaining;
  // Goodput curve cache (per epoch and model version).
  int curve_epoch = -1;
  std::size_t curve_model = 0;
  std::vector<double> curve;  ///< best predicted goodput at k packed devices, k = 0..cap
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
  double target_work = 0.0;  ///< fraction of the target's work done (progress / progress to target, per batch)
  double stop_best = std::numeric_limits<double>::quiet_NaN();  ///< early stopping: best metric seen
  int stop_since = 0;                                           ///< epochs since it improved
  bool stopped_early = false;
  // What the scheduler sees, and the record of its remaining-work estimates (epochs done, median,
  // tail) for the calibration report.
  job_view view;
  bool completion_recorded = false;
  std::vector<std::array<double, 3>> estimate_log;
  std::vector<std::array<double, 5>> estimate_checks;  ///< at 10/50/90 % of life: see job_result
  // Tiresias bookkeeping.
  double executed_s = 0.0;
  int queue = 0;
  double demoted_at = 0.0;
  // What the job has measured (Pollux's throughput model, fitted online) and its policy.
  std::unique_ptr<policy::perf_model> model;
  std::unique_ptr<signals::convergence_estimator> est;
  std::unique_ptr<policy::constrained_policy> policy;
  std::unique_ptr<fitted_predictor> predictor;
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

/// The job's own estimate of its gradient statistics at its current batch and epoch: the trace's,
/// times a per-epoch log-normal error of spread spec.gns_estimate_sigma (0 in replays, as the
/// reference; the study's live-like estimates are noisy).
inline policy::grad_stats measured_stats(const job_state& j) {
  const double ref_batch = j.last_batch > 0.0 ? j.last_batch : std::max(j.app->init_batch(), j.spec.batch);
  auto [sqr, var] = stats(j, ref_batch, j.epoch);
  if (j.spec.gns_estimate_sigma > 0.0) {
    std::uint64_t h = 1469598103934665603ULL;
    for (char c : j.spec.name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    portable_rng rng(h + static_cast<std::uint64_t>(j.epoch) * 0x9E3779B97F4A7C15ULL);
    sqr *= std::exp(j.spec.gns_estimate_sigma * rng.normal());
    var *= std::exp(j.spec.gns_estimate_sigma * rng.normal());
  }
  return {sqr, var};
}

/// Predicted best goodput at (nodes, replicas) over batch sizes (Pollux's GoodputFunction.optimize
/// with accumulation), from the job's fitted model and its measured gradient statistics.
inline policy::batch_choice predicted_best(const job_view& v, int nodes, int replicas, const sim_config& config) {
  policy::batch_limits lim = v.limits;
  lim.candidates = config.batch_candidates;
  auto step = [&](double atomic, int accum) { return v.model->step_time(nodes, replicas, atomic, accum); };
  if (v.fixed_batch > 0.0) {
    const auto s = policy::split_total_batch(v.fixed_batch, replicas, lim);
    const double total = replicas * s.atomic * (s.accum + 1);
    const double t = step(s.atomic, s.accum);
    return {t > 0.0 ? policy::adascale_progress_gain(v.grad, total / lim.init_batch) / t : 0.0, s.atomic, s.accum};
  }
  return policy::best_batch(step, v.grad, replicas, lim);
}

/// Predicted best goodput at k packed devices, cached per epoch and model fit.
inline double curve_at(job_view& v, int k, const sim_config& config) {
  if (k <= 0 || !v.model || !v.model->fitted()) return 0.0;
  if (v.curve_epoch != v.epoch || v.curve_model != v.model->configurations() || v.curve.empty()) {
    v.curve.assign(static_cast<std::size_t>(v.max_devices) + 1, -1.0);
    v.curve_epoch = v.epoch;
    v.curve_model = v.model->configurations();
  }
  const int kk = std::min(k, v.max_devices);
  double& g = v.curve[static_cast<std::size_t>(kk)];
  if (g < 0.0) g = predicted_best(v, (kk + config.devices_per_node - 1) / config.devices_per_node, kk, config).goodput;
  return g;
}

/// Copies what a scheduler can know about the job into its view.
inline void refresh_view(job_state& j) {
  job_view& v = j.view;
  if (v.name.empty()) {
    v.name = j.spec.name;
    v.job_class = j.spec.application;
    v.submit_s = j.spec.submit_s;
    v.requested_replicas = j.spec.replicas;
    v.requested_batch = j.spec.batch;
    v.declared_epochs = j.spec.declared_epochs;
    v.limits = limits_of(*j.app, 1);
    v.fixed_batch = j.fixed_batch;
    v.max_devices = j.max_devices;
    v.model = j.model.get();
  }
  v.devices = j.devices;
  v.restarts = j.restarts;
  v.attained = j.attained;
  v.epoch = j.epoch;
  const double start = j.app->progress_at(j.epoch), end = j.app->progress_at(j.epoch + 1);
  v.work_per_epoch = end - start;
  v.work_done = j.progress;
  v.epochs_done = j.epoch + (end > start ? std::clamp((j.progress - start) / (end - start), 0.0, 1.0) : 0.0);
  v.last_batch = j.last_batch;
  if (v.loss_history.size() != j.loss_history.size()) v.loss_history = j.loss_history;
  v.grad = measured_stats(j);
}

/// What the job reports to the remaining-work estimator (epochs as the unit of work).
inline signals::work_observation observation(const job_view& v) {
  signals::work_observation o;
  o.job_class = v.job_class;
  o.declared = v.declared_epochs;
  o.done = v.epochs_done;
  o.curve = v.loss_history;
  return o;
}

inline void choose_batch(job_state& j, const sim_config& config) {
  j.step_cached = false;
  policy::batch_choice c;
  const int nodes = static_cast<int>(compact(j.alloc).size());
  if (j.model->fitted()) {
    refresh_view(j);
    c = predicted_best(j.view, nodes, j.devices, config);
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

inline bool target_reached(const job_state& j) {
  if (std::isnan(j.spec.target_metric) || j.epoch == 0) return false;
  if (j.spec.target_by_work) return j.target_work >= 1.0 - 1e-9;
  return j.app->metric_increases() ? j.best_metric >= j.spec.target_metric : j.best_metric <= j.spec.target_metric;
}

inline double loss_proxy(const job_state& j, double batch, int epoch) {
  // The traces hold a validation metric per epoch, not a loss. A loss-like quantity that falls as
  // the model learns: the error (1 - accuracy, on the metric's own scale) or the metric itself.
  const double m = j.app->metric(batch, epoch);
  if (!j.app->metric_increases()) return m;
  const double top = m <= 1.0 ? 1.0 : 100.0;
  return std::max(top - m, 1e-6);
}

/// Progress a run at total batch `batch` needs to reach the job's target: the progress of the first
/// epoch whose best metric reaches it, on the validated batches around `batch` (linear in batch).
inline double progress_to_target(const job_state& j, double batch) {
  const auto& app = *j.app;
  auto at = [&](double b) {
    for (int e = 1; e <= app.max_epochs(); ++e) {
      const double m = app.best_metric(b, e);
      if (app.metric_increases() ? m >= j.spec.target_metric : m <= j.spec.target_metric) return app.progress_at(e);
    }
    return app.progress_at(app.max_epochs());
  };
  const auto& v = app.validated_batches();
  const auto [lo, hi, w] = bracket(v, batch);
  return at(lo) + w * (at(hi) - at(lo));
}

/// Bookkeeping at the end of an epoch trained at total batch `batch`: the metric, the loss proxy the
/// job sees, the target and early stopping. Returns whether the job stops now.
inline bool end_epoch(job_state& j, double batch, double epoch_progress) {
  ++j.epoch;
  // The traces give the metric of runs at one batch size. A run whose batch changed gets the
  // metric of the epoch-weighted geometric mean of its batches (not of its latest batch, which
  // would forget the epochs trained at the others).
  j.log_batch_sum += std::log(batch);
  const double metric_batch = std::exp(j.log_batch_sum / j.epoch);
  j.best_metric = j.app->best_metric(metric_batch, j.epoch);
  const double loss = loss_proxy(j, metric_batch, j.epoch - 1);
  j.est->update_loss(j.epoch, loss);
  j.loss_history.emplace_back(static_cast<double>(j.epoch), loss);
  // Work to the target: each epoch at batch b does epoch_progress / (progress to target at b) of it.
  if (!std::isnan(j.spec.target_metric))
    j.target_work += epoch_progress / std::max(progress_to_target(j, batch), 1e-12);
  j.reached_target = target_reached(j);
  // Early stopping on the job's own validation metric (the truth; no policy sees the rule).
  if (j.spec.stop_patience > 0) {
    const double m = j.app->metric(metric_batch, j.epoch - 1);
    const bool up = j.app->metric_increases();
    const double d = j.spec.stop_min_delta;
    if (std::isnan(j.stop_best) || (up ? m > j.stop_best * (1.0 + d) : m < j.stop_best * (1.0 - d)))
      j.stop_best = m, j.stop_since = 0;
    else if (++j.stop_since >= j.spec.stop_patience)
      // Early only where the job would have gone on: patience running out at its last epoch (or
      // at its target) ends nothing early.
      j.stopped_early = j.epoch < j.app->max_epochs() && !j.reached_target;
  }
  return j.epoch >= j.app->max_epochs() || j.reached_target || j.stopped_early;
}

}  // namespace detail
}  // namespace dra::sim
