// Tests of the device pool's core (include/dra/pool/): inventory and request validation (the
// field and the fix named, nothing changed), the deterministic scheduler (suitable devices, least
// fragmentation, locality, priority with aging, preemption that shrinks elastic jobs in place and
// never breaks a rigid gang), leases, the replica autoscaler's hysteresis (scale-down on the window's mean load),
// admission to the request, and the scaler on the cluster arbiter (whose fast path must give the allocations of the
// straightforward search).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/policy/cluster_arbiter.hpp"
#include "dra/pool/inventory.hpp"
#include "dra/pool/lease.hpp"
#include "dra/pool/request.hpp"
#include "dra/pool/scaler.hpp"
#include "dra/pool/scheduler.hpp"
#include "pool_test_support.hpp"

using namespace dra::pool;
using pool_test::apply;
using pool_test::slots;

namespace {

// Two nodes, two NVLink-like groups of two GPUs each per node, 80 GB; plus 4 CPU slots.
inventory mixed_pool() {
  inventory inv;
  for (int node = 0; node < 2; ++node)
    for (int g = 0; g < 4; ++g) {
      device d;
      d.id = "n" + std::to_string(node) + "/gpu" + std::to_string(g);
      d.type = "gpu-80gb";
      d.node = "n" + std::to_string(node);
      d.group = g / 2;
      d.memory_gb = 80;
      d.enforcement = "cuda_visible_devices";
      inv.add(d);
    }
  for (int s = 0; s < 4; ++s) {
    device d;
    d.id = "slot" + std::to_string(s);
    d.type = "cpu-slot";
    d.node = "local";
    d.memory_gb = 2;
    d.compute = 0.5;
    d.enforcement = "cgroup";
    inv.add(d);
  }
  return inv;
}

request req(const std::string& job, int min_size, int max_size, const std::string& priority = "normal",
            bool elastic = true, const std::string& type = "cpu-slot") {
  request r;
  r.job = job, r.min_size = min_size, r.max_size = max_size, r.priority = priority, r.elastic = elastic;
  r.device_type = type;
  return r;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// The arbiter's search as first written (every (job, increment) pair per device; every pair of
// jobs per move): the fast path must give the same allocations.
std::vector<int> reference_allocate(const dra::policy::cluster_arbiter& arb,
                                    const std::vector<dra::policy::arbiter_job>& jobs, int capacity) {
  const double p = arb.config().p, eps = arb.config().epsilon;
  const std::size_t n = jobs.size();
  auto term = [&](double s) { return std::pow(s + eps, p); };
  std::vector<std::vector<double>> terms(n);
  for (std::size_t j = 0; j < n; ++j) {
    const int most = std::max(0, static_cast<int>(jobs[j].speedup.size()) - 1);
    terms[j].resize(static_cast<std::size_t>(most) + 1);
    for (int k = 0; k <= most; ++k)
      terms[j][static_cast<std::size_t>(k)] = term(dra::policy::cluster_arbiter::effective(jobs[j], k));
  }
  std::vector<int> alloc(n, 0);
  int free = capacity;
  for (std::size_t j = 0; j < n; ++j) {
    const int keep = std::min({jobs[j].min_devices, jobs[j].current, static_cast<int>(terms[j].size()) - 1});
    if (keep > 0 && keep <= free) alloc[j] = keep, free -= keep;
  }
  const double sign = p < 0.0 ? -1.0 : 1.0;
  while (free > 0) {
    double best_rate = 0.0;
    std::size_t best_j = n;
    int best_k = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const auto& t = terms[j];
      const double now = t[static_cast<std::size_t>(alloc[j])];
      const int most = std::min(static_cast<int>(t.size()) - 1, alloc[j] + free);
      for (int k = alloc[j] + 1; k <= most; ++k) {
        const double rate = sign * (t[static_cast<std::size_t>(k)] - now) / (k - alloc[j]);
        if (rate > best_rate * (1.0 + 1e-12) && rate > 0.0) best_rate = rate, best_j = j, best_k = k;
      }
    }
    if (best_j == n) break;
    free -= best_k - alloc[best_j];
    alloc[best_j] = best_k;
  }
  for (int move = 0; move < arb.config().max_moves; ++move) {
    double best = 0.0;
    std::size_t from = n, to = n;
    for (std::size_t a = 0; a < n; ++a) {
      if (alloc[a] == 0 || alloc[a] <= std::min(jobs[a].min_devices, jobs[a].current)) continue;
      const auto ka = static_cast<std::size_t>(alloc[a]);
      const double lose = terms[a][ka - 1] - terms[a][ka];
      for (std::size_t b = 0; b < n; ++b) {
        const auto kb = static_cast<std::size_t>(alloc[b]);
        if (b == a || kb + 1 >= terms[b].size()) continue;
        const double delta = sign * (lose + terms[b][kb + 1] - terms[b][kb]);
        if (delta > best + 1e-12) best = delta, from = a, to = b;
      }
    }
    if (from == n) break;
    --alloc[from];
    ++alloc[to];
  }
  return alloc;
}

}  // namespace

