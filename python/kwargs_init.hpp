#pragma once
// Keyword construction for config structs: `EstimatorConfig(window=32)`. Unknown keywords raise
// ValueError naming the keyword and listing the valid ones; the struct is then validated, so a
// bad value raises ValueError naming the field before any object is created.
#include <pybind11/pybind11.h>

#include <string>

namespace dra::python {

namespace detail {

// The options a config object takes (its public data fields), for messages.
inline std::string config_fields(const pybind11::object& self) {
  namespace py = pybind11;
  std::string valid;
  for (auto name : py::module_::import("builtins").attr("dir")(self)) {
    const auto n = name.cast<std::string>();
    if (n.rfind('_', 0) != 0 && n != "validate") valid += (valid.empty() ? "" : ", ") + n;
  }
  return valid;
}

inline bool is_config_field(const pybind11::object& self, const std::string& key) {
  namespace py = pybind11;
  return key.rfind('_', 0) != 0 && py::hasattr(self, key.c_str()) &&
         !py::isinstance<py::function>(py::getattr(self, key.c_str())) &&
         !py::hasattr(py::getattr(self, key.c_str()), "__func__");
}

// Sets one field; a value of the wrong type raises ValueError naming the field, the value and the
// type it takes (pybind11's own TypeError lists the setter's signature instead).
inline void set_config_field(const pybind11::object& self, const std::string& key, const pybind11::handle& value) {
  namespace py = pybind11;
  if (!is_config_field(self, key))
    throw py::value_error("unknown option '" + key + "'; valid options: " + config_fields(self));
  if (PyObject_GenericSetAttr(self.ptr(), py::str(key).ptr(), value.ptr()) == 0) return;
  py::error_already_set e;
  if (!e.matches(PyExc_TypeError)) throw e;
  const auto want = py::type::of(py::getattr(self, key.c_str())).attr("__name__").cast<std::string>();
  const auto given = py::repr(value).cast<std::string>();
  const auto given_type = py::type::of(value).attr("__name__").cast<std::string>();
  if (want == "float" && py::isinstance<py::str>(value)) {  // "nan" from a command line's NAME=VALUE
    auto word = py::str(value).attr("strip")().attr("lower")().attr("lstrip")("+-").cast<std::string>();
    if (word == "nan" || word == "inf" || word == "infinity")
      throw py::value_error(key + ": " + given.substr(0, 80) + " is not a finite number; give a finite value");
  }
  if (want == given_type)  // an integer beyond the field's C++ type (a negative seed, 2**70)
    throw py::value_error(key + ": " + given.substr(0, 80) + " is out of range for this field; give a " +
                          "smaller or non-negative integer");
  throw py::value_error(key + ": " + given.substr(0, 80) + " (" + given_type + ") is not of type " + want +
                        "; give a value of that type");
}

// The config types' attribute assignment (tp_setattro): set_config_field's messages. A slot, not a
// bound __setattr__, so that the generated stubs (and type checkers) still know each field.
inline int config_setattro(PyObject* self, PyObject* name, PyObject* value) {
  namespace py = pybind11;
  if (value == nullptr || !PyUnicode_Check(name)) return PyObject_GenericSetAttr(self, name, value);
  try {
    set_config_field(py::reinterpret_borrow<py::object>(self), py::cast<std::string>(py::handle(name)),
                     py::handle(value));
    return 0;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  }
  return -1;
}

}  // namespace detail

// Validate = false for types validated against something else later (a pool request against the
// pool's inventory). Assigning a field later (`config.window = "8"`) names it the same way.
template <class Config, bool Validate = true, class Class>
void def_kwargs_init(Class& cls) {
  namespace py = pybind11;
  cls.def(py::init([](const py::kwargs& kwargs) {
            auto config = std::make_unique<Config>();
            py::object self = py::cast(config.get(), py::return_value_policy::reference);
            for (auto item : kwargs) detail::set_config_field(self, item.first.cast<std::string>(), item.second);
            if constexpr (Validate) config->validate();
            return config;
          }),
          "Keyword construction; unknown keywords and invalid values raise ValueError.");
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_setattro = &detail::config_setattro;
  PyType_Modified(type);
}

}  // namespace dra::python
