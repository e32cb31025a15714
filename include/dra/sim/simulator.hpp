#pragma once
// Discrete-time/event cluster simulator (DESIGN.md §3.4). Jobs arrive, an allocation policy runs
// every `interval_s` seconds, each reallocation costs `reallocation_cost_s` seconds of no progress
// while the job keeps its devices, and between decisions each job advances analytically epoch by
// epoch: within an epoch its goodput (AdaScale gain per second) is constant, so the exact time at
// which it crosses each epoch boundary (and completes) is computed, not sampled.
//
// The per-job dynamic policies are dra::policy::constrained_policy around the same
// convergence_phase_policy / goodput_policy / convergence_aware_policy a live job runs, fed a
// throughput model fitted online from what the job has measured (Pollux's model, from a
// linear-speedup prior) and convergence_signals derived from the trace. The cluster-level policies
// (arbiter, convergence_aware under contention, and Pollux itself) are dra::policy::cluster_arbiter
// over goodput curves from the same online-fitted model, under the same rules as Pollux: at most
// twice the most devices a job has run on (exploration), at most one distributed job per node, the
// total batch capped at the largest measured one, and every change of a job's set of nodes charged
// as a reallocation.
//
// Reference semantics (petuum/adaptdl osdi21-artifact simulator) and every deviation from them are
// documented in docs/guide/simulator.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/policy/perf_model.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/sim/profile.hpp"
#include "dra/sim/workload.hpp"

namespace dra::sim {

/// Stand-in for the measured in-place resize cost (seconds) until the elastic-world benchmark
/// publishes its figure; `dra-sim --reallocation-cost inplace` uses this value.
inline constexpr double in_place_resize_cost_stand_in_s = 1.0;

/// The policies the simulator knows, in the order reports list them.
inline const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names{"static",  "tiresias", "convergence", "goodput",
                                              "convergence_aware", "arbiter", "pollux"};
  return names;
}

struct sim_config {
  int nodes = 16;
  int devices_per_node = 4;
  double interval_s = 60.0;           ///< seconds between allocation decisions (reference: 60)
  double reallocation_cost_s = 30.0;  ///< no-progress seconds per reallocation (reference: 30)
  std::string policy = "static";
  /// Dynamic jobs may hold at most this multiple of the devices they requested (0: no quota).
  double quota_scale = 0.0;
  /// Apply the reference's per-application scheduling limits (ncf: one device). The replays keep
  /// them (faithful to the reference); the study may lift them, since the profiles measure ncf on
  /// up to 64 devices and the limit is a choice of the reference's Pollux policy.
  bool reference_limits = true;
  /// Stop simulating after this much simulated time (jobs not done are reported incomplete).
  double max_time_s = 30.0 * 24 * 3600;
  bool record_timeline = true;

  // Per-job policies (live-job code, unchanged).
  policy::convergence_phase_config convergence{};
  policy::goodput_config goodput{};
  policy::convergence_aware_config convergence_aware{};
  /// The convergence policy never goes below the devices the job requested: it grows beyond the
  /// request while learning is fast and releases the extra on plateau. false: down to one device.
  bool convergence_floor_at_request = true;
  /// Amortisation horizon of the per-job policies in seconds of training at the current size.
  double horizon_s = 1800.0;
  signals::estimator_config estimator = epoch_estimator_config();
  /// convergence_aware on a shared cluster: the cluster arbitrates (jobs ranked by remaining work,
  /// curves cut at the price floor). false: each job's own constrained policy decides against the
  /// devices it may use (what a lone job does; the study's runs are alone).
  bool cluster_arbitration = true;
  /// A job's remaining work for ranking: its declared epoch budget (the training script's epochs)
  /// minus its progress. false: predicted from the loss curve only (Optimus-style fit of the
  /// per-epoch loss proxy), capped by nothing.
  bool remaining_work_from_budget = true;
  /// convergence_aware on a shared cluster: power-mean exponent over the jobs' completion rates
  /// goodput(k) / remaining work. 1 maximises their sum (shortest remaining work first, which starves
  /// long jobs that scale well); towards 0 the remaining work stops mattering (proportional
  /// fairness); 0.5, chosen on workloads 1-4 at load 1.0 among {1, 0.5, 0.2, -1}, sits between.
  double remaining_work_power = 0.5;
  /// convergence_aware on a shared cluster: price floor per device. 0: a device the arbiter leaves
  /// idle costs nothing, so the contention price is what the arbiter's marginal values imply.
  double cluster_price_floor = 0.0;

  // Cluster arbiter (dra's policy over goodput curves) and Pollux.
  policy::arbiter_config arbiter{};
  /// Batch sizes tried per device count when co-adapting the batch (reference: 50, geometric).
  int batch_candidates = 50;

  // Tiresias-style baseline.
  double tiresias_threshold_gpu_s = 16.0 * 3600.0;  ///< demotion to the second queue (reference)

  /// The convergence estimator as the simulator feeds it: one update per epoch, so the window,
  /// warm-up and patience are counted in epochs.
  static signals::estimator_config epoch_estimator_config() {
    signals::estimator_config c;
    c.window = 5;
    c.warmup_steps = 5;
    c.plateau_patience = 3;
    c.plateau_relative_improvement = 0.01;
    c.fast_relative_improvement = 0.10;
    c.loss_decay = 0.5;
    // Plateau only once learning stalled over the last two doublings of training: on the shipped
    // traces this never fires before half of a run (tests/cpp/test_signals.cpp).
    c.plateau_history_fraction = 0.25;
    c.plateau_history_improvement = 0.02;
    return c;
  }

