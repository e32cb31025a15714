// The driver of variants.json (simulated, 2026-12-02): one policy, with completion settings given as
// key=value, on one workload and load; prints the case's average and p99 JCT, reallocations and
// each job's (name, application, submit, JCT, reallocations, device-seconds, wait for its first
// device). Built against commit 6f04db9, which still has the fair floor and the light-load
// fallback that were measured and dropped:
//   g++ -O2 -DNDEBUG -std=c++17 -Iinclude -I/usr/include/eigen3 variants.cpp -o variants
//   ./variants convergence_aware 0.5 1.0 3 admission=0.3   # policy, declared sigma, load, workload
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
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
  // usage: exp POLICY SIGMA LOAD WORKLOAD [key=value...]
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
  c.record_timeline = getenv("TL") != nullptr;
  for (int i = 5; i < argc; ++i) {
    std::string kv = argv[i];
    auto eq = kv.find('=');
    std::string k = kv.substr(0, eq);
    double v = atof(kv.c_str() + eq + 1);
    const std::pair<const char*, double*> settings[] = {
        {"exponent", &c.completion.exponent},     {"tilt", &c.completion.tilt},
        {"power", &c.completion.power},           {"admission", &c.completion.admission},
        {"fair_floor", &c.completion.fair_floor}, {"knee", &c.completion.light_load_knee}};
    bool known = false;
    for (const auto& [name, field] : settings)
      if (k == name) *field = v, known = true;
    if (known) continue;
    fprintf(stderr, "unknown %s\n", k.c_str());
    return 2;
  }
  auto r = simulate(lib, jobs, c);
  if (getenv("TL")) {
    double s = 0, q = 0;
    int n = 0, over = 0;
    for (auto& t : r.timeline) {
      s += t.running + t.waiting;
      q += t.waiting;
      ++n;
      over += (t.running + t.waiting) > 16;
    }
    fprintf(stderr, "active %.1f waiting %.2f over16 %.2f\n", s / n, q / n, (double)over / n);
  }
  std::vector<double> jct;
  int re = 0;
  for (auto& j : r.jobs) {
    jct.push_back(std::isnan(j.jct_s) ? 1e12 : j.jct_s);
    re += j.reallocations;
  }
  double avg = 0;
  for (double x : jct) avg += x;
  avg /= jct.size();
  printf("{\"policy\":\"%s\",\"load\":\"%s\",\"w\":%d,\"sigma\":%g,\"avg\":%.3f,\"p99\":%.3f,\"realloc\":%d,\"jct\":[",
         policy.c_str(), load.c_str(), w, sigma, avg, pct(jct, 99), re);
  for (size_t i = 0; i < r.jobs.size(); ++i)
    printf("%s[\"%s\",\"%s\",%.1f,%.1f,%d,%.1f,%.1f]", i ? "," : "", r.jobs[i].name.c_str(),
           r.jobs[i].application.c_str(), r.jobs[i].submit_s, jct[i], r.jobs[i].reallocations, r.jobs[i].gpu_seconds,
           r.jobs[i].start_s - r.jobs[i].submit_s);
  printf("]}\n");
}
