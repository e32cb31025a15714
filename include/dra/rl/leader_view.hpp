#pragma once
// What the RL pipeline's leader knows of a run, on the event engine (events.hpp builds on it): the
// lengths it has seen finish and draws from them (observed_lengths), the cost model it fitted
// (fitted_costs), the last switch's measured parts, and the translation between a run's state and
// the leader's snapshot (snapshot_of, restore): the look-ahead planner reads nothing else.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dra/rl/event_engine.hpp"
#include "dra/rl/snapshot.hpp"
#include "dra/rl/stage_balance.hpp"

namespace dra::sim {

class rl_leader_view : protected rl_event_engine {
 protected:
  using rl_event_engine::rl_event_engine;

  // What a leader has seen of the lengths, and draws from it for a look-ahead: the 2,048 most
  // recent finished sequences and, by GRPO group, the log-scales of the 256 most recent finished
  // groups and their samples' deviations within a group (a random-effects model: how much a
  // group's finished siblings say of the rest depends on how much groups differ beyond their
  // samples' spread). Reads finished sequences only.
  class observed_lengths {
   public:
    observed_lengths(const rl_leader_view& sim, const state& s, bool grouped)
        : s_(s),
          sim_(sim),
          group_(std::max(1, sim.config_.workload.group_size)),
          limit_(sim.config_.workload.max_generation_tokens) {
      for (std::size_t id = s.generated.size(); id-- > 0 && seen_.size() < 2048;)
        if (s.generated[id]) seen_.push_back(sim.length_of(static_cast<int>(id)));
      std::sort(seen_.begin(), seen_.end());
      if (!grouped || group_ < 2) return;
      for (int gid = static_cast<int>(s.generated.size()) / group_; gid-- > 0 && scales_.size() < 256;) {
        bool done = true;
        for (int id = gid * group_; id < (gid + 1) * group_; ++id)
          done = done && s.generated[static_cast<std::size_t>(id)];
        if (!done) continue;
        double m = 0.0;
        for (int id = gid * group_; id < (gid + 1) * group_; ++id) m += std::log(sim.length_of(id)) / group_;
        scales_.push_back(m);
        for (int id = gid * group_; id < (gid + 1) * group_; ++id)
          deviations_.push_back(std::log(sim.length_of(id)) - m);
      }
      if (scales_.size() < 2) {
        scales_.clear();  // too few groups to tell them apart: independent draws
        return;
      }
      for (double m : scales_) mean_log_ += m / static_cast<double>(scales_.size());
      for (double& m : scales_) m -= mean_log_;
      // A random-effects view of the groups: within-group variance sigma^2, and what the groups'
      // means vary by beyond it, tau^2 (0 when a prompt's samples do not move together).
      double within = 0.0, between = 0.0;
      for (double d : deviations_) within += d * d;
      within /= static_cast<double>(scales_.size()) * (group_ - 1);
      for (double m : scales_) between += m * m / static_cast<double>(scales_.size() - 1);
      within_ = within;
      between_ = std::max(0.0, between - within / group_);
    }
    bool ready() const { return seen_.size() >= static_cast<std::size_t>(sim_.n()); }
    /// A length for sequence `id` above what it generated. By group: the group's log-scale is drawn
    /// once per sample (into `scales`) from its posterior given its k finished siblings (normal, mean
    /// k tau^2 / (k tau^2 + sigma^2) times their mean deviation, variance tau^2 sigma^2 /
    /// (k tau^2 + sigma^2)), plus a recent within-group deviation; else a recent finished length.
    double draw(int id, double generated, std::mt19937_64& rng, std::map<int, double>& scales) const {
      if (!scales_.empty()) {
        const int gid = id / group_;
        auto it = scales.find(gid);
        if (it == scales.end()) {
          double known = 0.0;
          int siblings = 0;
          for (int m = gid * group_; m < (gid + 1) * group_; ++m)
            if (s_.generated[static_cast<std::size_t>(m)]) known += std::log(sim_.length_of(m)) - mean_log_, ++siblings;
          const double precision = siblings * between_ + within_;
          const double mean = precision > 0.0 ? between_ * known / precision : 0.0;
          const double sd = precision > 0.0 ? std::sqrt(between_ * within_ / precision) : 0.0;
          it = scales.emplace(gid, mean + sd * std::normal_distribution<double>()(rng)).first;
        }
        for (int tries = 0; tries < 32; ++tries) {
          const double v = std::min(limit_, std::exp(mean_log_ + it->second + deviations_[rng() % deviations_.size()]));
          if (v > generated) return v;
        }
      }
      const auto above = std::upper_bound(seen_.begin(), seen_.end(), generated);
      if (above == seen_.end()) return std::min(limit_, generated + 1.0);
      return above[static_cast<std::ptrdiff_t>(rng() % static_cast<std::uint64_t>(seen_.end() - above))];
    }

