// The policy registry: every entry is selectable by name where it says it runs (the live engine,
// the simulator), names it cannot run are refused with the list of valid ones, and an entry added
// at run time is selectable in both at once (the engine and the simulator read only the registry).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "dra/engine.hpp"
#include "dra/policy/registry.hpp"
#include "dra/sim/simulator.hpp"

namespace fs = std::filesystem;
using dra::policy::policy_registry;
using dra::policy::sim_scheduler;

namespace {

const dra::sim::profile_library& shipped() {
  static const dra::sim::profile_library lib =
      dra::sim::profile_library::load((fs::path(DRA_SOURCE_DIR) / "data" / "pollux" / "traces").string());
  return lib;
}

std::vector<dra::sim::job_spec> small_workload() {
  std::vector<dra::sim::job_spec> jobs(3);
  const char* apps[] = {"cifar10", "bert", "ncf"};
  for (int i = 0; i < 3; ++i) {
    jobs[i].name = std::string(apps[i]) + "-" + std::to_string(i);
    jobs[i].application = apps[i];
    jobs[i].submit_s = 30.0 * i;
    jobs[i].replicas = i == 2 ? 1 : 2;
    jobs[i].batch = i == 0 ? 256 : i == 1 ? 96 : 32768;
  }
  return jobs;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

TEST_CASE("registry.every_entry_is_selectable_where_it_runs") {
  int engine = 0, simulated = 0;
  for (const auto& e : policy_registry::entries()) {
    CAPTURE(e.name);
    CHECK(contains(dra::policy_names(), e.name) == e.engine);
    CHECK(contains(dra::sim::policy_names(), e.name) == (e.simulator != sim_scheduler::none));
    if (e.engine) {
      ++engine;
      dra::engine_config c;
      c.policy = e.name;
      dra::resize_engine eng(c);
      for (int s = 0; s < 30; ++s) eng.step(s, 2.0 / (1.0 + s));
      CHECK(eng.status().decisions == 3);
    }
    if (e.simulator != sim_scheduler::none) {
      ++simulated;
      dra::sim::sim_config c;
      c.policy = e.name;
      const auto r = dra::sim::simulate(shipped(), small_workload(), c);
      CHECK(r.all_completed);
      CHECK(r.policy == e.name);
    }
  }
  CHECK(engine >= 3);
  CHECK(simulated >= 5);
}

TEST_CASE("registry.unknown_names_are_refused_with_the_valid_ones") {
  dra::engine_config c;
  c.policy = "pollux";  // a cluster policy: the simulator runs it, the engine cannot
  try {
    c.validate();
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("'pollux'") != std::string::npos);
    CHECK(msg.find("'convergence_aware'") != std::string::npos);
  }
  dra::sim::sim_config s;
  s.policy = "zeus_cost";  // an energy objective: the engine runs it, the simulator does not
  CHECK_THROWS_AS(s.validate(), std::invalid_argument);
  CHECK_THROWS_AS(policy_registry::add({"pollux", "", false, sim_scheduler::cluster, false, "", nullptr}),
                  std::invalid_argument);
  CHECK_THROWS_AS(policy_registry::add({"x", "no_such_section", true, sim_scheduler::none, true, "", nullptr}),
                  std::invalid_argument);
  CHECK_THROWS_AS(policy_registry::add({"y", "", true, sim_scheduler::none, true, "", nullptr}), std::invalid_argument);
}

TEST_CASE("registry.a_new_entry_shows_up_in_the_engine_and_the_simulator") {
  // A per-job policy that always holds, under a new name with the goodput section.
  policy_registry::add(
      {"test_hold", "goodput", true, sim_scheduler::per_job, true, "holds",
       [](const dra::policy::policy_sections&) { return std::make_shared<dra::policy::hold_policy>(); }});
  CHECK(contains(dra::policy_names(), "test_hold"));
  CHECK(contains(dra::sim::policy_names(), "test_hold"));
  dra::engine_config c;
  c.policy = "test_hold";
  dra::resize_engine eng(c);
  for (int s = 0; s < 10; ++s) eng.step(s, 1.0);
  CHECK(eng.status().last_decision.kind == dra::policy::action::hold);
  dra::sim::sim_config sc;
  sc.policy = "test_hold";
  const auto r = dra::sim::simulate(shipped(), small_workload(), sc);
  CHECK(r.all_completed);
  for (const auto& j : r.jobs) CHECK(j.reallocations == 0);  // never resized after its start
  policy_registry::remove("test_hold");
  CHECK(!contains(dra::policy_names(), "test_hold"));
  CHECK_THROWS_AS(policy_registry::at("test_hold", true), std::invalid_argument);
}
