#pragma once
// Umbrella header of the cluster simulator (dra::sim, header-only, on dra::core): replays job
// traces with the same policy code a live job runs.
#include "dra/dra.hpp"
#include "dra/rl/pipeline.hpp"  // RL post-training: rollout vs training devices (issue 12)
#include "dra/sim/simulator.hpp"
#include "dra/sim/study.hpp"
