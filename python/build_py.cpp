#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "bindings.hpp"
#include "dra/torch/build_info.hpp"
#include "to_dict.hpp"

namespace py = pybind11;
using dra::build_info;

void dra::python::bind_build(py::module_& m) {
  def_to_dict(py::class_<build_info>(m, "BuildInfo", "What this build of the compiled part contains."))
      .def_readonly("version", &build_info::version)
      .def_readonly("compiler", &build_info::compiler)
      .def_readonly("torch_version_compiled", &build_info::torch_version)
      .def_readonly("gloo", &build_info::gloo)
      .def_property_readonly(
          "nccl",
          [](const build_info& b) { return b.nccl ? std::optional<std::string>(b.nccl_header_version) : std::nullopt; },
          "The NCCL headers' version the backend was compiled against; None without the backend.");
  m.def("_build_info", []() { return dict_of(dra::get_build_info()); });
}