  void validate() const {
    if (nodes < 1) dra::detail::throw_invalid("nodes", "must be >= 1, got " + std::to_string(nodes));
    if (devices_per_node < 1 || devices_per_node > 9)
      dra::detail::throw_invalid("devices_per_node", "must lie in [1, 9] (placements are digit strings), got " +
                                                         std::to_string(devices_per_node));
    if (!(interval_s > 0.0)) dra::detail::throw_invalid("interval_s", "must be > 0 seconds");
    if (!(reallocation_cost_s >= 0.0) || !std::isfinite(reallocation_cost_s))
      dra::detail::throw_invalid("reallocation_cost_s", "must be a finite number >= 0 seconds");
    if (std::find(policy_names().begin(), policy_names().end(), policy) == policy_names().end()) {
      std::string have;
      for (const auto& n : policy_names()) have += (have.empty() ? "" : ", ") + n;
      dra::detail::throw_invalid("policy", "unknown policy '" + policy + "'; use one of: " + have);
    }
    if (quota_scale < 0.0) dra::detail::throw_invalid("quota_scale", "must be >= 0 (0: no quota)");
    if (!(max_time_s > 0.0)) dra::detail::throw_invalid("max_time_s", "must be > 0");
    if (!(horizon_s > 0.0)) dra::detail::throw_invalid("horizon_s", "must be > 0");
    if (batch_candidates < 1) dra::detail::throw_invalid("batch_candidates", "must be >= 1");
    convergence.validate();
    goodput.validate();
    convergence_aware.validate();
    estimator.validate();
    arbiter.validate();
  }
};

struct job_result {
  std::string name, application;
  double submit_s = 0.0;
  double start_s = std::numeric_limits<double>::quiet_NaN();       ///< first allocation
  double completion_s = std::numeric_limits<double>::quiet_NaN();  ///< NaN: did not finish
  double jct_s = std::numeric_limits<double>::quiet_NaN();         ///< completion - submit
  double gpu_seconds = 0.0;          ///< device time allocated (held, including resize time)
  double compute_gpu_seconds = 0.0;  ///< device time spent computing gradients (not sync, not resizing)
  double busy_gpu_seconds = 0.0;     ///< device time spent running steps (compute and sync; not resizing)
  double progress = 0.0;             ///< statistical progress (steps at the initial batch)
  int epochs = 0;
  int requested_replicas = 0;
  double requested_batch = 0.0;
  double final_batch = 0.0;
  double final_metric = std::numeric_limits<double>::quiet_NaN();
  bool reached_target = false;
  int reallocations = 0;  ///< allocation changes after the first start
  int max_devices = 0;
  double device_time_weighted_devices = 0.0;  ///< mean devices while allocated
};

struct timeline_point {
  double time_s = 0.0;
  int allocated = 0;              ///< devices held by jobs
  double busy_fraction = 0.0;     ///< busy device-time / capacity over the last interval
  int running = 0;                ///< jobs holding devices
  int waiting = 0;                ///< submitted jobs with no devices
  double compute_fraction = 0.0;  ///< computing device-time / capacity over the last interval
};

struct sim_result {
  std::string policy;
  int capacity = 0;
  double reallocation_cost_s = 0.0;
  double makespan_s = 0.0;  ///< last completion (from t = 0)
  double first_submit_s = 0.0;
  std::vector<job_result> jobs;
  std::vector<timeline_point> timeline;
  double wall_s = 0.0;  ///< simulator run time
  bool all_completed = true;
};

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

/// Optimus-style prediction of the epoch a run converges at, from its per-epoch loss: fits
/// loss(e) = 1 / (a e + b) + c (c on a grid below the lowest loss, a and b by least squares on
/// 1 / (loss - c)), then returns the first epoch from which a further 10 % of epochs would improve
/// the fitted loss by less than 1 %. Returns the last observed epoch + 1 when no fit descends.
inline double optimus_epochs(const std::vector<std::pair<double, double>>& history) {
  const double last = history.empty() ? 0.0 : history.back().first;
  if (history.size() < 3) return last + 1.0;
  double lowest = INFINITY;
  for (const auto& h : history) lowest = std::min(lowest, h.second);
  double best_err = INFINITY, best_a = 0.0, best_b = 0.0, best_c = 0.0;
  for (int g = 0; g < 20; ++g) {
    const double c = lowest * 0.05 * g;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double n = static_cast<double>(history.size());
    for (const auto& [e, l] : history) {
      const double y = 1.0 / std::max(l - c, 1e-12);
      sx += e, sy += y, sxx += e * e, sxy += e * y;
    }
    const double den = n * sxx - sx * sx;
    if (!(std::abs(den) > 0.0)) continue;
    const double a = (n * sxy - sx * sy) / den, b = (sy - a * sx) / n;
    if (!(a > 0.0)) continue;
    double err = 0.0;
    for (const auto& [e, l] : history) {
      const double pred = 1.0 / std::max(a * e + b, 1e-12) + c;
      err += (pred - l) * (pred - l);
    }
    if (err < best_err) best_err = err, best_a = a, best_b = b, best_c = c;
  }
  if (!std::isfinite(best_err)) return last + 1.0;
  auto loss = [&](double e) { return 1.0 / std::max(best_a * e + best_b, 1e-12) + best_c; };
  for (double e = std::max(last, 1.0); e < 1e5; e *= 1.02)
    if (loss(e) - loss(1.1 * e) < 0.01 * loss(e)) return std::max(e, last + 1.0);
  return 1e5;
}

}  // namespace detail

