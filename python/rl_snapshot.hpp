#pragma once
// A leader's snapshot of its RL pipeline from a Python dict (python/rl_snapshot_py.cpp).
#include <pybind11/pybind11.h>

#include "dra/rl/snapshot.hpp"

namespace dra::python {
/// The snapshot `d` describes; a missing key, an unknown one or a wrong type raises ValueError
/// naming it (as "snapshot.slots[2].role: ...").
dra::sim::pipeline_snapshot snapshot_from(const pybind11::dict& d);
}  // namespace dra::python
