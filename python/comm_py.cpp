// dra._core.comm: the communicator backends registered by name (src/comm/registry.cpp). Each
// backend's own bindings live beside it (nccl_py.cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "dra/torch/comm/communicator.hpp"

namespace py = pybind11;

void dra::python::bind_comm(py::module_& m) {
  auto c = m.def_submodule("comm", "Communicator backends.");
  c.def("backends", &dra::comm::backend_names,
        "Names of the registered backends (what Controller(backend=...) takes).");
  bind_nccl(c);
}
