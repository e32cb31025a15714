// dra.Controller: the controller of one process (include/dra/torch/elastic/controller.hpp), its
// options (parsed once, here, with errors that name the option) and the step status every dra.step
// returns. dra.step's fast path is step_py.cpp.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "dra/torch/elastic/codec_hook.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "dra/torch/elastic/options.hpp"
#include "to_dict.hpp"

namespace py = pybind11;
using namespace dra::elastic;

namespace {

// ---- options -------------------------------------------------------------------------------------
[[noreturn]] void bad(const std::string& option, const std::string& problem) {
  throw py::value_error(option + ": " + problem);
}

std::string shown(py::handle v) {
  return py::repr(v).cast<std::string>() + " (" + std::string(py::str(py::type::handle_of(v).attr("__name__"))) + ")";
}

// Python values of the controller's other arguments (dra.step's signals, join=, store_address=).
long long as_int(py::handle v, const std::string& name, long long lo = 0, long long hi = INT_MAX) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) bad(name, "expected an integer, got " + shown(v));
  long long out = 0;
  try {
    out = v.cast<long long>();
  } catch (const py::cast_error&) {
    bad(name, "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + shown(v));
  }
  if (out < lo || out > hi)
    bad(name, "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(out));
  return out;
}

double as_float(py::handle v, const std::string& name) {
  if ((!py::isinstance<py::float_>(v) && !py::isinstance<py::int_>(v)) || py::isinstance<py::bool_>(v))
    bad(name, "expected a number, got " + shown(v));
  return v.cast<double>();
}

bool as_bool(py::handle v, const std::string& name) {
  if (!py::isinstance<py::bool_>(v)) bad(name, "expected True or False, got " + shown(v));
  return v.cast<bool>();
}

std::string as_str(py::handle v, const std::string& name) {
  if (!py::isinstance<py::str>(v)) bad(name, "expected a string, got " + shown(v));
  return v.cast<std::string>();
}

// A config section: an object of its class, or a dict of its keywords.
template <class Config>
Config as_section(py::handle v, const std::string& name, const char* class_name) {
  if (py::isinstance<Config>(v)) return v.cast<Config>();
  if (py::isinstance<py::dict>(v)) {
    try {
      return py::module_::import("dra._core").attr(class_name)(**v.cast<py::dict>()).cast<Config>();
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_ValueError)) throw;
      bad(name, py::str(e.value()).cast<std::string>());
    }
  }
  bad(name, std::string("expected a dra.") + class_name + " or a dict of its options, got " + shown(v));
}

// The engine sections take Python objects (dra.EstimatorConfig, ...) or dicts; every other option
// is set through the one C++ table (include/dra/torch/elastic/options.hpp) from its JSON value.
using section_setter = std::function<void(controller_options&, py::handle)>;
const std::map<std::string, section_setter>& section_table() {
  static const std::map<std::string, section_setter> table = {
      {"estimator",
       [](controller_options& o, py::handle v) {
         o.engine.estimator = as_section<dra::signals::estimator_config>(v, "estimator", "EstimatorConfig");
       }},
      {"throughput",
       [](controller_options& o, py::handle v) {
         o.engine.throughput =
             as_section<dra::policy::throughput_model_config>(v, "throughput", "ThroughputModelConfig");
       }},
      {"limits",
       [](controller_options& o, py::handle v) {
         o.engine.limits = as_section<dra::policy::constraints>(v, "limits", "Constraints");
       }},
      {"convergence",
       [](controller_options& o, py::handle v) {
         o.engine.convergence =
             as_section<dra::policy::convergence_phase_config>(v, "convergence", "ConvergencePhaseConfig");
       }},
      {"goodput",
       [](controller_options& o, py::handle v) {
         o.engine.goodput = as_section<dra::policy::goodput_config>(v, "goodput", "GoodputConfig");
       }},
      {"convergence_aware",
       [](controller_options& o, py::handle v) {
         o.engine.convergence_aware =
             as_section<dra::policy::convergence_aware_config>(v, "convergence_aware", "ConvergenceAwareConfig");
       }},
      {"energy",
       [](controller_options& o, py::handle v) {
         o.engine.energy = as_section<dra::policy::energy_policy_config>(v, "energy", "EnergyPolicyConfig");
       }},
  };
  return table;
}

