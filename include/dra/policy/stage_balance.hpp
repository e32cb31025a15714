#pragma once
// Deprecated path, kept for code written against dra 0.2: the RL stage-balance policy moved to
// dra/rl/stage_balance.hpp (RL post-training has its own folder). This forwarder is removed in
// dra 0.4.
#include "dra/rl/stage_balance.hpp"
