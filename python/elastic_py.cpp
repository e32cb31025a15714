#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.hpp"
#include "dra/elastic/controller.hpp"
#include "dra/elastic/membership.hpp"
#include "dra/elastic/sampler.hpp"
#include "dra/engine.hpp"

#include <torch/csrc/utils/pybind.h>

#include <map>
#include <tuple>

namespace py = pybind11;
using namespace dra::elastic;

void bind_elastic_controller(py::module_& e);

// The membership functions every rank evaluates (include/dra/elastic/membership.hpp) and the
// elastic controller itself: python/dra/elastic/ is a thin layer over these.
void dra::python::bind_elastic(py::module_& m) {
  auto e = m.def_submodule("elastic", "Membership and data-partition decisions of the elastic world.");
  e.def("rank_of", &rank_of, py::arg("members"), py::arg("uid"), "Rank of uid in members, or -1.");
  e.def("leader_of", &leader_of, py::arg("members"));
  e.def("next_members", &next_members, py::arg("current"), py::arg("leave"), py::arg("join"),
        "Next epoch's members: stayers keep their order, joiners are appended.");
  e.def("survivors", &survivors, py::arg("current"), py::arg("alive"));
  e.def("rank_mapping", &rank_mapping, py::arg("old_members"), py::arg("new_members"));
  e.def("pick_joiners", &pick_joiners, py::arg("members"), py::arg("candidates"), py::arg("target"));
  e.def("pick_leavers", &pick_leavers, py::arg("members"), py::arg("target"));
  e.def("handoff_sources", &handoff_sources, py::arg("new_members"), py::arg("joined"),
        "New rank of the member that sends the state to each joiner (stayers share the work).");
  e.def(
      "step_batch",
      [](std::int64_t cursor, std::int64_t global_batch, std::int64_t epoch_size) {
        const auto r = step_batch(cursor, global_batch, epoch_size);
        return py::make_tuple(r.begin, r.end);
      },
      py::arg("cursor"), py::arg("global_batch"), py::arg("epoch_size"), "(begin, end) of one step's samples.");
  e.def(
      "rank_share",
      [](std::int64_t begin, std::int64_t end, int world, int rank) {
        const auto r = rank_share(index_range{begin, end}, world, rank);
        return py::make_tuple(r.begin, r.end);
      },
      py::arg("begin"), py::arg("end"), py::arg("world"), py::arg("rank"), "(begin, end) of one rank's share of a batch.");
  e.def(
      "epoch_order",
      [](std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
        const auto order = epoch_order(n, seed, epoch);
        py::array_t<std::int64_t> out(static_cast<py::ssize_t>(order.size()));
        if (!order.empty()) std::memcpy(out.mutable_data(), order.data(), order.size() * sizeof(std::int64_t));
        return out;
      },
      py::arg("n"), py::arg("seed"), py::arg("epoch"), "The deterministic sample order of a data epoch (int64 array).");
  bind_elastic_controller(e);
}

// ---- the elastic controller (include/dra/elastic/controller.hpp) -----------------------------
namespace {

// A state provider implemented in Python (dra.elastic._state.PyTorchState): the controller moves
// the bytes, Python says what the state is. Manifests cross as bytes (they are pickles).
class py_state_provider final : public state_provider {
 public:
  std::vector<tensor_spec> signature() override {
    py::gil_scoped_acquire gil;
    std::vector<tensor_spec> out;
    for (const auto& item : call("signature")()) {
      auto t = item.cast<py::sequence>();
      out.push_back({t[0].cast<std::string>(), t[1].cast<std::vector<std::int64_t>>(), t[2].cast<std::string>()});
    }
    return out;
  }
  snapshot collect() override {
    py::gil_scoped_acquire gil;
    auto r = call("collect")().cast<py::tuple>();
    return {r[0].cast<std::vector<at::Tensor>>(), r[1].cast<std::string>()};
  }
  std::vector<at::Tensor> prepare(const std::string& manifest) override {
    py::gil_scoped_acquire gil;
    return call("prepare")(py::bytes(manifest)).cast<std::vector<at::Tensor>>();
  }
  void load(const std::string& manifest, const std::vector<at::Tensor>& tensors) override {
    py::gil_scoped_acquire gil;
    call("load")(py::bytes(manifest), tensors);
  }
  void scale_learning_rate(double factor) override {
    py::gil_scoped_acquire gil;
    call("scale_learning_rate")(factor);
  }

 private:
  py::function call(const char* name) {
    py::function f = py::get_override(static_cast<const state_provider*>(this), name);
    if (!f) throw std::logic_error(std::string("StateProvider subclass must implement ") + name);
    return f;
  }
};

// Destroys a controller without the GIL (its communicator's teardown waits for Gloo threads
// that may need the GIL).
struct delete_without_gil {
  void operator()(controller* c) const {
    py::gil_scoped_release nogil;
    delete c;
  }
};
using controller_ptr = std::unique_ptr<controller, delete_without_gil>;

std::chrono::milliseconds ms(double seconds, const char* field) {
  if (!(seconds > 0.0)) dra::detail::throw_invalid(field, "must be a positive number of seconds, got " + std::to_string(seconds));
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

py::array_t<std::int64_t> to_array(const std::vector<std::int64_t>& v) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(std::int64_t));
  return out;
}

}  // namespace

