// Timing loops for `python -m dra.bench overhead`: the C++ hot paths are timed in C++, so the
// figures do not include the Python call that starts them.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "dra/engine.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/signals/convergence_estimator.hpp"

namespace py = pybind11;

namespace {

using clock_type = std::chrono::steady_clock;

// A noisy power-law loss curve, precomputed so the timed loop measures the estimator only.
std::vector<double> loss_curve(std::size_t n) {
  std::vector<double> out(n);
  std::uint64_t state = 88172645463325252ull;
  for (std::size_t i = 0; i < n; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
    const double noise = static_cast<double>(state >> 11) * 0x1.0p-53 - 0.5;
    out[i] = 4.0 * std::pow(1.0 + static_cast<double>(i) / 50.0, -0.5) * (1.0 + 0.02 * noise);
  }
  return out;
}

double ns_per(clock_type::time_point start, clock_type::time_point stop, std::int64_t count) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start).count()) /
         static_cast<double>(count);
}

void check_count(std::int64_t count, const char* name) {
  if (count < 1) throw py::value_error(std::string(name) + ": must be >= 1, got " + std::to_string(count));
}

// ns per convergence_estimator::update_loss (and, with gradients, update_gradients as well).
double estimator_update_ns(std::int64_t updates, bool with_gradients) {
  check_count(updates, "updates");
  const auto curve = loss_curve(4096);
  dra::signals::convergence_estimator est;
  double sink = 0.0;
  py::gil_scoped_release release;
  const auto start = clock_type::now();
  for (std::int64_t t = 0; t < updates; ++t) {
    const double loss = curve[static_cast<std::size_t>(t) & 4095];
    est.update_loss(t, loss);
    if (with_gradients) est.update_gradients(1.0 + loss, 8.0, 1.0 + 0.2 * loss, 64.0);
    sink += est.signals().smoothed_loss;
  }
  const auto stop = clock_type::now();
  if (!std::isfinite(sink)) throw std::runtime_error("estimator benchmark produced a non-finite sum");
  return ns_per(start, stop, updates);
}

// ns per constrained_policy::decide on a job in its fast phase at 4 of 16 devices.
double policy_decision_ns(const std::string& policy_name, std::int64_t decisions) {
  check_count(decisions, "decisions");
  dra::engine_config config;
  config.policy = policy_name;
  config.validate();
  dra::policy::constrained_policy policy(dra::make_policy(config), config.limits);
  dra::policy::throughput_model throughput;
  for (int k = 1; k <= 8; ++k) throughput.observe(k, 32.0, 0.01 + 0.001 * k, 0.001 * k);
  dra::signals::convergence_estimator est;
  const auto curve = loss_curve(256);
  for (std::size_t t = 0; t < curve.size(); ++t) est.update_loss(static_cast<std::int64_t>(t), curve[t]);
  est.update_gradients(2.0, 8.0, 1.2, 64.0);
  dra::policy::world_state world;
  world.size = 4;
  world.active = {0, 1, 2, 3};
  world.candidates = {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  world.steps_since_resize = 1000;
  world.global_batch = 128.0;
  world.base_batch = 128.0;
  const dra::policy::capacity cap{16};
  const dra::policy::cost_model costs{1.0, 500.0};
  std::size_t sink = 0;
  py::gil_scoped_release release;
  const auto start = clock_type::now();
  for (std::int64_t i = 0; i < decisions; ++i) {
    world.step = i;
    const auto d = policy.decide(est.signals(), world, cap, costs, throughput);
    sink += static_cast<std::size_t>(d.target_size) + d.reason.size();
  }
  const auto stop = clock_type::now();
  if (sink == 0) throw std::runtime_error("policy benchmark produced no decisions");
  return ns_per(start, stop, decisions);
}

// ns per resize_engine::step (estimator update plus a decision every decide_every steps).
double engine_step_ns(std::int64_t steps, std::int64_t decide_every) {
  check_count(steps, "steps");
  check_count(decide_every, "decide_every");
  dra::engine_config config;
  config.decide_every = decide_every;
  dra::resize_engine engine(config);
  const auto curve = loss_curve(4096);
  std::uint64_t sink = 0;
  py::gil_scoped_release release;
  const auto start = clock_type::now();
  for (std::int64_t t = 0; t < steps; ++t) sink += engine.step(t, curve[static_cast<std::size_t>(t) & 4095]).decisions;
  const auto stop = clock_type::now();
  if (sink == 0 && steps >= decide_every) throw std::runtime_error("engine benchmark took no decisions");
  return ns_per(start, stop, steps);
}

}  // namespace

void dra::python::bind_bench(py::module_& m) {
  m.def("bench_estimator_update_ns", &estimator_update_ns, py::arg("updates") = 1000000,
        py::arg("with_gradients") = false,
        "Nanoseconds per ConvergenceEstimator update, timed in C++ (benchmark helper).");
  m.def("bench_policy_decision_ns", &policy_decision_ns, py::arg("policy") = "convergence",
        py::arg("decisions") = 100000, "Nanoseconds per ConstrainedPolicy.decide, timed in C++ (benchmark helper).");
  m.def("bench_engine_step_ns", &engine_step_ns, py::arg("steps") = 1000000, py::arg("decide_every") = 10,
        "Nanoseconds per ResizeEngine.step, timed in C++ (benchmark helper).");
}