class simulator {
 public:
  simulator(const profile_library& profiles, std::vector<job_spec> jobs, sim_config config)
      : profiles_(&profiles), config_((config.validate(), std::move(config))) {
    capacity_ = config_.nodes * config_.devices_per_node;
    free_per_node_.assign(static_cast<std::size_t>(config_.nodes), config_.devices_per_node);
    distributed_on_node_.assign(static_cast<std::size_t>(config_.nodes), 0);
    const std::string& p = config_.policy;
    cluster_ = p == "arbiter" || p == "pollux" || (p == "convergence_aware" && config_.cluster_arbitration);
    jobs_.reserve(jobs.size());
    for (auto& spec : jobs) {
      job_state j;
      j.app = &profiles.at(spec.application);
      if (spec.replicas < 1) dra::detail::throw_invalid("replicas", "job '" + spec.name + "' requests < 1 device");
      if (!(spec.batch > 0.0)) dra::detail::throw_invalid("batch", "job '" + spec.name + "' has batch <= 0");
      j.spec = std::move(spec);
      j.fixed_batch = j.spec.batch;
      // Cluster policies co-adapt the batch, except for applications the reference pins (ncf: its
      // workloads all request 32768, the batch the reference forces), which keep the user's batch.
      if (cluster_ && j.app->adaptive_fixed_batch() <= 0.0) j.fixed_batch = 0.0;
      j.max_devices = job_cap(j);
      if (p == "static" || p == "tiresias") j.spec.replicas = std::min(j.spec.replicas, capacity_);
      j.est = std::make_unique<signals::convergence_estimator>(config_.estimator);
      j.model = std::make_unique<policy::perf_model>();
      if (!cluster_ && (p == "convergence" || p == "goodput" || p == "convergence_aware")) {
        std::shared_ptr<const policy::policy> inner;
        if (p == "convergence") {
          inner = std::make_shared<policy::convergence_phase_policy>(config_.convergence);
        } else if (p == "goodput") {
          inner = std::make_shared<policy::goodput_policy>(config_.goodput);
        } else {
          policy::convergence_aware_config c = config_.convergence_aware;
          c.min_per_rank_batch = j.app->min_local_batch();
          // The batch cap: the largest measured batch (ncf keeps the user's batch, as above).
          c.max_global_batch = j.app->adaptive_fixed_batch() > 0.0 ? 0.0 : j.app->max_batch();
          inner = std::make_shared<policy::convergence_aware_policy>(c);
        }
        policy::constraints limits;
        limits.max_size = std::max(1, j.max_devices);
        limits.min_size = config_.convergence_floor_at_request && p == "convergence"
                              ? std::clamp(j.spec.replicas, 1, limits.max_size)
                              : 1;
        j.policy = std::make_unique<policy::constrained_policy>(inner, limits);
        j.predictor = std::make_unique<fitted_predictor>(*j.model, config_.devices_per_node, j.app->max_local_batch());
      }
      jobs_.push_back(std::move(j));
    }
    std::stable_sort(jobs_.begin(), jobs_.end(),
                     [](const job_state& a, const job_state& b) { return a.spec.submit_s < b.spec.submit_s; });
  }

  const sim_config& config() const noexcept { return config_; }
  int capacity() const noexcept { return capacity_; }

  /// Runs to completion (or max_time_s). `progress(now, done, total)` is called once per tick
  /// when given; returning false stops the run early.
  sim_result run(const std::function<bool(double, std::size_t, std::size_t)>& progress = nullptr) {
    const auto wall_start = std::chrono::steady_clock::now();
    sim_result out;
    out.policy = config_.policy;
    out.capacity = capacity_;
    out.reallocation_cost_s = config_.reallocation_cost_s;
    double now = 0.0;
    std::size_t done = 0;
    double last_compute = 0.0, last_busy = 0.0;
    while (done < jobs_.size() && now < config_.max_time_s) {
      // Advance every job by one interval, then decide at the new time (as the reference does).
      for (auto& j : jobs_) advance(j, now, config_.interval_s);
      now += config_.interval_s;
      done = 0;
      for (auto& j : jobs_)
        if (j.done) {
          ++done;
          if (j.devices > 0) release(j);
        }
      schedule(now);
      check_conservation();
      if (config_.record_timeline) {
        timeline_point p;
        p.time_s = now;
        double compute = 0.0, busy = 0.0;
        for (const auto& j : jobs_) {
          compute += j.compute_s;
          busy += j.busy_s;
          if (j.devices > 0)
            ++p.running, p.allocated += j.devices;
          else if (!j.done && j.spec.submit_s <= now)
            ++p.waiting;
        }
        p.compute_fraction = (compute - last_compute) / (config_.interval_s * capacity_);
        p.busy_fraction = (busy - last_busy) / (config_.interval_s * capacity_);
        last_compute = compute;
        last_busy = busy;
        out.timeline.push_back(p);
      }
      if (progress && !progress(now, done, jobs_.size())) break;
    }
    out.first_submit_s = jobs_.empty() ? 0.0 : jobs_.front().spec.submit_s;
    for (const auto& j : jobs_) {
      job_result r;
      r.name = j.spec.name;
      r.application = j.spec.application;
      r.submit_s = j.spec.submit_s;
      r.start_s = j.start_s;
      r.completion_s = j.done ? j.completion_s : std::numeric_limits<double>::quiet_NaN();
      r.jct_s = j.done ? j.completion_s - j.spec.submit_s : std::numeric_limits<double>::quiet_NaN();
      r.gpu_seconds = j.gpu_s;
      r.compute_gpu_seconds = j.compute_s;
      r.busy_gpu_seconds = j.busy_s;
      r.progress = j.progress;
      r.epochs = j.epoch;
      r.requested_replicas = j.spec.replicas;
      r.requested_batch = j.spec.batch;
      r.final_batch = j.last_batch;
      r.final_metric = j.epoch > 0 ? j.best_metric : std::numeric_limits<double>::quiet_NaN();
      r.reached_target = j.reached_target;
      r.reallocations = std::max(0, j.restarts);
      r.max_devices = j.max_held;
      r.device_time_weighted_devices = j.held_s > 0.0 ? j.gpu_s / j.held_s : 0.0;
      if (j.done)
        out.makespan_s = std::max(out.makespan_s, j.completion_s);
      else
        out.all_completed = false;
      out.jobs.push_back(std::move(r));
    }
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    return out;
  }

