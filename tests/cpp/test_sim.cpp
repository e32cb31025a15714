// Cluster simulator: CSV errors, profile interpolation against values computed by hand from the
// shipped CSVs, a single job finishing at the analytically expected time, conservation of
// devices, determinism of the study, and the cluster arbiter.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "dra/policy/cluster_arbiter.hpp"
#include "dra/sim/study.hpp"
#include "sim_test_support.hpp"

namespace fs = std::filesystem;
using namespace dra::sim;

namespace {

using sim_test::data_dir;
using sim_test::shipped;
using sim_test::write;

/// A two-epoch toy application whose completion time can be worked out by hand.
fs::path toy_traces() {
  const fs::path root = fs::temp_directory_path() / ("dra_sim_toy_" + std::to_string(::getpid()));
  write(root / "toy" / "placements.csv",
        "placement,local_bsz,step_time,sync_time\n1,10,0.5,0.0\n1,20,1.0,0.0\n2,10,0.6,0.1\n2,20,1.1,0.1\n");
  write(root / "toy" / "scalability.csv", "num_nodes,num_replicas,local_bsz,step_time,sync_time\n");
  write(root / "toy" / "validation-10.csv",
        "progress,iteration,metric,grad_sqr,grad_var\n100,100,0.5,1.0,1.0\n200,200,0.8,1.0,1.0\n");
  write(root / "toy" / "validation-20.csv",
        "progress,iteration,metric,grad_sqr,grad_var\n100,60,0.5,1.0,1.0\n210,120,0.8,1.0,1.0\n");
  return root;
}

}  // namespace

