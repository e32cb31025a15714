#pragma once
// The RL pipeline simulated event by event: every sequence finishes at its own time on its rollout
// device, training steps start when their batch is generated, and devices change role inside a
// step, at the trainers' boundary window. Pipelines: one-step-off without a per-phase barrier (the
// regime where moving devices pays), the same with the barrier, and synchronous. Schedules: a
// static split, the stage-balance policy (decide_window, or the look-ahead planner on a leader's
// snapshot: plan, the code the live leader runs), the within-step oracle (clairvoyant, free
// switches) and colocated time sharing. What is modelled and why: docs/design/rl.md.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/rl/event_engine.hpp"
#include "dra/rl/leader_view.hpp"
#include "dra/rl/rollout.hpp"
#include "dra/rl/snapshot.hpp"
#include "dra/rl/stage_balance.hpp"
#include "dra/rl/workload.hpp"

namespace dra::sim {

/// Schedules of the three-part report, all on the same lengths.
struct rl_event_report {
  std::vector<rl_run_result> barrier_free, barrier, synchronous;  ///< static splits 1 .. devices - 1
  std::size_t best_barrier_free = 0, best_barrier = 0, best_synchronous = 0;
  rl_run_result dynamic, oracle, colocated;
  rl_run_result lookahead;  ///< the policy with planner "lookahead" (dynamic: the configured one)
  std::string length_source;
};

class rl_event_sim : private rl_leader_view {
 public:
  rl_event_sim(const length_distribution& lengths, rl_event_config config)
      : rl_leader_view(lengths, std::move(config)),
        source_(config_.workload.lengths == length_model::reasoning ? std::string("reasoning lengths")
                                                                    : lengths.source) {}

  using rl_event_engine::batches;
  using rl_event_engine::config;

  /// A fixed split in the given pipeline (barrier: the per-phase barrier).
  rl_run_result run_static(int rollout, policy::rl_pipeline pipeline, bool barrier) const {
    check_split(rollout);
    state s = initial(rollout, pipeline, barrier, config_.costs);
    const char* name = pipeline == policy::rl_pipeline::synchronous ? "static_synchronous"
                       : barrier                                    ? "static_barrier"
                                                                    : "static_barrier_free";
    simulate(s, hold_controller{}, -1);
    return finish(s, name, rollout);
  }
  rl_run_result run_static(int rollout) const { return run_static(rollout, config_.pipeline, config_.barrier); }

  /// The stage-balance policy deciding in every boundary window (no per-phase barrier), by its
  /// planner: decide_window, or the look-ahead planner on a leader's snapshot of this run's state
  /// (plan: which device holds which sequence, what each generated so far, the queues, the
  /// finished lengths, the costs the policy fitted and the engines' configured limits; nothing of
  /// the truth), as the live leader runs it.
  rl_run_result run_dynamic() const { return run_dynamic(config_.policy.planner); }
  /// The same with the planner named ("window" or "lookahead").
  rl_run_result run_dynamic(const std::string& planner) const {
    auto pc = config_.stage_policy();
    pc.planner = planner;
    policy::stage_balance_policy pol(pc);
    state s = initial(config_.start_rollout(), config_.pipeline, config_.barrier, config_.costs);
    s.policy = &pol;
    if (pc.planner == "lookahead")
      simulate(s, planner_controller{this}, -1);
    else
      simulate(s, policy_controller{this}, -1);
    s.policy = nullptr;
    return finish(s, planner == "lookahead" ? "dynamic_lookahead" : "dynamic", 0);
  }

  /// oracle_within_step: in every boundary window, every feasible trainer count is simulated ahead
  /// `oracle_lookahead` windows with the true lengths, and the one whose step starts earliest is
  /// taken. A clairvoyant greedy reference, not a proof of optimality. `free_switches`: every switch
  /// costs nothing (the ceiling the reports use); false: the measured costs, as the policy pays
  /// them (oracle_within_step_paid).
  rl_run_result run_oracle(bool free_switches = true) const {
    rl_cost_model free = config_.costs;
    if (free_switches) {
      free.switch_agree_s = free.switch_rebuild_s = free.switch_weights_s = free.switch_optimizer_s = 0.0;
      free.rollout_start_s = 0.0;
    }
    state s = initial(config_.start_rollout(), config_.pipeline, config_.barrier, free);
    simulate(s, oracle_controller{this, 0, config_.devices, false}, -1);
    return finish(s, free_switches ? "oracle_within_step" : "oracle_within_step_paid", 0);
  }

