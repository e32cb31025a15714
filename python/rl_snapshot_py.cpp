// A leader's view of its RL pipeline (include/dra/rl/snapshot.hpp) from a Python dict, for
// StageBalancePolicy.plan (rl_py.cpp): every key checked, unknown ones named, wrong types named.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "rl_snapshot.hpp"

namespace py = pybind11;

namespace {

// A leader's view of its pipeline (snapshot.hpp) from a dict: every key checked, unknown ones named.
template <class T>
T take(const py::dict& d, const char* key, const std::string& where, const T* fallback = nullptr) {
  if (!d.contains(key)) {
    if (fallback) return *fallback;
    throw py::value_error(where + key + ": missing; the snapshot's keys are listed in StageBalancePolicy.plan's doc");
  }
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    const py::object value = d[key];
    throw py::value_error(where + key + ": wrong type (" +
                          py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>() +
                          "); see StageBalancePolicy.plan's doc");
  }
}
void only_keys(const py::dict& d, std::initializer_list<const char*> keys, const std::string& where) {
  for (const auto& item : d) {
    const auto k = item.first.cast<std::string>();
    bool known = false;
    for (const char* x : keys) known = known || k == x;
    if (!known) throw py::value_error(where + k + ": unknown key; see StageBalancePolicy.plan's doc");
  }
}
}  // namespace

dra::sim::pipeline_snapshot dra::python::snapshot_from(const py::dict& d) {
  using namespace dra::sim;
  only_keys(d, {"now_s",           "seed",
                "steps",           "prompts_per_step",
                "group_size",      "updates_per_step",
                "prompt_tokens",   "max_generation_tokens",
                "max_concurrency", "kv_capacity_tokens",
                "kv_watermark",    "kv_reserve_ratio",
                "horizon_windows", "step",
                "update",          "training",
                "published",       "trainers_free_s",
                "members",         "slots",
                "batches",         "lengths",
                "last_switch"},
            "snapshot.");
  pipeline_snapshot s;
  const std::string w = "snapshot.";
  s.now_s = take<double>(d, "now_s", w);
  s.seed = take<std::uint64_t>(d, "seed", w, &s.seed);
  s.steps = take<int>(d, "steps", w);
  s.prompts_per_step = take<int>(d, "prompts_per_step", w);
  s.group_size = take<int>(d, "group_size", w);
  s.updates_per_step = take<int>(d, "updates_per_step", w);
  s.prompt_tokens = take<double>(d, "prompt_tokens", w);
  s.max_generation_tokens = take<double>(d, "max_generation_tokens", w);
  s.max_concurrency = take<int>(d, "max_concurrency", w);
  s.kv_capacity_tokens = take<double>(d, "kv_capacity_tokens", w, &s.kv_capacity_tokens);
  s.kv_watermark = take<double>(d, "kv_watermark", w, &s.kv_watermark);
  s.kv_reserve_ratio = take<double>(d, "kv_reserve_ratio", w, &s.kv_reserve_ratio);
  s.horizon_windows = take<int>(d, "horizon_windows", w, &s.horizon_windows);
  s.step = take<int>(d, "step", w);
  s.update = take<int>(d, "update", w, &s.update);
  s.training = take<bool>(d, "training", w, &s.training);
  s.published = take<int>(d, "published", w);
  s.trainers_free_s = take<double>(d, "trainers_free_s", w, &s.now_s);
  s.members = take<std::vector<int>>(d, "members", w);
  s.lengths = take<std::vector<std::vector<double>>>(d, "lengths", w);
  const auto slots = take<py::list>(d, "slots", w);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::string at = "snapshot.slots[" + std::to_string(i) + "].";
    const auto sd = slots[i].cast<py::dict>();
    only_keys(sd, {"role", "version", "clock_s", "in_flight", "waiting"}, at);
    pipeline_slot sl;
    sl.role = take<std::string>(sd, "role", at);
    sl.version = take<int>(sd, "version", at, &sl.version);
    sl.clock_s = take<double>(sd, "clock_s", at, &s.now_s);
    const std::vector<std::vector<double>> none;
    for (const auto& q : take<std::vector<std::vector<double>>>(sd, "in_flight", at, &none)) {
      if (q.size() < 2 || q.size() > 3) throw py::value_error(at + "in_flight: each is (id, generated[, admitted_at])");
      sl.in_flight.push_back({static_cast<int>(q[0]), q[1], q.size() > 2 ? q[2] : 0.0});
    }
    for (const auto& q : take<std::vector<std::vector<double>>>(sd, "waiting", at, &none)) {
      if (q.size() != 2) throw py::value_error(at + "waiting: each is (id, generated)");
      sl.waiting.emplace_back(static_cast<int>(q[0]), q[1]);
    }
    s.slots.push_back(std::move(sl));
  }
  const auto batches = take<py::list>(d, "batches", w);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const std::string at = "snapshot.batches[" + std::to_string(i) + "].";
    const auto bd = batches[i].cast<py::dict>();
    only_keys(bd, {"open", "opened_s", "complete_s", "rollout_at_open", "remaining", "queued"}, at);
    pipeline_batch b;
    b.open = take<bool>(bd, "open", at);
    b.opened_s = take<double>(bd, "opened_s", at, &b.opened_s);
    b.complete_s = take<double>(bd, "complete_s", at, &b.complete_s);
    b.rollout_at_open = take<int>(bd, "rollout_at_open", at, &b.rollout_at_open);
    b.remaining = take<int>(bd, "remaining", at, &b.remaining);
    b.queued = take<std::vector<std::vector<int>>>(bd, "queued", at, &b.queued);
    s.batches.push_back(std::move(b));
  }
  if (d.contains("last_switch")) {
    const auto ld = take<py::dict>(d, "last_switch", w);
    only_keys(ld, {"agree_s", "rebuild_s", "weights_s", "optimizer_s"}, "snapshot.last_switch.");
    const std::string at = "snapshot.last_switch.";
    s.last_switch.agree_s = take<double>(ld, "agree_s", at, &s.last_switch.agree_s);
    s.last_switch.rebuild_s = take<double>(ld, "rebuild_s", at, &s.last_switch.rebuild_s);
    s.last_switch.weights_s = take<double>(ld, "weights_s", at, &s.last_switch.weights_s);
    s.last_switch.optimizer_s = take<double>(ld, "optimizer_s", at, &s.last_switch.optimizer_s);
  }
  return s;
}