TEST_CASE("pool.inventory.validation") {
  inventory inv = slots(2);
  device dup;
  dup.id = "slot0", dup.type = "cpu-slot";
  CHECK(message_of([&] { inv.add(dup); }).find("already") != std::string::npos);
  device bad;
  bad.id = "x", bad.type = "cpu-slot", bad.enforcement = "magic";
  CHECK(message_of([&] { inv.add(bad); }).rfind("enforcement:", 0) == 0);
  bad.enforcement = "soft", bad.compute = 0;
  CHECK(message_of([&] { inv.add(bad); }).rfind("compute:", 0) == 0);
  CHECK(inv.size() == 2);  // nothing half-added
  CHECK(inv.types() == std::vector<std::string>{"cpu-slot"});
}

TEST_CASE("pool.request.validation_names_field_and_fix") {
  const inventory inv = mixed_pool();
  request ok = req("a", 1, 2);
  CHECK_NOTHROW(ok.validate(inv));
  request r = ok;
  r.device_type = "tpu";
  auto m = message_of([&] { r.validate(inv); });
  CHECK(m.rfind("device_type:", 0) == 0);
  CHECK(m.find("cpu-slot, gpu-80gb") != std::string::npos);
  r = ok, r.memory_gb = 64;  // slots have 2 GB
  m = message_of([&] { r.validate(inv); });
  CHECK(m.rfind("memory_gb:", 0) == 0);
  CHECK(m.find("at most") != std::string::npos);
  r = ok, r.fraction = 1.5;
  CHECK(message_of([&] { r.validate(inv); }).rfind("fraction:", 0) == 0);
  r = ok, r.fraction = 0.0;
  CHECK(message_of([&] { r.validate(inv); }).rfind("fraction:", 0) == 0);
  r = ok, r.min_size = 3, r.max_size = 2;
  m = message_of([&] { r.validate(inv); });
  CHECK(m.rfind("min_size:", 0) == 0);
  CHECK(m.find("min_size <= max_size") != std::string::npos);
  r = ok, r.priority = "urgent";
  m = message_of([&] { r.validate(inv); });
  CHECK(m.rfind("priority:", 0) == 0);
  CHECK(m.find("low, normal, high, critical") != std::string::npos);
  r = ok, r.elastic = false;
  CHECK(message_of([&] { r.validate(inv); }).rfind("max_size:", 0) == 0);
  r = ok, r.min_size = 5, r.max_size = 5;  // only 4 slots
  CHECK(message_of([&] { r.validate(inv); }).rfind("min_size:", 0) == 0);
  r = ok, r.job = "a b";
  CHECK(message_of([&] { r.validate(inv); }).rfind("job:", 0) == 0);
  r = ok, r.kind = "batch";
  CHECK(message_of([&] { r.validate(inv); }).rfind("kind:", 0) == 0);
}

TEST_CASE("pool.lease.ids_free_share_heartbeat_restore") {
  const inventory inv = slots(2);
  lease_book book;
  const auto a = book.grant(inv, "j", "slot0", 0.5, 0.0).id;
  const auto b = book.grant(inv, "k", "slot0", 0.5, 0.0).id;
  CHECK(a != b);
  CHECK(book.free_share("slot0") == doctest::Approx(0.0));
  CHECK(message_of([&] { book.grant(inv, "m", "slot0", 0.25, 0.0); }).rfind("device:", 0) == 0);
  CHECK(book.size() == 2);
  book.heartbeat(a, 10.0);
  CHECK(book.expired(12.0, 5.0) == std::vector<std::int64_t>{b});
  book.release(b);
  // A restored book continues ids above the highest restored id.
  lease_book restored;
  lease l = book.at(a);
  l.id = 41;
  restored.restore(l);
  CHECK(restored.grant(inv, "j", "slot1", 1.0, 0.0).id == 42);
  CHECK(message_of([&] { restored.release(7); }).rfind("lease:", 0) == 0);
}