TEST_CASE("sim.csv.malformed_row_names_file_line_column") {
  const auto t = csv_table::parse_text(
      "name,time,application,num_replicas,batch_size\nj0,10,cifar10,1,128\nj1,abc,cifar10,1,128\n", "w.csv");
  CHECK(t.number(0, 1) == 10.0);
  try {
    (void)t.number(1, t.column("time"));
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("w.csv:3:") != std::string::npos);
    CHECK(msg.find("column 'time' (2)") != std::string::npos);
    CHECK(msg.find("'abc'") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(csv_table::parse_text("a,b\n1,2\n3\n", "x.csv"), doctest::Contains("x.csv:3: column 2"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)t.column("nope"), doctest::Contains("missing column 'nope'"), std::invalid_argument);
  // Decimal numbers only (strtod alone reads hexadecimal, inf and nan), and one column per name.
  const auto odd = csv_table::parse_text("t\n0x10\ninf\n1e3\n", "o.csv");
  CHECK_THROWS_WITH_AS((void)odd.number(0, 0),
                       doctest::Contains("o.csv:2: column 't' (1): '0x10' is not a finite decimal"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS((void)odd.number(1, 0), doctest::Contains("'inf'"), std::invalid_argument);
  CHECK(odd.number(2, 0) == 1000.0);
  CHECK_THROWS_WITH_AS(csv_table::parse_text("a,b,a\n1,2,3\n", "d.csv"),
                       doctest::Contains("d.csv:1: column 'a' appears twice in the header (columns 1 and 3)"),
                       std::invalid_argument);

  // Through the workload reader, with the profile checks.
  const fs::path bad = fs::temp_directory_path() / ("dra_sim_bad_" + std::to_string(::getpid()) + ".csv");
  write(bad, "name,time,application,num_replicas,batch_size\nj0,1,cifar10,2,128\nj1,2,cifar10,zero,128\n");
  const std::string where = bad.string() + ":3: column 'num_replicas' (4)";
  CHECK_THROWS_WITH_AS(read_workload(bad.string(), &shipped()), doctest::Contains(where.c_str()),
                       std::invalid_argument);
  write(bad, "name,time,application,num_replicas,batch_size\nj0,1,resnet9000,2,128\n");
  CHECK_THROWS_WITH_AS(read_workload(bad.string(), &shipped()), doctest::Contains(":2: column 'application' (3)"),
                       std::invalid_argument);
  write(bad, "name,time,application,num_replicas,batch_size\nj0,1,cifar10,2,99999\n");
  CHECK_THROWS_WITH_AS(read_workload(bad.string(), &shipped()), doctest::Contains(":2: column 'batch_size' (5)"),
                       std::invalid_argument);
  fs::remove(bad);
}

TEST_CASE("sim.interpolation.placement") {
  const auto& cifar = shipped().at("cifar10");
  // placements.csv rows "1,32,0.0427886962890625,0.0004995360016822816" and
  // "1,45,0.05048525333404541,0.000504022404551506": halfway in local batch.
  const step_times mid = cifar.throughput({1}, 38.5);
  CHECK(mid.step_s == doctest::Approx((0.0427886962890625 + 0.05048525333404541) / 2).epsilon(1e-12));
  CHECK(mid.sync_s == doctest::Approx((0.0004995360016822816 + 0.000504022404551506) / 2).epsilon(1e-12));
  CHECK(cifar.throughput({1}, 32.0).step_s == doctest::Approx(0.0427886962890625).epsilon(1e-15));
  // Rotation to the smallest order: {2, 1} and {1, 2} are the same placement "12"; zeros dropped.
  CHECK(placement_key({2, 1}) == "12");
  CHECK(placement_key({0, 3, 0, 1, 4}) == "143");
  CHECK(cifar.throughput({2, 1}, 64.0).step_s == cifar.throughput({0, 1, 2}, 64.0).step_s);
  // Beyond the measured range: clamped to the edge.
  CHECK(cifar.throughput({1}, 1.0).step_s == cifar.throughput({1}, 32.0).step_s);
}

TEST_CASE("sim.interpolation.scalability_grid") {
  const auto& cifar = shipped().at("cifar10");
  // Six nodes with one device each is not in placements.csv: scalability.csv row
  // "6,6,32,0.14090566635131835,0.09941204528808593" is hit exactly.
  const step_times t = cifar.throughput({1, 1, 1, 1, 1, 1}, 32.0);
  CHECK_FALSE(cifar.has_placement({1, 1, 1, 1, 1, 1}));
  CHECK(t.step_s == doctest::Approx(0.14090566635131835).epsilon(1e-12));
  CHECK(t.sync_s == doctest::Approx(0.09941204528808593).epsilon(1e-12));
  // Between two measured local batches of the same (nodes, replicas): linear.
  const step_times a = cifar.throughput({1, 1, 1, 1, 1, 1}, 32.0), b = cifar.throughput({1, 1, 1, 1, 1, 1}, 45.0);
  CHECK(cifar.throughput({1, 1, 1, 1, 1, 1}, 38.5).step_s == doctest::Approx((a.step_s + b.step_s) / 2));
}

TEST_CASE("sim.interpolation.efficiency_and_progress") {
  const auto& cifar = shipped().at("cifar10");
  // validation-128.csv epoch 0: grad_sqr 8.947307535897329, grad_var 5.066593295150894;
  // validation-256.csv epoch 0: grad_sqr 17.379458169870425, grad_var 13.937760473946334.
  const auto [sqr, var] = cifar.grad_stats(192.0, 0);
  CHECK(sqr == doctest::Approx((8.947307535897329 + 17.379458169870425) / 2));
  CHECK(var == doctest::Approx((5.066593295150894 + 13.937760473946334) / 2));
  // Epoch 1 ends at the smallest first-row progress over the six files (validation-256: 390.714...).
  CHECK(cifar.progress_at(1) == doctest::Approx(390.71438596642224));
  CHECK(cifar.progress_at(0) == 0.0);
  CHECK(cifar.init_batch() == 128.0);
  CHECK(cifar.max_batch() == 4096.0);
  CHECK(cifar.max_epochs() == 100);
  CHECK(shipped().at("yolov3").max_local_batch() == 8.0);
  // The efficiency the simulator charges is the policy library's: (B + M0) / (B + M), B = M0 var/sqr.
  const double gns = 128.0 * var / sqr;
  const double gain = detail::adascale_gain_from_stats(sqr, var, 512.0 / 128.0);
  CHECK(gain / 4.0 == doctest::Approx(dra::policy::statistical_efficiency(gns, true, 512.0, 128.0)));
}

TEST_CASE("sim.single_job.analytic_completion") {
  const fs::path root = toy_traces();
  const profile_library lib = profile_library::load(root.string());
  const auto& toy = lib.at("toy");
  CHECK(toy.progress_at(2) == 200.0);  // min(200, 210)

  SUBCASE("one device, batch at M0: gain 1, 0.5 s per step") {
    // Allocated at the first decision (t = 60), 30 s reallocation cost, then 200 progress at
    // 1 / 0.5 s = 2 per second: 100 s. Done at 60 + 30 + 100 = 190.
    sim_config c;
    c.policy = "static";
    c.reallocation_cost_s = 30.0;
    const sim_result r = simulate(lib, {{"j", 0.0, "toy", 1, 10.0}}, c);
    REQUIRE(r.jobs.size() == 1);
    CHECK(r.jobs[0].completion_s == doctest::Approx(190.0).epsilon(1e-12));
    CHECK(r.jobs[0].jct_s == doctest::Approx(190.0).epsilon(1e-12));
    CHECK(r.jobs[0].epochs == 2);
    CHECK(r.jobs[0].gpu_seconds == doctest::Approx(130.0));          // held from 60 to 190
    CHECK(r.jobs[0].compute_gpu_seconds == doctest::Approx(100.0));  // sync 0: all training time computes
    CHECK(r.jobs[0].final_metric == doctest::Approx(0.8));
  }
  SUBCASE("two devices, batch 20: AdaScale gain 4/3, 0.6 s per step") {
    // scale 2, gain (1 + 1) / (1/2 + 1) = 4/3 per step of 0.6 s: 200 / (4/3 / 0.6) = 90 s.
    sim_config c;
    c.policy = "static";
    c.reallocation_cost_s = 20.0;
    const sim_result r = simulate(lib, {{"j", 5.0, "toy", 2, 20.0}}, c);
    CHECK(r.jobs[0].completion_s == doctest::Approx(60.0 + 20.0 + 90.0).epsilon(1e-12));
    CHECK(r.jobs[0].jct_s == doctest::Approx(165.0).epsilon(1e-12));
    CHECK(r.jobs[0].gpu_seconds == doctest::Approx(2 * 110.0));
    CHECK(r.jobs[0].compute_gpu_seconds == doctest::Approx(2 * 90.0 * 0.5 / 0.6));
  }
  fs::remove_all(root);
}

TEST_CASE("sim.conservation.every_policy") {
  auto jobs = read_workload((data_dir() / "workloads" / "workload-1.csv").string(), &shipped());
  jobs.resize(40);
  for (const auto& policy : policy_names()) {
    CAPTURE(policy);
    sim_config c;
    c.policy = policy;
    // The simulator checks conservation after every decision and throws std::logic_error when
    // devices are over-allocated, double-counted, or still held by a finished job.
    sim_result r;
    CHECK_NOTHROW(r = simulate(shipped(), jobs, c));
    CHECK(r.all_completed);
    for (const auto& p : r.timeline) CHECK(p.allocated <= r.capacity);
    for (const auto& j : r.jobs) {
      CHECK(j.completion_s >= j.start_s);
      CHECK(j.start_s >= j.submit_s);
      CHECK(j.max_devices <= r.capacity);
      if (policy == "static" || policy == "tiresias") CHECK(j.max_devices == j.requested_replicas);
      CHECK(j.busy_gpu_seconds <= j.gpu_seconds + 1e-6);
    }
    // After the last completion the next decision frees everything.
    CHECK(r.timeline.back().allocated == 0);
  }
}

TEST_CASE("sim.fidelity.tiresias_matches_published") {
  // The Tiresias-style baseline follows the reference's semantics; its published average JCT on
  // workload-1 is 2473.7 s (published_jct.json). A faithful replay lands close to it.
  const auto jobs = read_workload((data_dir() / "workloads" / "workload-1.csv").string(), &shipped());
  sim_config c;
  c.policy = "tiresias";
  const sim_result r = simulate(shipped(), jobs, c);
  double sum = 0.0;
  for (const auto& j : r.jobs) sum += j.jct_s;
  CHECK(sum / static_cast<double>(r.jobs.size()) == doctest::Approx(2473.7).epsilon(0.05));
}

TEST_CASE("sim.study.deterministic_for_a_seed") {
  const auto pool = read_workload((data_dir() / "workloads" / "workload-2.csv").string(), &shipped());
  study_config c;
  c.runs = 12;
  c.seed = 42;
  const auto a = run_study(shipped(), pool, c);
  const auto b = run_study(shipped(), pool, c);
  REQUIRE(a.size() == 12);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].spec.application == b[i].spec.application);
    CHECK(a[i].spec.batch == b[i].spec.batch);
    CHECK(a[i].spec.replicas == b[i].spec.replicas);
    CHECK(a[i].spec.throughput_scale == b[i].spec.throughput_scale);
    for (const auto& p : c.policies) CHECK(a[i].results.at(p).completion_s == b[i].results.at(p).completion_s);
  }
  c.seed = 43;
  const auto other = run_study(shipped(), pool, c);
  int differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += a[i].spec.throughput_scale != other[i].spec.throughput_scale;
  CHECK(differ > 0);
  // Run i does not depend on how many runs are drawn.
  c.seed = 42;
  c.runs = 3;
  const auto prefix = run_study(shipped(), pool, c);
  CHECK(prefix[2].spec.batch == a[2].spec.batch);
  CHECK(prefix[2].spec.gns_scale == a[2].spec.gns_scale);
}

