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
#include "dra/policy/constraints.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/policy/policies.hpp"
#include "dra/signals/remaining_work.hpp"
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
    const bool ca = p == "convergence_aware" || p == "oracle_convergence_aware";
    cluster_ = p == "arbiter" || p == "pollux" || (ca && config_.cluster_arbitration);
    nodes_ = node_pool(config_.nodes, config_.devices_per_node, p == "tiresias", cluster_);
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
      if (!cluster_ && (p == "convergence" || p == "goodput" || ca)) {
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
  /// The remaining-work estimator the jobs report to (it learns from the jobs that finish).
  signals::remaining_work_estimator& estimator() noexcept { return estimator_; }
  /// A cluster policy runs (arbiter, pollux, convergence_aware with cluster arbitration).
  bool cluster() const noexcept { return cluster_; }
  std::vector<job_state>& jobs() noexcept { return jobs_; }

  /// Jobs submitted by `now` and not done, in arrival order.
  std::vector<job_state*> active(double now) {
    std::vector<job_state*> out;
    for (auto& j : jobs_)
      if (!j.done && j.spec.submit_s <= now) out.push_back(&j);
    return out;
  }

  int free_devices() const { return nodes_.free_devices(); }
  void release(job_state& j) { nodes_.release(j); }
  /// Devices each job would get if `alloc` were applied (node_pool::plan).
  std::vector<int> plan(const std::vector<job_state*>& act, const std::vector<int>& alloc) const {
    return nodes_.plan(act, alloc);
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
    j.max_held = std::max(j.max_held, got);
    j.rescale_left = config_.reallocation_cost_s;
    if (j.restarts < 0) j.start_s = now;
    ++j.restarts;
    j.steps_at_resize = j.steps;
    if (j.fixed_batch > 0.0) {
      const auto s = detail::split_batch(*j.app, j.fixed_batch, got);
      j.atomic = s.atomic, j.accum = s.accum;
    } else {
      choose_batch(j, config_);
    }
    j.last_batch = j.devices * j.atomic * (j.accum + 1);
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
  /// Most devices the job may ever hold: the cluster, the reference's limits, the batch cap, the quota.
  int job_cap(const job_state& j) const {
    int cap = capacity_;
    if (config_.reference_limits && j.app->max_replicas() > 0) cap = std::min(cap, j.app->max_replicas());
    const double batch_for_cap = j.fixed_batch > 0.0 ? j.fixed_batch : j.app->max_batch();
    cap = std::min(cap, std::max(1, static_cast<int>(std::floor(batch_for_cap / j.app->min_local_batch() + 1e-9))));
    if (config_.quota_scale > 0.0 && config_.policy != "static" && config_.policy != "tiresias")
      cap = std::min(cap, std::max(1, static_cast<int>(std::floor(config_.quota_scale * j.spec.replicas + 1e-9))));
    return std::max(cap, 1);
  }

  sim_config config_;
  bool cluster_ = false;
  int capacity_ = 0;
  node_pool nodes_;
  std::vector<job_state> jobs_;
  signals::remaining_work_estimator estimator_{config_.remaining_work};
};

}  // namespace dra::sim::detail