TEST_CASE("pool.scheduler.suitable_devices_and_locality") {
  const inventory inv = mixed_pool();
  lease_book book;
  const scheduler s;
  // A 2-GPU job lands inside one NVLink group of one node.
  std::vector<job_entry> jobs{{req("g2", 2, 2, "normal", false, "gpu-80gb"), 0.0, 0}};
  plan p = s.admit(inv, jobs, book, 0.0);
  REQUIRE(p.grants.size() == 2);
  const auto& d0 = inv.at(p.grants[0].device);
  const auto& d1 = inv.at(p.grants[1].device);
  CHECK(d0.type == "gpu-80gb");
  CHECK((d0.node == d1.node && d0.group == d1.group));
  apply(inv, book, p, 0.0);
  // A 3-GPU job then prefers the other node's two groups (4 free there) over splitting nodes.
  jobs.push_back({req("g3", 3, 3, "normal", false, "gpu-80gb"), 1.0, 1});
  p = s.admit(inv, jobs, book, 1.0);
  REQUIRE(p.grants.size() == 3);
  std::set<std::string> nodes;
  for (const auto& g : p.grants) nodes.insert(inv.at(g.device).node);
  CHECK(nodes.size() == 1);
  CHECK(*nodes.begin() != d0.node);
  // Growth of g2 would go next to its own devices: same node first.
  apply(inv, book, p, 1.0);
  jobs[0].req.elastic = true, jobs[0].req.max_size = 4;
  p = s.resize(inv, jobs, {{"g2", 4}}, book, 2.0);
  REQUIRE(p.grants.size() == 2);
  for (const auto& g : p.grants) CHECK(inv.at(g.device).node == d0.node);
}

TEST_CASE("pool.scheduler.fractions_least_fragmentation") {
  const inventory inv = slots(3);
  lease_book book;
  const scheduler s;
  book.grant(inv, "x", "slot1", 0.5, 0.0);  // slot1 half used
  request r = req("half", 1, 1);
  r.fraction = 0.5;
  plan p = s.admit(inv, {{r, 0.0, 0}}, book, 0.0);
  REQUIRE(p.grants.size() == 1);
  CHECK(p.grants[0].device == "slot1");  // fills the partly used slot, keeps whole slots whole
  r.fraction = 0.75;
  p = s.admit(inv, {{r, 0.0, 0}}, book, 0.0);
  REQUIRE(p.grants.size() == 1);
  CHECK(p.grants[0].device == "slot0");
}

TEST_CASE("pool.scheduler.priority_and_aging") {
  const inventory inv = slots(1);
  lease_book book;
  scheduler_config c;
  c.aging_s = 10.0;
  c.preemption = false;
  const scheduler s(c);
  std::vector<job_entry> jobs{{req("low", 1, 1, "low"), 0.0, 0}, {req("high", 1, 1, "high"), 5.0, 1}};
  plan p = s.admit(inv, jobs, book, 6.0);
  REQUIRE(p.grants.size() == 1);
  CHECK(p.grants[0].job == "high");
  CHECK(p.waiting == std::vector<std::string>{"low"});
  // After waiting 25 s the low job has aged two levels (low + 2 = high) and arrived first.
  jobs[1].submitted_at = 24.0;
  p = s.admit(inv, jobs, book, 25.0);
  REQUIRE(p.grants.size() == 1);
  CHECK(p.grants[0].job == "low");
  // Deterministic: the same inputs give the same plan.
  const plan q = s.admit(inv, jobs, book, 25.0);
  CHECK(q.grants[0].device == p.grants[0].device);
}

