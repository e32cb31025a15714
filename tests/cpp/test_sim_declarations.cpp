// Cluster simulator: what jobs declare (log-normal error, a share declaring nothing, early
// stopping), the workload file's declared_epochs column and the declarations it refuses, and the
// remaining-work estimator's calibration on a trace.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dra/sim/simulator.hpp"
#include "dra/sim/workload.hpp"
#include "sim_test_support.hpp"

namespace fs = std::filesystem;
using namespace dra::sim;

namespace {

using sim_test::data_dir;
using sim_test::shipped;
using sim_test::write;

}  // namespace

TEST_CASE("sim.declarations.lognormal_error_none_share_and_early_stopping") {
  std::vector<job_spec> jobs(4000, job_spec{"j", 0.0, "cifar10", 1, 128.0});
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].name = "j" + std::to_string(i);
  declaration_config c;
  c.sigma = 0.5;
  c.none_share = 0.25;
  c.early_stop_share = 0.3;
  c.seed = 7;
  auto a = jobs;
  declare_budgets(a, shipped(), c);
  double n_none = 0, n_stop = 0, sum = 0, sum2 = 0, n = 0;
  for (const auto& j : a) {
    n_stop += j.stop_patience > 0;
    if (std::isnan(j.declared_epochs)) {
      ++n_none;
      continue;
    }
    const double r = std::log(j.declared_epochs / 100.0);  // cifar10's budget: 100 epochs
    sum += r, sum2 += r * r, ++n;
  }
  const auto total = static_cast<double>(a.size());
  CHECK(n_none / total == doctest::Approx(0.25).epsilon(0.1));
  CHECK(n_stop / total == doctest::Approx(0.3).epsilon(0.1));
  CHECK(sum / n == doctest::Approx(0.0).epsilon(0.05));
  CHECK(std::sqrt(sum2 / n - (sum / n) * (sum / n)) == doctest::Approx(0.5).epsilon(0.05));
  // Deterministic per (seed, index); sigma 0 declares the budget exactly.
  auto b = jobs;
  declare_budgets(b, shipped(), c);
  for (std::size_t i = 0; i < a.size(); i += 97)
    CHECK((a[i].declared_epochs == b[i].declared_epochs ||
           (std::isnan(a[i].declared_epochs) && std::isnan(b[i].declared_epochs))));
  auto exact = jobs;
  declare_budgets(exact, shipped(), declaration_config{});
  for (const auto& j : exact) CHECK(j.declared_epochs == 100.0);
  CHECK_THROWS_AS(declare_budgets(exact, shipped(), declaration_config{-1.0}), std::invalid_argument);
}

TEST_CASE("sim.workload.declared_epochs_column") {
  const fs::path dir = fs::temp_directory_path() / ("dra_sim_decl_" + std::to_string(::getpid()));
  write(dir / "w.csv",
        "name,time,application,num_replicas,batch_size,declared_epochs\n"
        "a,0,cifar10,1,128,60\nb,5,cifar10,1,128,\n");
  auto jobs = read_workload((dir / "w.csv").string(), &shipped());
  CHECK(jobs[0].declared_epochs == 60.0);
  CHECK(std::isnan(jobs[1].declared_epochs));  // an empty cell declares nothing
  declare_budgets(jobs, shipped(), declaration_config{});
  CHECK(jobs[0].declared_epochs == 60.0);  // a file's declaration is kept
  CHECK(std::isnan(jobs[1].declared_epochs));
  write(dir / "bad.csv", "name,time,application,num_replicas,batch_size,declared_epochs\na,0,cifar10,1,128,-3\n");
  try {
    read_workload((dir / "bad.csv").string(), &shipped());
    FAIL("expected an error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("declared_epochs") != std::string::npos);
    CHECK(std::string(e.what()).find(":2") != std::string::npos);
  }
  // Another declaration (steps, a target) is refused by name, not ignored: ignored, its jobs would
  // declare their exact budget.
  for (const std::string column : {"declared_steps", "Declared_Epochs"}) {
    write(dir / "other.csv", "name,time,application,num_replicas,batch_size," + column + "\na,0,cifar10,1,128,500\n");
    const std::string where = (dir / "other.csv").string() + ":1: column '" + column + "'";
    CHECK_THROWS_WITH_AS(read_workload((dir / "other.csv").string(), &shipped()), doctest::Contains(where.c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(read_workload((dir / "other.csv").string(), &shipped()),
                         doctest::Contains("accepts only declared_epochs"), std::invalid_argument);
  }
  fs::remove_all(dir);
}

TEST_CASE("sim.estimator.calibration_on_a_trace") {
  // Workload-3 (160 jobs, no imagenet) with noisy declarations, a quarter declaring nothing and
  // 30 % stopping early: the estimator's relative error (median and p90) at 10, 50 and 90 % of a
  // job's life and the coverage of its p90 at half of it (simulated; deterministic). The bounds sit
  // 1.4-4x above what this trace gives (MESSAGE prints it), so a real regression fails. Late in a
  // job the true remaining work is small, and an early stopper's estimate still points at its
  // declared budget, hence the large p90 at 90 %.
  auto jobs = read_workload((data_dir() / "workloads" / "workload-3.csv").string(), &shipped());
  declaration_config d;
  d.sigma = 0.5;
  d.none_share = 0.25;
  d.early_stop_share = 0.3;
  declare_budgets(jobs, shipped(), d);
  sim_config c;
  c.policy = "convergence_aware";
  c.record_timeline = false;
  const sim_result r = simulate(shipped(), jobs, c);
  struct errors {
    double median, p90, coverage;
    std::size_t n;
  };
  const auto at = [&](double f) {
    std::vector<double> err;
    double covered = 0;
    for (const auto& j : r.jobs)
      for (const auto& e : j.estimate_checks)
        if (e[0] == f && e[2] > 0.0) {
          err.push_back(std::abs(e[3] - e[2]) / e[2]);
          covered += e[2] <= e[4];
        }
    REQUIRE(!err.empty());
    std::sort(err.begin(), err.end());
    const errors out{err[err.size() / 2], err[err.size() * 9 / 10], covered / static_cast<double>(err.size()),
                     err.size()};
    MESSAGE("at " << f << " of life: median " << out.median << ", p90 " << out.p90 << ", p90 coverage " << out.coverage
                  << " (" << out.n << " jobs)");
    return out;
  };
  const errors early = at(0.1), half = at(0.5), late = at(0.9);
  // Measured on this trace: median 0.0013 / 0.0013 / 0.0002 and p90 0.54 / 0.57 / 5.5 at 10 / 50 /
  // 90 %, coverage 0.96 at half of life (finished jobs of the same kind make most estimates exact).
  // Before the cap at the class's longest total (signals::detail::total_law) the median at 90 % was
  // 0.57 (a near-finished job kept a remainder in proportion to the belief's spread), the p90 8.0
  // and the coverage 0.99.
  REQUIRE(half.n > 100);
  CHECK(early.median < 0.01);
  CHECK(early.p90 < 0.8);
  CHECK(half.median < 0.01);
  CHECK(half.p90 < 0.8);
  CHECK(half.coverage > 0.95);
  CHECK(late.median < 0.01);
  CHECK(late.p90 < 8.0);
}