TEST_CASE("sim.arbiter.power_mean") {
  using dra::policy::arbiter_job;
  const dra::policy::cluster_arbiter arbiter;
  auto linear = [](int most) {
    arbiter_job j;
    for (int k = 0; k <= most; ++k) j.speedup.push_back(k);
    return j;
  };
  SUBCASE("linear speedups share equally") {
    const auto alloc = arbiter.allocate({linear(8), linear(8), linear(8), linear(8)}, 8);
    CHECK(alloc == std::vector<int>{2, 2, 2, 2});
  }
  SUBCASE("fewer devices than jobs: at most one each, never over capacity") {
    const auto alloc = arbiter.allocate({linear(4), linear(4), linear(4)}, 2);
    CHECK(alloc[0] + alloc[1] + alloc[2] == 2);
    for (int k : alloc) CHECK(k <= 1);
  }
  SUBCASE("a job that stops scaling gets no more") {
    arbiter_job flat;
    flat.speedup = {0.0, 1.0, 1.0, 1.0, 1.0};
    const auto alloc = arbiter.allocate({flat, linear(8)}, 8);
    CHECK(alloc[0] == 1);
    CHECK(alloc[1] == 7);
  }
  SUBCASE("a change penalty keeps the current allocation when the gain is small") {
    arbiter_job a = linear(8), b = linear(8);
    a.current = 5, b.current = 3;
    a.change_penalty = b.change_penalty = 0.5;
    CHECK(arbiter.allocate({a, b}, 8) == std::vector<int>{5, 3});
    a.change_penalty = b.change_penalty = 1.0;
    CHECK(arbiter.allocate({a, b}, 8) == std::vector<int>{4, 4});
  }
  SUBCASE("presence: under a weighted sum a waiting job starts before a running one keeps growing") {
    // A job that has run for a while holds all 4 devices and scales linearly; a new job arrives.
    // Without presence, taking one device costs the runner 1.3 (4 - 3 x 0.9: the device and its
    // restart penalty) and the newcomer's first device brings 0.5 (its own start penalty), so the
    // newcomer waits; with one device's worth of presence each, it starts (5.2 > 5).
    const dra::policy::cluster_arbiter sum(dra::policy::arbiter_config{1.0});
    arbiter_job running = linear(4), waiting = linear(4);
    running.current = 4, running.change_penalty = 0.9;
    waiting.current = 0, waiting.change_penalty = 0.5;
    CHECK(sum.allocate({running, waiting}, 4) == std::vector<int>{4, 0});
    running.presence = waiting.presence = 1.0;
    CHECK(sum.allocate({running, waiting}, 4) == std::vector<int>{3, 1});
    // The restart penalty never discounts presence.
    CHECK(dra::policy::cluster_arbiter::effective(waiting, 1) == doctest::Approx(0.5 + 1.0));
    waiting.presence = -1.0;
    CHECK_THROWS_WITH_AS(sum.allocate({running, waiting}, 4), doctest::Contains("presence"), std::invalid_argument);
    dra::policy::completion_config c;
    CHECK(c.presence(2.0, 0.25) == doctest::Approx(c.admission * 2.0 * 0.25));
    c.power = -1.0;  // the fair objective admits by itself
    CHECK(c.presence(2.0, 0.25) == 0.0);
    c.admission = -0.1;
    CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("admission"), std::invalid_argument);
  }
  SUBCASE("bad input") {
    arbiter_job bad;
    bad.speedup = {0.0, -1.0};
    CHECK_THROWS_AS(arbiter.allocate({bad}, 4), std::invalid_argument);
    CHECK_THROWS_AS(dra::policy::cluster_arbiter(dra::policy::arbiter_config{0.0}), std::invalid_argument);
  }
}