TEST_CASE("pool.scheduler.preemption_shrinks_elastic_in_place_never_rigid") {
  const inventory inv = slots(4);
  lease_book book;
  const scheduler s;
  std::vector<job_entry> jobs{{req("elastic-low", 1, 3, "low"), 0.0, 0},
                              {req("rigid-low", 1, 1, "low", false), 0.0, 1}};
  plan p = s.admit(inv, jobs, book, 0.0);
  apply(inv, book, p, 0.0);
  p = s.resize(inv, jobs, {{"elastic-low", 3}}, book, 0.0);
  apply(inv, book, p, 0.0);
  CHECK(book.count("elastic-low") == 3);
  CHECK(book.count("rigid-low") == 1);
  // A high-priority gang of 2 arrives: two of the elastic job's leases are asked back (it keeps
  // its minimum of 1), the rigid job is untouched, nothing is granted until they come back.
  jobs.push_back({req("gang-high", 2, 2, "high", false), 1.0, 2});
  p = s.admit(inv, jobs, book, 1.0);
  CHECK(p.grants.empty());
  REQUIRE(p.releases.size() == 2);
  for (const auto& r : p.releases) {
    CHECK(r.job == "elastic-low");
    CHECK(r.preemption);
    CHECK(r.for_job == "gang-high");
  }
  apply(inv, book, p, 1.0);
  // Asking again does not preempt twice while those leases are on their way back.
  p = s.admit(inv, jobs, book, 1.5);
  CHECK(p.releases.empty());
  CHECK(p.grants.empty());
  for (const auto& l : book.all())
    if (l.state == lease_state::releasing) book.release(l.id);
  p = s.admit(inv, jobs, book, 2.0);
  REQUIRE(p.grants.size() == 2);
  for (const auto& g : p.grants) CHECK(g.job == "gang-high");
  apply(inv, book, p, 2.0);
  // A critical gang of 3 cannot fit without breaking the rigid job or the elastic job's minimum:
  // nothing is preempted at all.
  jobs.push_back({req("gang-critical", 3, 3, "critical", false), 3.0, 3});
  p = s.admit(inv, jobs, book, 3.0);
  CHECK(p.releases.empty());
  CHECK(p.grants.empty());
}

TEST_CASE("pool.scheduler.preemption_counts_releasing_leases_on_devices_away") {
  // A job (min 2) holds slot0-2 and gives slot1 back already; slot1 and slot2 are away (their node
  // went with a Ray cluster's head: the devices leave the inventory, the leases stay in the book).
  // A high-priority job arrives: taking slot0 too would leave the job one lease (slot2), below its
  // minimum. Counting only the releasing leases on devices present, the scheduler took it.
  inventory inv;
  for (int s = 0; s < 3; ++s) {
    device d;
    d.id = "slot" + std::to_string(s);
    d.type = "cpu-slot";
    d.node = "n" + std::to_string(s);
    inv.add(d);
  }
  lease_book book;
  const scheduler s;
  std::vector<job_entry> jobs{{req("v", 2, 3, "low"), 0.0, 0}};
  apply(inv, book, s.admit(inv, jobs, book, 0.0), 0.0);
  REQUIRE(book.count("v") == 3);
  for (const auto& l : book.all())
    if (l.device == "slot1") book.mark_releasing(l.id);
  inv.remove_node("n1");
  inv.remove_node("n2");
  jobs.push_back({req("h", 1, 1, "high"), 1.0, 1});
  const plan p = s.admit(inv, jobs, book, 1.0);
  CHECK(p.releases.empty());
  CHECK(p.grants.empty());
}

TEST_CASE("pool.scheduler.admission_to_the_request_when_nobody_waits") {
  const inventory inv = slots(4);
  lease_book book;
  const scheduler s;
  // Alone, an elastic training job starts on its request (max_size), not its minimum.
  std::vector<job_entry> jobs{{req("a", 1, 3), 0.0, 0}};
  plan p = s.admit(inv, jobs, book, 0.0);
  REQUIRE(p.grants.size() == 3);
  CHECK(p.grants[0].reason == "admit");
  CHECK(p.grants[2].reason == "admit to request");
  apply(inv, book, p, 0.0);
  // The next one finds one free slot: its minimum, nothing more.
  jobs.push_back({req("b", 1, 2), 1.0, 1});
  p = s.admit(inv, jobs, book, 1.0);
  REQUIRE(p.grants.size() == 1);
  CHECK(p.grants[0].job == "b");
  apply(inv, book, p, 1.0);
  // A rigid job, an inference service and a job while another waits get no more than they need.
  lease_book empty;
  request inf = req("inf", 1, 3);
  inf.kind = "inference";
  p = s.admit(inv, {{req("rigid", 2, 2, "normal", false), 0.0, 0}, {inf, 0.0, 1}}, empty, 0.0);
  CHECK(p.grants.size() == 3);
  p = s.admit(inv, {{req("c", 1, 4), 0.0, 0}, {req("gang", 4, 4, "normal", false), 0.0, 1}}, empty, 0.0);
  CHECK(p.grants.size() == 1);
  CHECK(p.waiting == std::vector<std::string>{"gang"});
  scheduler_config off;
  off.admit_to_request = false;
  CHECK(scheduler(off).admit(inv, {{req("a", 1, 3), 0.0, 0}}, empty, 0.0).grants.size() == 1);
}

