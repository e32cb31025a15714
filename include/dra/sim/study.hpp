#pragma once
// The generated static-vs-dynamic study (the DRA framework's 1,500-run evaluation, whose logs are
// not public): each run, drawn from the measured profiles, simulated under its request, the best
// static configurations in hindsight and each dynamic policy. Seeded: run i depends only on
// (seed, i). Every condition (request, budget, target, noise, declarations, what the policies
// measure) is justified in docs/guide/simulator.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "dra/sim/simulator.hpp"

namespace dra::sim {

struct study_config {
  int runs = 1500;
  std::uint64_t seed = 1;
  /// Dynamic policies (the static baselines are always run).
  std::vector<std::string> policies{"convergence", "goodput", "convergence_aware"};
  double reallocation_cost_s = in_place_resize_cost_stand_in_s;
  /// Dynamic policies may hold up to this multiple of the requested devices (1: the same budget).
  double quota_scale = 1.0;
  double interval_s = 60.0;
  int nodes = 16;
  int devices_per_node = 4;
  /// Perturb the drawn request (batch and devices x 2^{-1,0,1}): an untuned request.
  bool perturb = false;
  /// The reference's per-application limits (ncf: one device); off: what the profiles measure.
  bool reference_limits = false;
  bool noise = true;
  /// Runs contend for one cluster in groups of jobs_per_cluster (arrival times of the workload rows).
  bool shared_cluster = false;
  int jobs_per_cluster = 160;
  /// Static baselines in hindsight: best fixed size at the user's batch, and best fixed size and
  /// batch (validated batches and the user's), within the quota, each chosen alone; on a shared
  /// cluster static_best_hindsight runs every job at its alone choice.
  bool hindsight = true;
  /// Settings of the convergence-aware policy (per job alone, and its cluster form when shared).
  policy::convergence_aware_config convergence_aware{};
  /// What each run declares (its epoch budget, with this log-normal error; none_share declare
  /// nothing). Early stopping is not used: a run stops at its target.
  double declared_sigma = 0.0;
  double declared_none_share = 0.0;
  /// Log-normal spread of a run's own gradient-noise-scale estimate, drawn per epoch: the policies
  /// see what a live job measures, never the trace's exact statistics.
  double gns_estimate_sigma = 0.2;
  /// Judge the target by the work done at each batch (true), or by the metric of the epoch-weighted
  /// geometric-mean batch (false: the earlier rule). `compare_target_rules` also runs every dynamic
  /// policy under the other rule, reported as "<policy>@geometric_batch".
  bool target_by_work = true;
  bool compare_target_rules = true;