// A Python value as JSON text for the C++ table: int, float, bool, str, None, os.PathLike (a path),
// and dicts/lists of those (a dict's keys become strings, as in JSON). Anything else is refused
// naming the option and what it takes.
std::string to_json(py::handle v, const std::string& name) {
  // Not static: a py::object destroyed with the process's statics outlives the interpreter.
  const py::object dumps = py::module_::import("json").attr("dumps");
  const py::object fspath = py::module_::import("os").attr("fspath");
  py::object value = py::reinterpret_borrow<py::object>(v);
  if (py::hasattr(value, "__fspath__")) value = fspath(value);
  const auto plain = [](py::handle x) {
    return x.is_none() || py::isinstance<py::bool_>(x) || py::isinstance<py::int_>(x) ||
           py::isinstance<py::float_>(x) || py::isinstance<py::str>(x);
  };
  bool ok = plain(value);
  if (py::isinstance<py::dict>(value)) {
    ok = true;
    for (auto item : value.cast<py::dict>()) ok = ok && plain(item.first) && plain(item.second);
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    ok = true;
    for (auto item : value) ok = ok && plain(item);
  }
  if (ok && py::isinstance<py::float_>(value) && !std::isfinite(value.cast<double>())) ok = false;
  if (ok && py::isinstance<py::dict>(value))  // a NaN or inf inside: name the key, not the whole dict
    for (auto item : value.cast<py::dict>())
      if (py::isinstance<py::float_>(item.second) && !std::isfinite(item.second.cast<double>()))
        bad(name + "." + py::str(item.first).cast<std::string>(),
            "must be a finite number, got " + py::repr(item.second).cast<std::string>());
  if (!ok) bad(name, "expected " + option_expects(name) + ", got " + shown(v));
  try {
    return dumps(value, py::arg("allow_nan") = false).cast<std::string>();
  } catch (py::error_already_set&) {
    bad(name, "expected " + option_expects(name) + ", got " + shown(v));
  }
}