TEST_CASE("pool.scheduler.inference_at_risk_first_before_admission_and_growth") {
  const inventory inv = slots(4);
  lease_book book;
  const scheduler s;
  request inf = req("serve", 1, 3, "normal");
  inf.kind = "inference";
  std::vector<job_entry> jobs{{inf, 0.0, 0}, {req("train", 1, 3), 0.0, 1}};
  apply(inv, book, s.admit(inv, jobs, book, 0.0), 0.0);
  CHECK(book.count("serve") == 1);
  CHECK(book.count("train") == 3);  // admitted on its request: the pool is full
  // The service's SLO is at risk (its autoscaler wants 2): with no free slot, an elastic training
  // job of its own class shrinks in place for it; a training job waiting for admission (even of a
  // higher class) does not get the slot that comes back.
  jobs[0].urgent_size = 2;
  jobs.push_back({req("late", 1, 1, "high", false), 1.0, 2});
  plan p = s.admit(inv, jobs, book, 1.0);
  REQUIRE(p.releases.size() == 2);  // one for the service, one for the high-priority admission
  CHECK(p.releases[0].for_job == "serve");
  CHECK(p.releases[1].for_job == "late");
  apply(inv, book, p, 1.0);
  CHECK(s.admit(inv, jobs, book, 1.5).empty());  // nothing preempted twice while they come back
  const auto back = book.all();
  for (const auto& l : back)
    if (l.state == lease_state::releasing) book.release(l.id);
  p = s.admit(inv, jobs, book, 2.0);
  REQUIRE(p.grants.size() == 2);
  CHECK(p.grants[0].job == "serve");
  CHECK(p.grants[0].reason == "inference first");
  CHECK(p.grants[1].job == "late");
  apply(inv, book, p, 2.0);
  // Never below a training job's minimum, never a rigid job: a third replica finds nothing to take.
  jobs[0].urgent_size = 3;
  p = s.admit(inv, jobs, book, 3.0);
  CHECK(p.releases.empty());
  CHECK(p.grants.empty());
  // A free slot goes to the service at risk before the admission of a job waiting for it, even
  // of a higher class.
  lease_book b2;
  std::vector<job_entry> two{
      {inf, 0.0, 0}, {req("big", 2, 2, "normal", false), 0.0, 1}, {req("one", 1, 1, "normal", false), 0.0, 2}};
  apply(inv, b2, s.admit(inv, two, b2, 0.0), 0.0);
  CHECK(b2.count("big") == 2);
  for (const auto& l : b2.of_job("one")) b2.release(l.id);  // "one" ended: one slot free
  two.pop_back();
  two.push_back({req("waits", 1, 1, "critical", false), 0.5, 3});
  two[0].urgent_size = 2;
  p = s.admit(inv, two, b2, 1.0);
  REQUIRE(p.grants.size() == 1);
  CHECK(p.grants[0].job == "serve");
  CHECK(p.waiting == std::vector<std::string>{"waits"});
}

TEST_CASE("pool.scheduler.resize_releases_newest_and_grows_partially") {
  const inventory inv = slots(4);
  lease_book book;
  scheduler_config c;
  c.admit_to_request = false;  // admitted at their minimum: the resizes below do the rest
  const scheduler s(c);
  std::vector<job_entry> jobs{{req("a", 1, 4), 0.0, 0}, {req("b", 1, 4), 0.0, 1}};
  apply(inv, book, s.admit(inv, jobs, book, 0.0), 0.0);
  plan p = s.resize(inv, jobs, {{"a", 4}, {"b", 1}}, book, 0.0);
  CHECK(p.grants.size() == 2);  // only 2 free: a partial grow
  apply(inv, book, p, 0.0);
  p = s.resize(inv, jobs, {{"a", 2}, {"b", 2}}, book, 1.0);
  REQUIRE(p.releases.size() == 1);
  CHECK(p.releases[0].job == "a");
  std::int64_t newest = 0;
  for (const auto& l : book.of_job("a")) newest = std::max(newest, l.id);
  CHECK(p.releases[0].lease == newest);
  CHECK(p.grants.empty());  // b's grow waits for the lease to come back
}

