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
              py::setattr(self, key.c_str(), item.second);
            }
            if constexpr (Validate) config->validate();
            return config;
          }),
          "Keyword construction; unknown keywords and invalid values raise ValueError.");
}

}  // namespace dra::python
