// How much of the within-step oracle's gain is its clairvoyance (simulated, 2026-12-03): on the
// `longgen` scenario (the settings of python/dra/rl/__init__.py, as in tests/cpp/test_rl.cpp), the
// best static barrier-free split, the stage-balance policy, the oracle with free switches (the
// reports' ceiling), the same oracle paying the measured switch costs, and the oracle's search on
// lengths drawn from what the run has seen instead of the true ones (events.hpp,
// run_lookahead_sampled): lookahead_sampled (draws that follow the GRPO groups) and
// lookahead_sampled_independent (independent draws). From the repository root:
//   g++ -O2 -DNDEBUG -std=c++17 -Iinclude -I/usr/include/eigen3 docs/results/rl/issue24/lookahead.cpp -o lookahead
//   ./lookahead SEED [SAMPLES=12] [STEPS=200] [longgen|reserve] [both|grouped|independent|fitted|planner|all]
// reserve: longgen_reserve (SGLang-like admission). fitted: the stage-balance policy with the
// look-ahead planner alone (SAMPLES draws per decision; TERMINAL_STEPS=K in the environment sets
// lookahead_terminal_steps); planner: the window planner, the oracle and the look-ahead planner;
// all: every row above and that one.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dra/rl/events.hpp"

int main(int argc, char** argv) {
  using namespace dra::sim;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s SEED [SAMPLES] [STEPS] [longgen|reserve] [both|grouped|independent|fitted|planner|all]\n",
                 argv[0]);
    return 2;
  }
  const auto seed = static_cast<std::uint64_t>(std::atoll(argv[1]));
  const int samples = argc > 2 ? std::atoi(argv[2]) : 12;
  rl_event_config c;
  c.devices = 8;
  auto& w = c.workload;
  w.steps = argc > 3 ? std::atoi(argv[3]) : 200;
  w.seed = seed;
  w.prompts_per_step = 64;
  w.group_size = 8;
  w.prompt_tokens = 512.0;
  w.max_generation_tokens = 20480.0;
  w.drift_final_scale = 2.0;
  w.updates_per_step = 8;
  w.lengths = length_model::reasoning;
  w.reasoning = {2000.0, 0.7, 0.35, 0.1, 4.0};
  auto& k = c.costs;
  k.max_concurrency = 256;
  k.kv_capacity_tokens = 270000.0;
  k.decode_fixed_s = 0.022;
  k.decode_per_sequence_s = 8e-5;
  k.decode_per_kilotoken_s = 3.9e-5;
  k.prefill_per_kilotoken_s = 0.04;
  k.train_per_token_s = 3.3e-4;
  k.train_fixed_s = k.sync_fixed_s = 0.5;
  k.weight_sync_s = k.weight_load_s = k.switch_weights_s = 1.3;
  k.switch_agree_s = 0.05;
  k.switch_rebuild_s = 0.5;
  k.switch_optimizer_s = 4.0;
  k.rollout_start_s = 5.0;
  const bool reserve = argc > 4 && std::strcmp(argv[4], "reserve") == 0;
  if (reserve) k.kv_reserve_ratio = 0.3;
  const rl_event_sim sim({}, c);
  double best = std::numeric_limits<double>::infinity();
  int best_r = 0;
  for (int r = 1; r < c.devices; ++r) {
    const double t = sim.run_static(r, dra::policy::rl_pipeline::one_step_off, false).total_s;
    if (t < best) best = t, best_r = r;
  }
  std::printf("%s seed %llu, %d steps: best static split %d rollout, %.0f s\n", reserve ? "longgen_reserve" : "longgen",
              static_cast<unsigned long long>(seed), w.steps, best_r, best);
  const auto row = [&](const rl_run_result& r) {
    std::printf("  %-24s x%.4f  switches %4d  mean rollout devices %.2f\n", r.name.c_str(), r.total_s / best,
                r.switches, r.mean_rollout_devices);
    std::fflush(stdout);
  };
  const char* which = argc > 5 ? argv[5] : "both";
  const bool planner = std::strcmp(which, "planner") == 0;
  if (std::strcmp(which, "fitted") != 0) {  // fitted: that row alone
    row(sim.run_dynamic());
    row(sim.run_oracle(true));
    if (!planner) row(sim.run_oracle(false));
  }
  if (planner) which = "fitted";  // planner: the window planner, the oracle and the look-ahead planner
  if (std::strcmp(which, "independent") != 0 && std::strcmp(which, "fitted") != 0)
    row(sim.run_lookahead_sampled(samples, 2, true));
  if (std::strcmp(which, "grouped") != 0 && std::strcmp(which, "fitted") != 0)
    row(sim.run_lookahead_sampled(samples, 2, false));
  if (std::strcmp(which, "fitted") == 0 || std::strcmp(which, "all") == 0) {  // the policy's look-ahead planner
    rl_event_config p = c;
    p.policy.planner = "lookahead";
    p.policy.lookahead_draws = samples;
    if (const char* k = std::getenv("TERMINAL_STEPS")) p.policy.lookahead_terminal_steps = std::atoi(k);
    auto r = rl_event_sim({}, p).run_dynamic();
    r.name = "dynamic (lookahead)";
    row(r);
  }
  return 0;
}
