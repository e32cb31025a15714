#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "dra/torch/build_info.hpp"

namespace py = pybind11;

void dra::python::bind_build(py::module_& m) {
  m.def("_build_info", []() {
    const auto info = dra::get_build_info();
    py::dict d;
    d["version"] = info.version;
    d["compiler"] = info.compiler;
    d["torch_version_compiled"] = info.torch_version;
    d["gloo"] = info.gloo;
    d["nccl"] = info.nccl ? py::object(py::str(info.nccl_header_version)) : py::object(py::none());
    return d;
  });
}
