#pragma once
// The cluster policies (pollux, arbiter, convergence_aware and its oracle_ upper bound on a shared
// cluster): dra::policy::cluster_arbiter over goodput curves from each job's online-fitted model,
// under Pollux's rules (restart penalty, exploration limit, one distributed job per node), and the
// cluster policies registered from outside (cluster_policy.hpp), whose counts are checked before
// they are placed. Policies see job views only (job_model.hpp); the oracle is handed the truth apart.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dra/policy/cluster_arbiter.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/signals/remaining_work.hpp"
#include "dra/sim/cluster.hpp"
#include "dra/sim/cluster_policy.hpp"
#include "dra/sim/config.hpp"
#include "dra/sim/job_model.hpp"
#include "dra/sim/observation.hpp"

namespace dra::sim::detail {

/// Most devices a cluster policy may give a job now: Pollux's exploration rule (twice the most it
/// has run on; one before it ran) within its cap.
inline int explore_cap(const job_view& v) {
  const int seen = v.model ? v.model->max_profiled_replicas() : 0;
  return std::min(v.max_devices, std::max(2 * seen, 1));
}

/// Inputs of one cluster decision besides the jobs: the cluster, the clock, the settings, and for
/// oracle_ policies only, each job's true remaining epochs.
struct cluster_context {
  int capacity = 0;
  int nodes = 1;
  double now = 0.0;
  const sim_config* config = nullptr;
  const std::vector<double>* oracle_remaining_epochs = nullptr;
};

/// What a cluster policy asks of the arbiter: each job's value per device count (same order as
/// the reordered views) and the arbiter's settings.
struct cluster_request {
  std::vector<policy::arbiter_job> jobs;
  policy::arbiter_config arbiter;
};

/// The cluster policies' request; `jobs` is reordered by priority (ties in the arbiter and the
/// placement go to the first) and the request is in that order. Reads views only.
///  - pollux: Pollux's objective: power mean (p = -1) of speedups over the goodput at the fair
///    share (ceil(capacity / jobs) replicas on one node), scaled by nodes / capacity as its code
///    does; jobs without a model get the linear prior k / fair; least attained service first.
///  - arbiter: the same objective with the fair share packed on nodes (dra's earlier arbiter).
///  - convergence_aware (and oracle_convergence_aware): Pollux's speedups, each scaled by the job's
///    heSRPT completion weight (policy::completion_weights of its remaining size: the time one
///    device would need for its remaining work, the estimate's Gittins size x work per epoch / the
///    goodput of one device; jobs without a model count as the smallest), and the arbiter maximises
///    their weighted sum (policy::completion_config, p = 1), with Pollux's restart penalty; holding
///    any device is worth completion.admission fair shares times the weight (arbiter_job::presence),
///    so waiting jobs start before running ones grow.
inline cluster_request cluster_allocation(std::vector<job_view*>& jobs, const cluster_context& ctx) {
  const sim_config& config = *ctx.config;
  const std::string& p = config.policy;
  const bool ca = p == "convergence_aware" || p == "oracle_convergence_aware";
  const std::size_t n = jobs.size();
  if (n == 0) return {{}, config.arbiter};
  // Remaining size (one-device seconds) and completion weights.
  std::vector<double> weight(n, 1.0);
  if (ca) {
    std::vector<double> size(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      job_view& v = *jobs[i];
      const double g1 = curve_at(v, 1, config);
      if (!(g1 > 0.0)) continue;  // no model yet: counts as the smallest
      double epochs;
      if (ctx.oracle_remaining_epochs) {
        epochs = (*ctx.oracle_remaining_epochs)[i];
      } else if (config.completion_rank == "median") {
        epochs = v.remaining.median;
      } else if (config.completion_rank == "mean") {
        epochs = v.remaining.mean;
      } else {
        epochs = signals::gittins_size(v.remaining, v.epochs_done);
      }
      size[i] = std::max(epochs, 1e-6) * v.work_per_epoch / g1;
    }
    weight = policy::completion_weights(size, config.completion.exponent);
  }
  // Priority order for the arbiter's ties: least attained service, then arrival.
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (ca && weight[a] != weight[b]) return weight[a] > weight[b];
    if (jobs[a]->attained != jobs[b]->attained) return jobs[a]->attained < jobs[b]->attained;
    return jobs[a]->submit_s < jobs[b]->submit_s;
  });
  {
    std::vector<job_view*> sorted;
    std::vector<double> sorted_weight;
    for (std::size_t i : order) sorted.push_back(jobs[i]), sorted_weight.push_back(weight[i]);
    jobs = std::move(sorted);
    weight = std::move(sorted_weight);
  }
  const int fair = static_cast<int>(std::ceil(static_cast<double>(ctx.capacity) / static_cast<double>(n)));
  const double scale = static_cast<double>(ctx.nodes) / static_cast<double>(ctx.capacity);
  std::vector<policy::arbiter_job> in;
  in.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    job_view& v = *jobs[i];
    const int most = explore_cap(v);
    policy::arbiter_job a;
    a.speedup.assign(static_cast<std::size_t>(most) + 1, 0.0);
    const bool fitted = v.model && v.model->fitted();
    if (ca) {
      // Pollux's speedups (over the goodput at the fair share; its linear prior before a model),
      // scaled by the job's completion weight (completion_config::factor).
      const double w = config.completion.factor(weight[i]);
      const int fair_k = std::clamp(fair, 1, v.max_devices);
      double base = fitted ? predicted_best(v, 1, fair_k, config).goodput : 0.0;
      if (fitted && !(base > 0.0)) base = curve_at(v, 1, config);
      for (int k = 1; k <= most; ++k)
        a.speedup[static_cast<std::size_t>(k)] = w * (!fitted      ? scale / fair * static_cast<double>(k)
                                                      : base > 0.0 ? scale * curve_at(v, k, config) / base
                                                                   : 0.0);
      a.presence = config.completion.presence(weight[i], scale);
    } else if (!fitted) {
      // Pollux's prior before any measurement: linear speedup.
      for (int k = 1; k <= most; ++k) a.speedup[static_cast<std::size_t>(k)] = scale / fair * static_cast<double>(k);
    } else {
      const int fair_k = std::clamp(fair, 1, v.max_devices);
      double base = p == "pollux" ? predicted_best(v, 1, fair_k, config).goodput : curve_at(v, fair_k, config);
      if (!(base > 0.0)) base = curve_at(v, 1, config);
      for (int k = 1; k <= most; ++k)
        a.speedup[static_cast<std::size_t>(k)] = base > 0.0 ? scale * curve_at(v, k, config) / base : 0.0;
    }
    a.current = v.devices;
    // Pollux's restart penalty: the value of any other allocation is scaled by the share of the
    // job's life that was not spent restarting, counting this restart.
    const double age = ctx.now - v.submit_s;
    const double cost = config.reallocation_cost_s;
    const int restarts = std::max(0, v.restarts);
    a.change_penalty = cost > 0.0 ? std::clamp(std::max(age - restarts * cost, 0.0) / (age + cost), 0.0, 1.0) : 1.0;
    in.push_back(std::move(a));
  }
  policy::arbiter_config ac = config.arbiter;
  if (ca) ac.p = config.completion.power;
  return {std::move(in), ac};
}