  /// lookahead_sampled: the oracle's search without its clairvoyance. Every length not generated
  /// yet is drawn (`samples` times) from what the run has seen, a sequence in flight above what it
  /// generated so far; the trainer count whose look-ahead step starts earliest on average is taken,
  /// at the measured switch costs, moving at most `max_move` devices at once (every count is one
  /// more chance to pick a loser on the draws' noise). `grouped`: a sequence's draw follows its
  /// GRPO group (observed_lengths: a random-effects model of the groups' log-scales, which weighs
  /// its finished siblings by how much groups differ); false: independent draws from the 2,048 most
  /// recent finished sequences (lookahead_sampled_independent). It reads the run's true cost model and which device
  /// holds which sequence, so it is a reference for what observable lengths allow, not a policy:
  /// docs/results/rl/issue24/README.md.
  rl_run_result run_lookahead_sampled(int samples, int max_move = 2, bool grouped = true) const {
    if (samples < 1) dra::detail::throw_invalid("samples", "must be >= 1, got " + std::to_string(samples));
    if (max_move < 1) dra::detail::throw_invalid("max_move", "must be >= 1, got " + std::to_string(max_move));
    state s = initial(config_.start_rollout(), config_.pipeline, config_.barrier, config_.costs);
    simulate(s, oracle_controller{this, samples, max_move, grouped}, -1);
    return finish(s, grouped ? "lookahead_sampled" : "lookahead_sampled_independent", 0);
  }

  /// The look-ahead planner on a leader's view of its pipeline: every trainer count within the
  /// policy's lookahead_max_move is tried on this event model, from the state the snapshot
  /// describes, with the costs `pol` fitted, the last switch's measured parts and lookahead_draws
  /// draws of every length not generated yet (by GRPO group); the count whose look-ahead step
  /// starts earliest (valued past the horizon, a saving over holding beyond one standard error)
  /// is the answer. The live leader calls it (python/dra/rl/live/pipeline.py) and so does this
  /// simulator's dynamic run (snapshot_of its own state): one code path.
  static planner_move plan(const pipeline_snapshot& snap, policy::stage_balance_policy& pol) {
    const auto& pc = pol.config();
    if (pc.devices != static_cast<int>(snap.slots.size()))
      dra::detail::throw_invalid("slots", "the policy is configured for " + std::to_string(pc.devices) +
                                              " devices but the snapshot has " + std::to_string(snap.slots.size()) +
                                              " slots; configure StageBalanceConfig.devices to match");
    snap.validate();
    rl_event_config c;
    c.devices = pc.devices;
    c.pipeline = policy::rl_pipeline::one_step_off;
    auto& w = c.workload;
    w.steps = snap.steps;
    w.prompts_per_step = snap.prompts_per_step;
    w.group_size = snap.group_size;
    w.updates_per_step = snap.updates_per_step;
    w.prompt_tokens = snap.prompt_tokens;
    w.max_generation_tokens = snap.max_generation_tokens;
    w.seed = snap.seed;
    c.costs.max_concurrency = snap.max_concurrency;
    c.costs.kv_capacity_tokens = snap.kv_capacity_tokens;
    c.costs.kv_watermark = snap.kv_watermark;
    c.costs.kv_reserve_ratio = snap.kv_reserve_ratio;
    c.policy = pc;
    c.oracle_lookahead = snap.horizon_windows;
    const rl_event_sim sim(std::move(c), snap.lengths);
    state s = sim.restore(snap);
    s.policy = &pol;
    const std::vector<int> before = s.members;
    sim.consult_oracle(s, pc.lookahead_draws, pc.lookahead_max_move, true, true, snap.last_switch);
    s.policy = nullptr;
    planner_move mv;
    mv.trainers = static_cast<int>(s.members.size());
    for (int m : before)
      if (std::find(s.members.begin(), s.members.end(), m) == s.members.end()) mv.leave.push_back(m);
    for (int m : s.members)
      if (std::find(before.begin(), before.end(), m) == before.end()) mv.join.push_back(m);
    mv.reason = s.sw.record.reason;
    return mv;
  }

