// A policy written outside dra (outside review): what its author's mistakes do to a decision.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "dra/engine.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/registry.hpp"

using namespace dra::policy;

namespace {

/// Proposes a fixed size and global batch, whatever the inputs.
class fixed_policy final : public policy {
 public:
  fixed_policy(int size, double batch) : size_(size), batch_(batch) {}
  const char* name() const noexcept override { return "my_fixed"; }
  proposal propose(const decision_inputs&, int, int) const override {
    return {size_, batch_, "my_fixed wants " + std::to_string(size_)};
  }

 private:
  int size_;
  double batch_;
};

/// Throws from propose, as a policy with a bug in it would.
template <class E>
class throwing_policy final : public policy {
 public:
  const char* name() const noexcept override { return "my_throwing"; }
  proposal propose(const decision_inputs&, int, int) const override { throw E("my model has no data yet"); }
};

world_state two_of_six() {
  world_state w;
  w.size = 2;
  w.active = {0, 1};
  w.candidates = {2, 3, 4, 5};
  w.global_batch = w.base_batch = 64.0;
  w.steps_since_resize = 100;
  return w;
}

decision decide_with(int size, double batch) {
  constraints limits;
  limits.min_size = 1;
  limits.max_size = 4;
  limits.max_change = 8;
  constrained_policy p(std::make_shared<fixed_policy>(size, batch), limits);
  throughput_model model;
  model.observe(2, 32.0, 0.1, 0.01);
  return p.decide({}, two_of_six(), capacity{6}, cost_model{0.0, 500.0}, model);
}

}  // namespace

TEST_CASE("outside.a_size_out_of_range_is_clamped_into_the_limits") {
  for (int size : {0, -5, 1000, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    CAPTURE(size);
    const decision d = decide_with(size, 0.0);
    CHECK(d.target_size >= 1);
    CHECK(d.target_size <= 4);
    CHECK(d.members.size() == static_cast<std::size_t>(d.target_size));
    CHECK(d.batch_scale == 1.0);
  }
}

TEST_CASE("outside.a_batch_that_is_not_a_batch_is_refused_naming_the_policy") {
  for (double batch : {std::numeric_limits<double>::infinity(), std::nan(""), -64.0}) {
    CAPTURE(batch);
    try {
      decide_with(2, batch);
      FAIL("expected an error");
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      CHECK(msg.find("global_batch") != std::string::npos);
      CHECK(msg.find("'my_fixed'") != std::string::npos);
      CHECK(msg.find("0 to keep") != std::string::npos);
    }
  }
  CHECK(decide_with(2, 0.0).batch_scale == 1.0);  // 0 keeps the batch
  CHECK(decide_with(2, 128.0).batch_scale == 2.0);
}

TEST_CASE("outside.an_exception_from_propose_names_the_policy_and_keeps_its_kind") {
  const auto check = [](const std::string& msg) {
    CHECK(msg.find("policy 'my_throwing' failed to propose a size (sizes 1..4)") != std::string::npos);
    CHECK(msg.find("my model has no data yet") != std::string::npos);
  };
  constraints limits;
  limits.max_size = 4;
  throughput_model model;
  model.observe(2, 32.0, 0.1, 0.01);
  try {
    constrained_policy(std::make_shared<throwing_policy<std::runtime_error>>(), limits)
        .decide({}, two_of_six(), capacity{6}, cost_model{0.0, 500.0}, model);
    FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    check(e.what());
  }
  try {
    constrained_policy(std::make_shared<throwing_policy<std::invalid_argument>>(), limits)
        .decide({}, two_of_six(), capacity{6}, cost_model{0.0, 500.0}, model);
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    check(e.what());
  }
  // The engine's desired_size (what a job asks a pool for) names it too.
  policy_registry::add({"outside_throwing", "", true, sim_scheduler::per_job, true, "throws",
                        [](const policy_sections&) { return std::make_shared<throwing_policy<std::logic_error>>(); }});
  dra::engine_config c;
  c.policy = "outside_throwing";
  c.limits.max_size = 4;
  dra::resize_engine eng(c);
  try {
    (void)eng.desired_size();
    FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    check(e.what());
  }
  policy_registry::remove("outside_throwing");
}

TEST_CASE("outside.a_registered_policy_runs_in_the_engine_by_name") {
  policy_registry::add({"outside_fixed", "", true, sim_scheduler::per_job, true, "grows to 3",
                        [](const policy_sections&) { return std::make_shared<fixed_policy>(3, 0.0); }});
  CHECK_THROWS_AS(policy_registry::add({"outside_fixed", "", true, sim_scheduler::none, true, "",
                                        [](const policy_sections&) { return std::make_shared<hold_policy>(); }}),
                  std::invalid_argument);
  dra::engine_config c;
  c.policy = "outside_fixed";
  c.decide_every = 5;
  dra::resize_engine eng(c);
  for (int s = 0; s < 5; ++s) eng.step(s, 1.0);
  CHECK(eng.status().last_decision.policy == "my_fixed");
  policy_registry::remove("outside_fixed");
}
