#pragma once
// The simulator's configuration: the cluster, the decision interval, the reallocation cost, which
// policy runs and the settings of each policy (validated in one place).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/registry.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/remaining_work.hpp"

namespace dra::sim {

/// Stand-in for the measured in-place resize cost (seconds) until the elastic-world benchmark
/// publishes its figure; `dra-sim --reallocation-cost inplace` uses this value.
inline constexpr double in_place_resize_cost_stand_in_s = 1.0;

/// The policies the simulator runs, in the order reports list them (policy/registry.hpp).
inline const std::vector<std::string>& policy_names() {
  return policy::policy_registry::names(false);
}

/// The simulator's settings; the per-job policies' sections come from policy::policy_sections.
struct sim_config : policy::policy_sections {
  int nodes = 16;
  int devices_per_node = 4;
  double interval_s = 60.0;           ///< seconds between allocation decisions (reference: 60)
  double reallocation_cost_s = 30.0;  ///< no-progress seconds per reallocation (reference: 30)
  /// No-progress seconds at a job's first start; < 0: reallocation_cost_s (the reference charges
  /// every start alike). Charging each policy its own mechanism, the launch stays one cost for all:
  /// an in-place resize makes no job's first start cheaper.
  double launch_cost_s = -1.0;
  std::string policy = "static";
  /// Dynamic jobs may hold at most this multiple of the devices they requested (0: no quota).
  double quota_scale = 0.0;
  /// Apply the reference's per-application scheduling limits (ncf: one device). The replays keep
  /// them (faithful to the reference); the study may lift them, since the profiles measure ncf on
  /// up to 64 devices and the limit is a choice of the reference's Pollux policy.
  bool reference_limits = true;
  /// Stop simulating this long after the first arrival (jobs not done are reported incomplete).
  double max_time_s = 30.0 * 24 * 3600;
  bool record_timeline = true;

  // Per-job policies: the live-job code, unchanged, with the sections of policy::policy_sections.
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
  /// convergence_aware on a shared cluster: how remaining work tilts the arbiter
  /// (policy::completion_config: heSRPT weights, exponent 2; tilt 1; weighted sum, p = 1; a
  /// waiting job's first device worth 0.3 fair shares, so it starts before a running job grows).
  policy::completion_config completion{2.0, 1.0, 1.0, 0.3};
  /// convergence_aware: the remaining-work statistic jobs are ranked by: "gittins" (the estimate's
  /// Gittins size, which uses its spread), "median" or "mean".
  std::string completion_rank = "gittins";
  /// The remaining-work estimator every job reports to (signals/remaining_work.hpp).
  signals::remaining_work_config remaining_work{};

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
    if (!(reallocation_cost_s >= 0.0) || !(reallocation_cost_s <= max_time_s))
      dra::detail::throw_invalid("reallocation_cost_s", "must lie in [0, max_time_s (" + std::to_string(max_time_s) +
                                                            ")] seconds, got " + std::to_string(reallocation_cost_s));
    if (!(launch_cost_s <= max_time_s))  // NaN too; any negative value means reallocation_cost_s
      dra::detail::throw_invalid("launch_cost_s", "must be at most max_time_s (" + std::to_string(max_time_s) +
                                                      ") seconds (< 0: reallocation_cost_s), got " +
                                                      std::to_string(launch_cost_s));
    policy::policy_registry::at(policy, false);
    if (quota_scale < 0.0) dra::detail::throw_invalid("quota_scale", "must be >= 0 (0: no quota)");
    if (!(max_time_s > 0.0)) dra::detail::throw_invalid("max_time_s", "must be > 0");
    if (!(horizon_s > 0.0)) dra::detail::throw_invalid("horizon_s", "must be > 0");
    if (batch_candidates < 1) dra::detail::throw_invalid("batch_candidates", "must be >= 1");
    if (completion_rank != "gittins" && completion_rank != "median" && completion_rank != "mean")
      dra::detail::throw_invalid("completion_rank",
                                 "must be 'gittins', 'median' or 'mean', got '" + completion_rank + "'");
    completion.validate();
    remaining_work.validate();
    convergence.validate();
    goodput.validate();
    convergence_aware.validate();
    energy.validate();
    estimator.validate();
    arbiter.validate();
  }
};

}  // namespace dra::sim
