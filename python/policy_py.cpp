#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "dra/engine.hpp"
#include "kwargs_init.hpp"
#include "to_dict.hpp"

namespace py = pybind11;
using namespace dra::policy;

void dra::python::bind_policy(py::module_& m) {
  py::class_<world_state>(m, "WorldState", "The job's world at a step boundary, as the leader sees it.")
      .def(py::init<>())
      .def_readwrite("size", &world_state::size)
      .def_readwrite("active", &world_state::active)
      .def_readwrite("candidates", &world_state::candidates)
      .def_readwrite("step", &world_state::step)
      .def_readwrite("steps_since_resize", &world_state::steps_since_resize)
      .def_readwrite("remaining_steps", &world_state::remaining_steps)
      .def_readwrite("global_batch", &world_state::global_batch)
      .def_readwrite("base_batch", &world_state::base_batch);
  py::class_<capacity>(m, "Capacity", "Devices the job could have now.")
      .def(py::init<>())
      .def(py::init([](int available) { return capacity{available}; }), py::arg("available"))
      .def_readwrite("available", &capacity::available)
      .def_readwrite("device_price", &capacity::device_price);
  py::class_<cost_model>(m, "CostModel", "Measured resize cost and the horizon a resize must pay back over.")
      .def(py::init<>())
      .def(
          py::init([](double resize_cost_s, double horizon_steps) { return cost_model{resize_cost_s, horizon_steps}; }),
          py::arg("resize_cost_s"), py::arg("horizon_steps") = 500.0)
      .def_readwrite("resize_cost_s", &cost_model::resize_cost_s)
      .def_readwrite("horizon_steps", &cost_model::horizon_steps);

  def_to_dict(py::class_<decision>(m, "Decision",
                                   "A resize decision: target size, who leaves, who joins, batch/LR scale, reason."))
      .def(py::init<>())
      .def_property_readonly("action", [](const decision& d) { return to_string(d.kind); })
      .def_readonly("target_size", &decision::target_size)
      .def_readonly("members", &decision::members)
      .def_readonly("leave", &decision::leave)
      .def_readonly("join", &decision::join)
      .def_readonly("batch_scale", &decision::batch_scale)
      .def_readonly("lr_scale", &decision::lr_scale)
      .def_readonly("predicted_speedup", &decision::predicted_speedup)
      .def_readonly("reason", &decision::reason)
      .def_readonly("policy", &decision::policy)
      .def("__repr__", [](const decision& d) {
        return "<Decision " + std::string(to_string(d.kind)) + " -> " + std::to_string(d.target_size) + ": " +
               d.reason + ">";
      });

  py::class_<throughput_predictor>(m, "ThroughputPredictor",
                                   "Predicts seconds per step for a world size and per-rank batch.")
      .def("step_time_s", &throughput_predictor::step_time_s, py::arg("world_size"), py::arg("per_rank_batch"))
      .def("throughput", &throughput_predictor::throughput, py::arg("world_size"), py::arg("per_rank_batch"));

  py::class_<throughput_model_config> tcfg(m, "ThroughputModelConfig",
                                           "Priors and settings of the online throughput model.");
  def_kwargs_init<throughput_model_config>(tcfg);
  tcfg.def_readwrite("gamma", &throughput_model_config::gamma)
      .def_readwrite("prior_compute_fixed_s", &throughput_model_config::prior_compute_fixed_s)
      .def_readwrite("prior_compute_per_sample_s", &throughput_model_config::prior_compute_per_sample_s)
      .def_readwrite("prior_sync_fixed_s", &throughput_model_config::prior_sync_fixed_s)
      .def_readwrite("prior_sync_per_rank_s", &throughput_model_config::prior_sync_per_rank_s)
      .def_readwrite("prior_weight", &throughput_model_config::prior_weight)
      .def_readwrite("forgetting", &throughput_model_config::forgetting)
      .def("validate", &throughput_model_config::validate);
  py::class_<throughput_model, throughput_predictor>(m, "ThroughputModel",
                                                     "Pollux throughput model fitted online from measured steps.")
      .def(py::init<throughput_model_config>(),
           py::arg_v("config", throughput_model_config{}, "ThroughputModelConfig()"))
      .def("observe", &throughput_model::observe, py::arg("world_size"), py::arg("per_rank_batch"),
           py::arg("step_time_s"), py::arg("sync_time_s"))
      .def("compute_time_s", &throughput_model::compute_time_s, py::arg("per_rank_batch"))
      .def("sync_time_s", &throughput_model::sync_time_s, py::arg("world_size"))
      .def_property_readonly("observations", &throughput_model::observations);

  m.def("statistical_efficiency", &statistical_efficiency, py::arg("noise_scale"), py::arg("valid"),
        py::arg("global_batch"), py::arg("base_batch"),
        "(B + M0) / (B + M): efficiency of global batch M relative to M0.");
  m.def("adascale_gain", &adascale_gain, py::arg("noise_scale"), py::arg("valid"), py::arg("global_batch"),
        py::arg("base_batch"), "AdaScale learning-rate gain for global batch M.");

  py::class_<dra::policy::policy, std::shared_ptr<dra::policy::policy>>(
      m, "Policy",
      "A resize policy (wrap it in ConstrainedPolicy to decide). Policies are C++: the classes are final, "
      "since the engine would never call a Python override (docs/guide/policy.md, 'Your own policy').")
      // Without a constructor pybind11 said only "No constructor defined!" to a Python subclass.
      .def(py::init([](const py::args&, const py::kwargs&) -> std::shared_ptr<dra::policy::policy> {
        throw py::type_error(
            "dra._core.Policy cannot be built or subclassed in Python: the engine decides in C++ and would "
            "never call a Python propose(). Pick a built-in policy by name (dra.Controller(policy=...)), "
            "add a C++ policy to dra/policy/registry.hpp and rebuild, or decide in Python with "
            "policy='none' and JobControl.set_capacity (docs/guide/policy.md, 'Your own policy')");
      }))
      .def_property_readonly("name", &dra::policy::policy::name);
  py::class_<goodput_config> gcfg(m, "GoodputConfig", "Settings of the goodput policy.");
  def_kwargs_init<goodput_config>(gcfg);
  gcfg.def_readwrite("min_marginal_efficiency", &goodput_config::min_marginal_efficiency)
      .def_readwrite("adapt_batch", &goodput_config::adapt_batch)
      .def_readwrite("min_per_rank_batch", &goodput_config::min_per_rank_batch)
      .def_readwrite("max_per_rank_batch", &goodput_config::max_per_rank_batch)
      .def("validate", &goodput_config::validate);
  py::class_<goodput_policy, dra::policy::policy, std::shared_ptr<goodput_policy>>(
      m, "GoodputPolicy", py::is_final(), "Pollux-style: the size maximising throughput x statistical efficiency.")
      .def(py::init<goodput_config>(), py::arg_v("config", goodput_config{}, "GoodputConfig()"));
  py::class_<convergence_phase_config> ccfg(m, "ConvergencePhaseConfig", "Settings of the convergence-phase policy.");
  def_kwargs_init<convergence_phase_config>(ccfg);
  ccfg.def_readwrite("grow_step", &convergence_phase_config::grow_step)
      .def_readwrite("min_parallel_efficiency", &convergence_phase_config::min_parallel_efficiency)
      .def_readwrite("plateau_size", &convergence_phase_config::plateau_size)
      .def("validate", &convergence_phase_config::validate);
  py::class_<convergence_phase_policy, dra::policy::policy, std::shared_ptr<convergence_phase_policy>>(
      m, "ConvergencePhasePolicy", py::is_final(),
      "Grow while learning is fast and scaling efficient; release on plateau; hold otherwise.")
      .def(py::init<convergence_phase_config>(),
           py::arg_v("config", convergence_phase_config{}, "ConvergencePhaseConfig()"));

  py::class_<convergence_aware_config> acfg(m, "ConvergenceAwareConfig", "Settings of the convergence-aware policy.");
  def_kwargs_init<convergence_aware_config>(acfg);
  acfg.def_readwrite("price_floor", &convergence_aware_config::price_floor)
      .def_readwrite("plateau_price", &convergence_aware_config::plateau_price)
      .def_readwrite("min_gain", &convergence_aware_config::min_gain)
      .def_readwrite("max_global_batch", &convergence_aware_config::max_global_batch)
      .def_readwrite("min_per_rank_batch", &convergence_aware_config::min_per_rank_batch)
      .def_readwrite("batch_candidates", &convergence_aware_config::batch_candidates)
      .def("validate", &convergence_aware_config::validate);
  py::class_<convergence_aware_policy, dra::policy::policy, std::shared_ptr<convergence_aware_policy>>(
      m, "ConvergenceAwarePolicy", py::is_final(), "Goodput over size and batch together, with a price per device.")
      .def(py::init<convergence_aware_config>(),
           py::arg_v("config", convergence_aware_config{}, "ConvergenceAwareConfig()"));

  py::class_<constraints> lim(m, "Constraints", "Limits around any policy: sizes, cooldown, hysteresis, amortisation.");
  def_kwargs_init<constraints>(lim);
  lim.def_readwrite("min_size", &constraints::min_size)
      .def_readwrite("max_size", &constraints::max_size)
      .def_readwrite("allowed_sizes", &constraints::allowed_sizes)
      .def_readwrite("cooldown_steps", &constraints::cooldown_steps)
      .def_readwrite("hysteresis_decisions", &constraints::hysteresis_decisions)
      .def_readwrite("max_change", &constraints::max_change)
      .def_readwrite("amortise", &constraints::amortise)
      .def("validate", &constraints::validate)
      .def("allows", &constraints::allows, py::arg("size"));
  py::class_<constrained_policy>(m, "ConstrainedPolicy", "A policy inside constraints: the object that decides.")
      .def(py::init([](std::shared_ptr<dra::policy::policy> inner, constraints limits) {
             return constrained_policy(std::move(inner), std::move(limits));
           }),
           py::arg("policy"), py::arg_v("constraints", constraints{}, "Constraints()"))
      .def("decide", &constrained_policy::decide, py::arg("signals"), py::arg("world"), py::arg("capacity"),
           py::arg("costs"), py::arg("throughput"));

  using dra::engine_config;
  using dra::engine_status;
  using dra::resize_engine;
  py::class_<engine_status>(m, "EngineStatus", "Result of one engine step (a view, valid until the next step).")
      .def_readonly("step", &engine_status::step)
      .def_readonly("decided", &engine_status::decided)
      .def_readonly("last_decision", &engine_status::last_decision)
      .def_readonly("decisions", &engine_status::decisions);
  py::class_<engine_config> ecfg(m, "EngineConfig", "Estimator, throughput model, policy and constraints of one job.");
  def_kwargs_init<engine_config>(ecfg);
  ecfg.def_readwrite("estimator", &engine_config::estimator)
      .def_readwrite("throughput", &engine_config::throughput)
      .def_readwrite("limits", &engine_config::limits)
      .def_readwrite("costs", &engine_config::costs)
      .def_readwrite("policy", &engine_config::policy)
      .def_readwrite("convergence", &engine_config::convergence)
      .def_readwrite("goodput", &engine_config::goodput)
      .def_readwrite("convergence_aware", &engine_config::convergence_aware)
      .def_readwrite("decide_every", &engine_config::decide_every)
      .def_readwrite("declared_steps", &engine_config::declared_steps,
                     "The job's declared budget in steps (0: none); sets world.remaining_steps from the estimate.")
      .def_readwrite("remaining_work", &engine_config::remaining_work)
      .def("validate", &engine_config::validate);
  py::class_<resize_engine>(m, "ResizeEngine", "Per-job decision engine fed once per step.")
      .def(py::init<engine_config>(), py::arg("config"))
      .def("step", &resize_engine::step, py::arg("step"), py::arg("loss"), py::return_value_policy::reference_internal)
      .def("observe", &resize_engine::observe, py::arg("step"), py::arg("loss"),
           "Feeds a step's loss without deciding (the members of a live world that are not the leader).")
      .def("decide", &resize_engine::decide, py::return_value_policy::reference_internal)
      .def("resized", &resize_engine::resized, py::arg("new_size"), py::arg("new_global_batch"))
      .def_property_readonly("signals", &resize_engine::signals, py::return_value_policy::reference_internal)
      .def_property_readonly("estimator", py::overload_cast<>(&resize_engine::estimator),
                             py::return_value_policy::reference_internal)
      .def_property_readonly("throughput", py::overload_cast<>(&resize_engine::throughput),
                             py::return_value_policy::reference_internal)
      .def_property_readonly("world", py::overload_cast<>(&resize_engine::world),
                             py::return_value_policy::reference_internal)
      .def_property_readonly("capacity", py::overload_cast<>(&resize_engine::capacity),
                             py::return_value_policy::reference_internal)
      .def_property_readonly("costs", py::overload_cast<>(&resize_engine::costs),
                             py::return_value_policy::reference_internal)
      .def_property_readonly("status", &resize_engine::status, py::return_value_policy::reference_internal)
      .def_property_readonly("remaining", &resize_engine::remaining, py::return_value_policy::reference_internal,
                             "The remaining-work estimate (steps) at the latest decision.")
      .def_property_readonly("config", &resize_engine::config, py::return_value_policy::reference_internal)
      .def_property_readonly("last_step", &resize_engine::last_step,
                             "Step index of the latest step, -1 before the first.")
      .def("desired_size", &resize_engine::desired_size,
           "The size the policy would choose if every device it might want were free (what a job asks a pool for).");
}