/// Checks a registered cluster policy's counts for the jobs of `in` (one per job, each in
/// [0, the job's max_devices], at most the capacity in all); std::invalid_argument naming the
/// policy, the job and the fix otherwise. Nothing has changed when it throws.
inline void check_cluster_counts(const std::string& name, const cluster_inputs& in, const std::vector<int>& counts) {
  const std::string who =
      "cluster policy '" + name + "' at t = " + std::to_string(static_cast<long long>(in.now)) + " s ";
  if (counts.size() != in.jobs.size())
    dra::detail::throw_invalid("counts", who + "returned " + std::to_string(counts.size()) + " counts for " +
                                             std::to_string(in.jobs.size()) +
                                             " jobs; return one count per job of inputs.jobs, in that order (0 "
                                             "for a job that waits)");
  long long total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const job_view& v = *in.jobs[i];
    if (counts[i] < 0 || counts[i] > v.max_devices)
      dra::detail::throw_invalid("counts", who + "gave job '" + v.name + "' " + std::to_string(counts[i]) +
                                               " devices; give each job 0 to its max_devices (" +
                                               std::to_string(v.max_devices) + " for this one)");
    total += counts[i];
  }
  if (total > in.capacity)
    dra::detail::throw_invalid("counts", who + "gave " + std::to_string(total) +
                                             " devices in all but the cluster has " + std::to_string(in.capacity) +
                                             "; give at most inputs.capacity in all (jobs that do not fit wait "
                                             "with 0)");
}

