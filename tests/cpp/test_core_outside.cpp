// The torch-free core embedded by a program dra did not write (outside review, 2026-12-06): the
// pool's planners never plan past a job's max_size or the devices there are, a world below its
// minimum comes back, settings that would hang or exhaust memory are refused, and a refused call
// leaves the object as it was.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/energy/energy.hpp"
#include "dra/engine.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/perf_model.hpp"
#include "dra/policy/registry.hpp"
#include "dra/pool/lease.hpp"
#include "dra/pool/scaler.hpp"
#include "dra/pool/scheduler.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/quantile_sketch.hpp"

using namespace dra;

namespace {

pool::inventory slots(int n) {
  pool::inventory inv;
  for (int i = 0; i < n; ++i) {
    pool::device d;
    d.id = "slot" + std::to_string(i);
    d.type = "cpu-slot";
    inv.add(d);
  }
  return inv;
}

pool::job_entry service(int min_size, int max_size, int urgent) {
  pool::job_entry j;
  j.req.job = "svc";
  j.req.kind = "inference";
  j.req.min_size = min_size;
  j.req.max_size = max_size;
  j.urgent_size = urgent;
  return j;
}

int granted(const pool::plan& p, const std::string& job) {
  int n = 0;
  for (const auto& g : p.grants) n += g.job == job ? 1 : 0;
  return n;
}

/// Proposes one size whatever it is shown.
class wants final : public policy::policy {
 public:
  explicit wants(int n) : n_(n) {}
  const char* name() const noexcept override { return "wants"; }
  dra::policy::proposal propose(const dra::policy::decision_inputs&, int, int) const override {
    return {n_, 0.0, "wants " + std::to_string(n_)};
  }

 private:
  int n_;
};

policy::world_state world_of(int size, std::vector<int> candidates = {}) {
  policy::world_state w;
  w.size = size;
  for (int i = 0; i < size; ++i) w.active.push_back(i);
  w.candidates = std::move(candidates);
  return w;
}

policy::decision decide(policy::constrained_policy& p, const policy::world_state& w, int available) {
  const signals::convergence_signals sig;
  policy::capacity cap;
  cap.available = available;
  const policy::throughput_model model;
  return p.decide(sig, w, cap, policy::cost_model{0.0, 500.0}, model);
}

}  // namespace

TEST_CASE("outside.core.an_urgent_service_is_never_planned_past_its_max_size") {
  const pool::inventory inv = slots(4);
  const pool::scheduler s;
  // A service of 2 replicas that lost one: one grant, not one for "inference first" and one more
  // for its minimum (it held 3 of its 2).
  pool::lease_book book;
  book.grant(inv, "svc", "slot0", 1.0, 0.0);
  pool::job_entry svc = service(2, 2, 2);
  svc.req.validate(inv);
  pool::plan p = s.admit(inv, {svc}, book, 10.0);
  CHECK(granted(p, "svc") == 1);
  // A new one holding nothing: its 2, not all 4 slots.
  pool::lease_book empty;
  p = s.admit(inv, {svc}, empty, 10.0);
  CHECK(granted(p, "svc") == 2);
  // Urgent for fewer than its minimum: the minimum still comes, once.
  svc.urgent_size = 1;
  svc.req.max_size = 3;
  p = s.admit(inv, {svc}, empty, 10.0);
  CHECK(granted(p, "svc") == 2);
}