 private:
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

  // ---- limits -------------------------------------------------------------------------------
  int job_cap(const job_state& j) const {
    int cap = capacity_;
    if (config_.reference_limits && j.app->max_replicas() > 0) cap = std::min(cap, j.app->max_replicas());
    const double batch_for_cap = j.fixed_batch > 0.0 ? j.fixed_batch : j.app->max_batch();
    cap = std::min(cap, std::max(1, static_cast<int>(std::floor(batch_for_cap / j.app->min_local_batch() + 1e-9))));
    if (config_.quota_scale > 0.0 && config_.policy != "static" && config_.policy != "tiresias")
      cap = std::min(cap, std::max(1, static_cast<int>(std::floor(config_.quota_scale * j.spec.replicas + 1e-9))));
    return std::max(cap, 1);
  }

  /// Most devices a cluster policy may give a job now: Pollux's exploration rule (twice the most it
  /// has run on; one before it ran) within its cap and 16 nodes' worth.
  int explore_cap(const job_state& j) const {
    const int seen = j.model->max_profiled_replicas();
    return std::min(j.max_devices, std::max(2 * seen, 1));
  }

  // ---- physics ------------------------------------------------------------------------------
  static std::vector<int> compact(const std::vector<int>& alloc) {
    std::vector<int> p;
    for (int c : alloc)
      if (c > 0) p.push_back(c);
    return p;
  }

  step_times measured(const job_state& j, const std::vector<int>& placement, double atomic, int accum) const {
    step_times t = j.app->accumulated(placement, atomic, accum);
    t.step_s *= j.spec.throughput_scale;
    t.sync_s *= j.spec.throughput_scale;
    return t;
  }

  std::pair<double, double> stats(const job_state& j, double batch, int epoch) const {
    auto [sqr, var] = j.app->grad_stats(batch, epoch);
    return {sqr, var * j.spec.gns_scale};
  }

  void account(job_state& j, double dt, double compute_fraction, bool stepping) {
    j.gpu_s += dt * j.devices;
    j.attained += dt * j.devices;
    j.compute_s += dt * j.devices * compute_fraction;
    if (stepping) j.busy_s += dt * j.devices;
    j.held_s += dt;
  }

  bool target_reached(const job_state& j) const {
    if (std::isnan(j.spec.target_metric) || j.epoch == 0) return false;
    return j.app->metric_increases() ? j.best_metric >= j.spec.target_metric : j.best_metric <= j.spec.target_metric;
  }

  double loss_proxy(const job_state& j, double batch, int epoch) const {
    // The traces hold a validation metric per epoch, not a loss. A loss-like quantity that falls as
    // the model learns: the error (1 - accuracy, on the metric's own scale) or the metric itself.
    const double m = j.app->metric(batch, epoch);
    if (!j.app->metric_increases()) return m;
    const double top = m <= 1.0 ? 1.0 : 100.0;
    return std::max(top - m, 1e-6);
  }

  /// Advances one job from `now` by `seconds`. While it trains, the job measures its step time at
  /// its configuration (the reference's update_params): a new configuration refits its model.
  void advance(job_state& j, double now, double seconds) {
    if (j.done || j.devices == 0) return;
    const double delay = std::min(j.rescale_left, seconds);
    account(j, delay, 0.0, false);
    j.rescale_left -= delay;
    seconds -= delay;
    double t = now + delay;
    while (seconds > 0.0 && !j.done) {
      const double batch = j.devices * j.atomic * (j.accum + 1);
      j.last_batch = batch;
      if (!j.step_cached) {
        j.step_cache = measured(j, compact(j.alloc), j.atomic, j.accum), j.step_cached = true;
        const step_times one = measured(j, compact(j.alloc), j.atomic, 0);
        j.model->observe(static_cast<int>(compact(j.alloc).size()), j.devices, j.atomic, one.step_s, one.sync_s);
      }
      const step_times st = j.step_cache;
      const double total = st.step_s;  // includes accumulation passes
      const double compute_fraction = total > 0.0 ? (total - st.sync_s) / total : 0.0;
      const auto [sqr, var] = stats(j, batch, j.epoch);
      const double gain = detail::adascale_gain_from_stats(sqr, var, batch / j.app->init_batch());
      const double rate = gain / total;  // progress per second
      const double next = j.app->progress_at(j.epoch + 1);
      if (j.progress + rate * seconds < next) {
        j.progress += rate * seconds;
        j.steps += seconds / total;
        account(j, seconds, compute_fraction, true);
        seconds = 0.0;
        break;
      }
      const double dt = std::max(0.0, (next - j.progress) / rate);
      account(j, dt, compute_fraction, true);
      j.steps += dt / total;
      j.progress = next;
      t += dt;
      seconds -= dt;
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
      j.reached_target = target_reached(j);
      if (j.epoch >= j.app->max_epochs() || j.reached_target) {
        j.done = true;
        j.completion_s = t;
        break;
      }
      if (j.fixed_batch <= 0.0) choose_batch(j);  // re-optimise between epochs, as the reference does
    }
    // The reference also re-optimises the batch at the end of every interval, with the model as
    // refitted from what the job measured in it.
    if (!j.done && j.fixed_batch <= 0.0) choose_batch(j);
  }

  // ---- placement ----------------------------------------------------------------------------
  void release(job_state& j) {
    const bool distributed = compact(j.alloc).size() > 1;
    for (std::size_t n = 0; n < j.alloc.size(); ++n) {
      free_per_node_[n] += j.alloc[n];
      if (distributed && j.alloc[n] > 0) --distributed_on_node_[n];
    }
    j.alloc.clear();
    j.devices = 0;
  }

