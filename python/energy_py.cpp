// Bindings of the energy readers and meter, energy objectives and their chooser.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>

#include "bindings.hpp"
#include "dra/energy/energy.hpp"
#include "dra/energy/readers.hpp"
#include "dra/engine.hpp"
#include "dra/policy/energy_policies.hpp"
#include "kwargs_init.hpp"

namespace py = pybind11;
using namespace dra::energy;
using namespace dra::policy;

namespace {
double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A meter that owns the reader chosen by detect_energy_reader and remembers why others were not used.
struct py_meter {
  std::unique_ptr<energy_meter> meter;
  std::vector<std::string> notes;
  std::string reader_name, scope;
};

energy_objective_kind objective_from(const std::string& name) {
  energy_objective_kind kind{};
  if (!energy_objective_named(name, &kind))
    dra::detail::throw_invalid(
        "kind",
        "unknown objective '" + name + "'; use 'min_energy_deadline', 'energy_delay', 'zeus_cost' or 'energy_budget'");
  return kind;
}
}  // namespace

namespace dra::python {

void bind_energy(py::module_& m) {
  py::class_<energy_interval>(m, "EnergyInterval", "Energy of one step or of the whole job, with its source.")
      .def_readonly("joules", &energy_interval::joules)
      .def_readonly("seconds", &energy_interval::seconds)
      .def_property_readonly("source", [](const energy_interval& e) { return std::string(to_string(e.source)); })
      .def_property_readonly("watts", &energy_interval::watts)
      .def("__repr__", [](const energy_interval& e) {
        return "EnergyInterval(joules=" + std::to_string(e.joules) + ", seconds=" + std::to_string(e.seconds) +
               ", source='" + to_string(e.source) + "')";
      });

  py::class_<py_meter>(m, "EnergyMeter",
                       "Per-step and per-job energy: NVML where a GPU counter can be read, RAPL where present, else "
                       "CPU-seconds x watts_per_core (estimated). `notes` says why a better reader was not used.")
      .def(py::init([](const std::string& nvml_library, const std::string& rapl_root, double watts_per_core,
                       bool try_nvml, bool try_rapl) {
             detect_options o;
             o.nvml_library = nvml_library;
             o.rapl_root = rapl_root;
             o.model.watts_per_core = watts_per_core;
             o.try_nvml = try_nvml;
             o.try_rapl = try_rapl;
             auto d = detect_energy_reader(o);
             auto out = std::make_unique<py_meter>();
             out->reader_name = d.reader->name();
             out->scope = d.reader->scope();
             out->notes = std::move(d.notes);
             out->meter = std::make_unique<energy_meter>(std::move(d.reader));
             out->meter->start(monotonic_s());
             return out;
           }),
           py::arg("nvml_library") = "libnvidia-ml.so.1", py::arg("rapl_root") = "/sys/class/powercap",
           py::arg("watts_per_core") = 10.0, py::arg("try_nvml") = true, py::arg("try_rapl") = true)
      .def(
          "mark", [](py_meter& self) { return self.meter->mark(monotonic_s()); },
          "Closes the current step now and returns its energy.")
      .def("restart", [](py_meter& self) { self.meter->start(monotonic_s()); })
      .def_property_readonly("last_step", [](const py_meter& self) { return self.meter->last_step(); })
      .def_property_readonly("job", [](const py_meter& self) { return self.meter->job(); })
      .def_property_readonly("steps", [](const py_meter& self) { return self.meter->steps(); })
      .def_property_readonly("source",
                             [](const py_meter& self) { return std::string(to_string(self.meter->source())); })
      .def_readonly("reader", &py_meter::reader_name)
      .def_readonly("scope", &py_meter::scope)
      .def_readonly("notes", &py_meter::notes);

  m.def("process_cpu_seconds", &process_cpu_seconds, "Busy CPU seconds of this process and its waited-for children.");

  py::class_<knob_setting>(m, "KnobSetting", "A point of the energy policies' knob space.")
      .def(py::init(
               [](int world_size, double global_batch, double sparsity, int compression_rank, double power_limit_w) {
                 return knob_setting{world_size, global_batch, sparsity, compression_rank, power_limit_w};
               }),
           py::arg("world_size") = 1, py::arg("global_batch") = 0.0, py::arg("sparsity") = 0.0,
           py::arg("compression_rank") = 0, py::arg("power_limit_w") = 0.0)
      .def_readwrite("world_size", &knob_setting::world_size)
      .def_readwrite("global_batch", &knob_setting::global_batch)
      .def_readwrite("sparsity", &knob_setting::sparsity)
      .def_readwrite("compression_rank", &knob_setting::compression_rank)
      .def_readwrite("power_limit_w", &knob_setting::power_limit_w);

  py::class_<energy_objective>(m, "EnergyObjective",
                               "kind: 'min_energy_deadline', 'energy_delay', 'zeus_cost' or 'energy_budget'.")
      .def(py::init([](const std::string& kind, double eta, double deadline_s, double budget_j) {
             energy_objective o{objective_from(kind), eta, deadline_s, budget_j};
             o.validate();
             return o;
           }),
           py::arg("kind") = "zeus_cost", py::arg("eta") = 0.5, py::arg("deadline_s") = INFINITY,
           py::arg("budget_j") = INFINITY)
      .def_property_readonly("kind", [](const energy_objective& o) { return std::string(to_string(o.kind)); })
      .def_readonly("eta", &energy_objective::eta)
      .def_readonly("deadline_s", &energy_objective::deadline_s)
      .def_readonly("budget_j", &energy_objective::budget_j)
      .def(
          "zeus_cost",
          [](const energy_objective& o, double energy_j, double time_s, double max_power_w) {
            return o.zeus_cost({time_s, energy_j, max_power_w, true});
          },
          py::arg("energy_j"), py::arg("time_s"), py::arg("max_power_w"));

  py::class_<energy_policy_config> pcfg(
      m, "EnergyPolicyConfig",
      "Settings of the energy policies (EngineConfig.energy); the objective's kind comes "
      "from EngineConfig.policy.");
  def_kwargs_init<energy_policy_config>(pcfg);
  pcfg.def_readwrite("objective", &energy_policy_config::objective)
      .def_readwrite("watts_per_device", &energy_policy_config::watts_per_device)
      .def_readwrite("max_watts_per_device", &energy_policy_config::max_watts_per_device)
      .def_readwrite("adapt_batch", &energy_policy_config::adapt_batch)
      .def_readwrite("min_per_rank_batch", &energy_policy_config::min_per_rank_batch)
      .def_readwrite("max_per_rank_batch", &energy_policy_config::max_per_rank_batch)
      .def_readwrite("job_deadline_s", &energy_policy_config::job_deadline_s)
      .def_readwrite("job_budget_j", &energy_policy_config::job_budget_j)
      .def("validate", &energy_policy_config::validate);
  // EngineConfig (policy_py.cpp) is bound before this class exists: its `energy` section is
  // attached here, so signatures name the Python type.
  py::reinterpret_borrow<py::class_<dra::engine_config>>(m.attr("EngineConfig"))
      .def_readwrite("energy", &dra::engine_config::energy, "Settings of the energy policies.");

  py::class_<energy_choice>(m, "EnergyChoice")
      .def_readonly("setting", &energy_choice::setting)
      .def_readonly("index", &energy_choice::index)
      .def_readonly("constraint_met", &energy_choice::constraint_met)
      .def_readonly("reason", &energy_choice::reason)
      .def_property_readonly("time_s", [](const energy_choice& c) { return c.prediction.time_s; })
      .def_property_readonly("energy_j", [](const energy_choice& c) { return c.prediction.energy_j; });

  m.def(
      "choose_setting",
      [](const energy_objective& obj, const std::vector<knob_setting>& candidates, const std::vector<double>& time_s,
         const std::vector<double>& energy_j, const std::vector<double>& max_power_w) {
        if (time_s.size() != candidates.size() || energy_j.size() != candidates.size() ||
            max_power_w.size() != candidates.size())
          dra::detail::throw_invalid("predictions", "time_s, energy_j and max_power_w need one value per candidate (" +
                                                        std::to_string(candidates.size()) + ")");
        std::vector<energy_prediction> preds;
        for (std::size_t i = 0; i < candidates.size(); ++i)
          preds.push_back({time_s[i], energy_j[i], max_power_w[i], true});
        return choose_setting(obj, candidates, preds);
      },
      py::arg("objective"), py::arg("candidates"), py::arg("time_s"), py::arg("energy_j"), py::arg("max_power_w"),
      "dra's energy chooser (the one the live energy policies use) over predicted candidates. Non-finite predictions "
      "are skipped.");
}

}  // namespace dra::python
