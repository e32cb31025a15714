// dra._core._testing: bindings that only tests and benchmarks use, kept out of what users import
// (dra.testing re-exports them): the elastic world's membership functions, a no-op call (the
// baseline of dra.step's cost), the C++ timing loops, the NCCL test world and the store fuzzer's
// entry point.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.hpp"
#include "dra/elastic/membership.hpp"
#include "dra/torch/elastic/store_check.hpp"

namespace py = pybind11;
using namespace dra::elastic;

void dra::python::bind_testing(py::module_& m) {
  auto e = m.def_submodule("_testing", "Test and benchmark bindings (not part of the user API).");
  e.def("noop", []() {}, "A bare binding call that does nothing: the benchmark baseline for dra.step.");
  e.def("rank_of", &rank_of, py::arg("members"), py::arg("uid"), "Rank of uid in members, or -1.");
  e.def("leader_of", &leader_of, py::arg("members"));
  e.def("next_members", &next_members, py::arg("current"), py::arg("leave"), py::arg("join"),
        "Next epoch's members: stayers keep their order, joiners are appended.");
  e.def("survivors", &survivors, py::arg("current"), py::arg("alive"));
  e.def("rank_mapping", &rank_mapping, py::arg("old_members"), py::arg("new_members"));
  e.def("pick_joiners", &pick_joiners, py::arg("members"), py::arg("candidates"), py::arg("target"));
  e.def("pick_leavers", &pick_leavers, py::arg("members"), py::arg("target"), py::arg("prefer") = std::vector<int>{});
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
      py::arg("begin"), py::arg("end"), py::arg("world"), py::arg("rank"),
      "(begin, end) of one rank's share of a batch.");
  e.def(
      "epoch_order",
      [](std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
        const auto order = epoch_order(n, seed, epoch);
        py::array_t<std::int64_t> out(static_cast<py::ssize_t>(order.size()));
        if (!order.empty()) std::memcpy(out.mutable_data(), order.data(), order.size() * sizeof(std::int64_t));
        return out;
      },
      py::arg("n"), py::arg("seed"), py::arg("epoch"), "The deterministic sample order of a data epoch (int64 array).");
  e.def("store_key_families", &dra::elastic::testing::store_key_families,
        "The store keys the elastic protocol reads, one per family (the store fuzzer's keys).");
  e.def(
      "read_store_value",
      [](const std::string& host, int port, const std::string& job, const std::string& family, py::bytes value) {
        const std::string raw = value;
        py::gil_scoped_release nogil;
        return dra::elastic::testing::read_store_value(host, port, job, family, raw);
      },
      py::arg("host"), py::arg("port"), py::arg("job"), py::arg("family"), py::arg("value"),
      "Writes value into the key of family (under the job prefix) as another client would, runs the protocol's "
      "readers of that key: 'read', 'ignored' (warned once) or 'handled: ...' (a dra error the protocol handles); "
      "anything else raises (a crash).");
  e.def(
      "agree_after_failure",
      [](const std::string& host, int port, const std::string& job, int uid, const std::vector<int>& old_members,
         bool holds_state, int window_ms, int stale_ms) {
        py::gil_scoped_release nogil;
        return dra::elastic::testing::agree_after_failure(host, port, job, uid, old_members, holds_state, window_ms,
                                                          stale_ms);
      },
      py::arg("host"), py::arg("port"), py::arg("job"), py::arg("uid"), py::arg("old_members"), py::arg("holds_state"),
      py::arg("window_ms"), py::arg("stale_ms"),
      "One survivors' agreement after world epoch 1 by uid: 'members ...', 'elsewhere ...' (it holds no state "
      "and members that beat never came: it steps out) or 'handled: ...'.");
  bind_bench(e);
  bind_nccl_testing(e);
}
