// The policy registry (include/dra/policy/registry.hpp) as Python sees it, in dra._core and in the
// torch-free dra._sim alike: dra.sim's policy names, dra.Controller's options and the tests read it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "dra/policy/registry.hpp"

namespace py = pybind11;

namespace {
const char* scheduler_name(dra::policy::sim_scheduler s) {
  using k = dra::policy::sim_scheduler;
  switch (s) {
    case k::first_come:
      return "first_come";
    case k::tiresias:
      return "tiresias";
    case k::per_job:
      return "per_job";
    case k::cluster:
      return "cluster";
    case k::cluster_or_per_job:
      return "cluster_or_per_job";
    case k::none:
      break;
  }
  return "";
}
}  // namespace

void dra::python::bind_registry(py::module_& m) {
  m.def(
      "policy_registry",
      [] {
        py::list out;
        for (const auto& e : dra::policy::policy_registry::entries()) {
          py::dict d;
          d["name"] = e.name;
          d["section"] = e.section.empty() ? py::object(py::none()) : py::object(py::str(e.section));
          d["engine"] = e.engine;
          d["simulator"] = e.simulator == dra::policy::sim_scheduler::none
                               ? py::object(py::none())
                               : py::object(py::str(scheduler_name(e.simulator)));
          d["mechanism"] = e.in_place ? "in_place" : "restart";
          d["summary"] = e.summary;
          out.append(d);
        }
        return out;
      },
      "Every policy by name: its settings section (None: none), whether the live engine runs it, how the "
      "simulator schedules it (None: not simulated), how its system changes devices (in_place or restart) and a "
      "one-line summary, in the order reports list them.");
  m.def(
      "policy_sections", [] { return dra::policy::policy_section_names(); },
      "Names of the policy settings sections (options of dra.Controller, members of EngineConfig).");
}
