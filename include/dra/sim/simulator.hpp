#pragma once
// Discrete-time/event cluster simulator (DESIGN.md §3.4). Jobs arrive, an allocation policy runs
// every `interval_s` seconds, each reallocation costs `reallocation_cost_s` seconds of no progress
// while the job keeps its devices, and between decisions each job advances analytically epoch by
// epoch: within an epoch its goodput (AdaScale gain per second) is constant, so the exact time at
// which it crosses each epoch boundary (and completes) is computed, not sampled.
//
// The per-job dynamic policies are dra::policy::constrained_policy around the same
// convergence_phase_policy / goodput_policy a live job runs, fed a throughput_predictor backed by
// the measured profile and convergence_signals derived from the trace. The cluster-level policy
// is dra::policy::cluster_arbiter over goodput curves from the profile.
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
  static const std::vector<std::string> names{"static", "tiresias", "convergence", "goodput", "arbiter"};
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
  /// The convergence policy never goes below the devices the job requested: it grows beyond the
  /// request while learning is fast and releases the extra on plateau. false: down to one device.
  bool convergence_floor_at_request = true;
  /// Amortisation horizon of the per-job policies in seconds of training at the current size.
  double horizon_s = 1800.0;
  signals::estimator_config estimator = epoch_estimator_config();

  // Cluster arbiter.
  policy::arbiter_config arbiter{};
  /// Pollux's exploration rule: a job may get at most twice the most devices it has held. Pollux
  /// needs it because its throughput model is learned online and cannot extrapolate; here the
  /// goodput curves come from the measured profile, so it is off by default (docs/guide/simulator.md
  /// reports both).
  bool arbiter_exploration_limit = false;
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

/// A throughput_predictor backed by the measured profile: a world of `size` devices packed on
/// nodes of `devices_per_node`, per-rank batch split into atomic batches with accumulation when it
/// exceeds the largest measured local batch, as the reference does.
class profile_predictor final : public policy::throughput_predictor {
 public:
  profile_predictor(const application_profile& app, int devices_per_node, double throughput_scale = 1.0)
      : app_(&app), per_node_(devices_per_node), scale_(throughput_scale) {}
  double step_time_s(int world_size, double per_rank_batch) const override {
    if (world_size < 1 || !(per_rank_batch > 0.0)) return 0.0;
    const int accum = std::max(0, static_cast<int>(std::ceil(per_rank_batch / app_->max_local_batch() - 1e-8)) - 1);
    const double atomic = per_rank_batch / (accum + 1);
    return scale_ * app_->accumulated(packed_placement(world_size, per_node_), atomic, accum).step_s;
  }

 private:
  const application_profile* app_;
  int per_node_;
  double scale_;
};

namespace detail {

/// Efficiency gain of AdaScale at `scale` = M / M0 with gradient statistics at M0.
inline double adascale_gain_from_stats(double sqr, double var, double scale) {
  const double denom = var / scale + sqr;
  return denom > 0.0 ? (var + sqr) / denom : 1.0;
}

/// Batch split of the reference for a fixed total batch on `replicas` devices.
struct batch_split {
  double atomic = 0.0;
  int accum = 0;
};
inline batch_split split_batch(const application_profile& app, double batch, int replicas) {
  const double eps = 1e-8;
  const double local = std::ceil(batch / replicas - eps);
  int accum = static_cast<int>(std::ceil(local / app.max_local_batch() - eps)) - 1;
  if (replicas == 1 && batch > app.init_batch()) accum = std::max(1, accum);
  accum = std::max(accum, 0);
  double atomic = std::ceil(local / (accum + 1) - eps);
  const double count = static_cast<double>(replicas) * (accum + 1);
  atomic = std::min(atomic, std::floor(app.max_batch() / count));
  return {std::max(atomic, 1.0), accum};
}

}  // namespace detail

