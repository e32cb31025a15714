#pragma once
// Registration functions, one per *_py.cpp file, called from core_py.cpp's module definition.
#include <pybind11/pybind11.h>

namespace dra::python {
void bind_signals(pybind11::module_& m);
void bind_policy(pybind11::module_& m);
void bind_build(pybind11::module_& m);
void bind_elastic(pybind11::module_& m);
void bind_bench(pybind11::module_& m);
void bind_sim(pybind11::module_& m);
void bind_nccl(pybind11::module_& m);
void bind_rl(pybind11::module_& m);  // issue 12: RL stage balance and simulator
}  // namespace dra::python
