#pragma once
// The cluster policies (pollux, arbiter, convergence_aware on a shared cluster):
// dra::policy::cluster_arbiter over goodput curves from each job's online-fitted model, under
// Pollux's rules (restart penalty, exploration limit, one distributed job per node).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "dra/policy/cluster_arbiter.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/sim/cluster.hpp"
#include "dra/sim/config.hpp"
#include "dra/sim/job_model.hpp"

namespace dra::sim::detail {

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

/// Most devices a cluster policy may give a job now: Pollux's exploration rule (twice the most it
/// has run on; one before it ran) within its cap and 16 nodes' worth.
inline int explore_cap(const job_state& j) {
  const int seen = j.model->max_profiled_replicas();
  return std::min(j.max_devices, std::max(2 * seen, 1));
}

/// Predicted best goodput at k packed devices, cached per epoch and model fit.
inline double curve_at(job_state& j, int k, const sim_config& config) {
  if (k <= 0 || !j.model->fitted()) return 0.0;
  if (j.curve_epoch != j.epoch || j.curve_model != j.model->configurations() || j.curve.empty()) {
    j.curve.assign(static_cast<std::size_t>(j.max_devices) + 1, -1.0);
    j.curve_epoch = j.epoch;
    j.curve_model = j.model->configurations();
  }
  const int kk = std::min(k, j.max_devices);
  double& g = j.curve[static_cast<std::size_t>(kk)];
  if (g < 0.0) g = predicted_best(j, (kk + config.devices_per_node - 1) / config.devices_per_node, kk, config).goodput;
  return g;
}

/// Remaining work (statistical progress) the job expects: its epoch budget left, or, without
/// the budget, an Optimus-style fit of its per-epoch loss proxy, loss(e) = 1 / (a e + b) + c,
/// extrapolated to where it improves by less than 1 % over a further 10 % of its epochs.
inline double remaining_work(const job_state& j, const sim_config& config) {
  const double total = j.app->progress_at(j.app->max_epochs());
  if (config.remaining_work_from_budget || j.epoch < 3) return std::max(total - j.progress, 1.0);
  const double per_epoch = j.progress / std::max(1, j.epoch);
  const double epochs = detail::optimus_epochs(j.loss_history);
  return std::max((epochs - j.epoch) * per_epoch, per_epoch);
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
inline void schedule_cluster(cluster_state& state, double now) {
  std::vector<job_state*> act = state.active(now);
  if (act.empty()) return;
  const std::string& p = state.config().policy;
  const bool ca = p == "convergence_aware";
  std::vector<double> work(act.size());
  for (std::size_t i = 0; i < act.size(); ++i) work[i] = ca ? remaining_work(*act[i], state.config()) : 0.0;
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
  const int fair = static_cast<int>(std::ceil(static_cast<double>(state.capacity()) / static_cast<double>(act.size())));
  const double scale = static_cast<double>(state.config().nodes) / static_cast<double>(state.capacity());
  // convergence_aware: a job's value at k devices is the rate at which it completes its remaining
  // work, goodput(k) / remaining work (1/s), normalised by the largest one-device rate. A job that
  // has not measured anything yet is taken to be as close to done as the closest job (new jobs
  // first, as least-attained-service does), at linear speedup.
  std::vector<double> rate_one(act.size(), 0.0);
  double top_rate = 0.0;
  if (ca)
    for (std::size_t i = 0; i < act.size(); ++i)
      if (act[i]->model->fitted()) {
        rate_one[i] = curve_at(*act[i], 1, state.config()) * policy::remaining_work_weight(work[i]);
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
      for (int k = 1; k <= most; ++k) g[static_cast<std::size_t>(k)] = curve_at(*j, k, state.config());
      const int cut = policy::priced_size(g, state.config().cluster_price_floor);
      const double w = policy::remaining_work_weight(work[i]) / top_rate;
      for (int k = 1; k <= most; ++k)
        a.speedup[static_cast<std::size_t>(k)] = w * g[static_cast<std::size_t>(std::min(k, cut))];
    } else {
      const int fair_k = std::clamp(fair, 1, j->max_devices);
      double base =
          p == "pollux" ? predicted_best(*j, 1, fair_k, state.config()).goodput : curve_at(*j, fair_k, state.config());
      if (!(base > 0.0)) base = curve_at(*j, 1, state.config());
      for (int k = 1; k <= most; ++k)
        a.speedup[static_cast<std::size_t>(k)] = base > 0.0 ? scale * curve_at(*j, k, state.config()) / base : 0.0;
    }
    a.current = j->devices;
    const double age = now - j->spec.submit_s;
    const double cost = state.config().reallocation_cost_s;
    const int restarts = std::max(0, j->restarts);
    a.change_penalty = cost > 0.0 ? std::clamp(std::max(age - restarts * cost, 0.0) / (age + cost), 0.0, 1.0) : 1.0;
    in.push_back(std::move(a));
  }
  policy::arbiter_config ac = state.config().arbiter;
  if (ca) ac.p = state.config().remaining_work_power;
  const policy::cluster_arbiter arbiter(ac);
  // Counts under the placement rule, moving jobs when that pays (cluster.hpp, place_allocation).
  place_allocation(state, act, in, arbiter, now);
}

}  // namespace dra::sim::detail
