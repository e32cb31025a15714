// dra.step's fast path: a plain CPython vectorcall function that steps the process's local
// controller directly, and hands everything else to the Python implementation.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.hpp"
#include "dra/torch/elastic/controller.hpp"

namespace py = pybind11;
using namespace dra::elastic;

namespace {

// ---- dra.step's fast path ---------------------------------------------------------------------------
// dra.step is called once per training step, so its cost is measured against a bare binding call
// (goal: < 3x). A pybind11 function with arguments costs more than that budget by itself, so
// dra.step is a plain CPython vectorcall function. For the process's local controller (no world)
// and a float or a 0-d tensor (CPU: read from its storage; CUDA: handed over unread, no device
// synchronisation), it steps the C++ controller directly and returns its status object; everything
// else (elastic worlds, keywords, bad values) goes to the Python implementation
// dra._controller._step_slow, which behaves identically.
struct fast_step_target {
  PyObject* slow = nullptr;   // dra._controller._step_slow (strong)
  PyObject* warn = nullptr;   // dra._controller._warn_nonfinite(loss, step) (strong)
  PyObject* owner = nullptr;  // keeps `ctl` alive (strong), or null: no fast path
  controller* ctl = nullptr;
  PyObject* status = nullptr;  // returned by every fast step (strong)
};
fast_step_target g_step;

void replace(PyObject*& slot, PyObject* value) {
  Py_XINCREF(value);
  PyObject* old = slot;
  slot = value;
  Py_XDECREF(old);
}

// A 0-d floating-point CPU tensor, read straight from its storage (no dispatch: an item() call
// costs several times the whole step).
bool read_cpu_scalar(const at::Tensor& t, double& loss) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat:
      loss = *static_cast<const float*>(p);
      return true;
    case at::kDouble:
      loss = *static_cast<const double*>(p);
      return true;
    case at::kHalf:
      loss = static_cast<float>(*static_cast<const c10::Half*>(p));
      return true;
    case at::kBFloat16:
      loss = static_cast<float>(*static_cast<const c10::BFloat16*>(p));
      return true;
    default:
      return false;
  }
}

// The loss of a fast step: a float, a 0-d CPU tensor (read here), or a 0-d device tensor (handed to
// the controller, which never reads it at a step without a decision). False: the Python path.
bool read_loss(PyObject* arg, double& loss, const at::Tensor*& device_loss) {
  device_loss = nullptr;
  if (PyFloat_CheckExact(arg)) {
    loss = PyFloat_AS_DOUBLE(arg);
    return true;
  }
  if (THPVariable_CheckExact(arg)) {  // a subclass may watch its reads (__torch_function__): Python path
    const at::Tensor& t = THPVariable_Unpack(arg);
    if (t.dim() != 0) return false;
    if (t.device().is_cpu()) return !t.is_conj() && !t.is_neg() && read_cpu_scalar(t, loss);
    if (t.is_cuda() && at::isFloatingType(t.scalar_type())) {
      device_loss = &t;
      return true;
    }
  }
  return false;
}

PyObject* fast_step(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  double loss = 0.0;
  const at::Tensor* device_loss = nullptr;
  if (g_step.ctl != nullptr && PyVectorcall_NARGS(nargs) == 1 && kwnames == nullptr &&
      read_loss(args[0], loss, device_loss)) {
    const auto& status = device_loss ? g_step.ctl->step(*device_loss) : g_step.ctl->step(loss);
    if (g_step.ctl->nonfinite_started()) {
      // Rare: a streak of non-finite losses starts. Warn from Python (once per streak), saying
      // whether the loss was float16 (inf there is an overflow past 65504: the warning says so).
      const bool half = device_loss
                            ? device_loss->scalar_type() == at::kHalf
                            : THPVariable_CheckExact(args[0]) && THPVariable_Unpack(args[0]).scalar_type() == at::kHalf;
      PyObject* warned = PyObject_CallFunction(g_step.warn, "dLiO", device_loss ? status.loss : loss,
                                               static_cast<long long>(status.step), 2, half ? Py_True : Py_False);
      if (warned == nullptr) return nullptr;  // warnings turned into errors propagate
      Py_DECREF(warned);
    }
    Py_INCREF(g_step.status);
    return g_step.status;
  }
  if (g_step.slow == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "dra.step: the package is not initialised (import dra first)");
    return nullptr;
  }
  return PyObject_Vectorcall(g_step.slow, args, nargs, kwnames);
}

PyMethodDef fast_step_def = {
    "step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&fast_step)), METH_FASTCALL | METH_KEYWORDS,
    "step(loss, **signals)\n--\n\n"
    "One training step: feeds the loss (a float or a 0-d tensor) and optional signals to the\n"
    "process's controller and returns its StepStatus (the same object every step). A NaN/inf loss is\n"
    "counted and warned about once per streak (RuntimeWarning), never raised. Bad values and unknown\n"
    "keywords raise ValueError naming dra.step and the value."};

}  // namespace

void dra::python::bind_step(py::module_& m) {
  m.add_object("step",
               py::reinterpret_steal<py::object>(PyCFunction_NewEx(&fast_step_def, nullptr, m.attr("__name__").ptr())));
  m.def(
      "_set_step_target",
      [](py::object slow, py::object warn, py::object ctl) {
        controller* raw = ctl.is_none() ? nullptr : ctl.cast<controller*>();
        const bool fast = raw != nullptr && raw->is_local();
        replace(g_step.slow, slow.ptr());
        replace(g_step.warn, warn.ptr());
        replace(g_step.owner, fast ? ctl.ptr() : nullptr);
        py::object status;
        if (fast) status = ctl.attr("status");
        replace(g_step.status, fast ? status.ptr() : nullptr);
        g_step.ctl = fast ? raw : nullptr;
      },
      py::arg("slow"), py::arg("warn"), py::arg("controller"),
      "Internal: where dra.step goes (set by dra.reset / dra.default_controller).");
}
