// The driver of fair-lead-results.txt (simulated, 2026-12-04): one policy on one Pollux workload and
// load, 30 s per change, declarations of seed 1 at the given sigma; prints "policy load workload
// sigma avg_jct p99_jct reallocations makespan". Built against main with fair-lead.patch applied
// (the patch is not in the tree; see README.md, "A fair-sojourn rank"), from the repository root:
//   git apply docs/results/sim/issue21/fair-lead.patch
//   g++ -O2 -DNDEBUG -std=c++17 -Iinclude -I/usr/include/eigen3 docs/results/sim/issue21/fair-lead-driver.cpp -o drv
//   ./drv convergence_aware 0 1.0 3 exponent=1.5 fair_lead=1   # policy, sigma, load, workload, settings
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dra/sim/csv.hpp"
#include "dra/sim/simulator.hpp"
#include "dra/sim/workload.hpp"
using namespace dra::sim;
static double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q / 100.0 * (v.size() - 1);
  size_t lo = (size_t)std::floor(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}
int main(int argc, char** argv) {
  std::string root = getenv("DRA_DATA") ? getenv("DRA_DATA") : "data/pollux";
  std::string policy = argv[1];
  double sigma = atof(argv[2]);
  std::string load = argv[3];
  int w = atoi(argv[4]);
  std::string folder = load == "1.0" ? "workloads" : "workloads-" + load;
  static const profile_library lib = profile_library::load(root + "/traces");
  auto jobs = read_workload(root + "/" + folder + "/workload-" + std::to_string(w) + ".csv", &lib);
  declaration_config d;
  d.sigma = sigma;
  d.seed = 1;
  declare_budgets(jobs, lib, d);
  sim_config c;
  c.policy = policy;
  c.reallocation_cost_s = 30.0;
  for (int i = 5; i < argc; ++i) {
    std::string kv = argv[i];
    auto eq = kv.find('=');
    std::string k = kv.substr(0, eq);
    double v = atof(kv.c_str() + eq + 1);
    if (k == "fair_lead")
      c.completion.fair_lead = v;
    else if (k == "exponent")
      c.completion.exponent = v;
    else {
      fprintf(stderr, "unknown %s\n", k.c_str());
      return 2;
    }
  }
  auto r = simulate(lib, jobs, c);
  std::vector<double> jct;
  int re = 0;
  for (auto& j : r.jobs) {
    jct.push_back(std::isnan(j.jct_s) ? 1e12 : j.jct_s);
    re += j.reallocations;
  }
  double avg = 0;
  for (double x : jct) avg += x;
  avg /= jct.size();
  double mk = 0;
  for (auto& j : r.jobs) mk = std::max(mk, j.submit_s + jct[&j - &r.jobs[0]]);
  printf("%s %s %d %g %.3f %.3f %d %.1f\n", policy.c_str(), load.c_str(), w, sigma, avg, pct(jct, 99), re, mk);
}
