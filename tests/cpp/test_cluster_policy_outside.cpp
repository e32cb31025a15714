// A cluster policy written outside dra, as a researcher comparing a scheduler of their own against
// Pollux would write one: registered by name (dra::sim::add_cluster_policy), replayed on a shipped
// Pollux workload beside pollux and tiresias, checked for plausible results, and, in its first
// drafts, refused with an error that names the policy and the mistake. The example of
// docs/guide/simulator.md ("Your own cluster policy") is compiled here, between the guide markers,
// and a test checks that the guide shows it verbatim.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dra/policy/registry.hpp"
#include "dra/sim/simulator.hpp"
#include "guide_example.hpp"

// [guide:your-own-cluster-policy]
#include <algorithm>
#include <dra/sim/simulator.hpp>
#include <string>
#include <vector>

// Every job that has arrived gets floor(devices / jobs), at most its max_devices; with more jobs
// than devices, the first to arrive get one each and the others wait.
std::vector<int> equal_share(const dra::sim::cluster_inputs& in) {
  const int jobs = static_cast<int>(in.jobs.size());
  const int share = in.capacity / jobs;
  std::vector<int> counts(in.jobs.size(), 0);
  for (int i = 0; i < jobs; ++i)
    counts[i] = share > 0 ? std::min(share, in.jobs[i]->max_devices) : (i < in.capacity ? 1 : 0);
  return counts;
}

// Replays a shipped Pollux workload (data/pollux) under a policy: "equal_share" once registered,
// or a built-in ("pollux", "tiresias", "convergence_aware", ...).
dra::sim::sim_result replay(const std::string& data, const std::string& workload, const std::string& policy) {
  const auto profiles = dra::sim::profile_library::load(data + "/traces");
  const auto jobs = dra::sim::read_workload(data + "/workloads/" + workload, &profiles);
  dra::sim::sim_config config;
  config.policy = policy;
  return dra::sim::simulate(profiles, jobs, config);
}

void register_equal_share() {
  dra::sim::add_cluster_policy("equal_share", equal_share, "floor(devices / jobs) each, at most the job's max");
}
// [guide:your-own-cluster-policy]