TEST_CASE("sim.config.validation") {
  sim_config c;
  c.policy = "fastest";
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("unknown policy 'fastest'"), std::invalid_argument);
  c.policy = "static";
  c.reallocation_cost_s = -1.0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("reallocation_cost_s"), std::invalid_argument);
}

TEST_CASE("sim.limits.reference_ncf_one_device") {
  // The reference pins ncf to one device; the profiles measure it on up to 64. The replays keep
  // the reference's limit, the study may lift it.
  const std::vector<job_spec> jobs{{"ncf-0", 0.0, "ncf", 1, 32768.0}};
  sim_config c;
  c.policy = "arbiter";
  CHECK(simulate(shipped(), jobs, c).jobs[0].max_devices == 1);
  c.reference_limits = false;
  c.quota_scale = 4.0;
  const job_result free_run = simulate(shipped(), jobs, c).jobs[0];
  CHECK(free_run.max_devices > 1);
  CHECK(free_run.max_devices <= 4);  // the quota: 4 x the one device requested
}

TEST_CASE("sim.study.baselines_share_the_budget_and_hindsight_is_no_worse") {
  const auto pool = read_workload((data_dir() / "workloads" / "workload-1.csv").string(), &shipped());
  study_config c;
  c.runs = 8;
  c.seed = 5;
  const auto runs = run_study(shipped(), pool, c);
  for (const auto& r : runs) {
    CAPTURE(r.spec.application);
    auto time = [&](const std::string& p) { return r.results.at(p).completion_s - r.results.at(p).start_s; };
    CHECK(time("static_best_size") <= time("static_request") + 1e-6);
    CHECK(time("static_best_hindsight") <= time("static_best_size") + 1e-6);
    CHECK(r.best_size_devices <= r.spec.replicas);
    CHECK(r.hindsight_devices <= r.spec.replicas);
    // The same target for every policy: fixed per application, not derived from static's run.
    CHECK(r.spec.target_metric == fixed_target(shipped().at(r.spec.application)));
    for (const auto& p : c.policies) CHECK(r.results.at(p).max_devices <= r.spec.replicas);  // quota 1
  }
}