   private:
    const state& s_;
    const rl_leader_view& sim_;
    int group_;
    double limit_;
    std::vector<double> seen_, scales_, deviations_;
    double mean_log_ = 0.0, within_ = 0.0, between_ = 0.0;
  };

  // The cost model a leader has learned: the engines' configured limits, every time as `pol`
  // fitted or measured it, the switch parts as the run's last switch of each kind measured them.
  rl_cost_model fitted_costs(const state& s, const policy::stage_balance_policy& pol,
                             const measured_switch& last) const {
    const rl_cost_model& truth = s.cost_model;
    rl_cost_model c;
    c.max_concurrency = truth.max_concurrency;  // configured engine limits, not measurements
    c.kv_capacity_tokens = truth.kv_capacity_tokens;
    c.kv_watermark = truth.kv_watermark;
    c.kv_reserve_ratio = truth.kv_reserve_ratio;
    c.decode_fixed_s = pol.generation().fixed_s();
    c.decode_per_sequence_s = pol.generation().per_sequence_s();
    c.decode_per_kilotoken_s = pol.generation().per_kilotoken_s();
    c.prefill_per_kilotoken_s = pol.prefill_per_kilotoken_s();
    const auto& train = pol.training();
    c.train_fixed_s = train.compute_time_s(0.0);
    c.train_per_token_s = std::max(0.0, train.compute_time_s(1000.0) - c.train_fixed_s) / 1000.0;
    c.sync_fixed_s = train.sync_time_s(2);
    c.sync_per_rank_s = std::max(0.0, train.sync_time_s(3) - c.sync_fixed_s);
    c.weight_sync_s = c.weight_load_s = pol.weight_sync_s();
    c.rollout_start_s = pol.engine_start_s();
    c.switch_agree_s = c.switch_weights_s = c.switch_optimizer_s = 0.0;
    c.switch_rebuild_s = pol.config().prior_switch_cost_s;
    if (last.agree_s >= 0.0) c.switch_agree_s = last.agree_s, c.switch_rebuild_s = std::max(0.0, last.rebuild_s);
    if (last.weights_s >= 0.0)
      c.switch_weights_s = last.weights_s, c.switch_optimizer_s = std::max(0.0, last.optimizer_s);
    return c;
  }
  static measured_switch measured_of(const std::vector<rl_switch_record>& log) {
    measured_switch m;
    if (!log.empty()) m.agree_s = log.back().agree_s, m.rebuild_s = log.back().rebuild_s;
    for (auto it = log.rbegin(); it != log.rend(); ++it)
      if (it->direction == "to_train") {
        m.weights_s = it->weights_s, m.optimizer_s = it->optimizer_s;
        break;
      }
    return m;
  }

  pipeline_snapshot snapshot_of(const state& s) const {
    pipeline_snapshot p;
    const auto& w = config_.workload;
    const auto& c = s.cost_model;
    p.now_s = s.now;
    p.seed = w.seed;
    p.steps = w.steps;
    p.prompts_per_step = w.prompts_per_step;
    p.group_size = w.group_size;
    p.updates_per_step = w.updates_per_step;
    p.prompt_tokens = w.prompt_tokens;
    p.max_generation_tokens = w.max_generation_tokens;
    p.max_concurrency = c.max_concurrency;
    p.kv_capacity_tokens = c.kv_capacity_tokens;
    p.kv_watermark = c.kv_watermark;
    p.kv_reserve_ratio = c.kv_reserve_ratio;
    p.horizon_windows = config_.oracle_lookahead;
    p.step = s.next_step;
    p.training = s.training;
    p.update = s.training ? s.update : 0;
    p.published = s.published;
    p.trainers_free_s = s.trainers_free_s;
    p.members = s.members;
    for (const auto& dv : s.dev) {
      pipeline_slot sl;
      sl.role = dv.r == role::train ? "train" : dv.r == role::starting ? "starting" : "rollout";
      sl.version = dv.version;
      sl.clock_s = dv.r == role::starting ? dv.ready_s : dv.rd.clock;
      dv.rd.for_each_active([&](int id, double g) { sl.in_flight.push_back({id, g, 0.0}); });
      std::size_t i = 0;
      dv.rd.for_each_admitted([&](int, double g0) { sl.in_flight[i++].admitted_at = g0; });
      dv.rd.for_each_waiting([&](int id, double g) { sl.waiting.emplace_back(id, g); });
      p.slots.push_back(std::move(sl));
    }
    for (int b = s.next_step; b < steps(); ++b) {
      const auto& bs = s.batches[static_cast<std::size_t>(b)];
      if (!bs.open) break;
      pipeline_batch pb;
      pb.open = true;
      pb.opened_s = bs.opened_s;
      pb.complete_s = bs.complete_s;
      pb.rollout_at_open = bs.rollout_at_open;
      pb.remaining = bs.remaining;
      for (const auto& q : bs.assigned) pb.queued.emplace_back(q.begin(), q.end());
      p.batches.push_back(std::move(pb));
    }
    p.lengths = batches_;
    for (std::size_t id = 0; id < s.generated.size(); ++id)
      if (!s.generated[id]) p.lengths[id / static_cast<std::size_t>(n())][id % static_cast<std::size_t>(n())] = 0.0;
    p.last_switch = measured_of(s.result.switch_log);
    return p;
  }

