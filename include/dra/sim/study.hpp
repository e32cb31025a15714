#pragma once
// The generated static-vs-dynamic study (the DRA framework's 1,500-run evaluation, whose logs are
// not public). Each run is one training job drawn from the measured profiles with documented
// perturbations, simulated alone on the cluster under its requested static allocation and under
// each dynamic policy. Seeded and reproducible: run i depends only on (seed, i), through a
// portable generator (splitmix64 + Box-Muller), never on the standard library's distributions,
// whose output differs between implementations.
//
// Distributions (justified in docs/guide/simulator.md):
//  - request: a row (application, num_replicas, batch_size) drawn uniformly from the workload
//    CSVs, so the application mix and the requests are the ones users made in the traces;
//  - batch: the request's batch times 2^u, u uniform in {-1, 0, 1}, clamped to the validated
//    batch range (the traces validate batches a factor 2 apart);
//  - devices: the request's devices times 2^v, v uniform in {-1, 0, 1}, rounded, clamped to
//    [1, min(cluster, batch / min local batch)] (and the reference's application limit when
//    `reference_limits` is set);
//  - throughput noise: step and sync time times exp(sigma_t z), sigma_t the application's median
//    spread of log step time between placements with the same nodes, replicas and batch;
//  - efficiency noise: tr(Sigma) times exp(sigma_g z), sigma_g the median spread of
//    log(grad_var/grad_sqr) across the batch-size runs at the same epoch;
//  - target metric: the best metric the run would reach at its batch by the last epoch, relaxed by
//    delta uniform in [0, 2 %] (lower for rising metrics, higher for falling ones); the run stops at
//    the first epoch that reaches it, or at the last epoch.
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dra/sim/simulator.hpp"

namespace dra::sim {

namespace detail {
/// splitmix64: a tiny, portable, well-mixed 64-bit generator.
class portable_rng {
 public:
  explicit portable_rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  /// Standard normal (Box-Muller; the second value is discarded for simplicity).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  std::uint64_t state_;
};
}  // namespace detail

struct study_config {
  int runs = 1500;
  std::uint64_t seed = 1;
  std::vector<std::string> policies{"static", "convergence", "goodput", "arbiter"};
  double reallocation_cost_s = in_place_resize_cost_stand_in_s;
  /// Dynamic policies may hold up to this multiple of the requested devices.
  double quota_scale = 2.0;
  double interval_s = 60.0;
  int nodes = 16;
  int devices_per_node = 4;
  double max_target_slack = 0.02;
  /// The reference's per-application limits (ncf: one device); off: what the profiles measure.
  bool reference_limits = false;
  bool noise = true;

  void validate() const {
    if (runs < 1) dra::detail::throw_invalid("runs", "must be >= 1, got " + std::to_string(runs));
    if (policies.empty()) dra::detail::throw_invalid("policies", "needs at least one policy");
    if (!(max_target_slack >= 0.0 && max_target_slack < 1.0))
      dra::detail::throw_invalid("max_target_slack", "must lie in [0, 1)");
  }
};

struct study_run {
  int index = 0;
  job_spec spec;
  std::map<std::string, job_result> results;  ///< by policy
};

/// Run i of the study: one job drawn from `pool` (workload rows) and perturbed.
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
  j.batch = std::clamp(row.batch * std::ldexp(1.0, u), app.init_batch(), app.max_batch());
  const int v = static_cast<int>(rng.below(3)) - 1;
  int cap = config.nodes * config.devices_per_node;
  cap = std::min(cap, std::max(1, static_cast<int>(std::floor(j.batch / app.min_local_batch() + 1e-9))));
  if (config.reference_limits && app.max_replicas() > 0) cap = std::min(cap, app.max_replicas());
  j.replicas = std::clamp(static_cast<int>(std::lround(row.replicas * std::ldexp(1.0, v))), 1, cap);
  const double zt = rng.normal(), zg = rng.normal();
  if (config.noise) {
    j.throughput_scale = std::exp(app.placement_noise() * zt);
    j.gns_scale = std::exp(app.gns_noise() * zg);
  }
  const double slack = config.max_target_slack * rng.uniform();
  const double final_metric = app.best_metric(j.batch, app.max_epochs());
  j.target_metric = app.metric_increases() ? final_metric * (1.0 - slack) : final_metric * (1.0 + slack);
  return j;
}

/// Simulates every run under every policy. `progress(done, total)` is called after each run.
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
    for (const auto& p : config.policies) {
      sim_config sc;
      sc.policy = p;
      sc.nodes = config.nodes;
      sc.devices_per_node = config.devices_per_node;
      sc.interval_s = config.interval_s;
      sc.reallocation_cost_s = config.reallocation_cost_s;
      sc.quota_scale = config.quota_scale;
      sc.reference_limits = config.reference_limits;
      sc.record_timeline = false;
      simulator s(profiles, {run.spec}, sc);
      run.results[p] = s.run().jobs.at(0);
    }
    out.push_back(std::move(run));
    if (progress) progress(i + 1, config.runs);
  }
  return out;
}

}  // namespace dra::sim
