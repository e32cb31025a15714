// Tests of the pool's inference services against each other and at their start (an outside
// review, docs/guide/pool.md "Inference first"): services of one class short at once share what
// can be had instead of the first submitted taking all of it, in the admission's urgent pass and in
// the scaler's plan alike; and a queue that builds while replicas start asks for no more replicas.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
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

request req(const std::string& job, int min_size, int max_size, const std::string& kind = "inference",
            const std::string& priority = "high") {
  request r;
  r.job = job, r.min_size = min_size, r.max_size = max_size, r.priority = priority, r.kind = kind;
  r.device_type = "cpu-slot";
  return r;
}

std::map<std::string, int> granted(const plan& p) {
  std::map<std::string, int> n;
  for (const auto& g : p.grants) ++n[g.job];
  return n;
}

std::map<std::string, int> asked_back_for(const plan& p) {
  std::map<std::string, int> n;
  for (const auto& r : p.releases) ++n[r.for_job];
  return n;
}

}  // namespace

TEST_CASE("pool.services.two_services_of_one_class_short_at_once_share_the_free_devices") {
  // Before: the first submitted took both free slots and the second, as loaded, kept one replica
  // until the first's load fell (SLO 99.6 % against 5.8 %).
  const inventory inv = slots(4);
  lease_book book;
  const scheduler s;
  std::vector<job_entry> jobs{{req("a", 1, 3), 0.0, 0}, {req("b", 1, 3), 2.0, 1}};
  apply(inv, book, s.admit(inv, jobs, book, 3.0), 3.0);
  REQUIRE(book.count("a") == 1);
  REQUIRE(book.count("b") == 1);
  jobs[0].urgent_size = jobs[1].urgent_size = 3;
  const plan p = s.admit(inv, jobs, book, 4.0);
  CHECK(granted(p) == std::map<std::string, int>{{"a", 1}, {"b", 1}});
  // Shared by how much of its want each holds: on 3 free slots, a service wanting 2 and one
  // wanting 6 (one replica each) get 1 and 2.
  const inventory five = slots(5);
  lease_book b5;
  std::vector<job_entry> uneven{{req("small", 1, 6), 0.0, 0}, {req("large", 1, 6), 1.0, 1}};
  apply(five, b5, s.admit(five, uneven, b5, 1.0), 1.0);
  uneven[0].urgent_size = 2, uneven[1].urgent_size = 6;
  const plan q = s.admit(five, uneven, b5, 2.0);
  CHECK(granted(q) == std::map<std::string, int>{{"large", 2}, {"small", 1}});
  // Alone, a service still gets all it wants that there is.
  lease_book b1;
  std::vector<job_entry> one{{req("solo", 1, 4), 0.0, 0}};
  apply(inv, b1, s.admit(inv, one, b1, 0.0), 0.0);
  one[0].urgent_size = 4;
  CHECK(granted(s.admit(inv, one, b1, 1.0)) == std::map<std::string, int>{{"solo", 3}});
}

TEST_CASE("pool.services.preemption_for_two_services_of_one_class_is_shared_too") {
  const inventory inv = slots(5);
  lease_book book;
  const scheduler s;
  std::vector<job_entry> jobs{{req("a", 1, 3), 0.0, 0}, {req("b", 1, 3), 0.0, 1}, {req("t", 1, 4, "training"), 0.0, 2}};
  apply(inv, book, s.admit(inv, jobs, book, 0.0), 0.0);
  REQUIRE(book.count("t") == 3);  // the slots the services' minimums left
  jobs[0].urgent_size = jobs[1].urgent_size = 3;
  const plan p = s.admit(inv, jobs, book, 1.0);
  // Two of the training job's slots can be taken (it keeps its minimum): one for each service
  // (before, both for the first).
  CHECK(asked_back_for(p) == std::map<std::string, int>{{"a", 1}, {"b", 1}});
  // A service of a higher class is served in full first whatever it was submitted after; the
  // lower one gets what is left (3 free slots: 2 and 1).
  std::vector<job_entry> classes{{req("a", 1, 3), 0.0, 0}, {req("b", 1, 3, "inference", "critical"), 1.0, 1}};
  lease_book b2;
  apply(inv, b2, s.admit(inv, classes, b2, 1.0), 1.0);
  classes[0].urgent_size = classes[1].urgent_size = 3;
  CHECK(granted(s.admit(inv, classes, b2, 2.0)) == std::map<std::string, int>{{"a", 1}, {"b", 2}});
}