/// One decision of a cluster policy registered from outside: observe, ask it for counts from
/// views only, check them, then place them under the cluster's placement rule as the built-in
/// policies' counts are (place_allocation: a job the rule cannot place at its count gets the
/// most it can; the others keep theirs).
inline void schedule_outside(cluster_state& state, double now, const cluster_policy_fn& decide) {
  observe_jobs(state, now);
  std::vector<job_state*> act = state.active(now);
  if (act.empty()) return;
  const sim_config& config = state.config();
  std::vector<job_view*> views;
  for (job_state* j : act) views.push_back(&j->view);
  const cluster_inputs in(std::move(views), state.capacity(), config.nodes, config.devices_per_node, now, config);
  const std::string who =
      "cluster policy '" + config.policy + "' at t = " + std::to_string(static_cast<long long>(now)) + " s: ";
  std::vector<int> counts;
  try {
    counts = decide(in);
  } catch (const cluster_policy_interrupted&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(who + e.what());
  } catch (const std::exception& e) {
    throw std::runtime_error(who + e.what());
  } catch (...) {
    throw std::runtime_error(who + "threw something that is not a std::exception");
  }
  check_cluster_counts(config.policy, in, counts);
  // The counts as curves the arbiter gives exactly (each job's value rises by one per device up to
  // its count, under a sum), so place_allocation's repair takes devices only from a job the
  // placement rule cannot place.
  std::vector<policy::arbiter_job> curves(act.size());
  for (std::size_t i = 0; i < act.size(); ++i) {
    curves[i].speedup.resize(static_cast<std::size_t>(counts[i]) + 1);
    for (int k = 0; k <= counts[i]; ++k) curves[i].speedup[static_cast<std::size_t>(k)] = k;
    curves[i].current = act[i]->devices;
  }
  policy::arbiter_config exact;
  exact.p = 1.0;
  exact.max_moves = 0;
  place_allocation(state, act, curves, policy::cluster_arbiter(exact), now);
}

/// One decision of a cluster policy: observe, let the policy value each job's device counts from
/// views only, then place the counts (cluster.hpp, place_allocation: repaired until the placement
/// rule can hold them, moving jobs when that pays).
inline void schedule_cluster(cluster_state& state, double now) {
  if (state.outside()) return schedule_outside(state, now, state.outside());
  observe_jobs(state, now);
  std::vector<job_state*> act = state.active(now);
  if (act.empty()) return;
  std::vector<job_view*> views;
  std::map<const job_view*, job_state*> owner;
  for (job_state* j : act) views.push_back(&j->view), owner[&j->view] = j;
  auto states = [&](const std::vector<job_view*>& vs) {
    std::vector<job_state*> out;
    for (const job_view* v : vs) out.push_back(owner.at(v));
    return out;
  };
  cluster_context ctx;
  ctx.capacity = state.capacity();
  ctx.nodes = state.config().nodes;
  ctx.now = now;
  ctx.config = &state.config();
  std::vector<double> truth;
  if (state.config().policy.rfind("oracle_", 0) == 0) {
    for (job_state* j : act) truth.push_back(std::max(true_total_epochs(*j) - j->view.epochs_done, 1e-6));
    ctx.oracle_remaining_epochs = &truth;
  }
  cluster_request req = cluster_allocation(views, ctx);
  act = states(views);
  const policy::cluster_arbiter arbiter(req.arbiter);
  place_allocation(state, act, req.jobs, arbiter, now);
}

}  // namespace dra::sim::detail