TEST_CASE("pool.autoscaler.hysteresis") {
  // The band and the window's mean alone (the anti-flap hold is off: pool.autoscaler.peak_window).
  autoscaler_config c;
  c.replica_rps = 10.0, c.min_replicas = 1, c.max_replicas = 4, c.down_delay_s = 5.0, c.peak_window_s = 0.0;
  c.up_utilisation = 0.75, c.target_utilisation = 0.6, c.down_utilisation = 0.35;
  replica_autoscaler a(c);
  CHECK(a.update(0.0, 5.0, 0.0, 1) == 1);   // 50 % load: inside the band
  CHECK(a.update(0.5, 20.0, 0.0, 1) == 4);  // 2 replicas' worth at 60 % target -> 4, at once
  CHECK(a.update(1.0, 20.0, 0.0, 4) == 4);  // a change starts the window
  CHECK(a.update(2.0, 5.0, 0.0, 4) == 4);   // low, but the window is 1 s long
  CHECK(a.update(4.0, 25.0, 0.0, 4) == 4);  // a short burst inside the band ...
  CHECK(a.update(4.5, 5.0, 0.0, 4) == 4);
  // ... does not pin 4 replicas: the window's mean load (2x1 + 0.5x2 + 2.5x0.5 + 0.5x1.5) / 5 =
  // 1.0 replica's worth is under 35 % of 4: one step down.
  CHECK(a.mean_load(6.0) == doctest::Approx(1.0));
  CHECK(a.update(6.0, 5.0, 0.0, 4) == 3);
  CHECK(a.update(7.0, 5.0, 0.0, 3) == 3);  // the next step waits another window
  CHECK(a.update(11.0, 5.0, 0.0, 3) == 3);
  CHECK(a.update(12.0, 5.0, 0.0, 3) == 2);
  CHECK(a.update(12.5, 0.0, 9.0, 2) == 4);   // a queue adds replicas at once
  CHECK(a.update(13.0, 20.0, 0.0, 4) == 4);  // a sustained load keeps them
  CHECK(a.update(20.0, 20.0, 0.0, 4) == 4);
  CHECK(a.update(21.0, 30.0, 0.0, 4, 5.0) == 4);   // a measured capacity of 5 req/s: 30 req/s needs more
  CHECK(a.update(22.0, 30.0, 0.0, 4, 50.0) == 4);  // 50 req/s each: 15 % load, low only after a window
  c.down_utilisation = 0.7;
  CHECK_THROWS_AS(replica_autoscaler{c}, std::invalid_argument);
}