TEST_CASE("pool.services.one_service_takes_what_training_can_spare_even_short_of_its_want") {
  // A replica at a time: a service wanting 3 more where training can spare 1 gets that one (the
  // first version asked back nothing unless every missing replica could be had).
  const inventory inv = slots(4);
  lease_book book;
  const scheduler s;
  std::vector<job_entry> jobs{{req("svc", 1, 4), 0.0, 0}, {req("t", 2, 3, "training"), 0.0, 1}};
  apply(inv, book, s.admit(inv, jobs, book, 0.0), 0.0);
  REQUIRE(book.count("t") == 3);
  jobs[0].urgent_size = 4;
  CHECK(asked_back_for(s.admit(inv, jobs, book, 1.0)) == std::map<std::string, int>{{"svc", 1}});
}

TEST_CASE("pool.services.the_scalers_plan_shares_between_services_of_one_class") {
  const dra::policy::cluster_arbiter arb;
  scale_job a;
  a.job = "a", a.kind = "inference", a.priority = "high", a.min_size = 1, a.max_size = 3, a.current = 3;
  a.replicas_wanted = 3;
  scale_job b = a;
  b.job = "b", b.current = 1;
  auto sizes = plan_sizes({a, b}, 4, arb);
  CHECK(sizes["a"] == 2);
  CHECK(sizes["b"] == 2);
  // A want of 1 next to one of 3 on 4: both served in full.
  b.replicas_wanted = 1;
  sizes = plan_sizes({a, b}, 4, arb);
  CHECK(sizes["a"] == 3);
  CHECK(sizes["b"] == 1);
  // Training of a higher class keeps what it holds past its minimum; the rest is shared.
  scale_job t;
  t.job = "t", t.priority = "critical", t.min_size = 1, t.max_size = 4, t.current = 2;
  b.replicas_wanted = 3;
  sizes = plan_sizes({a, b, t}, 6, arb);
  CHECK(sizes["t"] == 2);
  CHECK(sizes["a"] == 2);
  CHECK(sizes["b"] == 2);
}

TEST_CASE("pool.services.a_queue_while_replicas_start_asks_for_no_more") {
  autoscaler_config c;
  c.replica_rps = 10.0, c.min_replicas = 1, c.max_replicas = 3;
  // A new service: its one replica is granted, its worker not started; 1.5 requests/s queue up.
  replica_autoscaler cold(c);
  CHECK(cold.update(0.0, 1.5, 6.0, 1, 0.0, 0) == 1);
  CHECK(cold.peak_needed() < 1.0);  // nothing held for peak_window_s either
  CHECK(cold.update(1.0, 1.5, 0.0, 1, 0.0, 1) == 1);
  // Once every replica serves, a queue says they are saturated.
  CHECK(cold.update(2.0, 1.5, 6.0, 1, 0.0, 1) == 2);
  // Without the count (serving < 0: every replica serves), the queue counts as before.
  replica_autoscaler plain(c);
  CHECK(plain.update(0.0, 1.5, 6.0, 1) == 2);
  // A queue past what the starting replica will take still asks for more (one replica that never
  // serves does not switch the queue off).
  replica_autoscaler long_queue(c);
  CHECK(long_queue.update(0.0, 1.5, 40.0, 1, 0.0, 0) == 3);
  replica_autoscaler two_of_three(c);
  CHECK(two_of_three.update(0.0, 1.5, 8.0, 3, 0.0, 2) == 3);  // the third takes 4 of the 8
  // A load the replicas cannot serve asks for more whether or not they have started.
  replica_autoscaler hot(c);
  CHECK(hot.update(0.0, 25.0, 40.0, 1, 0.0, 0) == 3);
}