TEST_CASE("sim.per_job.batch_decisions_are_applied") {
  // A lone cifar10 job under convergence_aware: its policy changes the batch as the noise scale
  // grows, and the simulator trains at the batch it chose.
  const std::vector<job_spec> jobs{{"c", 0.0, "cifar10", 4, 512.0}};
  sim_config c;
  c.policy = "convergence_aware";
  c.cluster_arbitration = false;
  c.quota_scale = 1.0;
  c.reallocation_cost_s = 1.0;
  const job_result r = simulate(shipped(), jobs, c).jobs.at(0);
  CHECK(r.max_devices <= 4);
  CHECK(r.final_batch != 512.0);
  CHECK(r.busy_gpu_seconds <= r.gpu_seconds);
  CHECK(r.compute_gpu_seconds <= r.busy_gpu_seconds);
}

TEST_CASE("sim.signals.no_plateau_before_half_of_a_run_on_the_traces") {
  // The simulator's estimator (fed once per epoch with the validation error) must not report a
  // plateau before half of any shipped run: a plateau there would release devices too early.
  int runs = 0, fired = 0, windowed_early = 0;
  for (const auto& name : shipped().names()) {
    const auto& app = shipped().at(name);
    for (double batch : app.validated_batches()) {
      CAPTURE(name);
      CAPTURE(batch);
      auto first_plateau = [&](const dra::signals::estimator_config& config) {
        dra::signals::convergence_estimator est(config);
        for (int e = 0; e < app.max_epochs(); ++e) {
          const double m = app.metric(batch, e);
          const double loss = app.metric_increases() ? std::max((m <= 1.0 ? 1.0 : 100.0) - m, 1e-6) : m;
          est.update_loss(e + 1, loss);
          if (est.signals().plateau) return e + 1;
        }
        return -1;
      };
      const int first = first_plateau(sim_config::epoch_estimator_config());
      auto windowed_only = sim_config::epoch_estimator_config();
      windowed_only.plateau_history_fraction = 0.0;
      const int w = first_plateau(windowed_only);
      windowed_early += w >= 0 && w * 2 < app.max_epochs();
      ++runs;
      if (first >= 0) {
        ++fired;
        CHECK(first * 2 >= app.max_epochs());
      }
    }
  }
  CHECK(runs == 40);
  MESSAGE("plateau fired in " << fired << " of " << runs
                              << " traced runs; without the history guard it fires before "
                                 "half of the run in "
                              << windowed_early);
}