  // The state a snapshot describes (validated), on this engine (whose lengths are the snapshot's).
  state restore(const pipeline_snapshot& p) const {
    state s;
    s.cost_model = config_.costs;
    s.pipeline = policy::rl_pipeline::one_step_off;
    s.now = p.now_s;
    s.members = p.members;
    s.dev.resize(p.slots.size());
    for (std::size_t d = 0; d < p.slots.size(); ++d) {
      const auto& sl = p.slots[d];
      device& dv = s.dev[d];
      dv.r = sl.role == "train" ? role::train : sl.role == "starting" ? role::starting : role::rollout;
      dv.version = sl.version;
      dv.ready_s = sl.clock_s;
      // In the order given, with placeholder lengths rising in remaining tokens (the look-ahead
      // draws every length): the engine's order is kept, and with it the order of the draws.
      double rank = 1.0;
      for (const auto& q : sl.in_flight)
        dv.rd.resume({q.id, q.generated + rank++, config_.workload.prompt_tokens, q.admitted_at,
                      config_.workload.max_generation_tokens},
                     q.generated - q.admitted_at);
      for (const auto& [id, g] : sl.waiting)
        dv.rd.resume_waiting({id, g + 1.0, config_.workload.prompt_tokens, g, config_.workload.max_generation_tokens});
      dv.rd.clock = sl.clock_s;
    }
    s.batches.resize(static_cast<std::size_t>(steps()));
    for (int b = 0; b < p.step; ++b) {
      auto& bs = s.batches[static_cast<std::size_t>(b)];
      bs.open = true;
      bs.complete_s = 0.0;
    }
    for (std::size_t i = 0; i < p.batches.size(); ++i) {
      const auto& pb = p.batches[i];
      if (!pb.open) break;
      auto& bs = s.batches[static_cast<std::size_t>(p.step) + i];
      bs.open = true;
      bs.opened_s = pb.opened_s;
      bs.complete_s = pb.complete_s;
      bs.rollout_at_open = pb.rollout_at_open;
      bs.remaining = pb.remaining;
      bs.assigned.resize(p.slots.size());
      for (std::size_t d = 0; d < pb.queued.size(); ++d) {
        bs.assigned[d].assign(pb.queued[d].begin(), pb.queued[d].end());
        bs.queued += static_cast<int>(pb.queued[d].size());
      }
    }
    s.generated.assign(static_cast<std::size_t>(steps()) * static_cast<std::size_t>(n()), 0);
    for (std::size_t id = 0; id < s.generated.size(); ++id)
      s.generated[id] = batches_[id / static_cast<std::size_t>(n())][id % static_cast<std::size_t>(n())] > 0.0;
    s.published = p.published;
    s.next_step = p.step;
    s.training = p.training;
    s.update = p.training ? p.update : 0;
    s.trainers_free_s = p.trainers_free_s;
    s.window_open = !p.training;
    s.window_fired = false;
    if (p.training) {  // the boundary before an update: its predecessor ended now
      s.train_event_s = s.now;
      s.train_tokens = sum(batches_[static_cast<std::size_t>(p.step)]) + config_.workload.prompt_tokens * n();
    }
    return s;
  }
};

}  // namespace dra::sim