controller_options parse_options(const py::kwargs& kwargs) {
  const auto& sections = section_table();
  controller_options o;
  // Sections first, then the flat names that reach into them: `min_size=` wins over `limits=`'s.
  for (const auto& [name, set] : sections)
    if (kwargs.contains(name) && !kwargs[name.c_str()].is_none()) set(o, kwargs[name.c_str()]);
  for (auto item : kwargs) {
    const auto name = item.first.cast<std::string>();
    try {
      if (is_option_section(name) || item.second.is_none()) continue;  // is_option_section names an unknown one
      set_option(o, name, to_json(item.second, name));
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  }
  try {
    o.validate();
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
  return o;
}

// ---- the controller --------------------------------------------------------------------------------
// Destroys a controller without the GIL (its communicator's teardown waits for Gloo threads that
// may need the GIL).
struct delete_without_gil {
  void operator()(controller* c) const {
    py::gil_scoped_release nogil;
    delete c;
  }
};
using controller_ptr = std::unique_ptr<controller, delete_without_gil>;

step_signals parse_signals(const py::kwargs& kwargs) {
  static const std::map<std::string, double step_signals::*> fields = {
      {"small_sqr_norm", &step_signals::small_sqr_norm}, {"small_batch", &step_signals::small_batch},
      {"big_sqr_norm", &step_signals::big_sqr_norm},     {"big_batch", &step_signals::big_batch},
      {"validation", &step_signals::validation},         {"step_time_s", &step_signals::step_time_s},
      {"sync_time_s", &step_signals::sync_time_s}};
  step_signals s;
  std::vector<std::string> gradient_keys;
  for (auto item : kwargs) {
    const auto name = item.first.cast<std::string>();
    const auto it = fields.find(name);
    if (it == fields.end()) {
      std::string valid;
      for (const auto& [n, _] : fields) valid += (valid.empty() ? "" : ", ") + n;
      throw py::value_error("dra.step: unknown signal '" + name + "'; valid: " + valid);
    }
    if (item.second.is_none()) continue;
    s.*(it->second) = as_float(item.second, "dra.step: " + name);
    if (name.find("_batch") != std::string::npos || name.find("_sqr_norm") != std::string::npos)
      gradient_keys.push_back(name);
  }
  // In step_signals NaN means "not given": a NaN the caller gave must still be counted as the
  // non-finite value it is, and a missing gradient statistic named rather than read as NaN.
  if (!gradient_keys.empty() && gradient_keys.size() != 4) {
    std::string missing;
    for (const char* key : {"small_sqr_norm", "small_batch", "big_sqr_norm", "big_batch"})
      if (std::find(gradient_keys.begin(), gradient_keys.end(), key) == gradient_keys.end())
        missing += (missing.empty() ? "" : ", ") + std::string(key);
    throw py::value_error(
        "small_sqr_norm: gradient statistics need all of small_sqr_norm, small_batch, big_sqr_norm, big_batch; "
        "missing " +
        missing);
  }
  // A batch size is what tells "given" from "not given" (NaN) in step_signals: a NaN one given
  // read as a missing statistic. Named here, with its value.
  for (const auto& [key, value] : {std::pair<const char*, double>{"small_batch", s.small_batch},
                                   std::pair<const char*, double>{"big_batch", s.big_batch}})
    if (!gradient_keys.empty() && !(std::isfinite(value) && value > 0.0))
      throw py::value_error(std::string(key) + ": must be a finite number of samples > 0, got " +
                            py::repr(py::float_(value)).cast<std::string>());
  if (kwargs.contains("validation") && !kwargs["validation"].is_none() && std::isnan(s.validation))
    s.validation = std::numeric_limits<double>::infinity();  // counted in nonfinite_count, as an inf is
  return s;
}

py::object event_dict(const std::string& line) {
  if (line.empty()) return py::none();
  return py::module_::import("json").attr("loads")(line);
}

}  // namespace

void dra::python::bind_controller(py::module_& m) {
  py::class_<controller_options>(
      m, "Options", "The options of a dra.Controller, parsed and validated once (ValueError names the option).")
      .def(py::init(&parse_options), "Options(**options): unknown names and bad values raise ValueError.")
      .def_static(
          "names", [] { return option_names(); }, "The option names dra.Controller takes.")
      .def_readonly("engine", &controller_options::engine)
      .def_readonly("start_size", &controller_options::start_size)
      .def_property_readonly(
          "release",
          [](const controller_options& o) -> py::object {
            return o.release ? py::object(py::str(to_string(*o.release))) : py::object(py::none());
          },
          "'standby', 'exit' or 'return'; None: exit on a GPU backend (NCCL), else standby.")
      .def_property_readonly(
          "batch_mode",
          [](const controller_options& o) { return o.batch == batch_mode::adascale ? "adascale" : "fixed"; })
      .def_readonly("resize_schedule", &controller_options::resize_schedule)
      .def_readonly("fault_timeout_s", &controller_options::fault_timeout_s)
      .def_readonly("store_timeout_s", &controller_options::store_timeout_s)
      .def_readonly("chunk_mb", &controller_options::chunk_mb)
      .def_readonly("verify", &controller_options::verify)
      .def_readonly("heal", &controller_options::heal,
                    "After a fault, re-admit waiting processes up to the size the world had before it.")
      .def_readonly("capacity_poll_s", &controller_options::capacity_poll_s)
      .def_property_readonly("handoff",
                             [](const controller_options& o) { return o.deferred_handoff ? "deferred" : "full"; })
      .def_readonly("events_path", &controller_options::events_path)
      .def_readonly("status_every", &controller_options::status_every)
      .def_readonly("max_resize_retries", &controller_options::max_resize_retries)
      .def_readonly("backend", &controller_options::backend)
      .def_readonly("backend_address", &controller_options::backend_address)
      .def_readonly("compress", &controller_options::compress,
                    "Gradient codec of the bucketed reduction ('' : a plain all-reduce).")
      .def_property_readonly(
          "sparsity",
          [](const controller_options& o) {
            const auto& c = o.sparsity;
            py::dict d;
            d["max_sparsity"] = c.max_sparsity;
            d["every"] = c.every;
            d["alpha"] = c.alpha;
            d["end_step"] = c.end_step;
            d["step_up"] = c.step_up;
            d["step_down"] = c.step_down;
            d["ramp_start"] = c.ramp_start;
            d["ramp_steps"] = c.ramp_steps;
            return d;
          },
          "How the 'masked' codec's RigL masks move (a dict of the rigl_config fields).");

  // exit_requested and released steer the caller (dra.step's wrapper); the dict records the step.
  def_to_dict(py::class_<dra::elastic::step_status>(
                  m, "StepStatus",
                  "What dra.step returns, in one process and in an elastic world alike: the controller's "
                  "status after the step (the same object every step: copy with to_dict())."),
              {"exit_requested", "released"})
      .def_readonly("step", &dra::elastic::step_status::step,
                    "Index of the latest committed step (-1 before the first).")
      .def_readonly("committed", &dra::elastic::step_status::committed,
                    "This call committed a step (its update applied everywhere).")
      .def_readonly("loss", &dra::elastic::step_status::loss,
                    "The world's mean loss of the latest step (an elastic world learns it one step late).")
      .def_readonly("world_size", &dra::elastic::step_status::world_size)
      .def_readonly("rank", &dra::elastic::step_status::rank, "This process's rank in the world now (-1 outside it).")
      .def_readonly("epoch", &dra::elastic::step_status::epoch, "The world epoch (-1 outside a world).")
      .def_readonly("decided", &dra::elastic::step_status::decided, "A decision was taken at this step.")
      .def_readonly("decision", &dra::elastic::step_status::decision, "The latest decision.")
      .def_property_readonly(
          "signals",
          [](const dra::elastic::step_status& s) -> const dra::signals::convergence_signals& { return *s.signals; },
          py::return_value_policy::reference_internal, "The controller's convergence signals now.")
      .def_property_readonly(
          "event", [](const dra::elastic::step_status& s) { return event_dict(s.event); },
          "The world change at this step boundary (a dict), or None.")
      .def_readonly("exit_requested", &dra::elastic::step_status::exit_requested)
      .def_readonly("released", &dra::elastic::step_status::released,
                    "Released with release='return': out of the world until Controller.rejoin().")
      .def_readonly("energy_step_j", &dra::elastic::step_status::energy_step_j,
                    "Energy of the world's processes in the latest step whose figures arrived (one step late; NaN "
                    "alone).")
      .def_readonly("energy_job_j", &dra::elastic::step_status::energy_job_j,
                    "Energy of the world's processes since the job started (NaN alone).")
      .def_readonly("energy_source", &dra::elastic::step_status::energy_source,
                    "'measured' only when every process measured its energy, else 'estimated' ('' alone).")
      .def("__repr__", [](const dra::elastic::step_status& s) {
        return "<StepStatus step=" + std::to_string(s.step) + " world=" + std::to_string(s.world_size) +
               " phase=" + dra::signals::to_string(s.signals->phase) +
               " decision=" + dra::policy::to_string(s.decision.kind) + ">";
      });

  // What Controller.handoff, .energy and .device_reads return (as dicts).
  def_to_dict(py::class_<controller::handoff_stats>(m, "HandoffStats", "This process's latest state handoff."))
      .def_readonly("deferred", &controller::handoff_stats::deferred)
      .def_readonly("bytes", &controller::handoff_stats::bytes)
      .def_readonly("skipped_bytes", &controller::handoff_stats::skipped_bytes)
      .def_readonly("deferred_bytes", &controller::handoff_stats::deferred_bytes)
      .def_readonly("deferred_s", &controller::handoff_stats::deferred_s)
      .def_readonly("wait_s", &controller::handoff_stats::wait_s);
  def_to_dict(py::class_<process_energy>(m, "ProcessEnergy", "This process's own energy."))
      .def_readonly("step_j", &process_energy::step_j)
      .def_readonly("job_j", &process_energy::job_j)
      .def_readonly("source", &process_energy::source)
      .def_readonly("reader", &process_energy::reader)
      .def_readonly("scope", &process_energy::scope);
  def_to_dict(py::class_<device_read_stats>(m, "DeviceReadStats", "Host reads of device values."))
      .def_readonly("reads", &device_read_stats::reads)
      .def_readonly("blocking_waits", &device_read_stats::blocking_waits);

  // Every call that may block on the store or a collective, or tear a process group down, runs
  // without the GIL: c10d's Gloo threads take the GIL when they release tensors, so holding it
  // there deadlocks (~ProcessGroupGloo waits for them). Callbacks into Python re-acquire it.
  using nogil = py::call_guard<py::gil_scoped_release>;
  py::class_<controller, controller_ptr>(m, "Controller",
                                         "The controller of one process (C++); dra.Controller extends it.")
      .def(py::init([](const controller_options& o) { return controller_ptr(new controller(o)); }), py::arg("options"))
      .def(py::init([](controller_options o, std::shared_ptr<state_provider> state,
                       std::shared_ptr<elastic_sampler> sampler, py::object store_address, py::object join,
                       py::object phase_hook) {
             if (!phase_hook.is_none()) {
               // Held by the options (the controller's lifetime), called with the GIL; the
               // controller may be destroyed without it, so the reference is dropped under it.
               std::shared_ptr<py::object> hook(new py::object(phase_hook), [](py::object* h) {
                 py::gil_scoped_acquire gil;
                 delete h;
               });
               o.phase_hook = [hook](change_phase phase, const controller& self) {
                 py::gil_scoped_acquire gil;
                 try {
                   (*hook)(py::cast(const_cast<controller*>(&self), py::return_value_policy::reference),
                           to_string(phase));
                 } catch (py::error_already_set& e) {
                   // A fault the test injects: the controller handles it as a failure of that phase.
                   throw dra::comm_error(std::string("dra.testing phase hook raised at ") + to_string(phase) + ": " +
                                         e.what());
                 }
               };
             }
             // A wait for admission (a candidate here, a standby in step, rejoin) runs without the
             // GIL: Python's signal handlers run every ~100 ms through this check, so Ctrl-C raises
             // KeyboardInterrupt from the call that waited (the registration withdrawn), and a
             // script's own handler (dra run's SIGTERM stop) runs in time.
             if (!o.interrupt_check) {
               o.interrupt_check = [] {
                 py::gil_scoped_acquire gil;
                 if (PyErr_CheckSignals() != 0) throw py::error_already_set();
               };
             }
             launch_info l = launch_info::from_env();
             if (!join.is_none()) l.join = as_bool(join, "join");
             if (!store_address.is_none()) {
               const auto addr = store_address.cast<py::tuple>();
               if (addr.size() != 2) bad("store_address", "expected (host, port), got " + shown(store_address));
               l.store_host = as_str(addr[0], "store_address");
               l.store_port = static_cast<int>(as_int(addr[1], "store_address", 0, 65535));
               l.host_store = false;
             }
             // Without the GIL: the constructor blocks on the store and on Gloo, whose worker
             // threads take the GIL when they drop tensors (a held GIL would deadlock them).
             py::gil_scoped_release nogil;
             return controller_ptr(new controller(std::move(o), std::move(l), std::move(state), std::move(sampler)));
           }),
           py::arg("options"), py::arg("state"), py::arg("sampler"), py::kw_only(),
           py::arg("store_address") = py::none(), py::arg("join") = py::none(), py::arg("phase_hook") = py::none())
      .def("reduce_gradients", &controller::reduce_gradients, py::arg("params"), nogil(),
           "After backward: averages the gradients over the step's global batch (False: the step failed).")
      .def(
          "_begin_reduction",
          [](controller& c, const std::vector<at::Tensor>& params, int in_flight, int skipped, int micro,
             bool unused_to_none) {
            if (micro < 1) dra::detail::throw_invalid("micro", "must be >= 1, got " + std::to_string(micro));
            return c.begin_reduction(params, batch_check{in_flight, skipped, micro, unused_to_none});
          },
          py::arg("params"), py::arg("in_flight") = -1, py::arg("skipped") = 0, py::arg("micro") = 1,
          py::arg("unused_to_none") = false, nogil(),
          "Bucketed reduction, at the first gradient of a step (False: nothing to reduce on this rank now); "
          "in_flight and skipped: the batches the sampler handed out and not stepped, and those skipped since the "
          "previous reduced batch (the job's exactly-once check); micro: the loader batches this gradient carries "
          "(accumulated under no_sync), whose commit consumes as many steps of the sampler; unused_to_none: a "
          "parameter "
          "no rank had a gradient for keeps none (DDP's find_unused_parameters).")
      .def("_catch_up_missed_step", &controller::catch_up_missed_step,
           "The previous backward never reached dra.step: commit its step as the world did; the world then compares "
           "states at the next reduction (Gloo) or this rank takes the world's state again (NCCL). Returns whether a "
           "step was missed.")
      .def("_note_update_skipped", &controller::note_update_skipped,
           "This rank committed the previous step without its optimizer stepping: the world compares states at the "
           "next reduction (Gloo), identical ones go on and a differing one is taken again.")
      .def("_set_window_open", &controller::set_window_open, py::arg("open"),
           "An accumulation window without no_sync() is open at this step: a resize waits for a step that closes "
           "one (at most 64 steps).")
      .def("_abandon", &controller::abandon, py::arg("why"), nogil(),
           "This process leaves the job mid-training (an uncaught exception): peers fail at once and do not wait.")
      .def_property_readonly(
          "_refusal",
          [](const controller& c) -> py::object {
            const auto& r = c.refusal();
            if (!r) return py::none();
            py::dict d;
            d["step"] = r->step;
            d["reason"] = r->reason;
            d["excess"] = r->excess;
            return d;
          },
          "The latest step was refused (a rank did not train its batch; it is redone): step, reason, and the "
          "batches this rank holds beyond the world's. None otherwise.")
      .def("_gradient_ready", &controller::gradient_ready, py::arg("index"), nogil(),
           "params[index]'s gradient is accumulated: its bucket is all-reduced once complete.")
      .def("_complete_handoff", &controller::complete_handoff, nogil(),
           "A deferred handoff's optimizer state has arrived and is loaded (before an optimizer step).")
      .def_property_readonly(
          "handoff", [](const controller& c) { return dict_of(c.last_handoff()); },
          "This process's latest state handoff: bytes moved at the change, bytes skipped (the joiner held "
          "them), bytes deferred, the deferred transfer's seconds and how long the optimizer step waited for it.")
      .def("_set_buffers", &controller::set_buffers, py::arg("buffers"),
           "The module's buffers, averaged over the world at every committed step before any decision (integers "
           "rounded); a failed all-reduce leaves them and fails the next step. Empty: not averaged.")
      .def("_finish_reduction", &controller::finish_reduction, nogil(),
           "End of backward: the remaining buckets, the gradients written back (False: the step failed).")
      .def(
          "_step_tensor",
          [](controller& c, const at::Tensor& loss, const py::kwargs& signals) -> const dra::elastic::step_status& {
            const step_signals extra = parse_signals(signals);
            if (c.is_local()) return c.step(loss, extra);
            py::gil_scoped_release nogil;
            return c.step(loss, extra);
          },
          py::arg("loss"), py::return_value_policy::reference_internal,
          "The C++ step with a 0-d tensor loss (a CUDA loss is read only where a decision needs it).")
      .def_property_readonly(
          "compression",
          [](const controller& c) -> py::object {
            const auto s = c.compression();
            if (s.codec.empty()) return py::none();
            py::dict d;
            d["codec"] = s.codec;
            d["bytes_sent"] = s.bytes.sent;
            d["bytes_dense"] = s.bytes.dense;
            d["ratio"] = s.ratio();
            if (const auto* h = dynamic_cast<const codec_hook*>(c.installed_bucket_hook())) {
              d["error_feedback_norm1"] = h->error_feedback_norm1();
              d["sparsity"] = h->sparsity();
              const auto state = h->shared_state();
              d["shared_state"] = py::bytes(reinterpret_cast<const char*>(state.data()), state.size());
            }
            return d;
          },
          "The gradient codec of the bucketed reduction (None without one): its spec, the bytes this rank handed "
          "to the communicator (payload) and what fp32 would have, their ratio, the residual it carries "
          "(error_feedback_norm1), the fraction of the sparsified weights pruned ('masked'; 0 otherwise) and "
          "the state every member shares (shared_state: equal on every rank).")
      .def(
          "_sparsity_masks",
          [](controller& c) {
            std::vector<std::pair<at::Tensor, at::Tensor>> out;
            if (auto* h = dynamic_cast<codec_hook*>(c.installed_bucket_hook())) out = h->sparsity_masks();
            return out;
          },
          "'masked': (parameter, mask) pairs, the mask as 1/0 on the parameter's device.")
      .def_property_readonly(
          "energy",
          [](const controller& c) -> py::object {
            auto e = c.energy();
            if (e.reader.empty()) return py::none();
            return dict_of(std::move(e));
          },
          "This process's own energy (None until it entered a world): the latest step, since it joined, the label "
          "and the reader. The world's figures are in status (energy_step_j, energy_job_j, energy_source).")
      .def_property_readonly("nonfinite_started", &controller::nonfinite_started,
                             "A streak of non-finite losses started in the latest step (device losses: when read).")
      .def_property_readonly(
          "device_reads", [](const controller& c) { return dict_of(c.device_reads()); },
          "Host reads of device values (decision steps only) and how many had to wait for the device.")
      .def(
          "_step",
          [](controller& c, double loss, const py::kwargs& signals) -> const dra::elastic::step_status& {
            const step_signals extra = parse_signals(signals);
            if (c.is_local()) return c.step(loss, extra);
            py::gil_scoped_release nogil;
            return c.step(loss, extra);
          },
          py::arg("loss"), py::return_value_policy::reference_internal,
          "The C++ step (dra.Controller.step validates the loss first).")
      .def("_skip_step", &controller::skip_step, py::return_value_policy::reference_internal,
           "A stale batch's step: neither reduced nor committed.")
      .def("resume_at", &controller::resume_at, py::arg("step_index"),
           "Restarting a whole job from a checkpoint: the committed steps it had (every process, before the first "
           "step).")
      .def("rejoin", &controller::rejoin, nogil(),
           "A process released with release='return' asks to be admitted again; waits until it is (True) or the "
           "job ends (False).")
      .def("try_join", &controller::try_join, nogil(),
           "rejoin() without waiting: True once admitted, False while waiting or when the job has ended.")
      .def("next_epoch", &controller::next_epoch, py::arg("num_epochs"), nogil())
      .def("finish", &controller::finish, nogil(),
           "End of training: members meet once more, the leader tells standbys to go.")
      .def_property_readonly(
          "role", [](const controller& c) { return std::string(to_string(c.current_role())); },
          "'local', 'candidate', 'member', 'released', 'finished' or 'rejected'.")
      .def_property_readonly("is_member", &controller::is_member, "Takes part in training now (always true alone).")
      .def_property_readonly("failed", &controller::failed, "The current step's reduction failed: it will be redone.")
      .def_property_readonly("uid", &controller::uid,
                             "The process's id for the job's life (RANK at launch, 10000+ for late joiners).")
      .def_property_readonly("rank", &controller::rank,
                             "The rank in the world now (changes with resizes; -1 outside it). After the job "
                             "finished: the rank in the last world, so that 'save on rank 0' after the loop works.")
      .def_property_readonly("is_leader", &controller::is_leader,
                             "rank == 0: the world's leader now, or after the end the last world's leader.")
      .def("request_stop", &controller::request_stop,
           "Asks the job to stop cleanly: every member ends training at the same step boundary (the step in hand "
           "is finished); the code after the loop runs. What SIGTERM does under `dra run`.")
      .def_property_readonly("stop_requested", &controller::stop_requested)
      .def_property_readonly("stopped", &controller::stopped, "Training ended on a stop request.")
      .def_property_readonly("world_size", &controller::world_size)
      .def_property_readonly("epoch", &controller::epoch, "The world epoch (a new one after every change).")
      .def_property_readonly("step_index", &controller::step_index, "Committed steps so far.")
      .def_property_readonly("resizes", &controller::resizes)
      .def_property_readonly("universe_size", &controller::universe_size)
      .def_property_readonly("start_size", &controller::start_size)
      .def_property_readonly("members", &controller::members)
      .def_property_readonly("last_digest", &controller::last_digest)
      .def_property_readonly("nonfinite_streak", &controller::nonfinite_streak)
      .def_property_readonly("status", &controller::status, py::return_value_policy::reference_internal)
      .def_property_readonly("options", &controller::options, py::return_value_policy::reference_internal)
      .def_property_readonly("last_event", [](const controller& c) { return event_dict(c.last_event()); })
      .def_property_readonly(
          "events",
          [](const controller& c) {
            py::list out;
            for (const auto& line : c.events()) out.append(event_dict(line));
            return out;
          },
          "Every event this process emitted (dicts), oldest first.")
      .def_property_readonly("store_address", &controller::store_address)
      .def("registered_candidates", &controller::registered_candidates, nogil())
      .def("state_digest", &controller::state_digest, nogil())
      .def_property_readonly("engine", &controller::engine, py::return_value_policy::reference_internal)
      .def_property_readonly(
          "signals", [](controller& c) -> const dra::signals::convergence_signals& { return c.engine().signals(); },
          py::return_value_policy::reference_internal);

  m.def(
      "_environment_options", [] { return py::module_::import("json").attr("loads")(environment_options_json()); },
      "DRA_OPTIONS as a dict of options (checked in C++: ValueError names DRA_OPTIONS or the option).");
}