class simulator {
 public:
  simulator(const profile_library& profiles, std::vector<job_spec> jobs, sim_config config)
      : profiles_(&profiles), config_((config.validate(), std::move(config))) {
    capacity_ = config_.nodes * config_.devices_per_node;
    free_per_node_.assign(static_cast<std::size_t>(config_.nodes), config_.devices_per_node);
    jobs_.reserve(jobs.size());
    for (auto& spec : jobs) {
      job_state j;
      j.app = &profiles.at(spec.application);
      if (spec.replicas < 1) dra::detail::throw_invalid("replicas", "job '" + spec.name + "' requests < 1 device");
      if (!(spec.batch > 0.0)) dra::detail::throw_invalid("batch", "job '" + spec.name + "' has batch <= 0");
      j.spec = std::move(spec);
      j.fixed_batch = j.spec.batch;
      // The arbiter co-adapts the batch, except for applications the reference pins (ncf: its
      // workloads all request 32768, the batch the reference forces), which keep the user's batch.
      if (config_.policy == "arbiter" && j.app->adaptive_fixed_batch() <= 0.0) j.fixed_batch = 0.0;
      j.max_devices = job_cap(j);
      if (config_.policy == "static" || config_.policy == "tiresias") {
        j.spec.replicas = std::min(j.spec.replicas, capacity_);
      }
      j.est = std::make_unique<signals::convergence_estimator>(config_.estimator);
      if (config_.policy == "convergence" || config_.policy == "goodput") {
        std::shared_ptr<const policy::policy> inner;
        if (config_.policy == "convergence")
          inner = std::make_shared<policy::convergence_phase_policy>(config_.convergence);
        else
          inner = std::make_shared<policy::goodput_policy>(config_.goodput);
        policy::constraints limits;
        limits.max_size = std::max(1, j.max_devices);
        limits.min_size = config_.convergence_floor_at_request && config_.policy == "convergence"
                              ? std::clamp(j.spec.replicas, 1, limits.max_size)
                              : 1;
        j.policy = std::make_unique<policy::constrained_policy>(inner, limits);
        j.predictor = std::make_unique<profile_predictor>(*j.app, config_.devices_per_node, j.spec.throughput_scale);
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
    double last_compute = 0.0;
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
        double compute = 0.0;
        for (const auto& j : jobs_) {
          compute += j.compute_s;
          if (j.devices > 0)
            ++p.running, p.allocated += j.devices;
          else if (!j.done && j.spec.submit_s <= now)
            ++p.waiting;
        }
        p.compute_fraction = (compute - last_compute) / (config_.interval_s * capacity_);
        last_compute = compute;
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
    double fixed_batch = 0.0;  ///< 0: the scheduler chooses the batch (arbiter)
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
    double gpu_s = 0.0, compute_s = 0.0, held_s = 0.0;
    double steps = 0.0, steps_at_resize = 0.0;
    int restarts = -1;  ///< -1 until first started (the first start is not a restart)
    int max_held = 0;
    double best_metric = std::numeric_limits<double>::quiet_NaN();
    // Tiresias bookkeeping.
    double executed_s = 0.0;
    int queue = 0;
    double demoted_at = 0.0;
    // Per-job policy.
    std::unique_ptr<signals::convergence_estimator> est;
    std::unique_ptr<policy::constrained_policy> policy;
    std::unique_ptr<profile_predictor> predictor;
    // Arbiter goodput curve cache (per epoch).
    int curve_epoch = -1;
    std::vector<double> curve;  ///< best goodput at k devices, k = 0..cap
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

  // ---- physics ------------------------------------------------------------------------------
  std::vector<int> compact(const std::vector<int>& alloc) const {
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

  /// measured() for k devices packed on nodes, memoised: the arbiter evaluates the same
  /// (application, devices, atomic batch) many times per decision.
  step_times measured_packed(const job_state& j, int k, double atomic, int accum) const {
    auto& cache = packed_cache_[j.app];
    // Atomic batches are whole numbers (the reference rounds them up); fractional ones bypass the cache.
    const bool whole = atomic == std::floor(atomic) && atomic < 4.0e9;
    const std::uint64_t key = (static_cast<std::uint64_t>(k) << 32) | (whole ? static_cast<std::uint64_t>(atomic) : 0u);
    auto it = whole ? cache.find(key) : cache.end();
    if (it == cache.end()) {
      const step_times raw = j.app->throughput(packed_placement(k, config_.devices_per_node), atomic);
      if (!whole) {
        const double step = raw.step_s + (raw.step_s - raw.sync_s) * accum;
        return {step * j.spec.throughput_scale, raw.sync_s * j.spec.throughput_scale};
      }
      it = cache.emplace(key, raw).first;
    }
    const step_times raw = it->second;
    const double step = raw.step_s + (raw.step_s - raw.sync_s) * accum;
    return {step * j.spec.throughput_scale, raw.sync_s * j.spec.throughput_scale};
  }

  std::pair<double, double> stats(const job_state& j, double batch, int epoch) const {
    auto [sqr, var] = j.app->grad_stats(batch, epoch);
    return {sqr, var * j.spec.gns_scale};
  }

  void account(job_state& j, double dt, double compute_fraction) {
    j.gpu_s += dt * j.devices;
    j.attained += dt * j.devices;
    j.compute_s += dt * j.devices * compute_fraction;
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

  /// Advances one job from `now` by `seconds`.
  void advance(job_state& j, double now, double seconds) {
    if (j.done || j.devices == 0) return;
    const double delay = std::min(j.rescale_left, seconds);
    account(j, delay, 0.0);
    j.rescale_left -= delay;
    seconds -= delay;
    double t = now + delay;
    while (seconds > 0.0 && !j.done) {
      const double batch = j.devices * j.atomic * (j.accum + 1);
      j.last_batch = batch;
      if (!j.step_cached) j.step_cache = measured(j, compact(j.alloc), j.atomic, j.accum), j.step_cached = true;
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
        account(j, seconds, compute_fraction);
        seconds = 0.0;
        break;
      }
      const double dt = std::max(0.0, (next - j.progress) / rate);
      account(j, dt, compute_fraction);
      j.steps += dt / total;
      j.progress = next;
      t += dt;
      seconds -= dt;
      ++j.epoch;
      j.best_metric = j.app->best_metric(batch, j.epoch);
      j.est->update_loss(j.epoch, loss_proxy(j, batch, j.epoch - 1));
      j.reached_target = target_reached(j);
      if (j.epoch >= j.app->max_epochs() || j.reached_target) {
        j.done = true;
        j.completion_s = t;
        break;
      }
      if (j.fixed_batch <= 0.0) choose_batch(j);  // re-optimise between epochs, as the reference does
    }
  }

  // ---- placement ----------------------------------------------------------------------------
  void release(job_state& j) {
    for (std::size_t n = 0; n < j.alloc.size(); ++n) free_per_node_[n] += j.alloc[n];
    j.alloc.clear();
    j.devices = 0;
  }

  int free_devices() const {
    int f = 0;
    for (int c : free_per_node_) f += c;
    return f;
  }

  /// Places k devices: whole free nodes first, then the node that fits the rest most tightly,
  /// then whatever is left on the fullest-free nodes. Returns devices per node.
  std::vector<int> place(int k) {
    std::vector<int> alloc(free_per_node_.size(), 0);
    const int per = config_.devices_per_node;
    int left = k;
    for (std::size_t n = 0; n < free_per_node_.size() && left >= per; ++n)
      if (free_per_node_[n] == per) alloc[n] = per, free_per_node_[n] = 0, left -= per;
    while (left > 0) {
      std::size_t best = free_per_node_.size();
      for (std::size_t n = 0; n < free_per_node_.size(); ++n)  // tightest node that fits the rest
        if (free_per_node_[n] >= left && (best == free_per_node_.size() || free_per_node_[n] < free_per_node_[best]))
          best = n;
      if (best == free_per_node_.size()) {
        for (std::size_t n = 0; n < free_per_node_.size(); ++n)  // otherwise the node with most free
          if (free_per_node_[n] > 0 && (best == free_per_node_.size() || free_per_node_[n] > free_per_node_[best]))
            best = n;
      }
      if (best == free_per_node_.size()) throw std::logic_error("place: not enough free devices");
      const int take = std::min(left, free_per_node_[best]);
      alloc[best] += take;
      free_per_node_[best] -= take;
      left -= take;
    }
    return alloc;
  }

  /// Gives a job k devices (k = 0 releases). A change costs reallocation_cost_s of no progress.
  void reallocate(job_state& j, int k, double now) {
    if (k == j.devices) return;
    release(j);
    j.step_cached = false;
    if (k <= 0) {
      j.atomic = 0.0;
      return;
    }
    j.alloc = place(k);
    j.devices = k;
    j.max_held = std::max(j.max_held, k);
    j.rescale_left = config_.reallocation_cost_s;
    if (j.restarts < 0) j.start_s = now;
    ++j.restarts;
    j.steps_at_resize = j.steps;
    if (j.fixed_batch > 0.0) {
      const auto s = detail::split_batch(*j.app, j.fixed_batch, k);
      j.atomic = s.atomic, j.accum = s.accum;
    } else {
      choose_batch(j);
    }
    j.last_batch = j.devices * j.atomic * (j.accum + 1);
  }

  // ---- goodput (arbiter) --------------------------------------------------------------------
  struct config_goodput {
    double goodput = 0.0, atomic = 0.0;
    int accum = 0;
  };

  /// Best goodput over batch sizes at a placement (the reference's GoodputFunction.optimize with
  /// accumulation), with the job's current gradient statistics.
  config_goodput best_config(const job_state& j, const std::vector<int>& placement, int replicas,
                             bool packed = false) const {
    const application_profile& app = *j.app;
    const double ref_batch = j.last_batch > 0.0 ? j.last_batch : std::max(app.init_batch(), j.spec.batch);
    const auto [sqr, var] = stats(j, ref_batch, j.epoch);
    const double eps = 1e-8;
    config_goodput best;
    auto evaluate = [&](double atomic, int accum) {
      if (atomic < app.min_local_batch() - eps || atomic > app.max_local_batch() + eps) return;
      const double batch = replicas * atomic * (accum + 1);
      const step_times st =
          packed ? measured_packed(j, replicas, atomic, accum) : measured(j, placement, atomic, accum);
      const double scale = batch / app.init_batch();
      const double eff = detail::adascale_gain_from_stats(sqr, var, scale) / scale;
      const double g = batch / st.step_s * eff;
      if (g > best.goodput) best = {g, atomic, accum};
    };
    if (j.fixed_batch > 0.0) {
      const auto s = detail::split_batch(app, j.fixed_batch, replicas);
      evaluate(s.atomic, s.accum);
      return best;
    }
    const double lo = std::max(app.init_batch(), app.min_local_batch() * replicas);
    const double hi = app.max_batch();
    if (lo > hi + eps) return best;
    const int n = config_.batch_candidates;
    for (int i = 0; i < n; ++i) {
      const double batch = n == 1 ? lo : lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1));
      const double local = batch / replicas;
      int accum = static_cast<int>(std::ceil(local / app.max_local_batch() - eps)) - 1;
      if (replicas == 1 && local > app.init_batch() + eps) accum = std::max(accum, 1);
      accum = std::max(accum, 0);
      evaluate(std::ceil(local / (accum + 1) - eps), accum);
    }
    return best;
  }

  void choose_batch(job_state& j) const {
    j.step_cached = false;
    const config_goodput c = best_config(j, compact(j.alloc), j.devices);
    if (c.goodput > 0.0) {
      j.atomic = c.atomic, j.accum = c.accum;
    } else {  // no valid batch at this size: fall back to the fixed split of the request
      const auto s = detail::split_batch(*j.app, std::max(j.spec.batch, j.app->init_batch()), j.devices);
      j.atomic = s.atomic, j.accum = s.accum;
    }
  }

  /// Best goodput at k packed devices, cached per epoch (gradient statistics change per epoch).
  double curve_at(job_state& j, int k) const {
    if (k <= 0) return 0.0;
    if (j.curve_epoch != j.epoch || j.curve.empty()) {
      j.curve.assign(static_cast<std::size_t>(j.max_devices) + 1, -1.0);
      j.curve_epoch = j.epoch;
    }
    double& g = j.curve[static_cast<std::size_t>(std::min(k, j.max_devices))];
    if (g < 0.0) g = best_config(j, {}, std::min(k, j.max_devices), true).goodput;
    return g;
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
    else if (p == "arbiter")
      schedule_arbiter(now);
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
  // arrival (or demotion) order within a queue; jobs that do not fit are preempted.
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

  // Each job runs its own constrained policy (the live-job code) against the devices it could get
  // now: its own plus the spare ones, up to its fair share. Waiting jobs are admitted first, in
  // arrival order, with what they requested when it is free (as static, with backfilling); then
  // running jobs decide in arrival order.
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
      policy::capacity cap{std::max(j->devices, std::min(j->devices + spare, fair))};
      policy::cost_model costs{config_.reallocation_cost_s, std::max(1.0, config_.horizon_s / std::max(step_s, 1e-9))};
      const policy::decision d = j->policy->decide(sig, world, cap, costs, *j->predictor);
      if (d.kind != policy::action::hold && d.target_size != j->devices) reallocate(*j, d.target_size, now);
    }
  }

  // The cluster arbiter over goodput curves, with Pollux's restart penalty, exploration rule and
  // least-attained-service order.
  void schedule_arbiter(double now) {
    std::vector<job_state*> act = active(now);
    if (act.empty()) return;
    std::stable_sort(act.begin(), act.end(), [](const job_state* a, const job_state* b) {
      if (a->attained != b->attained) return a->attained < b->attained;
      return a->spec.submit_s < b->spec.submit_s;
    });
    const int fair = static_cast<int>(std::ceil(static_cast<double>(capacity_) / static_cast<double>(act.size())));
    std::vector<policy::arbiter_job> in;
    in.reserve(act.size());
    for (job_state* j : act) {
      int most = j->max_devices;
      if (config_.arbiter_exploration_limit) most = std::min(most, std::max(2 * j->max_held, 1));
      const int fair_k = std::clamp(fair, 1, j->max_devices);
      double base = curve_at(*j, fair_k);
      if (!(base > 0.0)) base = curve_at(*j, 1);
      policy::arbiter_job a;
      a.speedup.assign(static_cast<std::size_t>(most) + 1, 0.0);
      for (int k = 1; k <= most; ++k)
        a.speedup[static_cast<std::size_t>(k)] = base > 0.0 ? curve_at(*j, k) / base : 0.0;
      a.current = j->devices;
      const double age = now - j->spec.submit_s;
      const double cost = config_.reallocation_cost_s;
      const int restarts = std::max(0, j->restarts);
      a.change_penalty = cost > 0.0 ? std::clamp(std::max(age - restarts * cost, 0.0) / (age + cost), 0.0, 1.0) : 1.0;
      in.push_back(std::move(a));
    }
    const policy::cluster_arbiter arbiter(config_.arbiter);
    const std::vector<int> alloc = arbiter.allocate(in, capacity_);
    // Shrinks first (they free devices), then grows, biggest first so they find whole nodes.
    std::vector<std::size_t> order(act.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (std::size_t i : order)
      if (alloc[i] != act[i]->devices && alloc[i] < act[i]->devices) reallocate(*act[i], alloc[i], now);
    for (std::size_t i : order)
      if (alloc[i] > act[i]->devices) release(*act[i]);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return alloc[a] > alloc[b]; });
    for (std::size_t i : order)
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
    if (held + free_devices() != capacity_ || held > capacity_)
      throw std::logic_error("simulator: " + std::to_string(held) + " devices held + " +
                             std::to_string(free_devices()) + " free != capacity " + std::to_string(capacity_));
  }

  const profile_library* profiles_;
  mutable std::unordered_map<const application_profile*, std::unordered_map<std::uint64_t, step_times>> packed_cache_;
  sim_config config_;
  int capacity_ = 0;
  std::vector<int> free_per_node_;
  std::vector<job_state> jobs_;
};

/// Convenience: simulate a workload under one policy.
inline sim_result simulate(const profile_library& profiles, const std::vector<job_spec>& jobs, const sim_config& config,
                           const std::function<bool(double, std::size_t, std::size_t)>& progress = nullptr) {
  simulator s(profiles, jobs, config);
  return s.run(progress);
}

}  // namespace dra::sim
