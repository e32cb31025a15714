#pragma once
// Umbrella header. The header-only core (dra::core) needs only Eigen; the compiled part's headers
// (dra::dra, LibTorch) are included when DRA_WITH_TORCH is defined by linking dra::dra.
#include "dra/error.hpp"
#include "dra/version.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/gradient_noise_scale.hpp"
#include "dra/policy/types.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/engine.hpp"
#if __has_include("dra/sim/simulator.hpp")
#include "dra/sim/simulator.hpp"
#endif