TEST_CASE("sim.arbiter.greedy_search_finds_the_exhaustive_optimum") {
  // The cluster search (greedy + single-device moves) over Pollux's objective, checked against
  // exhaustive enumeration on small random instances: concave speedup curves with restart penalties.
  detail::portable_rng rng(11);
  const dra::policy::cluster_arbiter arbiter;
  int optimal = 0, total = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng.below(3));
    const int capacity = 2 + static_cast<int>(rng.below(7));
    std::vector<dra::policy::arbiter_job> jobs(static_cast<std::size_t>(n));
    for (auto& j : jobs) {
      const int most = 1 + static_cast<int>(rng.below(6));
      const double rate = 0.3 + rng.uniform();
      const double sat = 0.05 + 0.5 * rng.uniform();
      j.speedup.push_back(0.0);
      for (int k = 1; k <= most; ++k) j.speedup.push_back(rate * k / (1.0 + sat * (k - 1)));
      j.current = static_cast<int>(rng.below(static_cast<std::uint64_t>(most) + 1));
      j.change_penalty = 0.7 + 0.3 * rng.uniform();
    }
    const auto alloc = arbiter.allocate(jobs, capacity);
    double best = 0.0;
    std::vector<int> a(static_cast<std::size_t>(n), 0);
    std::function<void(std::size_t, int)> search = [&](std::size_t j, int left) {
      if (j == a.size()) {
        best = std::max(best, arbiter.objective(jobs, a));
        return;
      }
      for (int k = 0; k < static_cast<int>(jobs[j].speedup.size()) && k <= left; ++k) {
        a[j] = k;
        search(j + 1, left - k);
      }
      a[j] = 0;
    };
    search(0, capacity);
    ++total;
    const double got = arbiter.objective(jobs, alloc);
    CHECK(got >= best * 0.98);
    optimal += got >= best * (1.0 - 1e-9);
  }
  MESSAGE("greedy + local search optimal in " << optimal << " of " << total << " instances");
  CHECK(optimal * 10 >= total * 9);
}

// ---- issue 21: no oracle by construction, realistic declarations, the estimator on the traces ----

namespace {
// Detection of a member by name: a policy cannot read what its view does not have.
#define DRA_HAS_MEMBER(member)              \
  template <class T, class = void>          \
  struct has_##member : std::false_type {}; \
  template <class T>                        \
  struct has_##member<T, std::void_t<decltype(&T::member)>> : std::true_type {};
DRA_HAS_MEMBER(app)
DRA_HAS_MEMBER(spec)
DRA_HAS_MEMBER(progress_at)
DRA_HAS_MEMBER(target_metric)
DRA_HAS_MEMBER(stop_patience)
DRA_HAS_MEMBER(gns_scale)
DRA_HAS_MEMBER(throughput_scale)
DRA_HAS_MEMBER(gns_estimate_sigma)
DRA_HAS_MEMBER(progress)
DRA_HAS_MEMBER(done)
DRA_HAS_MEMBER(epochs_done)
#undef DRA_HAS_MEMBER
}  // namespace

