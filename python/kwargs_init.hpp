#pragma once
// Keyword construction for config structs: `EstimatorConfig(window=32)`. Unknown keywords raise
// ValueError naming the keyword and listing the valid ones; the struct is then validated, so a
// bad value raises ValueError naming the field before any object is created.
#include <pybind11/pybind11.h>

#include <string>

namespace dra::python {

// Validate = false for types validated against something else later (a pool request against the
// pool's inventory).
template <class Config, bool Validate = true, class Class>
void def_kwargs_init(Class& cls) {
  namespace py = pybind11;
  cls.def(py::init([](const py::kwargs& kwargs) {
            auto config = std::make_unique<Config>();
            py::object self = py::cast(config.get(), py::return_value_policy::reference);
            for (auto item : kwargs) {
              const auto key = item.first.cast<std::string>();
              if (key.rfind('_', 0) == 0 || !py::hasattr(self, key.c_str()) ||
                  py::isinstance<py::function>(py::getattr(self, key.c_str())) ||
                  py::hasattr(py::getattr(self, key.c_str()), "__func__")) {
                std::string valid;
                for (auto name : py::module_::import("builtins").attr("dir")(self)) {
                  const auto n = name.cast<std::string>();
                  if (n.rfind('_', 0) != 0 && n != "validate") valid += (valid.empty() ? "" : ", ") + n;
                }
                throw py::value_error("unknown option '" + key + "'; valid options: " + valid);
              }
              try {
                py::setattr(self, key.c_str(), item.second);
              } catch (py::error_already_set& e) {
                if (!e.matches(PyExc_TypeError)) throw;
                // pybind11's own message lists the setter's signature: name the field, the value
                // and the type it takes instead.
                const auto want = py::type::of(py::getattr(self, key.c_str())).attr("__name__").cast<std::string>();
                const auto given = py::repr(item.second).cast<std::string>();
                const auto given_type = py::type::of(item.second).attr("__name__").cast<std::string>();
                if (want == given_type)  // an integer beyond the field's C++ type (a negative seed, 2**70)
                  throw py::value_error(key + ": " + given.substr(0, 80) + " is out of range for this field; give a " +
                                        "smaller or non-negative integer");
                throw py::value_error(key + ": " + given.substr(0, 80) + " (" + given_type + ") is not of type " +
                                      want + "; give a value of that type");
              }
            }
            if constexpr (Validate) config->validate();
            return config;
          }),
          "Keyword construction; unknown keywords and invalid values raise ValueError.");
}

}  // namespace dra::python