  int free_devices() const {
    int f = 0;
    for (int c : free_per_node_) f += c;
    return f;
  }

  /// Places k devices. Packed (static, per-job policies): whole free nodes first, then the node
  /// that fits the rest most tightly, then the fullest-free nodes. Tiresias: the node with the
  /// most free devices, repeatedly (the reference's). Cluster policies: packed, but at most one
  /// distributed job per node (Pollux's rule); returns fewer than k devices when that rule leaves
  /// no room. Returns devices per node.
  std::vector<int> place(int k) { return place_on(k, free_per_node_, distributed_on_node_); }

  /// place() on explicit free-device and distributed-job counts (so a plan can be tried first).
  std::vector<int> place_on(int k, std::vector<int>& free, std::vector<int>& distributed) const {
    std::vector<int> alloc(free.size(), 0);
    const int per = config_.devices_per_node;
    const std::size_t none = free.size();
    int left = k;
    if (config_.policy == "tiresias") {
      while (left > 0) {
        std::size_t best = none;
        for (std::size_t n = 0; n < free.size(); ++n)
          if (free[n] > 0 && (best == none || free[n] > free[best])) best = n;
        if (best == none) throw std::logic_error("place: not enough free devices");
        const int take = std::min(left, free[best]);
        alloc[best] += take, free[best] -= take, left -= take;
      }
      return alloc;
    }
    if (cluster_) {
      // One node if it fits, tightest first.
      std::size_t fit = none;
      for (std::size_t n = 0; n < free.size() && k <= per; ++n)
        if (free[n] >= k && (fit == none || free[n] < free[fit])) fit = n;
      if (fit != none) {
        alloc[fit] = k, free[fit] -= k;
        return alloc;
      }
      // Distributed: only nodes without another distributed job; whole free nodes first, then the
      // tightest node that fits the rest, then the most free.
      for (std::size_t n = 0; n < free.size() && left >= per; ++n)
        if (free[n] == per && distributed[n] == 0) alloc[n] = per, free[n] = 0, left -= per;
      while (left > 0) {
        std::size_t best = none;
        for (std::size_t n = 0; n < free.size(); ++n)
          if (alloc[n] == 0 && distributed[n] == 0 && free[n] >= left && (best == none || free[n] < free[best])) best = n;
        if (best == none)
          for (std::size_t n = 0; n < free.size(); ++n)
            if (alloc[n] == 0 && distributed[n] == 0 && free[n] > 0 && (best == none || free[n] > free[best])) best = n;
        if (best == none) break;
        const int take = std::min(left, free[best]);
        alloc[best] += take, free[best] -= take, left -= take;
      }
      if (compact(alloc).size() > 1)
        for (std::size_t n = 0; n < alloc.size(); ++n)
          if (alloc[n] > 0) ++distributed[n];
      return alloc;
    }
    for (std::size_t n = 0; n < free.size() && left >= per; ++n)
      if (free[n] == per) alloc[n] = per, free[n] = 0, left -= per;
    while (left > 0) {
      std::size_t best = none;
      for (std::size_t n = 0; n < free.size(); ++n)  // tightest node that fits the rest
        if (free[n] >= left && (best == none || free[n] < free[best])) best = n;
      if (best == none) {
        for (std::size_t n = 0; n < free.size(); ++n)  // otherwise the node with most free
          if (free[n] > 0 && (best == none || free[n] > free[best])) best = n;
      }
      if (best == none) throw std::logic_error("place: not enough free devices");
      const int take = std::min(left, free[best]);
      alloc[best] += take;
      free[best] -= take;
      left -= take;
    }
    return alloc;
  }

  /// Devices each job would end up with if `alloc` were applied in apply_allocation's order (a dry
  /// run of the placement rule).
  std::vector<int> plan(const std::vector<job_state*>& act, const std::vector<int>& alloc) const {
    std::vector<int> free = free_per_node_, distributed = distributed_on_node_;
    std::vector<int> got(act.size());
    auto drop = [&](const job_state& j) {
      const bool dist = compact(j.alloc).size() > 1;
      for (std::size_t n = 0; n < j.alloc.size(); ++n) {
        free[n] += j.alloc[n];
        if (dist && j.alloc[n] > 0) --distributed[n];
      }
    };
    for (std::size_t i = 0; i < act.size(); ++i) {
      got[i] = act[i]->devices;
      if (alloc[i] != act[i]->devices) drop(*act[i]), got[i] = 0;
    }
    // Shrinks are placed before grows (they fit where they were), grows biggest first.
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (alloc[i] != act[i]->devices && alloc[i] > 0 && alloc[i] < act[i]->devices) order.push_back(i);
    std::vector<std::size_t> grows;
    for (std::size_t i = 0; i < act.size(); ++i)
      if (alloc[i] > act[i]->devices) grows.push_back(i);
    std::stable_sort(grows.begin(), grows.end(), [&](std::size_t a, std::size_t b) { return alloc[a] > alloc[b]; });
    order.insert(order.end(), grows.begin(), grows.end());
    for (std::size_t i : order) {
      int sum = 0;
      for (int c : place_on(alloc[i], free, distributed)) sum += c;
      got[i] = sum;
    }
    return got;
  }

  /// Gives a job k devices (k = 0 releases). A change costs reallocation_cost_s of no progress.
  /// Returns the devices it got (cluster policies may get fewer under the placement rule).
  int reallocate(job_state& j, int k, double now) {
    if (k == j.devices) return k;
    release(j);
    j.step_cached = false;
    if (k <= 0) {
      j.atomic = 0.0;
      return 0;
    }
    j.alloc = place(k);
    int got = 0;
    for (int c : j.alloc) got += c;
    j.devices = got;
    if (got == 0) {
      j.alloc.clear();
      j.atomic = 0.0;
      return 0;
    }
    j.max_held = std::max(j.max_held, got);
    j.rescale_left = config_.reallocation_cost_s;
    if (j.restarts < 0) j.start_s = now;
    ++j.restarts;
    j.steps_at_resize = j.steps;
    if (j.fixed_batch > 0.0) {
      const auto s = detail::split_batch(*j.app, j.fixed_batch, got);
      j.atomic = s.atomic, j.accum = s.accum;
    } else {
      choose_batch(j);
    }
    j.last_batch = j.devices * j.atomic * (j.accum + 1);
    return got;
  }

