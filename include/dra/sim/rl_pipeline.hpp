#pragma once
// Deprecated path, kept for code written against dra 0.2: the RL pipeline simulator moved to
// dra/rl/pipeline.hpp (RL post-training has its own folder). This forwarder is removed in
// dra 0.4.
#include "dra/rl/pipeline.hpp"
