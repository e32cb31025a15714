// A third party extending dra the documented way (outside review, 2026-12-06): a policy of its own
// registered by name and run by the engine. A name the command line or a list would mangle, or
// one that claims dra's oracle prefix, is refused; a factory that returns null, and a policy that
// throws something that is not a std::exception, are named; a policy that throws once leaves the
// decision due, so the next step decides; in the simulator, its error names the job and the
// simulated time.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "dra/engine.hpp"
#include "dra/policy/registry.hpp"
#include "dra/sim/simulator.hpp"

using namespace dra;

namespace {

/// Grows to the most it may; throws on its first `failures` calls (what, per `kind`).
class flaky final : public policy::policy {
 public:
  flaky(int failures, int kind) : failures_(std::make_shared<int>(failures)), kind_(kind) {}
  const char* name() const noexcept override { return "flaky"; }
  dra::policy::proposal propose(const dra::policy::decision_inputs&, int, int hi) const override {
    if (*failures_ > 0) {
      --*failures_;
      if (kind_ == 0) throw std::runtime_error("transient");
      throw 42;  // not a std::exception
    }
    return {hi, 0.0, ""};  // says no reason
  }

 private:
  std::shared_ptr<int> failures_;  // propose() is const: the count lives outside
  int kind_;
};

struct registered {
  std::string name;
  registered(std::string n, int failures, int kind) : name(std::move(n)) {
    policy::policy_registry::add(
        {name, "", true, policy::sim_scheduler::per_job, true, "flaky",
         [=](const policy::policy_sections&) { return std::make_shared<flaky>(failures, kind); }});
  }
  ~registered() { policy::policy_registry::remove(name); }
};

engine_config config_for(const std::string& policy) {
  engine_config c;
  c.policy = policy;
  c.decide_every = 10;
  return c;
}

}  // namespace

TEST_CASE("extend_outside.a_policy_that_throws_once_decides_at_the_next_step") {
  registered r("ext_flaky", 1, 0);
  resize_engine e(config_for("ext_flaky"));
  e.capacity().available = 4;
  for (int s = 0; s < 9; ++s) e.step(s, 1.0);
  CHECK_THROWS_WITH_AS(e.step(9, 1.0), doctest::Contains("policy 'flaky' failed to propose a size"),
                       std::runtime_error);
  CHECK(e.status().decisions == 0);
  CHECK(e.steps_to_decision() == 1);  // still due: it was a full decide_every later
  const engine_status& st = e.step(10, 1.0);
  CHECK(st.decided);
  CHECK(st.decisions == 1);
  CHECK(st.last_decision.target_size == 4);
  CHECK(st.last_decision.reason == "flaky: (no reason given)");  // a decision always says why
  CHECK(e.steps_to_decision() == 10);
}

TEST_CASE("extend_outside.something_that_is_not_a_std_exception_is_named") {
  registered r("ext_throws_int", 1, 1);
  resize_engine e(config_for("ext_throws_int"));
  e.capacity().available = 4;
  for (int s = 0; s < 9; ++s) e.step(s, 1.0);
  CHECK_THROWS_WITH_AS(e.step(9, 1.0), doctest::Contains("policy 'flaky' failed to propose a size"),
                       std::runtime_error);
}

TEST_CASE("extend_outside.a_factory_that_returns_null_is_named") {
  policy::policy_registry::add(
      {"ext_null", "", true, policy::sim_scheduler::per_job, true, "null",
       [](const policy::policy_sections&) { return std::shared_ptr<const policy::policy>(); }});
  CHECK_THROWS_WITH_AS(resize_engine(config_for("ext_null")),
                       doctest::Contains("the factory registered as 'ext_null' returned null"), std::invalid_argument);
  policy::policy_registry::remove("ext_null");
}

TEST_CASE("extend_outside.names_a_command_line_or_a_list_would_mangle_are_refused") {
  const auto make = [](const policy::policy_sections&) { return std::make_shared<flaky>(0, 0); };
  const std::size_t before = policy::policy_registry::entries().size();
  for (const std::string odd : {"my policy", ",a,b", "--json", "-x", ".hidden", "a/b", "née", "x\ny"}) {
    CAPTURE(odd);
    CHECK_THROWS_WITH_AS(policy::policy_registry::add({odd, "", true, policy::sim_scheduler::per_job, true, "", make}),
                         doctest::Contains("cannot name a policy"), std::invalid_argument);
  }
  // The built-in baselines' schedules run those baselines, not the entry: refused.
  for (const auto sched : {policy::sim_scheduler::first_come, policy::sim_scheduler::tiresias})
    CHECK_THROWS_WITH_AS(policy::policy_registry::add({"as_baseline", "", true, sched, true, "", make}),
                         doctest::Contains("run dra's built-in static and Tiresias baselines"), std::invalid_argument);
  // dra's oracle prefix: the simulator hands those the truth, and reports call them upper bounds.
  CHECK_THROWS_WITH_AS(
      policy::policy_registry::add({"oracle_peek", "", true, policy::sim_scheduler::per_job, true, "", make}),
      doctest::Contains("the prefix 'oracle_' is kept for dra's built-in upper bounds"), std::invalid_argument);
  CHECK(policy::policy_registry::entries().size() == before);
  for (const std::string fine : {"mine", "my-policy", "v2.1", "A_b"}) {
    CHECK_NOTHROW(policy::policy_registry::add({fine, "", true, policy::sim_scheduler::per_job, true, "", make}));
    policy::policy_registry::remove(fine);
  }
  CHECK(policy::policy_registry::entries().size() == before);
}

TEST_CASE("extend_outside.a_per_job_policy_that_throws_in_the_simulator_is_named_with_its_job_and_time") {
  registered r("ext_flaky_sim", 1 << 20, 0);
  const std::string data = std::string(DRA_SOURCE_DIR) + "/data/pollux";
  const auto profiles = sim::profile_library::load(data + "/traces");
  auto jobs = sim::read_workload(data + "/workloads/workload-6.csv", &profiles);
  jobs.resize(3);
  sim::sim_config c;
  c.policy = "ext_flaky_sim";
  try {
    (void)sim::simulate(profiles, jobs, c);
    FAIL("the simulation ran a policy that always throws");
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.rfind("job '" + jobs.front().name + "' at t = ", 0) == 0);
    CHECK(msg.find(" s: policy 'flaky' failed to propose a size") != std::string::npos);
    CHECK(msg.find("transient") != std::string::npos);
  }
}