TEST_CASE("outside.core.plan_sizes_stays_within_the_devices_and_checks_its_jobs") {
  const policy::cluster_arbiter arb;
  pool::scale_job train;
  train.job = "train";
  train.min_size = train.max_size = train.current = 4;
  pool::scale_job svc;
  svc.job = "svc";
  svc.kind = "inference";
  svc.min_size = 1;
  svc.max_size = 2;
  svc.replicas_wanted = 1;
  // A new service on a pool full of training at its minimum: it waits (0), the plan fits in 4.
  auto plan = pool::plan_sizes({train, svc}, 4, arb);
  CHECK(plan.at("train") + plan.at("svc") <= 4);
  CHECK(plan.at("train") == 4);
  // With room left after training's minimum, the service's minimum comes out of it.
  train.min_size = 2;
  plan = pool::plan_sizes({train, svc}, 4, arb);
  CHECK(plan.at("svc") == 1);
  CHECK(plan.at("train") + plan.at("svc") <= 4);
  // A service holding its minimum keeps it.
  svc.current = 1;
  train.min_size = train.max_size = train.current = 3;
  plan = pool::plan_sizes({train, svc}, 4, arb);
  CHECK(plan.at("svc") == 1);
  CHECK(plan.at("train") == 3);
  // A huge max_size is planned within the devices (it sized the curve by max_size: 16 GB).
  pool::scale_job big;
  big.job = "big";
  big.max_size = 2'000'000'000;
  plan = pool::plan_sizes({big}, 4, arb);
  CHECK(plan.at("big") == 4);
  // Jobs it cannot take are named.
  pool::scale_job bad = big;
  bad.max_size = -2;
  CHECK_THROWS_WITH_AS(pool::plan_sizes({bad}, 4, arb), doctest::Contains("jobs['big'].max_size"),
                       std::invalid_argument);
  bad = big;
  bad.min_size = 5, bad.max_size = 2;
  CHECK_THROWS_WITH_AS(pool::plan_sizes({bad}, 4, arb), doctest::Contains("raise max_size or lower min_size"),
                       std::invalid_argument);
  bad = big;
  bad.current = -3;
  CHECK_THROWS_WITH_AS(pool::plan_sizes({bad}, 4, arb), doctest::Contains("jobs['big'].current"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(pool::plan_sizes({big, big}, 4, arb), doctest::Contains("listed twice"), std::invalid_argument);
}

TEST_CASE("outside.core.goodput_with_an_infinite_batch_bound_is_refused_not_hung") {
  engine_config c;
  c.policy = "goodput";
  c.goodput.adapt_batch = true;
  c.goodput.max_per_rank_batch = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(resize_engine{c}, doctest::Contains("max_per_rank_batch"), std::invalid_argument);
  c.goodput.min_per_rank_batch = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(resize_engine{c}, doctest::Contains("min_per_rank_batch"), std::invalid_argument);
  engine_config long_window;
  long_window.estimator.window = std::size_t{1} << 40;  // 8 TiB of window
  CHECK_THROWS_WITH_AS(resize_engine{long_window}, doctest::Contains("window"), std::invalid_argument);
}

TEST_CASE("outside.core.a_world_below_a_minimum_that_is_not_an_allowed_size_comes_back") {
  policy::constraints c;
  c.min_size = 2;
  c.max_size = 8;
  c.allowed_sizes = {4, 8};
  policy::constrained_policy p(std::make_shared<wants>(4), c);
  const auto d = decide(p, world_of(1, {1, 2, 3, 4, 5, 6, 7}), 8);
  CHECK(d.kind == policy::action::grow);
  CHECK(d.target_size == 4);
  CHECK(d.members.size() == 4);
  // Too few devices for the smallest allowed size: a hold that says why.
  const auto held = decide(p, world_of(1, {1, 2}), 3);
  CHECK(held.kind == policy::action::hold);
  CHECK(held.reason.find("restoring takes size 4 and 3 are available") != std::string::npos);
}

TEST_CASE("outside.core.a_malformed_world_is_refused_before_anything_is_counted") {
  policy::constraints c;
  c.hysteresis_decisions = 2;
  c.max_size = 4;
  policy::constrained_policy p(std::make_shared<wants>(3), c);
  policy::world_state twice = world_of(2, {2});
  twice.active = {0, 0};
  CHECK_THROWS_WITH_AS(decide(p, twice, 3), doctest::Contains("appears twice"), std::invalid_argument);
  policy::world_state short_named = world_of(4);
  short_named.active = {0, 1};
  CHECK_THROWS_WITH_AS(decide(p, short_named, 4), doctest::Contains("world.active"), std::invalid_argument);
  policy::world_state no_batch = world_of(2, {2});
  no_batch.global_batch = 0.0;
  CHECK_THROWS_WITH_AS(decide(p, no_batch, 3), doctest::Contains("world.global_batch"), std::invalid_argument);
  // Nothing was counted: the first good decision is the first of the two hysteresis asks for.
  const auto first = decide(p, world_of(2, {2}), 3);
  CHECK(first.kind == policy::action::hold);
  CHECK(first.reason.find("1 of 2") != std::string::npos);
  CHECK(decide(p, world_of(2, {2}), 3).kind == policy::action::grow);
  // A failing decision after the hysteresis counted leaves the count as it was.
  policy::constrained_policy q(std::make_shared<wants>(3), c);
  CHECK(decide(q, world_of(2, {2}), 3).kind == policy::action::hold);  // 1 of 2
  policy::world_state bad_candidates = world_of(2, {-1});
  CHECK_THROWS_AS(decide(q, bad_candidates, 3), std::invalid_argument);
  CHECK(decide(q, world_of(2, {2}), 3).kind == policy::action::grow);  // 2 of 2
}

TEST_CASE("outside.core.desired_size_is_a_size_the_job_may_take") {
  policy::policy_registry::add({"outside_wants5", "", true, policy::sim_scheduler::per_job, true, "wants 5",
                                [](const policy::policy_sections&) { return std::make_shared<wants>(5); }});
  engine_config c;
  c.policy = "outside_wants5";
  c.limits.max_size = 8;
  c.limits.allowed_sizes = {4, 8};
  resize_engine e(c);
  e.world() = world_of(4, {4, 5, 6, 7});
  e.capacity().available = 8;
  CHECK(e.desired_size() == 4);
  c.limits.allowed_sizes = {6, 8};
  c.limits.min_size = 1;
  resize_engine above(c);
  above.world() = world_of(6, {6, 7});
  CHECK(above.desired_size() == 6);
  // resized() refuses what the next decision would have refused, naming itself.
  CHECK_THROWS_WITH_AS(e.resized(0, 64.0), doctest::Contains("new_size"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(e.resized(2, std::nan("")), doctest::Contains("new_global_batch"), std::invalid_argument);
  CHECK(e.world().size == 4);
}

TEST_CASE("outside.core.lease_ids_never_wrap_and_restored_shares_are_checked") {
  const pool::inventory inv = slots(2);
  pool::lease_book book;
  pool::lease l;
  l.id = std::numeric_limits<std::int64_t>::max();
  l.job = "a", l.device = "slot0", l.share = 1.0;
  CHECK_THROWS_WITH_AS(book.restore(l), doctest::Contains("leaves no id after it"), std::invalid_argument);
  l.id = 7;
  l.share = 7.0;
  CHECK_THROWS_WITH_AS(book.restore(l), doctest::Contains("share"), std::invalid_argument);
  l.share = std::nan("");
  CHECK_THROWS_AS(book.restore(l), std::invalid_argument);
  CHECK(book.all().empty());
}

TEST_CASE("outside.core.one_outlier_does_not_ruin_the_sketch_and_a_tiny_half_life_is_refused") {
  signals::quantile_sketch q;
  for (int i = 0; i < 100; ++i) q.add(100.0);
  q.add(1e200);
  for (int i = 0; i < 100; ++i) q.add(100.0);
  CHECK(std::isfinite(q.mean()));
  CHECK(q.mean() < q.config().max_value);
  signals::quantile_sketch_config c;
  c.half_life = 1e-4;
  CHECK_THROWS_WITH_AS(signals::quantile_sketch{c}, doctest::Contains("half_life"), std::invalid_argument);
}

namespace {
/// A reader that returns NaN at its third reading (10 J a reading otherwise).
class flaky_reader final : public energy::energy_reader {
 public:
  std::string name() const override { return "flaky"; }
  std::string scope() const override { return "a test"; }
  double read_joules() override {
    ++reads_;
    return reads_ == 3 ? std::nan("") : 10.0 * reads_;
  }
  energy::energy_source source() const noexcept override { return energy::energy_source::estimated; }

 private:
  int reads_ = 0;
};
}  // namespace

TEST_CASE("outside.core.one_bad_energy_reading_costs_one_step_not_two") {
  energy::energy_meter m(std::make_unique<flaky_reader>());
  m.start(0.0);                       // 10 J
  CHECK(m.mark(1.0).joules == 10.0);  // 20 J
  CHECK(m.mark(2.0).joules == 0.0);   // NaN: the last good reading kept
  CHECK(m.mark(3.0).joules == 20.0);  // 40 J
  CHECK(m.bad_readings() == 1);
  CHECK(m.job().joules == 30.0);  // every joule between the first and the last good reading
  CHECK(m.mark(std::nan("")).seconds == 0.0);
  CHECK(m.mark(5.0).seconds == 2.0);
  CHECK(m.bad_readings() == 2);
}

TEST_CASE("outside.core.a_held_list_of_policy_names_follows_the_registry") {
  const auto& names = policy::policy_registry::names(true);
  const std::size_t before = names.size();
  REQUIRE(before > 0);
  policy::policy_registry::add({"outside_wants2", "", true, policy::sim_scheduler::per_job, true, "wants 2",
                                [](const policy::policy_sections&) { return std::make_shared<wants>(2); }});
  CHECK(names.size() == before + 1);  // it read as empty after add()
  CHECK(names.back() == "outside_wants2");
  policy::policy_registry::remove("outside_wants2");
  CHECK(names.size() == before);
}

TEST_CASE("outside.core.the_autoscaler_takes_finite_settings_only") {
  for (double pool::autoscaler_config::* field :
       {&pool::autoscaler_config::replica_rps, &pool::autoscaler_config::up_utilisation,
        &pool::autoscaler_config::down_delay_s, &pool::autoscaler_config::peak_window_s,
        &pool::autoscaler_config::queue_per_replica}) {
    pool::autoscaler_config c;
    c.*field = std::numeric_limits<double>::infinity();
    CHECK_THROWS_WITH_AS(pool::replica_autoscaler{c}, doctest::Contains("must be a finite number"),
                         std::invalid_argument);
  }
}

TEST_CASE("outside.core.batch_limits_that_overflow_the_split_are_refused") {
  const auto step_time = [](double atomic, int accum) { return 0.01 * atomic * (accum + 1) + 0.05; };
  policy::batch_limits lim;
  lim.init_batch = 32;
  lim.max_batch = 4096;
  lim.min_atomic = 8;
  lim.max_atomic = 256;
  CHECK(policy::best_batch(step_time, policy::grad_stats{1.0, 1.0}, 4, lim).goodput > 0.0);
  policy::batch_limits huge = lim;
  huge.max_batch = 3e12;  // 2^38 micro-batches: the accumulation count overflowed an int
  huge.min_atomic = huge.max_atomic = 1;
  CHECK_THROWS_WITH_AS(policy::best_batch(step_time, policy::grad_stats{1.0, 1.0}, 1, huge),
                       doctest::Contains("max_batch"), std::invalid_argument);
  policy::batch_limits nan_batch = lim;
  nan_batch.max_atomic = std::nan("");
  CHECK_THROWS_WITH_AS(policy::best_batch(step_time, policy::grad_stats{1.0, 1.0}, 2, nan_batch),
                       doctest::Contains("max_atomic"), std::invalid_argument);
}

TEST_CASE("outside.core.a_curve_cut_at_the_devices_still_reaches_the_jobs_minimum") {
  const policy::cluster_arbiter arb;
  pool::scale_job a;
  a.job = "a";
  a.min_size = 3;
  a.max_size = 8;
  pool::scale_job b = a;
  b.job = "b";
  b.min_size = 1;
  b.current = 2;
  const auto plan = pool::plan_sizes({a, b}, 2, arb);  // fewer devices than a's minimum
  CHECK(plan.at("b") <= 2);
  CHECK(plan.count("a") == 1);
}
