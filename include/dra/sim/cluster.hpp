#pragma once
// The simulated cluster's state: its configuration, its nodes and its jobs (each with the per-job
// policy it runs), and the one way a job's devices change (reallocate, which charges the cost).
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/registry.hpp"
#include "dra/signals/remaining_work.hpp"
#include "dra/sim/cluster_policy.hpp"
#include "dra/sim/config.hpp"
#include "dra/sim/job_model.hpp"
#include "dra/sim/placement.hpp"
#include "dra/sim/profile.hpp"
#include "dra/sim/workload.hpp"

namespace dra::sim::detail {

class cluster_state {
 public:
  cluster_state(const profile_library& profiles, std::vector<job_spec> jobs, sim_config config)
      : config_((config.validate(), std::move(config))) {
    capacity_ = config_.nodes * config_.devices_per_node;
    const std::string& p = config_.policy;
    entry_ = policy::policy_registry::at(p, false);
    using sched = policy::sim_scheduler;
    cluster_ = entry_.simulator == sched::cluster ||
               (entry_.simulator == sched::cluster_or_per_job && config_.cluster_arbitration);
    baseline_ = entry_.simulator == sched::first_come || entry_.simulator == sched::tiresias;
    // A cluster entry whose decision is neither dra's nor registered would run dra's arbiter under
    // its name (its results would be the arbiter's).
    // The decision is copied now (its captures held): a registration removed or replaced while the
    // run goes on changes nothing here, and the function is never destroyed while it runs.
    if (const cluster_policy_fn* f = find_cluster_policy(p)) outside_ = *f;
    if (cluster_ && !builtin_cluster_policy(p) && !outside_)
      dra::detail::throw_invalid(
          "policy", "'" + p +
                        "' is registered to run as a cluster policy in the simulator but no cluster decision is "
                        "registered for it; register it with dra::sim::add_cluster_policy(name, decide) "
                        "(docs/guide/simulator.md, 'Your own cluster policy')" +
                        (entry_.simulator == sched::cluster_or_per_job
                             ? ", or set sim_config::cluster_arbitration = false to run its per-job policy"
                             : ""));
    nodes_ = node_pool(config_.nodes, config_.devices_per_node, entry_.simulator == sched::tiresias, cluster_);
    jobs_.reserve(jobs.size());
    for (auto& spec : jobs) {
      job_state j;
      j.app = &profiles.at(spec.application);
      if (spec.replicas < 1) dra::detail::throw_invalid("replicas", "job '" + spec.name + "' requests < 1 device");
      if (!(spec.batch > 0.0)) dra::detail::throw_invalid("batch", "job '" + spec.name + "' has batch <= 0");
      if (!(spec.submit_s >= 0.0 && spec.submit_s <= kMaxArrivalS))  // NaN too
        dra::detail::throw_invalid("submit_s", "job '" + spec.name + "' arrives at " + std::to_string(spec.submit_s) +
                                                   " s, outside [0, 1e13]: give seconds (subtract the first arrival)");
      j.spec = std::move(spec);
      j.fixed_batch = j.spec.batch;
      // Cluster policies co-adapt the batch, except for applications the reference pins (ncf: its
      // workloads all request 32768, the batch the reference forces), which keep the user's batch.
      if (cluster_ && j.app->adaptive_fixed_batch() <= 0.0) j.fixed_batch = 0.0;
      j.max_devices = job_cap(j);
      if (j.spec.replicas > capacity_)  // capped, it would be another job (batch per device, throughput)
        dra::detail::throw_invalid("replicas", "job '" + j.spec.name + "' requests " + std::to_string(j.spec.replicas) +
                                                   " devices but the cluster has " + std::to_string(capacity_) +
                                                   "; simulate a larger cluster or request fewer devices");
      j.est = std::make_unique<signals::convergence_estimator>(config_.estimator);
      j.model = std::make_unique<policy::perf_model>();
      if (!cluster_ && entry_.make) {
        // The job's own policy, built by its registry entry; convergence_aware's batch limits are
        // the job's (its smallest micro-batch, the largest measured batch; ncf keeps the user's).
        policy::policy_sections sections = config_;
        sections.convergence_aware.min_per_rank_batch = j.app->min_local_batch();
        sections.convergence_aware.max_global_batch = j.app->adaptive_fixed_batch() > 0.0 ? 0.0 : j.app->max_batch();
        std::shared_ptr<const policy::policy> inner = entry_.make(sections);
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
  /// The remaining-work estimator the jobs report to (it learns from the jobs that finish).
  signals::remaining_work_estimator& estimator() noexcept { return estimator_; }
  /// A cluster policy runs (arbiter, pollux, convergence_aware with cluster arbitration).
  bool cluster() const noexcept { return cluster_; }
  /// The policy's registry entry (how it is scheduled).
  const policy::policy_entry& entry() const noexcept { return entry_; }
  /// The decision of a policy registered with add_cluster_policy, as it was when the run began
  /// (empty for the built-in ones).
  const cluster_policy_fn& outside() const noexcept { return outside_; }
  std::vector<job_state>& jobs() noexcept { return jobs_; }
  const std::vector<job_state>& jobs() const noexcept { return jobs_; }

  /// Jobs submitted by `now` and not done, in arrival order.
  std::vector<job_state*> active(double now) {
    std::vector<job_state*> out;
    for (auto& j : jobs_)
      if (!j.done && j.spec.submit_s <= now) out.push_back(&j);
    return out;
  }

  int free_devices() const { return nodes_.free_devices(); }
  void release(job_state& j) { nodes_.release(j); }
  /// Where each job would run if `counts` were applied, unchanged jobs in place (node_pool::plan).
  placement_plan plan(const std::vector<job_state*>& act, const std::vector<int>& counts) const {
    return nodes_.plan(act, counts);
  }
  /// The same, with every job free to move (node_pool::repack).
  placement_plan repack(const std::vector<job_state*>& act, const std::vector<int>& counts) const {
    return nodes_.repack(act, counts);
  }

  /// Applies a plan: every job whose node-level allocation changes (its count, or its nodes at the
  /// same count, as Pollux's reference charges it) is released, then given its new nodes and
  /// charged reallocation_cost_s.
  void apply(const std::vector<job_state*>& act, const placement_plan& plan, double now) {
    for (std::size_t i = 0; i < act.size(); ++i)
      if (plan.alloc[i] != act[i]->alloc && act[i]->devices > 0) {
        nodes_.release(*act[i]);
        act[i]->step_cached = false;
        act[i]->atomic = 0.0;
      }
    for (std::size_t i = 0; i < act.size(); ++i) {
      job_state& j = *act[i];
      if (plan.alloc[i] == j.alloc || plan.got[i] == 0) continue;
      nodes_.take(j, plan.alloc[i]);
      started(j, now);
    }
  }

  /// Gives a job k devices (k = 0 releases). A change costs reallocation_cost_s of no progress.
  /// Returns the devices it got (cluster policies may get fewer under the placement rule).
  int reallocate(job_state& j, int k, double now) {
    if (k == j.devices) return k;
    nodes_.release(j);
    j.step_cached = false;
    if (k <= 0) {
      j.atomic = 0.0;
      return 0;
    }
    j.alloc = nodes_.place(k);
    int got = 0;
    for (int c : j.alloc) got += c;
    j.devices = got;
    if (got == 0) {
      j.alloc.clear();
      j.atomic = 0.0;
      return 0;
    }
    started(j, now);
    return got;
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
    nodes_.check();
    if (held + free_devices() != capacity_ || held > capacity_)
      throw std::logic_error("simulator: " + std::to_string(held) + " devices held + " +
                             std::to_string(free_devices()) + " free != capacity " + std::to_string(capacity_));
  }

 private:
  /// A job starts on new devices: it pays the reallocation cost (at its first start, the launch
  /// cost) and picks its batch for them.
  void started(job_state& j, double now) {
    j.step_cached = false;
    j.max_held = std::max(j.max_held, j.devices);
    j.rescale_left =
        j.restarts < 0 && config_.launch_cost_s >= 0.0 ? config_.launch_cost_s : config_.reallocation_cost_s;
    if (j.restarts < 0) j.start_s = now;
    ++j.restarts;
    j.steps_at_resize = j.steps;
    if (j.fixed_batch > 0.0) {
      const auto s = detail::split_batch(*j.app, j.fixed_batch, j.devices);
      j.atomic = s.atomic, j.accum = s.accum;
    } else {
      choose_batch(j, config_);
    }
    j.last_batch = j.devices * j.atomic * (j.accum + 1);
  }

  /// Most devices the job may ever hold: the cluster, the reference's limits, the batch cap, the quota.
  int job_cap(const job_state& j) const {
    int cap = capacity_;
    if (config_.reference_limits && j.app->max_replicas() > 0) cap = std::min(cap, j.app->max_replicas());
    const double batch_for_cap = j.fixed_batch > 0.0 ? j.fixed_batch : j.app->max_batch();
    cap = std::min(cap, std::max(1, static_cast<int>(std::floor(batch_for_cap / j.app->min_local_batch() + 1e-9))));
    if (config_.quota_scale > 0.0 && !baseline_)
      cap = std::min(cap, std::max(1, static_cast<int>(std::floor(config_.quota_scale * j.spec.replicas + 1e-9))));
    return std::max(cap, 1);
  }

  sim_config config_;
  policy::policy_entry entry_;
  cluster_policy_fn outside_;
  bool cluster_ = false;
  bool baseline_ = false;  ///< static or tiresias: requests as made
  int capacity_ = 0;
  node_pool nodes_;
  std::vector<job_state> jobs_;
  signals::remaining_work_estimator estimator_{config_.remaining_work};
};

/// Applies a cluster policy's device counts under the placement rule (one distributed job per
/// node) as Pollux's search does, which only ever keeps placeable node-level allocations: the
/// policy divides counts, and while the packer cannot place them, each job left short loses one
/// device from its curve and the policy divides again. Two packers compete on the policy's own
/// objective: one that keeps every job whose count is unchanged where it is, and one that may move
/// such jobs to make room (each move charged and penalised as a restart, as the reference does).
inline void place_allocation(cluster_state& state, const std::vector<job_state*>& act,
                             const std::vector<policy::arbiter_job>& in, const policy::cluster_arbiter& arbiter,
                             double now) {
  const int rounds = 4 * state.capacity();
  // Counts the packer can place, repaired one device at a time from what the policy wants.
  auto repaired = [&](bool may_move) {
    std::vector<policy::arbiter_job> capped = in;
    std::vector<int> counts = arbiter.allocate(capped, state.capacity());
    placement_plan plan = may_move ? state.repack(act, counts) : state.plan(act, counts);
    for (int round = 0; round < rounds && !plan.complete(counts); ++round) {
      for (std::size_t i = 0; i < act.size(); ++i)
        if (plan.got[i] < counts[i]) {
          const auto keep = static_cast<std::size_t>(std::max(counts[i] - 1, 0)) + 1;
          if (capped[i].speedup.size() > keep) capped[i].speedup.resize(keep);
        }
      counts = arbiter.allocate(capped, state.capacity());
      plan = may_move ? state.repack(act, counts) : state.plan(act, counts);
    }
    return plan;
  };
  const placement_plan kept = repaired(false);
  const placement_plan packed = repaired(true);
  std::vector<policy::arbiter_job> charged = in;
  for (std::size_t i = 0; i < act.size(); ++i)
    if (packed.moved[i]) charged[i].current = -1;  // a move is a restart: penalised like a resize
  if (arbiter.objective(charged, packed.got) > arbiter.objective(in, kept.got)) return state.apply(act, packed, now);
  state.apply(act, kept, now);
}
}  // namespace dra::sim::detail