  void validate() const {
    if (runs < 1) dra::detail::throw_invalid("runs", "must be >= 1, got " + std::to_string(runs));
    if (!(quota_scale > 0.0))
      dra::detail::throw_invalid("quota_scale", "must be > 0, got " + std::to_string(quota_scale));
    if (jobs_per_cluster < 1) dra::detail::throw_invalid("jobs_per_cluster", "must be >= 1");
    if (!(declared_sigma >= 0.0 && declared_sigma <= 5.0))
      dra::detail::throw_invalid("declared_sigma", "must lie in [0, 5] (0.5 and 1 are realistic)");
    if (!(declared_none_share >= 0.0 && declared_none_share <= 1.0))
      dra::detail::throw_invalid("declared_none_share", "must lie in [0, 1]");
    if (!(gns_estimate_sigma >= 0.0 && gns_estimate_sigma <= 5.0))
      dra::detail::throw_invalid("gns_estimate_sigma", "must lie in [0, 5] (0.2 is the default)");
    for (const auto& p : policies)
      if (std::find(policy_names().begin(), policy_names().end(), p) == policy_names().end())
        dra::detail::throw_invalid("policies", "unknown policy '" + p + "'");
  }
};

/// Names of the static baselines a study reports, in order.
inline const std::vector<std::string>& study_baselines() {
  static const std::vector<std::string> names{"static_request", "static_best_size", "static_best_hindsight"};
  return names;
}

struct study_run {
  int index = 0;
  job_spec spec;
  int cluster = -1;                           ///< shared-cluster group (-1: alone)
  std::map<std::string, job_result> results;  ///< by policy (and static baselines)
  int best_size_devices = 0;                  ///< the configuration static_best_size chose
  int hindsight_devices = 0;                  ///< the configuration static_best_hindsight chose
  double hindsight_batch = 0.0;
};

/// The fixed target of an application: the lowest final best metric over its validated batch sizes
/// (the highest for falling metrics), a quality every batch size reaches by its last epoch.
inline double fixed_target(const application_profile& app) {
  double target = app.metric_increases() ? INFINITY : -INFINITY;
  for (double b : app.validated_batches()) {
    const double m = app.best_metric(b, app.max_epochs());
    target = app.metric_increases() ? std::min(target, m) : std::max(target, m);
  }
  return target;
}

/// Run i of the study: one job drawn from `pool` (workload rows).
inline job_spec generate_run(const profile_library& profiles, const std::vector<job_spec>& pool,
                             const study_config& config, int index) {
  if (pool.empty()) dra::detail::throw_invalid("pool", "needs at least one workload row to draw requests from");
  detail::portable_rng rng(config.seed * 0x100000001B3ULL + static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ULL +
                           1);
  rng.next();
  const job_spec& row = pool[rng.below(pool.size())];
  const application_profile& app = profiles.at(row.application);
  job_spec j;
  j.name = "run-" + std::to_string(index);
  j.application = row.application;
  j.submit_s = 0.0;
  const int u = static_cast<int>(rng.below(3)) - 1;
  const int v = static_cast<int>(rng.below(3)) - 1;
  j.batch = config.perturb ? std::clamp(row.batch * std::ldexp(1.0, u), app.init_batch(), app.max_batch()) : row.batch;
  int cap = config.nodes * config.devices_per_node;
  cap = std::min(cap, std::max(1, static_cast<int>(std::floor(j.batch / app.min_local_batch() + 1e-9))));
  if (config.reference_limits && app.max_replicas() > 0) cap = std::min(cap, app.max_replicas());
  j.replicas = std::clamp(
      config.perturb ? static_cast<int>(std::lround(row.replicas * std::ldexp(1.0, v))) : row.replicas, 1, cap);
  const double zt = rng.normal(), zg = rng.normal();
  if (config.noise) {
    j.throughput_scale = std::exp(app.placement_noise() * zt);
    j.gns_scale = std::exp(app.gns_noise() * zg);
  }
  j.target_metric = fixed_target(app);
  j.target_by_work = config.target_by_work;
  j.gns_estimate_sigma = config.gns_estimate_sigma;
  // Its declaration: the epoch budget (as its script states it), with the configured error.
  const double zd = rng.normal(), ud = rng.uniform();
  j.declared_epochs = ud < config.declared_none_share
                          ? std::numeric_limits<double>::quiet_NaN()
                          : std::max(1.0, std::round(app.max_epochs() * std::exp(config.declared_sigma * zd)));
  return j;
}

namespace detail {
inline sim_config study_sim_config(const study_config& config, const std::string& policy, bool alone) {
  sim_config sc;
  sc.policy = policy;
  sc.nodes = config.nodes;
  sc.devices_per_node = config.devices_per_node;
  sc.interval_s = config.interval_s;
  sc.reallocation_cost_s = config.reallocation_cost_s;
  sc.quota_scale = config.quota_scale;
  sc.reference_limits = config.reference_limits;
  sc.record_timeline = false;
  sc.convergence_aware = config.convergence_aware;
  // Alone on the cluster there is nothing to arbitrate: the job's own policy decides (the live path).
  sc.cluster_arbitration = !alone;
  return sc;
}

/// Best static configuration in hindsight for one run: every size 1..budget at the user's batch
/// (and, with batches, every validated batch too); the shortest training time wins, ties to fewer
/// GPU-hours.
inline job_result best_static(const profile_library& profiles, const job_spec& spec, const study_config& config,
                              bool batches, int& devices, double& batch) {
  const application_profile& app = profiles.at(spec.application);
  std::vector<double> candidates{spec.batch};
  if (batches)
    for (double b : app.validated_batches())
      if (b != spec.batch) candidates.push_back(b);
  const int budget = std::max(1, static_cast<int>(std::floor(config.quota_scale * spec.replicas + 1e-9)));
  job_result best;
  bool have = false;
  for (double b : candidates) {
    const int most = std::min({budget, config.nodes * config.devices_per_node,
                               std::max(1, static_cast<int>(std::floor(b / app.min_local_batch() + 1e-9)))});
    for (int k = 1; k <= most; ++k) {
      job_spec s = spec;
      s.batch = b;
      s.replicas = k;
      simulator sim(profiles, {s}, study_sim_config(config, "static", true));
      job_result r = sim.run().jobs.at(0);
      const double t = r.completion_s - r.start_s;
      const double bt = best.completion_s - best.start_s;
      if (!std::isfinite(t)) continue;
      if (!have || t < bt - 1e-9 || (std::abs(t - bt) <= 1e-9 && r.gpu_seconds < best.gpu_seconds)) {
        best = r, have = true, devices = k, batch = b;
      }
    }
  }
  return best;
}
}  // namespace detail

/// Simulates every run under the static baselines and every dynamic policy. `progress(done, total)`
/// is called after each run (alone) or each cluster (shared).
inline std::vector<study_run> run_study(const profile_library& profiles, const std::vector<job_spec>& pool,
                                        const study_config& config,
                                        const std::function<void(int, int)>& progress = nullptr) {
  config.validate();
  std::vector<study_run> out;
  out.reserve(static_cast<std::size_t>(config.runs));
  for (int i = 0; i < config.runs; ++i) {
    study_run run;
    run.index = i;
    run.spec = generate_run(profiles, pool, config, i);
    out.push_back(std::move(run));
  }
  if (!config.shared_cluster) {
    for (auto& run : out) {
      simulator s(profiles, {run.spec}, detail::study_sim_config(config, "static", true));
      run.results["static_request"] = s.run().jobs.at(0);
      if (config.hindsight) {
        double b = 0.0;
        run.results["static_best_size"] =
            detail::best_static(profiles, run.spec, config, false, run.best_size_devices, b);
        run.results["static_best_hindsight"] =
            detail::best_static(profiles, run.spec, config, true, run.hindsight_devices, run.hindsight_batch);
      }
      for (const auto& p : config.policies) {
        simulator d(profiles, {run.spec}, detail::study_sim_config(config, p, true));
        run.results[p] = d.run().jobs.at(0);
        if (config.compare_target_rules) {
          job_spec other = run.spec;
          other.target_by_work = !other.target_by_work;
          simulator o(profiles, {other}, detail::study_sim_config(config, p, true));
          run.results[p + (other.target_by_work ? "@work" : "@geometric_batch")] = o.run().jobs.at(0);
        }
      }
      if (progress) progress(run.index + 1, config.runs);
    }
    return out;
  }
  // Shared cluster: groups of jobs_per_cluster runs, arriving at the times of consecutive workload
  // rows (group g uses rows g x jobs_per_cluster ..., wrapping around the pool).
  const int groups = (config.runs + config.jobs_per_cluster - 1) / config.jobs_per_cluster;
  std::vector<std::string> policies{"static"};
  for (const auto& p : config.policies)
    if (p != "static") policies.push_back(p);
  // Best static configuration in hindsight, chosen alone per run, then run together.
  if (config.hindsight)
    for (auto& run : out) {
      double b = 0.0;
      int d = 0;
      detail::best_static(profiles, run.spec, config, false, d, b);
      run.best_size_devices = d;
      detail::best_static(profiles, run.spec, config, true, run.hindsight_devices, run.hindsight_batch);
    }
  for (int g = 0; g < groups; ++g) {
    const int first = g * config.jobs_per_cluster;
    const int last = std::min(config.runs, first + config.jobs_per_cluster);
    std::vector<job_spec> specs;
    for (int i = first; i < last; ++i) {
      job_spec s = out[static_cast<std::size_t>(i)].spec;
      s.submit_s = pool[static_cast<std::size_t>(i) % pool.size()].submit_s;
      out[static_cast<std::size_t>(i)].spec.submit_s = s.submit_s;
      out[static_cast<std::size_t>(i)].cluster = g;
      specs.push_back(std::move(s));
    }
    auto run_all = [&](const std::string& p, const std::vector<job_spec>& js, const std::string& as) {
      simulator sim(profiles, js, detail::study_sim_config(config, p, false));
      const sim_result r = sim.run();
      for (const auto& j : r.jobs) {
        const int i = std::stoi(j.name.substr(4));  // "run-<i>"
        out[static_cast<std::size_t>(i)].results[as] = j;
      }
    };
    for (const auto& p : policies) run_all(p, specs, p == "static" ? "static_request" : p);
    if (config.hindsight) {
      std::vector<job_spec> best = specs, size = specs;
      for (std::size_t k = 0; k < specs.size(); ++k) {
        const auto& run = out[static_cast<std::size_t>(first) + k];
        best[k].replicas = run.hindsight_devices, best[k].batch = run.hindsight_batch;
        size[k].replicas = run.best_size_devices;
      }
      run_all("static", size, "static_best_size");
      run_all("static", best, "static_best_hindsight");
    }
    if (progress) progress(g + 1, groups);
  }
  return out;
}

}  // namespace dra::sim
