// Energy-aware objectives and the energy policy in the engine.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <map>

#include "dra/engine.hpp"
#include "dra/policy/energy_policies.hpp"

using namespace dra::policy;

namespace {
// A table: world size -> (time, energy, max power).
struct table_predictor final : energy_predictor {
  std::map<int, energy_prediction> rows;
  energy_prediction predict(const knob_setting& s) const override {
    auto it = rows.find(s.world_size);
    if (it == rows.end()) return {0, 0, 0, false};
    return it->second;
  }
};
std::vector<knob_setting> sizes(std::initializer_list<int> s) {
  std::vector<knob_setting> out;
  for (int w : s) out.push_back({w});
  return out;
}
table_predictor three() {
  table_predictor t;
  t.rows[1] = {100.0, 1000.0, 300.0};  // slow, frugal
  t.rows[2] = {60.0, 1200.0, 600.0};
  t.rows[4] = {40.0, 1600.0, 1200.0};  // fast, hungry
  return t;
}
// Step time: compute c/K per sample-share + sync s per extra rank (not perfectly scalable).
struct simple_throughput final : throughput_predictor {
  double compute_per_sample = 0.01, sync_s = 0.05;
  double step_time_s(int k, double per_rank) const override {
    return compute_per_sample * per_rank + (k > 1 ? sync_s : 0.0);
  }
};
}  // namespace

TEST_CASE("energy_policy.objectives.pick_what_each_promises") {
  const auto t = three();
  const auto c = sizes({1, 2, 4});
  energy_objective o;
  o.kind = energy_objective_kind::energy_delay;  // 1e5, 7.2e4, 6.4e4
  CHECK(choose_setting(o, c, t).setting.world_size == 4);
  o.kind = energy_objective_kind::zeus_cost;
  o.eta = 1.0;  // energy only
  CHECK(choose_setting(o, c, t).setting.world_size == 1);
  o.eta = 0.5;  // 0.5*E + 0.5*P*T: 15500, 18600, 24800
  CHECK(choose_setting(o, c, t).setting.world_size == 1);
  o.eta = 0.0;  // P*T: 30000, 36000, 48000
  CHECK(choose_setting(o, c, t).setting.world_size == 1);
  CHECK(o.zeus_cost(t.rows.at(2)) == doctest::Approx(36000.0));
  o.kind = energy_objective_kind::min_energy_deadline;
  o.deadline_s = 70.0;
  auto d = choose_setting(o, c, t);
  CHECK(d.setting.world_size == 2);
  CHECK(d.constraint_met);
  o.deadline_s = 10.0;
  d = choose_setting(o, c, t);
  CHECK(d.setting.world_size == 4);
  CHECK_FALSE(d.constraint_met);
  CHECK(d.reason.find("no setting meets the deadline") != std::string::npos);
  o.kind = energy_objective_kind::energy_budget;
  o.budget_j = 1300.0;
  CHECK(choose_setting(o, c, t).setting.world_size == 2);
  o.budget_j = 500.0;
  d = choose_setting(o, c, t);
  CHECK(d.setting.world_size == 1);
  CHECK_FALSE(d.constraint_met);
}

TEST_CASE("energy_policy.objectives.invalid_candidates_are_skipped_and_bad_input_named") {
  const auto t = three();
  energy_objective o;
  o.kind = energy_objective_kind::energy_delay;
  CHECK(choose_setting(o, sizes({3, 1}), t).setting.world_size == 1);  // 3 has no prediction
  CHECK_THROWS_WITH_AS(choose_setting(o, sizes({3, 5}), t), doctest::Contains("no candidate"), std::invalid_argument);
  o.eta = 1.5;
  CHECK_THROWS_WITH_AS(choose_setting(o, sizes({1}), t), doctest::Contains("eta"), std::invalid_argument);
}

TEST_CASE("energy_policy.knob_space.enumerates_every_combination_in_order") {
  knob_space s;
  s.world_sizes = {1, 2};
  s.sparsities = {0.0, 0.9};
  s.power_limits_w = {100.0, 200.0, 300.0};
  const auto all = s.enumerate();
  REQUIRE(all.size() == 12);
  CHECK(all[0].power_limit_w == 100.0);
  CHECK(all[1].power_limit_w == 200.0);
  CHECK(all[3].sparsity == 0.9);
  CHECK(all[6].world_size == 2);
}

TEST_CASE("energy_policy.live.energy_vs_time_tradeoff_over_world_sizes") {
  dra::signals::convergence_signals sig;
  world_state w;
  w.size = 2;
  w.global_batch = 64;
  w.remaining_steps = 1000;
  capacity cap{8};
  cost_model costs;
  simple_throughput tp;
  const decision_inputs in{sig, w, cap, costs, tp};
  energy_policy_config cfg;
  cfg.watts_per_device = 200.0;
  cfg.max_watts_per_device = 250.0;
  // Energy grows with size (sync overhead), time shrinks: least energy is one device.
  cfg.objective.kind = energy_objective_kind::min_energy_deadline;
  CHECK(energy_policy(cfg).propose(in, 1, 8).target_size == 1);
  // With a deadline the single device misses (1000 x 0.64 s = 640 s), the policy takes the
  // smallest size that meets it: K=2 takes 1000 x (0.32 + 0.05) = 370 s.
  cfg.job_deadline_s = 400.0;
  auto p = energy_policy(cfg).propose(in, 1, 8);
  CHECK(p.target_size == 2);
  w.elapsed_s = 200.0;  // 200 s left: K=4 takes 210 s, K=5 178 s, K=8 130 s; K=5 uses least energy
  p = energy_policy(cfg).propose(in, 1, 8);
  CHECK(p.target_size == 5);
  w.elapsed_s = 0.0;
  // EDP rewards speed: E x T with E = K x 200 x T.
  cfg.objective.kind = energy_objective_kind::energy_delay;
  cfg.job_deadline_s = std::numeric_limits<double>::infinity();
  const int edp = energy_policy(cfg).propose(in, 1, 8).target_size;
  CHECK(edp > 1);
  // A budget: spent most of it already, only the frugal size fits.
  cfg.objective.kind = energy_objective_kind::energy_budget;
  cfg.job_budget_j = 1e9;
  CHECK(energy_policy(cfg).propose(in, 1, 8).target_size == 8);  // fits: fastest
  w.energy_spent_j = 1e9 - 200.0 * 640.0 - 1.0;                  // one device's energy left
  CHECK(energy_policy(cfg).propose(in, 1, 8).target_size == 1);
}

TEST_CASE("energy_policy.engine.selectable_by_name") {
  dra::engine_config c;
  c.policy = "zeus_cost";
  c.energy.objective.eta = 0.3;
  c.validate();
  auto p = dra::make_policy(c);
  CHECK(std::string(p->name()) == "zeus_cost");
  c.policy = "energy_delay";
  dra::resize_engine engine(c);
  CHECK(std::string(engine.config().policy) == "energy_delay");
  c.policy = "greenest";
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("zeus_cost"), std::invalid_argument);
  c.policy = "zeus_cost";
  c.energy.watts_per_device = 400.0;  // above the max
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("max_watts_per_device"), std::invalid_argument);
}