TEST_CASE("pool.services.a_service_aged_below_its_minimum_shares_with_its_class_as_the_scaler_does") {
  // A service below its minimum (it lost a replica) and waiting past aging_s was a group of its
  // own in the admission and was filled first; the scaler's next plan, by base class, took one
  // replica back for its peer: a replica stopped and restarted per such event.
  scheduler_config c;
  c.aging_s = 10.0;
  const scheduler s(c);
  const inventory inv = slots(6);
  lease_book book;
  std::vector<job_entry> jobs{{req("a", 2, 4), 0.0, 0}, {req("b", 2, 4), 0.0, 1}};
  apply(inv, book, s.admit(inv, jobs, book, 0.0), 0.0);
  REQUIRE(book.count("a") == 2);
  REQUIRE(book.count("b") == 2);
  book.release(book.of_job("a").front().id);  // a lost a replica: 1 of its minimum 2
  REQUIRE(book.count("a") == 1);
  jobs[0].urgent_size = jobs[1].urgent_size = 4;
  REQUIRE(s.effective_priority(jobs[0], book, 30.0) > s.effective_priority(jobs[1], book, 30.0));
  const plan p = s.admit(inv, jobs, book, 30.0);
  CHECK(granted(p) == std::map<std::string, int>{{"a", 2}, {"b", 1}});
  apply(inv, book, p, 30.0);
  // The scaler's plan for the same wants keeps what the admission gave.
  const dra::policy::cluster_arbiter arb;
  std::vector<scale_job> running;
  for (const auto& j : jobs) {
    scale_job x;
    x.job = j.req.job, x.kind = "inference", x.priority = "high", x.min_size = 2, x.max_size = 4;
    x.current = book.count(j.req.job), x.replicas_wanted = 4;
    running.push_back(x);
  }
  const auto sizes = plan_sizes(running, 6, arb);
  CHECK(sizes.at("a") == 3);
  CHECK(sizes.at("b") == 3);
}

TEST_CASE("pool.services.a_service_steps_down_whatever_its_peak_window_once_the_load_falls") {
  // 2 replicas at 1.8 requests/s for 5 s, then 0.2 requests/s (an outside review). While the
  // window's mean fell through 0.6-0.7 replicas' worth, the size aimed at was still 2: that
  // answer was held as a step down and kept 2 replicas for good with peak_window_s below
  // down_delay_s (0 included, which the docs offer).
  for (const double window : {0.0, 0.5, 1.0, 4.9, 5.0, 30.0}) {
    CAPTURE(window);
    autoscaler_config c;
    c.replica_rps = 1.0, c.down_delay_s = 5.0, c.peak_window_s = window, c.min_replicas = 1, c.max_replicas = 2;
    replica_autoscaler a(c);
    double t = 0.0;
    for (int i = 0; i < 100; ++i) t += 0.05, a.update(t, 1.8, 0.0, 2);
    double down_at = -1.0;
    for (int i = 0; i < 1200 && down_at < 0.0; ++i) {
      t += 0.05;
      if (a.update(t, 0.2, 0.0, 2) == 1) down_at = t - 5.0;
    }
    REQUIRE(down_at > 0.0);
    CHECK(down_at <= std::max(window, 5.0) + 5.0 + 0.1);  // the burst out of the hold, then one window
  }
  // The same with the defaults' band at a steady load whose window mean aims at the current size
  // at first: a later fall still steps down.
  autoscaler_config c;
  c.replica_rps = 1.0, c.down_delay_s = 5.0, c.peak_window_s = 0.0, c.min_replicas = 1, c.max_replicas = 2;
  replica_autoscaler a(c);
  double t = 0.0;
  for (int i = 0; i < 200; ++i) {
    t += 0.05;
    CHECK(a.update(t, 0.65, 0.0, 2) == 2);  // aims at 2: no step
  }
  int last = 2;
  for (int i = 0; i < 200; ++i) t += 0.05, last = a.update(t, 0.1, 0.0, 2);
  CHECK(last == 1);
}
