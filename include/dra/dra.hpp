#pragma once
// Umbrella header of the header-only core (dra::core): signals, policies, the decision engine,
// and the elastic world's membership and exactly-once data functions. No torch, no NCCL, no
// Python. The simulator has its own umbrella (dra/sim.hpp, target dra::sim); the compiled part
// (dra::dra, LibTorch) has dra/torch.hpp.
#include "dra/elastic/membership.hpp"
#include "dra/elastic/sampler.hpp"
#include "dra/engine.hpp"
#include "dra/error.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/policy/types.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/gradient_noise_scale.hpp"
#include "dra/version.hpp"
