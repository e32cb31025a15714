#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "bindings.hpp"
#include "dra/elastic/sampler.hpp"
#include "dra/torch/elastic/job_control.hpp"
#include "dra/torch/elastic/state.hpp"

namespace py = pybind11;
using namespace dra::elastic;

// ---- the Python state provider and the sampler -------------------------------------------------------
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
  state_layout layout() override {
    py::gil_scoped_acquire gil;
    state_layout out;
    py::function f = py::get_override(static_cast<const state_provider*>(this), "layout");
    if (!f) return out;  // optional in Python
    for (const auto& [k, v] : f().cast<py::dict>()) out[k.cast<std::string>()] = v.cast<std::string>();
    return out;
  }
  snapshot collect() override {
    py::gil_scoped_acquire gil;
    auto r = call("collect")().cast<py::tuple>();
    snapshot snap{r[0].cast<std::vector<at::Tensor>>(), r[1].cast<std::string>()};
    if (r.size() > 2) snap.deferrable_from = r[2].cast<std::size_t>();  // (tensors, manifest, first deferrable)
    return snap;
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
  // Optional in Python: a provider without them keeps its state where it is.
  void release_device() override { call_optional("release_device"); }
  void restore_device() override { call_optional("restore_device"); }

 private:
  void call_optional(const char* name) {
    py::gil_scoped_acquire gil;
    if (py::function f = py::get_override(static_cast<const state_provider*>(this), name)) f();
  }

  py::function call(const char* name) {
    py::function f = py::get_override(static_cast<const state_provider*>(this), name);
    if (!f) throw std::logic_error(std::string("StateProvider subclass must implement ") + name);
    return f;
  }
};

py::array_t<std::int64_t> to_array(const std::vector<std::int64_t>& v) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(std::int64_t));
  return out;
}

}  // namespace

static void bind_sampler_and_state(py::module_& e) {
  py::class_<elastic_sampler, std::shared_ptr<elastic_sampler>>(
      e, "Sampler", "Exactly-once sample order over a changing world (C++).")
      .def(py::init<std::int64_t, std::int64_t, std::uint64_t, bool, bool>(), py::arg("dataset_size"),
           py::arg("global_batch"), py::arg("seed") = 0, py::arg("drop_last") = false, py::arg("shuffle") = true)
      .def_property_readonly("shuffle", &elastic_sampler::shuffle)
      .def(
          "indices_at",
          [](elastic_sampler& s, std::int64_t cursor, int world, int rank) {
            return to_array(s.indices_at(cursor, world, rank));
          },
          py::arg("cursor"), py::arg("world"), py::arg("rank"), "A rank's sample ids for the step starting at cursor.")
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
      .def("step_range",
           [](const elastic_sampler& s) {
             const auto r = s.step_range();
             return py::make_tuple(r.begin, r.end);
           })
      .def("share_range",
           [](const elastic_sampler& s) {
             const auto r = s.share_range();
             return py::make_tuple(r.begin, r.end);
           })
      .def("order", [](elastic_sampler& s) { return to_array(s.order()); })
      .def("indices", [](elastic_sampler& s) { return to_array(s.indices()); })
      .def("step_indices", [](elastic_sampler& s) { return to_array(s.step_indices()); })
      .def("set_world", &elastic_sampler::set_world, py::arg("world"), py::arg("rank"))
      .def("commit", &elastic_sampler::commit, py::arg("steps") = 1,
           "The current step's samples are consumed (steps: that many consecutive steps, accumulated batches).")
      .def("next_epoch", &elastic_sampler::next_epoch)
      .def("position",
           [](const elastic_sampler& s) {
             const auto p = s.position();
             return py::dict(py::arg("epoch") = p.epoch, py::arg("cursor") = p.cursor,
                             py::arg("global_batch") = p.global_batch, py::arg("seed") = p.seed);
           })
      .def(
          "set_position",
          [](elastic_sampler& s, std::int64_t epoch, std::int64_t cursor, std::int64_t global_batch,
             std::uint64_t seed) { s.set_position({epoch, cursor, global_batch, seed}); },
          py::arg("epoch"), py::arg("cursor"), py::arg("global_batch"), py::arg("seed"));

  py::class_<state_provider, py_state_provider, std::shared_ptr<state_provider>>(
      e, "StateProvider",
      "Base of a state provider written in Python (signature, collect, prepare, load, scale_learning_rate).")
      .def(py::init<>());

  e.def(
      "signature_mismatch",
      [](const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>& a,
         const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>& b) -> py::object {
        auto conv = [](const auto& v) {
          std::vector<tensor_spec> out;
          for (const auto& [n, s, d] : v) out.push_back({n, s, d});
          return out;
        };
        const auto r = signature_mismatch(conv(a), conv(b));
        if (r.empty()) return py::none();
        return py::str(r);
      },
      py::arg("world"), py::arg("joiner"), "First difference between two model signatures, or None.");
}