  /// Colocated time sharing: every device generates a batch (on-policy), hands its memory over,
  /// trains on it with every device, hands back, publishes.
  rl_run_result run_colocated() const {
    const auto& c = config_.costs;
    const auto& w = config_.workload;
    const int n_dev = config_.devices;
    rl_run_result r;
    r.name = "colocated";
    r.steps = w.steps;
    double busy = 0.0;
    for (int k = 0; k < w.steps; ++k) {
      const auto& batch = batches_[static_cast<std::size_t>(k)];
      const rollout_outcome ro =
          simulate_rollout(batch, n_dev, w.prompt_tokens, c, {}, nullptr, w.max_generation_tokens);
      const double tokens = sum(batch) + w.prompt_tokens * static_cast<double>(batch.size());
      const double compute = c.train_s(n_dev, tokens);
      rl_phase_record rec;
      rec.phase = k;
      rec.rollout = rec.train = n_dev;
      rec.start_s = r.total_s;
      rec.rollout_s = ro.makespan_s;
      rec.train_s = compute;
      rec.duration_s = c.weight_load_s + ro.makespan_s + c.colocated_switch_s + compute + c.weight_sync_s;
      rec.mean_length = sum(batch) / static_cast<double>(batch.size());
      rec.longest = *std::max_element(batch.begin(), batch.end());
      rec.trained_sequences = static_cast<int>(batch.size());
      rec.idle_device_s = n_dev * rec.duration_s - ro.busy_device_s - n_dev * compute;
      busy += ro.busy_device_s + n_dev * compute;
      r.tail_share += ro.makespan_s > 0.0 ? (ro.makespan_s - ro.ninety_s) / ro.makespan_s : 0.0;
      r.rollout_share += ro.makespan_s / (ro.makespan_s + compute);
      r.generated_tokens_per_s += sum(batch);
      r.total_s += rec.duration_s;
      r.phases.push_back(rec);
    }
    r.generated_sequences = r.trained_sequences = w.steps * w.sequences_per_step();
    r.exactly_once = true;
    r.tail_share /= w.steps;
    r.rollout_share /= w.steps;
    if (r.total_s > 0.0) {
      r.samples_per_s = static_cast<double>(r.trained_sequences) / r.total_s;
      r.generated_tokens_per_s /= r.total_s;
      r.bubble_fraction = std::max(0.0, 1.0 - busy / (n_dev * r.total_s));
    }
    r.mean_rollout_devices = n_dev;
    r.roles = {{0.0, n_dev, n_dev, 0}};
    return r;
  }

  /// Every static split in the three pipelines, the policy with each planner, the oracle and
  /// colocated.
  rl_event_report report(const std::function<void(int, int)>& progress = nullptr) const {
    rl_event_report out;
    out.length_source = source_;
    const int splits = config_.devices - 1;
    const int total = 3 * splits + 4;
    int done = 0;
    const auto tick = [&] {
      if (progress) progress(++done, total);
    };
    for (int r = 1; r < config_.devices; ++r) {
      out.barrier_free.push_back(run_static(r, policy::rl_pipeline::one_step_off, false));
      tick();
      out.barrier.push_back(run_static(r, policy::rl_pipeline::one_step_off, true));
      tick();
      out.synchronous.push_back(run_static(r, policy::rl_pipeline::synchronous, false));
      tick();
    }
    out.best_barrier_free = best_of(out.barrier_free);
    out.best_barrier = best_of(out.barrier);
    out.best_synchronous = best_of(out.synchronous);
    out.dynamic = run_dynamic();  // the configured planner
    tick();
    out.lookahead = config_.policy.planner == "lookahead" ? out.dynamic : run_dynamic("lookahead");
    tick();
    out.oracle = run_oracle();
    tick();
    out.colocated = run_colocated();
    tick();
    return out;
  }

