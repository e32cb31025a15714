// Uses the installed header-only core: an estimator and a constrained policy decide once.
#include <cstdio>
#include <dra/dra.hpp>
#include <memory>

int main() {
  dra::signals::convergence_estimator estimator;
  for (int step = 0; step < 200; ++step) estimator.update_loss(step, 2.0 / (1.0 + step));
  dra::policy::throughput_model throughput;
  dra::policy::constrained_policy policy(std::make_shared<dra::policy::convergence_phase_policy>(),
                                         dra::policy::constraints{});
  dra::policy::world_state world;
  world.size = 2;
  const auto decision = policy.decide(estimator.signals(), world, dra::policy::capacity{4}, {}, throughput);
  std::printf("consumer: phase=%s decision=%s -> %d (%s)\n", dra::signals::to_string(estimator.signals().phase),
              dra::policy::to_string(decision.kind), decision.target_size, decision.reason.c_str());
  return estimator.signals().accepted == 200 ? 0 : 1;
}