void bind_elastic_controller(py::module_& e) {
  py::class_<elastic_sampler, std::shared_ptr<elastic_sampler>>(e, "Sampler",
                                                                "Exactly-once sample order over a changing world (C++).")
      .def(py::init<std::int64_t, std::int64_t, std::uint64_t, bool>(), py::arg("dataset_size"), py::arg("global_batch"),
           py::arg("seed") = 0, py::arg("drop_last") = false)
      .def_property_readonly("dataset_size", &elastic_sampler::dataset_size)
      .def_property("global_batch", &elastic_sampler::global_batch, &elastic_sampler::set_global_batch)
      .def_property_readonly("seed", &elastic_sampler::seed)
      .def_property_readonly("drop_last", &elastic_sampler::drop_last)
      .def_property_readonly("epoch", &elastic_sampler::epoch)
      .def_property_readonly("cursor", &elastic_sampler::cursor)
      .def_property_readonly("world", &elastic_sampler::world)
      .def_property_readonly("rank", &elastic_sampler::rank)
      .def_property_readonly("epoch_size", &elastic_sampler::epoch_size)
      .def_property_readonly("exhausted", &elastic_sampler::exhausted)
      .def_property_readonly("steps_left", &elastic_sampler::steps_left)
      .def("step_range", [](const elastic_sampler& s) { const auto r = s.step_range(); return py::make_tuple(r.begin, r.end); })
      .def("share_range", [](const elastic_sampler& s) { const auto r = s.share_range(); return py::make_tuple(r.begin, r.end); })
      .def("order", [](elastic_sampler& s) { return to_array(s.order()); })
      .def("indices", [](elastic_sampler& s) { return to_array(s.indices()); })
      .def("step_indices", [](elastic_sampler& s) { return to_array(s.step_indices()); })
      .def("set_world", &elastic_sampler::set_world, py::arg("world"), py::arg("rank"))
      .def("commit", &elastic_sampler::commit)
      .def("next_epoch", &elastic_sampler::next_epoch)
      .def("position", [](const elastic_sampler& s) {
        const auto p = s.position();
        return py::dict(py::arg("epoch") = p.epoch, py::arg("cursor") = p.cursor, py::arg("global_batch") = p.global_batch,
                        py::arg("seed") = p.seed);
      })
      .def("set_position", [](elastic_sampler& s, std::int64_t epoch, std::int64_t cursor, std::int64_t global_batch,
                              std::uint64_t seed) { s.set_position({epoch, cursor, global_batch, seed}); },
           py::arg("epoch"), py::arg("cursor"), py::arg("global_batch"), py::arg("seed"));

  py::class_<state_provider, py_state_provider, std::shared_ptr<state_provider>>(
      e, "StateProvider", "Base of a state provider written in Python (signature, collect, prepare, load, scale_learning_rate).")
      .def(py::init<>());

  py::class_<step_result>(e, "StepResult")
      .def_readonly("committed", &step_result::committed)
      .def_readonly("step", &step_result::step)
      .def_readonly("loss", &step_result::loss)
      .def_readonly("event", &step_result::event)
      .def_readonly("exit_requested", &step_result::exit_requested);

  // Every call that may block on the store or a collective, or tear a process group down, runs
  // without the GIL: c10d's Gloo threads take the GIL when they release tensors, so holding it
  // there deadlocks (~ProcessGroupGloo waits for them). Callbacks into Python re-acquire it.
  using nogil = py::call_guard<py::gil_scoped_release>;
  py::class_<controller, controller_ptr>(e, "Controller", "The elastic controller (C++): the whole protocol of an elastic world.")
      .def(py::init([](const dra::engine_config& engine, std::shared_ptr<state_provider> state,
                       std::shared_ptr<elastic_sampler> sampler, int start_size, const std::string& release,
                       const std::string& batch_mode_name, std::int64_t decide_every,
                       const std::map<std::int64_t, int>& schedule, double fault_timeout_s, double store_timeout_s,
                       double chunk_mb, bool verify, const std::string& events_path, std::int64_t status_every,
                       int max_resize_retries, const std::string& config_fingerprint, py::object phase_hook,
                       py::object store_host, py::object store_port, py::object join, py::object host_store) {
             controller_options o;
             o.engine = engine;
             o.start_size = start_size;
             if (release != "standby" && release != "exit")
               dra::detail::throw_invalid("release", "must be 'standby' or 'exit', got '" + release + "'");
             o.release = release == "exit" ? release_mode::exit : release_mode::standby;
             if (batch_mode_name != "fixed" && batch_mode_name != "adascale")
               dra::detail::throw_invalid("batch_mode", "must be 'fixed' (global batch kept) or 'adascale', got '" +
                                                            batch_mode_name + "'");
             o.batch = batch_mode_name == "adascale" ? batch_mode::adascale : batch_mode::fixed;
             o.decide_every = decide_every;
             o.schedule = schedule;
             o.fault_timeout = ms(fault_timeout_s, "fault_timeout_s");
             o.store_timeout = ms(store_timeout_s, "store_timeout_s");
             if (!(chunk_mb > 0.0)) dra::detail::throw_invalid("chunk_mb", "must be > 0, got " + std::to_string(chunk_mb));
             o.chunk_bytes = static_cast<std::size_t>(chunk_mb * 1048576.0);
             o.verify = verify;
             o.events_path = events_path;
             o.status_every = status_every;
             o.max_resize_retries = max_resize_retries;
             o.config_fingerprint = config_fingerprint;
             if (!phase_hook.is_none()) {
               // Held by the options (the controller's lifetime); called with the GIL.
               // The controller may be destroyed without the GIL (see below): the hook's Python
               // reference is dropped with it.
               std::shared_ptr<py::object> hook(new py::object(phase_hook), [](py::object* h) {
                 py::gil_scoped_acquire gil;
                 delete h;
               });
               o.phase_hook = [hook](const std::string& phase, const controller& self) {
                 py::gil_scoped_acquire gil;
                 (*hook)(py::cast(const_cast<controller*>(&self), py::return_value_policy::reference), phase);
               };
             }
             launch_info l = launch_info::from_env();
             if (!join.is_none()) l.join = join.cast<bool>();
             if (!store_host.is_none()) {
               l.store_host = store_host.cast<std::string>();
               l.store_port = store_port.cast<int>();
               l.host_store = host_store.is_none() ? false : host_store.cast<bool>();
             } else if (!host_store.is_none()) {
               l.host_store = host_store.cast<bool>();
             }
             // Without the GIL: the constructor blocks on the store and on Gloo, whose worker threads
             // take the GIL when they drop tensors (a held GIL would deadlock them).
             py::gil_scoped_release nogil;
             return controller_ptr(new controller(std::move(o), std::move(l), std::move(state), std::move(sampler)));
           }),
           py::arg("engine"), py::arg("state"), py::arg("sampler"), py::kw_only(), py::arg("start_size") = -1,
           py::arg("release") = "standby", py::arg("batch_mode") = "fixed", py::arg("decide_every") = 10,
           py::arg("schedule") = std::map<std::int64_t, int>{}, py::arg("fault_timeout_s") = 3.0,
           py::arg("store_timeout_s") = 30.0, py::arg("chunk_mb") = 16.0, py::arg("verify") = false,
           py::arg("events_path") = "", py::arg("status_every") = 0, py::arg("max_resize_retries") = 3,
           py::arg("config_fingerprint") = "", py::arg("phase_hook") = py::none(), py::arg("store_host") = py::none(),
           py::arg("store_port") = py::none(), py::arg("join") = py::none(), py::arg("host_store") = py::none())
      .def("reduce_gradients", &controller::reduce_gradients, py::arg("params"), nogil())
      .def("step", &controller::step, py::arg("loss"), nogil())
      .def("next_epoch", &controller::next_epoch, py::arg("num_epochs"), nogil())
      .def("finish", &controller::finish, nogil())
      .def_property_readonly("role", [](const controller& c) { return std::string(to_string(c.current_role())); })
      .def_property_readonly("is_member", &controller::is_member)
      .def_property_readonly("failed", &controller::failed)
      .def_property_readonly("uid", &controller::uid)
      .def_property_readonly("rank", &controller::rank)
      .def_property_readonly("world_size", &controller::world_size)
      .def_property_readonly("epoch", &controller::epoch)
      .def_property_readonly("step_index", &controller::step_index)
      .def_property_readonly("resizes", &controller::resizes)
      .def_property_readonly("universe_size", &controller::universe_size)
      .def_property_readonly("start_size", &controller::start_size)
      .def_property_readonly("members", &controller::members)
      .def_property_readonly("last_digest", &controller::last_digest)
      .def_property_readonly("last_event", &controller::last_event)
      .def_property_readonly("events", &controller::events)
      .def_property_readonly("last_loss", &controller::last_loss)
      .def_property_readonly("store_address", &controller::store_address)
      .def("registered_candidates", &controller::registered_candidates, nogil())
      .def("state_digest", &controller::state_digest, nogil())
      .def_property("num_epochs", [](const controller&) { return 0; }, &controller::set_num_epochs)
      .def_property_readonly("engine", &controller::engine, py::return_value_policy::reference_internal);
  e.def("signature_mismatch", [](const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>& a,
                                 const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>& b) -> py::object {
    auto conv = [](const auto& v) {
      std::vector<tensor_spec> out;
      for (const auto& [n, s, d] : v) out.push_back({n, s, d});
      return out;
    };
    const auto r = signature_mismatch(conv(a), conv(b));
    if (r.empty()) return py::none();
    return py::str(r);
  }, py::arg("world"), py::arg("joiner"), "First difference between two model signatures, or None.");
}
