#pragma once
// Cluster policies from outside dra: a program linking dra::sim registers, by name, a function
// that divides the cluster's devices among the jobs from their views (job_view: what a real
// scheduler could know), and the simulator runs it as it runs pollux, arbiter and
// convergence_aware: same cluster, same placement rule, same reallocation cost, same batch choice.
// What the function returns is checked before anything changes, and a mistake names the policy,
// the job and the fix. Guide: docs/guide/simulator.md, "Your own cluster policy".
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/registry.hpp"
#include "dra/sim/config.hpp"
#include "dra/sim/job_model.hpp"

namespace dra::sim {

/// What a cluster policy is told at one decision: the jobs that have arrived and are not done, as
/// views only (no profile, no spec, no true remaining work or noise: job_model.hpp), and the
/// cluster. A policy sees no truth, whatever its name.
struct cluster_inputs {
  /// The simulator builds these at each decision; a test of a policy may build its own.
  cluster_inputs(std::vector<job_view*> views, int capacity_, int nodes_, int devices_per_node_, double now_,
                 const sim_config& config_)
      : jobs(views.begin(), views.end()),
        capacity(capacity_),
        nodes(nodes_),
        devices_per_node(devices_per_node_),
        now(now_),
        config(&config_),
        views_(std::move(views)) {}

  std::vector<const job_view*> jobs;  ///< arrived, not done, in arrival order
  int capacity = 0;                   ///< devices in the cluster
  int nodes = 1;
  int devices_per_node = 1;
  double now = 0.0;                    ///< simulated seconds
  const sim_config* config = nullptr;  ///< the run's settings (no job's truth)

  /// Predicted best goodput (statistical progress per second, over batch sizes) of jobs[i] at k
  /// devices packed on nodes, from the job's online-fitted throughput model and its own gradient
  /// statistics: what pollux and arbiter divide by. 0 before the job's first measurement or for
  /// k < 1; k above the job's max_devices counts as max_devices.
  double goodput(std::size_t i, int k) const {
    if (i >= views_.size())
      dra::detail::throw_invalid("i", "goodput asked about job " + std::to_string(i) + " of " +
                                          std::to_string(views_.size()) + "; use an index of inputs.jobs");
    return detail::curve_at(*views_[i], k, *config);  // fills the view's curve cache only
  }

 private:
  std::vector<job_view*> views_;
};

/// A cluster policy: one device count per job of `inputs.jobs`, in that order, each in
/// [0, job.max_devices], at most `inputs.capacity` in all.
using cluster_policy_fn = std::function<std::vector<int>(const cluster_inputs&)>;

/// What a cluster policy's function throws to stop the run as its user asked (a binding's
/// interrupt: Python's KeyboardInterrupt, SystemExit): passed on as it is, not taken for the
/// policy's failure.
struct cluster_policy_interrupted : std::exception {
  const char* what() const noexcept override { return "the run was interrupted inside a cluster policy"; }
};

namespace detail {

inline std::map<std::string, cluster_policy_fn>& cluster_policy_table() {
  static std::map<std::string, cluster_policy_fn> t;
  return t;
}

/// The cluster policies whose decisions are dra's own (arbitration.hpp, cluster_allocation).
inline bool builtin_cluster_policy(const std::string& name) {
  return name == "pollux" || name == "arbiter" || name == "convergence_aware" || name == "oracle_convergence_aware";
}

}  // namespace detail

/// The function registered for `name` by add_cluster_policy, or nullptr.
inline const cluster_policy_fn* find_cluster_policy(const std::string& name) {
  const auto& t = detail::cluster_policy_table();
  const auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

/// Registers a cluster policy: `name` becomes a simulator policy of this program's registry
/// (policy::policy_registry, sim_scheduler::cluster; not the engine's), selectable as
/// sim_config::policy and in study_config::policies. `in_place`: its system resizes in place (as
/// dra's) rather than by checkpoint and restart (as Pollux's). Refused, with nothing registered:
/// an empty function, a name that is empty or taken.
inline void add_cluster_policy(const std::string& name, cluster_policy_fn decide, const std::string& summary = "",
                               bool in_place = false) {
  if (!decide)
    dra::detail::throw_invalid("decide", "cluster policy '" + name +
                                             "' has an empty function; pass a callable that returns one device "
                                             "count per job of its cluster_inputs");
  policy::policy_registry::add({name, "", false, policy::sim_scheduler::cluster, in_place,
                                summary.empty() ? "cluster policy registered with add_cluster_policy" : summary,
                                nullptr});
  detail::cluster_policy_table()[name] = std::move(decide);
}

/// Removes a policy added with add_cluster_policy (built-in policies stay).
inline void remove_cluster_policy(const std::string& name) {
  if (!find_cluster_policy(name)) return;
  policy::policy_registry::remove(name);
  detail::cluster_policy_table().erase(name);
}

}  // namespace dra::sim