TEST_CASE("pool.autoscaler.peak_window") {
  // The main job's service (measured capacity 46 req/s a replica, band 0.15 / 0.4 / 0.5, 15 s): a
  // burst of 37 req/s at 5 s, quiet (3 req/s) after it. The window's mean says one replica from
  // 20 s on; one replica would have asked for a second at that burst, so the two are held until
  // the burst is peak_window_s old: no step down into a size the last minute outgrew.
  autoscaler_config c;
  c.replica_rps = 46.0, c.min_replicas = 1, c.max_replicas = 2, c.down_delay_s = 15.0;
  c.up_utilisation = 0.5, c.target_utilisation = 0.4, c.down_utilisation = 0.15;
  const auto quiet_after_burst = [&](replica_autoscaler& a, double until) {
    int current = 1, last = 0;
    for (double t = 0.0; t <= until + 1e-9; t += 0.25) {
      const double rate = t >= 5.0 && t < 6.0 ? 37.0 : 3.0;
      last = a.update(t, rate, 0.0, current);
      current = last;  // carried out at once
    }
    return last;
  };
  {
    replica_autoscaler a(c);
    CHECK(quiet_after_burst(a, 6.0) == 2);  // up at the burst
    CHECK(a.peak_needed() == doctest::Approx(37.0 / 46.0 / 0.5));
  }
  {
    replica_autoscaler a(c);
    CHECK(quiet_after_burst(a, 50.0) == 2);  // the mean has been low since ~20 s: held
    replica_autoscaler b(c);
    CHECK(quiet_after_burst(b, 66.0) == 1);  // the burst is over 60 s old: one step down
  }
  c.peak_window_s = 0.0;  // without the hold (the first version): down as soon as the mean allows
  {
    replica_autoscaler a(c);
    CHECK(quiet_after_burst(a, 21.0) == 1);
  }
  // A queue at n replicas needs n + 1: no step down from n for the window either.
  c.peak_window_s = 30.0;
  replica_autoscaler q(c);
  CHECK(q.update(0.0, 3.0, 8.0, 2) == 2);  // a queue of 8 (4 a replica) at the most replicas allowed
  CHECK(q.peak_needed() == doctest::Approx(3.0));
  CHECK(q.update(20.0, 3.0, 0.0, 2) == 2);
  CHECK(q.update(31.0, 3.0, 0.0, 2) == 1);
  // A service that stopped reporting lets go of its peaks (the pool then counts it as no load).
  replica_autoscaler s(c);
  CHECK(s.update(0.0, 40.0, 0.0, 2) == 2);  // 0.87 replicas' worth: inside the band, 1.7 at up_utilisation
  CHECK(s.update(0.5, 0.0, 0.0, 2) == 2);
  s.forget_peaks();
  CHECK(s.peak_needed() == 0.0);
  CHECK(s.update(16.0, 0.0, 0.0, 2) == 1);
  // A load alternating around the threshold (0.6 and 0.05 of a replica's capacity, 10 s each)
  // goes up once and stays; without the hold it changed size every other window.
  const auto alternating = [&](double window) {
    c.peak_window_s = window;
    replica_autoscaler a(c);
    int current = 1, changes = 0;
    for (double t = 0.0; t < 300.0; t += 0.25) {
      const int want = a.update(t, std::fmod(t, 20.0) < 10.0 ? 0.6 * 46.0 : 0.05 * 46.0, 0.0, current);
      changes += want != current, current = want;
    }
    return changes;
  };
  c.replica_rps = 46.0, c.down_delay_s = 5.0;
  CHECK(alternating(60.0) == 1);
  CHECK(alternating(0.0) > 20);
  c.peak_window_s = -1.0;
  CHECK_THROWS_WITH_AS(replica_autoscaler{c}, doctest::Contains("peak_window_s: must be >= 0"), std::invalid_argument);
}

TEST_CASE("pool.scaler.a_step_decided_holds_until_it_is_carried_out") {
  // The pool asks every tick and re-plans every few seconds: the answer must hold in between.
  autoscaler_config c;
  c.replica_rps = 10.0, c.min_replicas = 1, c.max_replicas = 4, c.down_delay_s = 5.0, c.peak_window_s = 0.0;
  c.up_utilisation = 0.75, c.target_utilisation = 0.6, c.down_utilisation = 0.35;
  replica_autoscaler a(c);
  CHECK(a.update(0.0, 2.0, 0.0, 2) == 2);
  CHECK(a.update(5.0, 2.0, 0.0, 2) == 1);  // 0.2 replicas' worth for a window: one step down
  CHECK(a.update(5.1, 2.0, 0.0, 2) == 1);  // still 2 running: the answer holds ...
  CHECK(a.update(6.0, 5.0, 0.0, 2) == 1);  // ... through load inside the band
  CHECK(a.update(7.0, 2.0, 0.0, 1) == 1);  // carried out: a new window
  // A decided step down gives way to a surge before it is carried out ...
  replica_autoscaler b(c);
  CHECK(b.update(0.0, 2.0, 0.0, 3) == 3);
  CHECK(b.update(5.0, 2.0, 0.0, 3) == 2);
  CHECK(b.update(5.5, 30.0, 0.0, 3) == 4);  // 3 replicas' worth: up at once
  // ... and a step up holds as well while its device is freed, the surge over: it was answered
  // for the surge's ticks only, and the device went to a training job.
  CHECK(b.update(6.0, 12.0, 0.0, 3) == 4);
  CHECK(b.update(9.0, 12.0, 0.0, 3) == 4);
  CHECK(b.update(10.6, 12.0, 0.0, 3) == 3);  // not carried out within down_delay_s and no new surge: it lapses
  CHECK(b.update(11.0, 30.0, 0.0, 3) == 4);
  CHECK(b.update(11.5, 12.0, 0.0, 4) == 4);  // carried out
}