TEST_CASE("sim.view.policies_cannot_reach_the_truth") {
  // The truth lives in job_state (its profile and spec); the cluster policies take job views.
  static_assert(has_app<detail::job_state>::value && has_spec<detail::job_state>::value, "the detector works");
  static_assert(!has_app<job_view>::value, "a view must not reach the profile (future metrics, epochs)");
  static_assert(!has_spec<job_view>::value, "a view must not reach the spec (truth fields)");
  static_assert(!has_progress_at<job_view>::value && !has_target_metric<job_view>::value &&
                    !has_stop_patience<job_view>::value && !has_gns_scale<job_view>::value &&
                    !has_throughput_scale<job_view>::value && !has_gns_estimate_sigma<job_view>::value &&
                    !has_progress<job_view>::value && !has_done<job_view>::value,
                "no truth field in the view");
  static_assert(has_epochs_done<job_view>::value, "what the job reports is there");
  static_assert(std::is_invocable_r_v<detail::cluster_request, decltype(&detail::cluster_allocation),
                                      std::vector<job_view*>&, const detail::cluster_context&>,
                "the cluster policies decide from views");

  // Behaviour: two workloads that differ only in a truth no job has revealed yet (whether a job
  // stops early) get the same decisions until the first job stops; the oracle sees it at once.
  auto jobs = read_workload((data_dir() / "workloads" / "workload-6.csv").string(), &shipped());
  jobs.resize(16);
  declaration_config plain;
  declare_budgets(jobs, shipped(), plain);
  auto stopping = jobs;
  for (auto& j : stopping) j.stop_patience = 10;
  auto run = [&](const std::string& policy, const std::vector<job_spec>& js) {
    sim_config c;
    c.policy = policy;
    return simulate(shipped(), js, c);
  };
  const sim_result a = run("convergence_aware", jobs), b = run("convergence_aware", stopping);
  double first_stop = INFINITY;
  for (const auto& j : b.jobs)
    if (j.stopped_early) first_stop = std::min(first_stop, j.completion_s);
  REQUIRE(std::isfinite(first_stop));
  auto same_until = [&](const sim_result& x, const sim_result& y, double until) {
    std::size_t same = 0, before = 0;
    for (std::size_t t = 0; t < std::min(x.timeline.size(), y.timeline.size()); ++t)
      if (x.timeline[t].time_s <= until) ++before, same += x.timeline[t].allocated == y.timeline[t].allocated;
    return std::make_pair(same, before);
  };
  const auto [same, before] = same_until(a, b, first_stop);
  REQUIRE(before > 3);
  CHECK(same == before);
  // What the jobs declare is visible, and changes the decisions (the comparison can fail).
  auto noisy = jobs;
  declaration_config d;
  d.sigma = 1.0;
  declare_budgets(noisy, shipped(), d);
  for (auto& j : noisy) j.declared_from_file = false;
  const sim_result c = run("convergence_aware", noisy);
  double end = 0.0;
  for (const auto& j : a.jobs) end = std::max(end, j.completion_s);
  const auto [same_noisy, all] = same_until(a, c, end);
  CHECK(same_noisy < all);
}

TEST_CASE("sim.target.by_work_matches_the_trace_at_one_batch") {
  // A run that never changes batch reaches the target at the same epoch under both rules.
  job_spec s{"j", 0.0, "cifar10", 4, 512.0};
  s.target_metric = fixed_target(shipped().at("cifar10"));
  sim_config c;
  c.policy = "static";
  const sim_result by_work = simulate(shipped(), {s}, c);
  s.target_by_work = false;
  const sim_result by_metric = simulate(shipped(), {s}, c);
  CHECK(by_work.jobs[0].reached_target);
  CHECK(by_work.jobs[0].epochs == by_metric.jobs[0].epochs);
  CHECK(by_work.jobs[0].epochs < shipped().at("cifar10").max_epochs());
}

TEST_CASE("sim.requests_above_the_cluster_are_refused") {
  // Capped, such a job would be another job (its batch per device, its throughput): refused.
  const profile_library lib = profile_library::load(toy_traces().string());
  sim_config c;
  c.policy = "static";
  c.nodes = 1;
  c.devices_per_node = 2;
  CHECK_THROWS_WITH_AS((void)simulate(lib, {{"big", 0.0, "toy", 4, 10.0}}, c),
                       doctest::Contains("job 'big' requests 4 devices but the cluster has 2"), std::invalid_argument);
  CHECK_NOTHROW((void)simulate(lib, {{"fits", 0.0, "toy", 2, 10.0}}, c));
}