// The elastic world's data and state pieces that Python builds on (the controller itself is bound
// in controller_py.cpp; the membership functions are test bindings, in testing_py.cpp).
static void bind_job_control(py::module_& e) {
  using release_gil = py::call_guard<py::gil_scoped_release>;
  py::class_<job_control>(e, "JobControl",
                          "An outside actor's handle on a running elastic job (a launcher, a device pool, an RL "
                          "coordinator): the store keys of the contract (docs/guide/elastic.md, \"Driving a job "
                          "from outside\"), written and read in one place.")
      .def(py::init([](const std::string& address, const std::string& job, int restart, double timeout_s) {
             const auto colon = address.rfind(':');
             if (colon == std::string::npos || colon == 0)
               throw std::invalid_argument("address: expected host:port, got '" + address + "'");
             int port = 0;
             try {
               port = std::stoi(address.substr(colon + 1));
             } catch (const std::exception&) {
               throw std::invalid_argument("address: the port must be an integer, got '" + address + "'");
             }
             if (!(timeout_s > 0.0)) throw std::invalid_argument("timeout_s: must be > 0");
             py::gil_scoped_release nogil;
             return std::make_unique<job_control>(address.substr(0, colon), port, job, restart,
                                                  std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000)));
           }),
           py::arg("address"), py::arg("job"), py::arg("restart") = 0, py::arg("timeout_s") = 30.0,
           "Connects to the job's store at host:port; keys under dra/<job>/<restart>.")
      .def("set_capacity", &job_control::set_capacity, py::arg("min_size"), py::arg("max_size"),
           py::arg("leave") = std::vector<int>{}, release_gil(),
           "The job's size bounds (0: none) and the uids that must leave now.")
      .def(
          "report",
          [](job_control& j) -> py::object {
            std::string text;
            {
              py::gil_scoped_release nogil;
              text = j.report();
            }
            if (text.empty()) return py::none();
            return py::module_::import("json").attr("loads")(text);
          },
          "The leader's latest report (a dict), or None before the first.")
      .def("done", &job_control::done, release_gil(), "Whether the job finished.")
      .def("final_members", &job_control::final_members, release_gil(),
           "The uids of the world that finished the job (a list), or None while it runs.")
      .def("stopped_at", &job_control::stopped_at, release_gil(),
           "The step at which a stop request ended the job's training (an int), or None.")
      .def("started", &job_control::started, release_gil(),
           "Whether the job's processes formed their dra world (a dra job, which survives a worker's death).")
      .def("checked_in", &job_control::checked_in, py::arg("uid"), release_gil(),
           "Whether process `uid` checked in (its options are in the store): a founding process that exits "
           "before it did leaves the others waiting for it.")
      .def("claim_late_uid", &job_control::claim_late_uid, release_gil(),
           "A late joiner's uid (start it with DRA_JOIN=1 and DRA_JOIN_UID).")
      .def_property_readonly("prefix", &job_control::prefix)
      .def_property_readonly("address", &job_control::address);
  e.attr("LATE_UID_BASE") = late_uid_base;
}

// The elastic world's data and state pieces that Python builds on (the controller itself is bound
// in controller_py.cpp; the membership functions are test bindings, in testing_py.cpp).
void dra::python::bind_elastic(py::module_& m) {
  auto e = m.def_submodule("elastic", "The exactly-once sampler and the state provider of the elastic world.");
  bind_sampler_and_state(e);
  bind_job_control(e);
}
