#pragma once
// Release 0.1's header of the elastic controller, kept as a deprecated forwarder (removed in 0.4):
// since 0.2 the compiled part's headers live under dra/torch/ (include <dra/torch.hpp>, or
// <dra/torch/elastic/controller.hpp>). docs/guide/compatibility.md lists every renamed name.
#if defined(__GNUC__) || defined(__clang__)
#pragma message( \
    "dra 0.2: <dra/elastic/controller.hpp> moved to <dra/torch/elastic/controller.hpp> (or <dra/torch.hpp>); this forwarder is removed in 0.4")
#endif
#include "dra/torch/elastic/controller.hpp"
#include "dra/torch/elastic/options.hpp"
#include "dra/torch/elastic/state.hpp"
