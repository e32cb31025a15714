#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "dra/error.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "dra's compiled core: signals, policies, the decision engine, the controller (the simulator is dra._sim).";
  // dra::timeout_error must reach Python as TimeoutError; the rest of the hierarchy keeps its name.
  static py::exception<dra::error> error_type(m, "DraError", PyExc_RuntimeError);
  error_type.doc() = "Base of every runtime failure raised by dra itself (a RuntimeError).";
  py::register_exception<dra::comm_error>(m, "CommError", error_type.ptr());
  py::register_exception<dra::membership_error>(m, "MembershipError", error_type.ptr());
  py::register_exception<dra::state_mismatch_error>(m, "StateMismatchError", error_type.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dra::timeout_error& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    }
  });
  dra::python::bind_signals(m);
  dra::python::bind_policy(m);
  dra::python::bind_registry(m);
  dra::python::bind_build(m);
  dra::python::bind_elastic(m);  // before the controller: its signature names these types
  dra::python::bind_controller(m);
  dra::python::bind_step(m);
  dra::python::bind_comm(m);
  dra::python::bind_rl(m);
  dra::python::bind_testing(m);
  dra::python::bind_energy(m);
  dra::python::bind_compress(m);
  dra::python::bind_pool(m);
}