TEST_CASE("pool.scaler.inference_first_then_arbiter") {
  const dra::policy::cluster_arbiter arb;
  scale_job inf;
  inf.job = "serve", inf.kind = "inference", inf.priority = "high", inf.min_size = 1, inf.max_size = 3;
  inf.current = 1, inf.replicas_wanted = 3;
  scale_job fast;
  fast.job = "fast", fast.min_size = 1, fast.max_size = 4, fast.current = 2;
  fast.speedup = {0, 1, 2, 3, 4};
  scale_job flat;
  flat.job = "flat", flat.min_size = 1, flat.max_size = 4, flat.current = 2;
  flat.speedup = {0, 1, 1.05, 1.1, 1.1};
  scale_job rigid;
  rigid.job = "rigid", rigid.elastic = false, rigid.min_size = 1, rigid.max_size = 1, rigid.current = 1;
  auto sizes = plan_sizes({inf, fast, flat, rigid}, 8, arb);
  CHECK(sizes["rigid"] == 1);
  CHECK(sizes["serve"] == 3);
  CHECK(sizes["fast"] + sizes["flat"] == 4);
  CHECK(sizes["fast"] > sizes["flat"]);
  // A peak that would need every device: training keeps its minimum, inference gets the rest.
  inf.replicas_wanted = 3, inf.max_size = 8;
  sizes = plan_sizes({inf, fast, flat, rigid}, 5, arb);
  CHECK(sizes["fast"] == 1);
  CHECK(sizes["flat"] == 1);
  CHECK(sizes["serve"] == 2);
}

TEST_CASE("pool.scaler.remaining_work_tilts_towards_the_job_closer_to_done") {
  // Two identical elastic jobs on 6 devices: without remaining sizes they split evenly; with them
  // (the pool's remaining-work estimates) the job with less work left gets more, as the simulator's
  // convergence_aware does; neither loses its minimum.
  const dra::policy::cluster_arbiter arb;
  scale_job a, b;
  a.job = "a", b.job = "b";
  a.min_size = b.min_size = 1, a.max_size = b.max_size = 6, a.current = b.current = 3;
  a.speedup = b.speedup = {0, 1, 1.8, 2.5, 3.1, 3.6, 4.0};
  const dra::policy::completion_config c;
  auto even = plan_sizes({a, b}, 6, arb, &c);
  CHECK(even["a"] == even["b"]);
  a.remaining_size_s = 100.0, b.remaining_size_s = 5000.0;
  auto tilted = plan_sizes({a, b}, 6, arb, &c);
  CHECK(tilted["a"] > tilted["b"]);
  CHECK(tilted["b"] >= 1);
  CHECK(tilted["a"] + tilted["b"] == 6);
  // Without a completion config the sizes are ignored (the pool's arbitration as before).
  auto plain = plan_sizes({a, b}, 6, arb);
  CHECK(plain["a"] == plain["b"]);
}

TEST_CASE("pool.arbiter.fast_path_matches_reference") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    dra::policy::arbiter_config cfg;
    cfg.p = trial % 3 == 0 ? 1.0 : -1.0;
    const dra::policy::cluster_arbiter arb(cfg);
    const int n = 1 + static_cast<int>(u(rng) * 12);
    std::vector<dra::policy::arbiter_job> jobs(static_cast<std::size_t>(n));
    for (auto& j : jobs) {
      const int most = 1 + static_cast<int>(u(rng) * 10);
      const double sigma = u(rng) * 0.3;
      j.speedup.assign(static_cast<std::size_t>(most) + 1, 0.0);
      for (int k = 1; k <= most; ++k)
        j.speedup[static_cast<std::size_t>(k)] = (trial % 5 == 0 ? 1.0 : (0.5 + u(rng))) * k / (1.0 + sigma * (k - 1));
      j.current = static_cast<int>(u(rng) * most);
      j.change_penalty = trial % 2 ? 1.0 : 0.7 + 0.3 * u(rng);
      j.min_devices = u(rng) < 0.3 ? 1 : 0;
    }
    const int capacity = static_cast<int>(u(rng) * 40);
    CAPTURE(trial);
    CHECK(arb.allocate(jobs, capacity) == reference_allocate(arb, jobs, capacity));
  }
}