namespace {

using dra::policy::policy_registry;
using dra::policy::sim_scheduler;
using dra::sim::cluster_inputs;
using dra::sim::sim_config;
using dra::sim::sim_result;

const std::string data_dir = std::string(DRA_SOURCE_DIR) + "/data/pollux";

const dra::sim::profile_library& shipped() {
  static const auto lib = dra::sim::profile_library::load(data_dir + "/traces");
  return lib;
}

std::vector<dra::sim::job_spec> first_jobs(std::size_t n) {
  auto jobs = dra::sim::read_workload(data_dir + "/workloads/workload-6.csv", &shipped());
  if (jobs.size() > n) jobs.resize(n);
  return jobs;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool listed(const std::string& name) {
  const auto& v = dra::sim::policy_names();
  return std::find(v.begin(), v.end(), name) != v.end();
}

// Registers `decide` as `name` for one scope.
struct registered {
  std::string name;
  registered(std::string n, dra::sim::cluster_policy_fn decide) : name(std::move(n)) {
    dra::sim::add_cluster_policy(name, std::move(decide));
  }
  ~registered() { dra::sim::remove_cluster_policy(name); }
  registered(const registered&) = delete;
  registered& operator=(const registered&) = delete;
};

sim_result run(const std::string& policy, const std::vector<dra::sim::job_spec>& jobs, double max_time_s = 0.0) {
  sim_config c;
  c.policy = policy;
  if (max_time_s > 0.0) c.max_time_s = max_time_s;
  return dra::sim::simulate(shipped(), jobs, c);
}

double mean_jct(const sim_result& r) {
  double s = 0.0;
  for (const auto& j : r.jobs) s += j.jct_s;
  return s / static_cast<double>(r.jobs.size());
}

// The error `policy` gets on the first jobs of workload-6; fails the test when there is none.
template <class E>
std::string refusal(const std::string& policy) {
  try {
    run(policy, first_jobs(12));
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an error from '" << policy << "'");
  return "";
}

}  // namespace

TEST_CASE("cluster_policy_outside.the_guide_shows_the_compiled_example") {
  dra_test::check_guide_shows_example("tests/cpp/test_cluster_policy_outside.cpp", "// [guide:your-own-cluster-policy]",
                                      "docs/guide/simulator.md", "## Your own cluster policy");
}

TEST_CASE("cluster_policy_outside.equal_share_against_pollux_and_tiresias_on_a_shipped_workload") {
  register_equal_share();
  CHECK(listed("equal_share"));
  // Every decision: one count per job, none over its max, never more than the cluster; what the
  // jobs hold when asked (the previous decision, placed) never exceeds the cluster either.
  int decisions = 0, most_held = 0;
  registered checked("equal_share_checked", [&](const cluster_inputs& in) {
    ++decisions;
    int held = 0;
    for (const auto* v : in.jobs) held += v->devices;
    most_held = std::max(most_held, held);
    return equal_share(in);
  });
  const std::string workload = "workload-6.csv";
  const sim_result mine = replay(data_dir, workload, "equal_share");
  const sim_result checked_run = replay(data_dir, workload, "equal_share_checked");
  const sim_result pollux = replay(data_dir, workload, "pollux");
  const sim_result tiresias = replay(data_dir, workload, "tiresias");
  const double ms = mean_jct(mine), mp = mean_jct(pollux), mt = mean_jct(tiresias);
  MESSAGE("workload-6 mean JCT (s): equal_share " << ms << ", pollux " << mp << ", tiresias " << mt << "; makespan "
                                                  << mine.makespan_s << " / " << pollux.makespan_s << " / "
                                                  << tiresias.makespan_s);
  CHECK(mine.policy == "equal_share");
  CHECK(mine.all_completed);
  CHECK(mine.jobs.size() == pollux.jobs.size());
  for (const auto& j : mine.jobs) {
    CAPTURE(j.name);
    CHECK(std::isfinite(j.jct_s));
    CHECK(j.jct_s > 0.0);
    CHECK(j.start_s >= j.submit_s);
    CHECK(j.max_devices >= 1);
  }
  for (const auto& p : mine.timeline) {
    CHECK(p.allocated <= mine.capacity);
    CHECK(p.busy_fraction <= 1.0 + 1e-9);
  }
  CHECK(decisions > 100);
  CHECK(most_held <= checked_run.capacity);
  CHECK(mean_jct(checked_run) == ms);  // the same policy gives the same run
  // Plausible: equal shares beat first come first served without resizing, and differ from Pollux
  // (a policy that silently ran dra's arbiter or Pollux under its name would equal one of them).
  CHECK(ms < mt);
  CHECK(ms != mp);
  const sim_result arbiter = replay(data_dir, workload, "arbiter");
  CHECK(ms != mean_jct(arbiter));
  dra::sim::remove_cluster_policy("equal_share");
  CHECK(!listed("equal_share"));
}

TEST_CASE("cluster_policy_outside.a_cluster_entry_without_a_decision_is_refused") {
  // Before: the simulator ran dra's arbiter under the new name (its results were the arbiter's).
  policy_registry::add({"mine_cluster", "", false, sim_scheduler::cluster, false, "no decision", nullptr});
  const std::string msg = refusal<std::invalid_argument>("mine_cluster");
  policy_registry::remove("mine_cluster");
  CHECK(contains(msg, "'mine_cluster'"));
  CHECK(contains(msg, "add_cluster_policy"));
  // A per-job policy that also claims the cluster: refused on a shared cluster, runs alone.
  policy_registry::add(
      {"mine_both", "", false, sim_scheduler::cluster_or_per_job, false, "holds",
       [](const dra::policy::policy_sections&) { return std::make_shared<dra::policy::hold_policy>(); }});
  const std::string both = refusal<std::invalid_argument>("mine_both");
  CHECK(contains(both, "'mine_both'"));
  CHECK(contains(both, "cluster_arbitration = false"));
  sim_config c;
  c.policy = "mine_both";
  c.cluster_arbitration = false;
  CHECK(dra::sim::simulate(shipped(), first_jobs(4), c).all_completed);
  policy_registry::remove("mine_both");
}

TEST_CASE("cluster_policy_outside.first_drafts_are_refused_naming_the_policy_and_the_mistake") {
  SUBCASE("more devices than the cluster has") {
    registered r("greedy_draft", [](const cluster_inputs& in) {
      std::vector<int> c;
      for (const auto* v : in.jobs) c.push_back(v->max_devices);  // everyone at their max
      return c;
    });
    const std::string msg = refusal<std::invalid_argument>("greedy_draft");
    MESSAGE(msg);
    CHECK(contains(msg, "'greedy_draft'"));
    CHECK(contains(msg, "devices in all but the cluster has 64"));
  }
  SUBCASE("more than a job's max") {
    registered r("over_max_draft", [](const cluster_inputs& in) {
      std::vector<int> c(in.jobs.size(), 0);
      c[0] = in.jobs[0]->max_devices + 1;
      return c;
    });
    const std::string msg = refusal<std::invalid_argument>("over_max_draft");
    CHECK(contains(msg, "'over_max_draft'"));
    CHECK(contains(msg, "max_devices"));
    CHECK(contains(msg, "job '"));
  }
  SUBCASE("a negative count") {
    registered r("negative_draft", [](const cluster_inputs& in) { return std::vector<int>(in.jobs.size(), -1); });
    const std::string msg = refusal<std::invalid_argument>("negative_draft");
    CHECK(contains(msg, "'negative_draft'"));
    CHECK(contains(msg, "-1 devices"));
  }
  SUBCASE("nothing for some jobs") {
    registered r("short_draft", [](const cluster_inputs&) { return std::vector<int>{1}; });
    const std::string msg = refusal<std::invalid_argument>("short_draft");
    CHECK(contains(msg, "'short_draft'"));
    CHECK(contains(msg, "one count per job"));
  }
  SUBCASE("an exception keeps its kind and names the policy") {
    registered r("throwing_draft", [](const cluster_inputs&) -> std::vector<int> { throw std::runtime_error("boom"); });
    const std::string msg = refusal<std::runtime_error>("throwing_draft");
    MESSAGE(msg);
    CHECK(contains(msg, "'throwing_draft'"));
    CHECK(contains(msg, "boom"));
    registered bad("refusing_draft",
                   [](const cluster_inputs&) -> std::vector<int> { throw std::invalid_argument("no jobs I like"); });
    CHECK(contains(refusal<std::invalid_argument>("refusing_draft"), "'refusing_draft'"));
  }
  SUBCASE("asking goodput about a job that is not there") {
    registered r("index_draft", [](const cluster_inputs& in) {
      in.goodput(in.jobs.size(), 1);
      return std::vector<int>(in.jobs.size(), 0);
    });
    const std::string msg = refusal<std::invalid_argument>("index_draft");
    CHECK(contains(msg, "'index_draft'"));
    CHECK(contains(msg, "use an index of inputs.jobs"));
  }
  SUBCASE("a policy that never gives a device ends at max_time_s, reported incomplete") {
    registered r("idle_draft", [](const cluster_inputs& in) { return std::vector<int>(in.jobs.size(), 0); });
    const sim_result res = run("idle_draft", first_jobs(4), 3600.0);
    CHECK(!res.all_completed);
    for (const auto& j : res.jobs) CHECK(std::isnan(j.jct_s));
  }
}

TEST_CASE("cluster_policy_outside.bad_registrations_change_nothing") {
  CHECK_THROWS_WITH_AS(dra::sim::add_cluster_policy("empty_fn", nullptr), doctest::Contains("'empty_fn'"),
                       std::invalid_argument);
  CHECK(!listed("empty_fn"));
  CHECK(dra::sim::find_cluster_policy("empty_fn") == nullptr);
  // A built-in's name is taken: refused, and pollux still runs Pollux.
  CHECK_THROWS_AS(dra::sim::add_cluster_policy("pollux", equal_share), std::invalid_argument);
  CHECK(dra::sim::find_cluster_policy("pollux") == nullptr);
  CHECK_THROWS_AS(dra::sim::add_cluster_policy("", equal_share), std::invalid_argument);
  CHECK(dra::sim::find_cluster_policy("") == nullptr);
  // The engine cannot run a cluster policy.
  registered r("sim_only", equal_share);
  CHECK_THROWS_AS(policy_registry::at("sim_only", true), std::invalid_argument);
}

TEST_CASE("cluster_policy_outside.a_cluster_policy_sees_only_what_a_real_scheduler_could_know") {
  // By construction: the inputs hold views (const), no job_state, profile or spec.
  static_assert(std::is_same_v<decltype(cluster_inputs::jobs), std::vector<const dra::sim::job_view*>>);
  static_assert(std::is_invocable_r_v<std::vector<int>, dra::sim::cluster_policy_fn, const cluster_inputs&>);
  // By behaviour: two workloads that differ only in a truth no job has revealed yet (whether a job
  // stops early) give the policy the same inputs until the first job stops.
  std::vector<std::string> seen;
  const auto r_decide = [&](const cluster_inputs& in) {
    std::ostringstream s;
    s.precision(17);
    s << in.now;
    for (std::size_t i = 0; i < in.jobs.size(); ++i) {
      const auto& v = *in.jobs[i];
      s << ' ' << v.name << ' ' << v.devices << ' ' << v.epochs_done << ' ' << v.remaining.median << ' ' << v.grad.sqr
        << ' ' << v.grad.var << ' ' << in.goodput(i, 4);
    }
    seen.push_back(s.str());
    return equal_share(in);
  };
  registered r("recorder", r_decide);
  auto jobs = first_jobs(16);
  auto stopping = jobs;
  for (auto& j : stopping) j.stop_patience = 10;
  auto inputs_of = [&](const std::string& policy, const std::vector<dra::sim::job_spec>& js, sim_result* out) {
    seen.clear();
    const sim_result res = run(policy, js);
    if (out) *out = res;
    return seen;
  };
  sim_result b;
  const std::vector<std::string> plain = inputs_of("recorder", jobs, nullptr);
  const std::vector<std::string> with_stop = inputs_of("recorder", stopping, &b);
  double first_stop = INFINITY;
  for (const auto& j : b.jobs)
    if (j.stopped_early) first_stop = std::min(first_stop, j.completion_s);
  REQUIRE(std::isfinite(first_stop));
  auto same_until = [&](const std::vector<std::string>& x, const std::vector<std::string>& y) {
    std::size_t before = 0, same = 0;
    for (std::size_t t = 0; t < std::min(x.size(), y.size()); ++t) {
      if (std::stod(x[t].substr(0, x[t].find(' '))) >= first_stop) break;
      ++before;
      same += x[t] == y[t];
    }
    return std::make_pair(before, same);
  };
  const auto [before, same] = same_until(plain, with_stop);
  CHECK(before > 3);
  CHECK(same == before);
  // Nor can a name hand it the truth: the oracle_ prefix (dra's upper bounds, which the simulator
  // gives the truth) is refused for a registered policy, nothing registered.
  CHECK_THROWS_WITH_AS(dra::sim::add_cluster_policy("oracle_recorder", r_decide),
                       doctest::Contains("the prefix 'oracle_' is kept for dra's built-in upper bounds"),
                       std::invalid_argument);
  CHECK(dra::sim::find_cluster_policy("oracle_recorder") == nullptr);
  CHECK(dra::policy::policy_registry::find("oracle_recorder") == nullptr);
}

TEST_CASE("cluster_policy_outside.a_policy_removed_while_it_runs_runs_on_as_it_began") {
  // Removed during the run (here by itself, at its second decision): the run kept looking it up at
  // every decision, fell through to dra's own arbiter and reported that under the policy's name
  // (and the function was destroyed while it ran). The run now holds the decision it began with.
  const auto jobs = first_jobs(12);
  registered plain("equal_plain", equal_share);
  const double expected = mean_jct(run("equal_plain", jobs));
  int calls = 0;
  dra::sim::add_cluster_policy("equal_self_removing", [&calls](const cluster_inputs& in) {
    if (++calls == 2) dra::sim::remove_cluster_policy("equal_self_removing");
    return equal_share(in);
  });
  const double got = mean_jct(run("equal_self_removing", jobs));
  CHECK(calls > 2);
  CHECK(got == doctest::Approx(expected).epsilon(1e-12));
  CHECK_FALSE(listed("equal_self_removing"));
}