  /// Sets a new total batch at the same devices (no resize, no cost): the simulator applies the
  /// per-job policies' batch decisions.
  void set_batch(job_state& j, double batch) {
    const auto s = detail::split_batch(*j.app, std::clamp(batch, j.app->init_batch(), j.app->max_batch()), j.devices);
    if (s.atomic == j.atomic && s.accum == j.accum) return;
    j.atomic = s.atomic, j.accum = s.accum;
    j.step_cached = false;
    j.last_batch = j.devices * j.atomic * (j.accum + 1);
  }

  // ---- goodput from the job's fitted model ---------------------------------------------------
  policy::grad_stats job_stats(const job_state& j) const {
    const double ref_batch = j.last_batch > 0.0 ? j.last_batch : std::max(j.app->init_batch(), j.spec.batch);
    const auto [sqr, var] = stats(j, ref_batch, j.epoch);
    return {sqr, var};
  }

  /// Predicted best goodput at (nodes, replicas) over batch sizes (Pollux's GoodputFunction.optimize
  /// with accumulation), from the job's fitted model and current gradient statistics.
  policy::batch_choice predicted_best(const job_state& j, int nodes, int replicas) const {
    const policy::batch_limits lim = detail::limits_of(*j.app, config_.batch_candidates);
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

  void choose_batch(job_state& j) const {
    j.step_cached = false;
    policy::batch_choice c;
    const int nodes = static_cast<int>(compact(j.alloc).size());
    if (j.model->fitted()) {
      c = predicted_best(j, nodes, j.devices);
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

  /// Predicted best goodput at k packed devices, cached per epoch and model fit.
  double curve_at(job_state& j, int k) const {
    if (k <= 0 || !j.model->fitted()) return 0.0;
    if (j.curve_epoch != j.epoch || j.curve_model != j.model->configurations() || j.curve.empty()) {
      j.curve.assign(static_cast<std::size_t>(j.max_devices) + 1, -1.0);
      j.curve_epoch = j.epoch;
      j.curve_model = j.model->configurations();
    }
    const int kk = std::min(k, j.max_devices);
    double& g = j.curve[static_cast<std::size_t>(kk)];
    if (g < 0.0) g = predicted_best(j, (kk + config_.devices_per_node - 1) / config_.devices_per_node, kk).goodput;
    return g;
  }

  /// Remaining work (statistical progress) the job expects: its epoch budget left, or, without
  /// the budget, an Optimus-style fit of its per-epoch loss proxy, loss(e) = 1 / (a e + b) + c,
  /// extrapolated to where it improves by less than 1 % over a further 10 % of its epochs.
  double remaining_work(const job_state& j) const {
    const double total = j.app->progress_at(j.app->max_epochs());
    if (config_.remaining_work_from_budget || j.epoch < 3) return std::max(total - j.progress, 1.0);
    const double per_epoch = j.progress / std::max(1, j.epoch);
    const double epochs = detail::optimus_epochs(j.loss_history);
    return std::max((epochs - j.epoch) * per_epoch, per_epoch);
  }

  // ---- policies -----------------------------------------------------------------------------
  std::vector<job_state*> active(double now) {
    std::vector<job_state*> out;
    for (auto& j : jobs_)
      if (!j.done && j.spec.submit_s <= now) out.push_back(&j);
    return out;
  }

  void schedule(double now) {
    const std::string& p = config_.policy;
    if (p == "static")
      schedule_static(now);
    else if (p == "tiresias")
      schedule_tiresias(now);
    else if (cluster_)
      schedule_cluster(now);
    else
      schedule_per_job(now);
  }

  // First come, first served with backfilling: a job starts with exactly what it requested as soon
  // as that many devices are free; a job that does not fit does not block smaller ones behind it.
  void schedule_static(double now) {
    for (job_state* j : active(now))
      if (j->devices == 0 && j->spec.replicas <= free_devices()) reallocate(*j, j->spec.replicas, now);
  }

  // Tiresias-style two-queue least-attained-service, preemptive, no resizing (as the reference's
  // baseline): a job is demoted after `threshold` GPU-seconds of service; queue 0 before queue 1,
  // arrival (or demotion) order within a queue; jobs that do not fit are preempted. Placement: the
  // node with the most free devices first, as the reference.
  void schedule_tiresias(double now) {
    std::vector<job_state*> act = active(now);
    for (job_state* j : act) {
      if (j->devices > 0) j->executed_s += config_.interval_s;
      if (j->queue == 0 && j->executed_s * j->spec.replicas >= config_.tiresias_threshold_gpu_s)
        j->queue = 1, j->demoted_at = now;
    }
    std::stable_sort(act.begin(), act.end(), [](const job_state* a, const job_state* b) {
      if (a->queue != b->queue) return a->queue < b->queue;
      if (a->queue == 1 && a->demoted_at != b->demoted_at) return a->demoted_at < b->demoted_at;
      return a->spec.submit_s < b->spec.submit_s;
    });
    int budget = capacity_;
    std::vector<job_state*> run;
    for (job_state* j : act) {
      if (j->spec.replicas <= budget) {
        budget -= j->spec.replicas;
        run.push_back(j);
      } else if (j->devices > 0) {
        reallocate(*j, 0, now);  // preempted
      }
    }
    for (job_state* j : run)
      if (j->devices == 0) reallocate(*j, j->spec.replicas, now);
  }

  /// Device price the cluster quotes to per-job policies: 0 while nothing waits, rising to 1 as the
  /// devices waiting jobs ask for approach the whole cluster.
  double contention_price(int waiting_demand) const {
    return std::clamp(static_cast<double>(waiting_demand) / static_cast<double>(capacity_), 0.0, 1.0);
  }

  // Each job runs its own constrained policy (the live-job code) against the devices it could get
  // now: its own plus the spare ones, up to its fair share. Waiting jobs are admitted first, in
  // arrival order, with what they requested when it is free (as static, with backfilling); then
  // running jobs decide in arrival order. Size and batch decisions are both applied.
  void schedule_per_job(double now) {
    std::vector<job_state*> act = active(now);
    for (job_state* j : act) {
      if (j->devices > 0) continue;
      const int k = std::min(j->spec.replicas, j->max_devices);
      if (k <= free_devices()) reallocate(*j, k, now);
    }
    int waiting_demand = 0;
    for (job_state* j : act)
      if (j->devices == 0) waiting_demand += std::min(j->spec.replicas, j->max_devices);
    for (job_state* j : act) {
      if (j->devices == 0 || j->rescale_left > 0.0) continue;
      signals::convergence_signals sig = j->est->signals();
      const double batch = j->last_batch > 0.0 ? j->last_batch : j->fixed_batch;
      const auto [sqr, var] = stats(*j, batch, j->epoch);
      // Gradient noise scale in samples from the trace: tr(Sigma)/|G|^2 at the initial batch M0.
      sig.grad_sqr = sqr;
      sig.grad_var = var;
      sig.gns_valid = sqr > 0.0 && var >= 0.0;
      sig.gns = sig.gns_valid ? var / sqr * j->app->init_batch() : 0.0;
      policy::world_state world;
      world.size = j->devices;
      world.step = static_cast<std::int64_t>(j->steps);
      world.steps_since_resize = static_cast<std::int64_t>(j->steps - j->steps_at_resize);
      world.global_batch = batch;
      world.base_batch = j->app->init_batch();
      const double step_s = j->predictor->step_time_s(j->devices, batch / j->devices);
      const double gain = detail::adascale_gain_from_stats(sqr, var, batch / j->app->init_batch());
      const double remaining_progress = j->app->progress_at(j->app->max_epochs()) - j->progress;
      world.remaining_steps = static_cast<std::int64_t>(std::max(0.0, remaining_progress / std::max(gain, 1e-12)));
      // The pool lends spare devices (none while jobs wait) up to the job's fair share of the
      // cluster, so one job's policy cannot starve the jobs arriving after it.
      const int fair =
          std::max(j->spec.replicas,
                   static_cast<int>(std::ceil(static_cast<double>(capacity_) / static_cast<double>(act.size()))));
      const int spare = std::max(0, free_devices() - waiting_demand);
      policy::capacity cap;
      cap.available = std::max(j->devices, std::min(j->devices + spare, fair));
      cap.device_price = contention_price(waiting_demand);
      policy::cost_model costs{config_.reallocation_cost_s,
                               std::max(1.0, config_.horizon_s / std::max(step_s > 0.0 ? step_s : 1.0, 1e-9))};
      const policy::decision d = j->policy->decide(sig, world, cap, costs, *j->predictor);
      if (d.kind != policy::action::hold && d.target_size != j->devices) {
        const double new_batch = batch * d.batch_scale;
        reallocate(*j, d.target_size, now);
        if (j->devices > 0 && d.batch_scale != 1.0) set_batch(*j, new_batch);
      } else if (d.batch_scale != 1.0) {
        set_batch(*j, batch * d.batch_scale);
      }
    }
  }

  // Cluster policies: dra::policy::cluster_arbiter over per-job curves from each job's fitted
  // model, with Pollux's restart penalty, exploration rule and placement rule.
  //  - pollux: Pollux's objective: power mean (p = -1) of speedups over the goodput at the fair
  //    share (ceil(capacity / jobs) replicas on one node), scaled by 16/64 as its code does; jobs
  //    without a model get the linear prior k / fair; jobs in least-attained-service order.
  //  - arbiter: the same objective with the fair share packed on nodes (dra's arbiter).
  //  - convergence_aware: sum (p = 1) of goodput / remaining work (shortest remaining work first,
  //    for malleable jobs), each curve cut where devices stop earning the price floor; jobs in
  //    order of remaining work.
  void schedule_cluster(double now) {
    std::vector<job_state*> act = active(now);
    if (act.empty()) return;
    const std::string& p = config_.policy;
    const bool ca = p == "convergence_aware";
    std::vector<double> work(act.size());
    for (std::size_t i = 0; i < act.size(); ++i) work[i] = ca ? remaining_work(*act[i]) : 0.0;
    std::vector<std::size_t> order(act.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (ca && work[a] != work[b]) return work[a] < work[b];
      if (act[a]->attained != act[b]->attained) return act[a]->attained < act[b]->attained;
      return act[a]->spec.submit_s < act[b]->spec.submit_s;
    });
    std::vector<job_state*> sorted;
    std::vector<double> sorted_work;
    for (std::size_t i : order) sorted.push_back(act[i]), sorted_work.push_back(work[i]);
    act = std::move(sorted);
    work = std::move(sorted_work);
    const int fair = static_cast<int>(std::ceil(static_cast<double>(capacity_) / static_cast<double>(act.size())));
    const double scale = static_cast<double>(config_.nodes) / static_cast<double>(capacity_);
    // convergence_aware: a job's value at k devices is the rate at which it completes its remaining
    // work, goodput(k) / remaining work (1/s), normalised by the largest one-device rate. A job that
    // has not measured anything yet is taken to be as close to done as the closest job (new jobs
    // first, as least-attained-service does), at linear speedup.
    std::vector<double> rate_one(act.size(), 0.0);
    double top_rate = 0.0;
    if (ca)
      for (std::size_t i = 0; i < act.size(); ++i)
        if (act[i]->model->fitted()) {
          rate_one[i] = curve_at(*act[i], 1) * policy::remaining_work_weight(work[i]);
          top_rate = std::max(top_rate, rate_one[i]);
        }
    if (!(top_rate > 0.0)) top_rate = 1.0;
    std::vector<policy::arbiter_job> in;
    in.reserve(act.size());
    for (std::size_t i = 0; i < act.size(); ++i) {
      job_state* j = act[i];
      const int most = explore_cap(*j);
      policy::arbiter_job a;
      a.speedup.assign(static_cast<std::size_t>(most) + 1, 0.0);
      if (!j->model->fitted()) {
        // Pollux's prior before any measurement: linear speedup.
        for (int k = 1; k <= most; ++k)
          a.speedup[static_cast<std::size_t>(k)] = (ca ? 1.0 : scale / fair) * static_cast<double>(k);
      } else if (ca) {
        std::vector<double> g(static_cast<std::size_t>(most) + 1, 0.0);
        for (int k = 1; k <= most; ++k) g[static_cast<std::size_t>(k)] = curve_at(*j, k);
        const int cut = policy::priced_size(g, config_.cluster_price_floor);
        const double w = policy::remaining_work_weight(work[i]) / top_rate;
        for (int k = 1; k <= most; ++k) a.speedup[static_cast<std::size_t>(k)] = w * g[static_cast<std::size_t>(std::min(k, cut))];
      } else {
        const int fair_k = std::clamp(fair, 1, j->max_devices);
        double base = p == "pollux" ? predicted_best(*j, 1, fair_k).goodput : curve_at(*j, fair_k);
        if (!(base > 0.0)) base = curve_at(*j, 1);
        for (int k = 1; k <= most; ++k)
          a.speedup[static_cast<std::size_t>(k)] = base > 0.0 ? scale * curve_at(*j, k) / base : 0.0;
      }
      a.current = j->devices;
      const double age = now - j->spec.submit_s;
      const double cost = config_.reallocation_cost_s;
      const int restarts = std::max(0, j->restarts);
      a.change_penalty = cost > 0.0 ? std::clamp(std::max(age - restarts * cost, 0.0) / (age + cost), 0.0, 1.0) : 1.0;
      in.push_back(std::move(a));
    }
    policy::arbiter_config ac = config_.arbiter;
    if (ca) ac.p = config_.remaining_work_power;
    const policy::cluster_arbiter arbiter(ac);
    // The arbiter divides device counts; the placement rule (one distributed job per node) may not
    // fit them all. Try the plan, cap each job that would get fewer devices at what it would get,
    // and divide again, so the search only returns allocations that can be placed (as Pollux's
    // genetic search only keeps repaired, placeable states).
    std::vector<int> alloc = arbiter.allocate(in, capacity_);
    for (int round = 0; round < 8; ++round) {
      const std::vector<int> got = plan(act, alloc);
      bool short_any = false;
      for (std::size_t i = 0; i < act.size(); ++i)
        if (got[i] < alloc[i]) {
          short_any = true;
          const auto keep = static_cast<std::size_t>(std::max(got[i], 0)) + 1;
          if (in[i].speedup.size() > keep) in[i].speedup.resize(keep);
        }
      if (!short_any) break;
      alloc = arbiter.allocate(in, capacity_);
    }
    // Shrinks first (they free devices), then grows, biggest first so they find whole nodes.
    std::vector<std::size_t> idx(act.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    for (std::size_t i : idx)
      if (alloc[i] < act[i]->devices) reallocate(*act[i], alloc[i], now);
    for (std::size_t i : idx)
      if (alloc[i] > act[i]->devices) release(*act[i]);
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return alloc[a] > alloc[b]; });
    for (std::size_t i : idx)
      if (alloc[i] > act[i]->devices) reallocate(*act[i], alloc[i], now);
  }

  void check_conservation() const {
    int held = 0;
    for (const auto& j : jobs_) {
      int s = 0;
      for (int c : j.alloc) s += c;
      if (s != j.devices)
        throw std::logic_error("simulator: job '" + j.spec.name + "' placement disagrees with its device count");
      if (j.done && j.devices != 0)
        throw std::logic_error("simulator: finished job '" + j.spec.name + "' still holds devices");
      held += j.devices;
    }
    for (int f : free_per_node_)
      if (f < 0 || f > config_.devices_per_node) throw std::logic_error("simulator: node over-allocated");
    if (cluster_)
      for (int d : distributed_on_node_)
        if (d > 1) throw std::logic_error("simulator: two distributed jobs on one node (Pollux's placement rule)");
    if (held + free_devices() != capacity_ || held > capacity_)
      throw std::logic_error("simulator: " + std::to_string(held) + " devices held + " +
                             std::to_string(free_devices()) + " free != capacity " + std::to_string(capacity_));
  }

  const profile_library* profiles_;
  sim_config config_;
  bool cluster_ = false;
  int capacity_ = 0;
  std::vector<int> free_per_node_;
  std::vector<int> distributed_on_node_;  ///< distributed jobs with devices on each node (rule: <= 1)
  std::vector<job_state> jobs_;
};

/// Convenience: simulate a workload under one policy.
inline sim_result simulate(const profile_library& profiles, const std::vector<job_spec>& jobs, const sim_config& config,
                           const std::function<bool(double, std::size_t, std::size_t)>& progress = nullptr) {
  simulator s(profiles, jobs, config);
  return s.run(progress);
}

}  // namespace dra::sim
