#pragma once
// Umbrella header of the compiled part (dra::dra, links LibTorch): the controller, its state
// providers, and the communicator backends.
#include "dra/dra.hpp"
#include "dra/torch/build_info.hpp"
#include "dra/torch/comm/communicator.hpp"
#include "dra/torch/comm/gloo.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "dra/torch/elastic/data.hpp"
#include "dra/torch/elastic/job_control.hpp"
#include "dra/torch/elastic/options.hpp"
#include "dra/torch/elastic/state.hpp"