 private:
  struct hold_controller {
    void operator()(state&, bool) const {}
  };
  struct policy_controller {
    const rl_event_sim* sim;
    void operator()(state& s, bool at_open) const { sim->consult_policy(s, at_open); }
  };
  struct planner_controller {
    const rl_event_sim* sim;
    void operator()(state& s, bool at_open) const {
      const auto& bs = s.batches[static_cast<std::size_t>(std::min(s.next_step, sim->steps() - 1))];
      if (at_open || (bs.open && bs.remaining == 0)) sim->consult_planner(s);
    }
  };
  struct oracle_controller {
    const rl_event_sim* sim;
    int samples;   // 0: the true lengths
    int max_move;  // devices moved at most at once
    bool grouped;  // draws follow the GRPO groups
    void operator()(state& s, bool at_open) const {
      const auto& bs = s.batches[static_cast<std::size_t>(std::min(s.next_step, sim->steps() - 1))];
      if (at_open || (bs.open && bs.remaining == 0)) sim->consult_oracle(s, samples, max_move, grouped);
    }
  };

  static std::size_t best_of(const std::vector<rl_run_result>& runs) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < runs.size(); ++i)
      if (runs[i].total_s < runs[best].total_s) best = i;
    return best;
  }
  void check_split(int rollout) const {
    if (rollout < 1 || rollout >= config_.devices)
      dra::detail::throw_invalid("rollout", "must lie in [1, devices - 1] = [1, " +
                                                std::to_string(config_.devices - 1) + "], got " +
                                                std::to_string(rollout));
  }
  // ---- decisions -----------------------------------------------------------------------------
  void consult_policy(state& s, bool at_open) const {
    (void)at_open;
    if (s.policy == nullptr || s.next_step >= steps()) return;
    policy::window_state w;
    const auto idle_list = idle_devices(s);
    w.train = static_cast<int>(s.members.size());
    w.rollout = config_.devices - w.train;
    w.idle_rollout = static_cast<int>(idle_list.size());
    w.step = s.next_step;
    w.remaining_steps = steps() - s.next_step;
    w.sequences_per_step = n();
    w.updates_per_step = config_.workload.updates_per_step;
    w.updates_left = s.training ? w.updates_per_step - s.update : w.updates_per_step;
    const auto& bs = s.batches[static_cast<std::size_t>(s.next_step)];
    w.wait_complete = bs.open && bs.remaining == 0;
    w.wait_queued = bs.open ? bs.queued : n();
    flight(s, s.next_step, w.wait_in_flight);
    w.next_exists = s.next_step + 1 < steps();
    if (w.next_exists) {
      const auto& nb = s.batches[static_cast<std::size_t>(s.next_step + 1)];
      w.next_queued = nb.open ? nb.queued : n();
      flight(s, s.next_step + 1, w.next_in_flight);
    }
    const policy::window_decision d = s.policy->decide_window(w);
    if (d.kind == policy::stage_action::to_rollout) {
      fire(s, std::min(d.moved, static_cast<int>(s.members.size()) - 1), {});
      s.sw.record.reason = d.reason;
      s.sw.record.predicted_payback_steps = d.payback_steps;
    } else if (d.kind == policy::stage_action::to_train) {
      std::vector<int> join(idle_list.begin(), idle_list.begin() + std::min<std::ptrdiff_t>(d.moved, idle_list.size()));
      if (!join.empty()) {
        fire(s, 0, join);
        s.sw.record.reason = d.reason;
        s.sw.record.predicted_payback_steps = d.payback_steps;
      }
    }
  }

  // A leader's view: the lengths of its snapshot (0 where a sequence is not finished).
  rl_event_sim(rl_event_config config, std::vector<std::vector<double>> lengths)
      : rl_leader_view(std::move(config), std::move(lengths)), source_("a leader's snapshot") {}

  // The simulator's own dynamic run with the planner: through the leader's view, as live.
  void consult_planner(state& s) const {
    if (s.policy == nullptr || s.next_step >= steps()) return;
    const planner_move mv = plan(snapshot_of(s), *s.policy);
    if (mv.leave.empty() && mv.join.empty()) return;
    fire(s, static_cast<int>(mv.leave.size()), mv.join);
    if (static_cast<int>(s.members.size()) != mv.trainers)
      throw std::logic_error("rl_event_sim: the planner's move does not apply to the state it was planned on");
    s.sw.record.reason = mv.reason;
  }

  // fitted: the planner (the costs s.policy fitted, `last` the last switch's measured parts).
  void consult_oracle(state& s, int samples, int max_move, bool grouped_draws, bool fitted = false,
                      const measured_switch& last = {}) const {
    if (s.next_step >= steps()) return;
    const auto idle_list = idle_devices(s);
    const int t = static_cast<int>(s.members.size());
    const int lo = std::max({1, config_.policy.min_train, t - max_move});
    const int hi = std::min({config_.devices - std::max(1, config_.policy.min_rollout),
                             t + static_cast<int>(idle_list.size()), t + max_move});
    const int target = std::min(steps(), s.next_step + config_.oracle_lookahead);
    // When the look-ahead step starts with `cand` trainers, from `from` (hold after the move).
    // The planner (fitted) also values what follows the horizon, `terminal` more steps (at most
    // the steps left; lookahead_terminal_steps). A join: at its split's last step time in the
    // trial, or at the current split's (the hold trial's) after lending the device back,
    // whichever is less; a device whose handover pays back over several steps is then worth
    // taking. A lend is for a tail: after the horizon the split is taken as back where it was.
    const int terminal =
        fitted ? std::min(s.policy->config().lookahead_terminal_steps, std::max(0, steps() - target)) : 0;
    rl_cost_model costs = s.cost_model;
    if (fitted) costs = fitted_costs(s, *s.policy, last);
    const double lend_back_s = costs.switch_agree_s + costs.switch_rebuild_s;
    const auto value = [&](const std::vector<std::pair<double, double>>& runs, int cand) {
      const auto [at, rate] = runs[static_cast<std::size_t>(cand)];
      const double held = runs[static_cast<std::size_t>(t)].second;
      if (terminal == 0 || rate <= 0.0 || held <= 0.0) return at;
      if (cand <= t) return at + terminal * held;
      return at + std::min(terminal * rate, terminal * held + lend_back_s);
    };
    const auto started = [&](const state& trial) {
      return trial.next_step >= steps() && !trial.training ? trial.now
             : trial.training                              ? trial.step_start_s
                                                           : trial.now;
    };
    // Between two updates the decision is taken inside the update's end (train_event): a trial
    // goes on from there as the run does, starting the next update after the boundary.
    const bool between_updates = s.training && !s.publishing && s.train_event_s <= s.now;
    const auto start_of = [&](const state& from, int cand) {
      state trial = from;
      trial.policy = nullptr;  // a trial observes nothing
      apply(trial, cand, idle_list);
      if (between_updates) {
        if (!trial.window_fired) fire(trial, 0, {});
        start_update(trial);
      }
      double before = 0.0;
      if (terminal > 0 && target - 1 > s.next_step) {
        simulate(trial, hold_controller{}, target - 1);
        before = started(trial);
      }
      simulate(trial, hold_controller{}, target);
      const double at = started(trial);
      return std::pair<double, double>{at, before > 0.0 ? at - before : 0.0};
    };
    std::vector<double> when(static_cast<std::size_t>(hi + 1), 0.0);
    std::vector<double> sq(static_cast<std::size_t>(hi + 1), 0.0);  // sum over draws of (value - hold's)^2
    std::vector<std::pair<double, double>> runs(static_cast<std::size_t>(hi + 1));
    if (samples == 0) {
      for (int cand = lo; cand <= hi; ++cand) runs[static_cast<std::size_t>(cand)] = start_of(s, cand);
      for (int cand = lo; cand <= hi; ++cand) when[static_cast<std::size_t>(cand)] = value(runs, cand);
    } else {
      const observed_lengths seen(*this, s, grouped_draws);
      if (!seen.ready()) return;  // hold until a batch was seen
      for (int k = 0; k < samples; ++k) {
        std::mt19937_64 rng(config_.workload.seed * 1000003ULL + static_cast<std::uint64_t>(s.now * 1000.0) +
                            7919ULL * static_cast<std::uint64_t>(k));
        std::map<int, double> scales;  // per group, drawn once per sample
        const auto draw = [&](int id, double generated) { return seen.draw(id, generated, rng, scales); };
        std::vector<std::vector<double>> drawn = batches_;
        state base = s;
        base.cost_model = costs;
        for (auto& dv : base.dev)
          dv.rd.resample([&](int id, double generated) {
            return drawn[static_cast<std::size_t>(id / n())][static_cast<std::size_t>(id % n())] = draw(id, generated);
          });
        for (int b = s.next_step; b <= std::min(steps() - 1, target + 1); ++b) {
          auto& lengths = drawn[static_cast<std::size_t>(b)];
          const auto& bs = s.batches[static_cast<std::size_t>(b)];
          if (!bs.open)
            for (int i = 0; i < n(); ++i) lengths[static_cast<std::size_t>(i)] = draw(b * n() + i, 0.0);
          else
            for (const auto& queue : bs.assigned)
              for (int id : queue) lengths[static_cast<std::size_t>(id % n())] = draw(id, 0.0);
        }
        base.lengths = &drawn;
        for (int cand = lo; cand <= hi; ++cand) runs[static_cast<std::size_t>(cand)] = start_of(base, cand);
        const double hold = value(runs, t);
        for (int cand = lo; cand <= hi; ++cand) {
          const double v = value(runs, cand);
          when[static_cast<std::size_t>(cand)] += v / samples;
          sq[static_cast<std::size_t>(cand)] += (v - hold) * (v - hold);
        }
      }
    }
    int best = -1;
    for (int cand = lo; cand <= hi; ++cand) {
      const double w = when[static_cast<std::size_t>(cand)];
      const double b = best < 0 ? std::numeric_limits<double>::infinity() : when[static_cast<std::size_t>(best)];
      if (w < b - 1e-9 || (std::abs(w - b) <= 1e-9 && std::abs(cand - t) < std::abs(best - t))) best = cand;
    }
    if (best < 0) return;
    // The planner moves only when the draws agree: its saving over holding must exceed one standard
    // error of that saving across the draws (the same draws for every count), else it holds.
    if (fitted && best != t && samples > 1) {
      const auto b = static_cast<std::size_t>(best);
      const double saving = when[static_cast<std::size_t>(t)] - when[b];
      const double var = std::max(0.0, (sq[b] - samples * saving * saving) / (samples - 1));
      if (!(saving > std::sqrt(var / samples))) return;
    }
    apply(s, best, idle_list);
    if (s.sw.direction != policy::stage_action::hold)
      s.sw.record.reason = std::string(samples ? "lookahead: " : "oracle: ") + std::to_string(best) +
                           " trainers start step " + std::to_string(target) +
                           detail_fmt(" earliest (%.4g s)", when[static_cast<std::size_t>(best)]);
  }
  void apply(state& s, int trainers, const std::vector<int>& idle_list) const {
    const int t = static_cast<int>(s.members.size());
    if (trainers < t) fire(s, t - trainers, {});
    if (trainers > t) fire(s, 0, std::vector<int>(idle_list.begin(), idle_list.begin() + (trainers - t)));
  }
  static std::string detail_fmt(const char* f, double v) { return policy::detail::fmt(f, v); }

  rl_run_result finish(state& s, const char* name, int rollout) const {
    rl_run_result r = std::move(s.result);
    r.name = name;
    r.rollout = rollout;
    r.steps = steps();
    r.total_s = s.now;
    r.trained_sequences = s.trained;
    r.generated_sequences = s.generated_count;
    r.exactly_once = s.duplicates == 0 && s.generated_count == steps() * n() && s.trained == steps() * n();
    double tokens = 0.0;
    for (const auto& b : batches_) tokens += sum(b);
    if (r.total_s > 0.0) {
      r.samples_per_s = static_cast<double>(s.trained) / r.total_s;
      r.generated_tokens_per_s = tokens / r.total_s;
      r.bubble_fraction = std::max(0.0, 1.0 - s.busy_s / (config_.devices * r.total_s));
    }
    double weighted = 0.0;
    for (std::size_t i = 0; i < r.roles.size(); ++i) {
      const double end = i + 1 < r.roles.size() ? r.roles[i + 1].t : r.total_s;
      weighted += r.roles[i].rollout * std::max(0.0, end - r.roles[i].t);
    }
    r.mean_rollout_devices = r.total_s > 0.0 ? weighted / r.total_s : 0.0;
    r.switches = static_cast<int>(r.switch_log.size());
    for (const auto& w : r.switch_log) r.switch_total_s += w.total_s, r.switch_exposed_s += w.exposed_s;
    r.hidden_fraction = hidden_share(r);
    return r;
  }

  std::string source_;
};

}  // namespace dra::sim
