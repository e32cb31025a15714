#pragma once
// Registration functions, one per *_py.cpp file, called from core_py.cpp's module definition
// (bind_sim from sim_module.cpp's: the simulator is a torch-free module of its own).
#include <pybind11/pybind11.h>

namespace dra::python {
void bind_signals(pybind11::module_& m);
void bind_policy(pybind11::module_& m);
void bind_build(pybind11::module_& m);
void bind_controller(pybind11::module_& m);
void bind_step(pybind11::module_& m);  // dra.step (python/step_py.cpp), after bind_controller
void bind_elastic(pybind11::module_& m);
void bind_comm(pybind11::module_& m);
void bind_nccl(pybind11::module_& comm);             // into dra._core.comm
void bind_sim(pybind11::module_& m);                 // dra._sim (python/sim_module.cpp), torch-free
void bind_testing(pybind11::module_& m);             // dra._core._testing
void bind_bench(pybind11::module_& testing);         // into dra._core._testing
void bind_nccl_testing(pybind11::module_& testing);  // into dra._core._testing
void bind_energy(pybind11::module_& m);
void bind_compress(pybind11::module_& m);
void bind_pool(pybind11::module_& m);
void bind_rl(pybind11::module_& m);        // issue 12: RL stage balance and simulator
void bind_registry(pybind11::module_& m);  // dra._core and dra._sim: the policy registry
}  // namespace dra::python
