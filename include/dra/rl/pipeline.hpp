#pragma once
// RL post-training pipeline simulator: a fixed set of devices split between rollout and training,
// run phase by phase on generation lengths drawn from a real trace, under every static split, the
// stage-balance policy the live loop runs (unchanged), a per-phase oracle and colocated time
// sharing, all on the same lengths. What is simulated and how a switch is costed (exposed vs hidden):
// docs/design/rl.md; each assumption and its source: docs/guide/rl.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/rl/rollout.hpp"
#include "dra/rl/stage_balance.hpp"
#include "dra/rl/workload.hpp"

namespace dra::sim {

namespace detail {

inline double sum_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
}

}  // namespace detail

/// Runs the schedules of one configuration over pre-drawn batches.
class rl_pipeline_sim {
 public:
  rl_pipeline_sim(const length_distribution& lengths, rl_sim_config config)
      : config_((config.validate(), std::move(config))),
        batches_(draw_batches(lengths, config_.workload)),
        source_(lengths.source) {}

  const rl_sim_config& config() const noexcept { return config_; }
  const std::vector<std::vector<double>>& batches() const noexcept { return batches_; }

  /// Every phase at a fixed split.
  rl_run_result run_static(int rollout) const {
    check_split(rollout);
    rl_run_result r = start("static");
    r.rollout = rollout;
    for (int p = 0; p < phases(); ++p) {
      phase_outcome o = run_phase(p, rollout, {}, nullptr);
      add_phase(r, o);
    }
    return finish(std::move(r));
  }

  /// The stage-balance policy deciding at every phase boundary from what it observed.
  rl_run_result run_dynamic() const {
    policy::stage_balance_policy pol(config_.stage_policy());
    rl_run_result r = start("dynamic");
    int rollout = config_.start_rollout();
    std::int64_t since = std::numeric_limits<std::int64_t>::max() / 4;
    pending_switch sw;
    double predicted = 0.0;
    const int n = config_.workload.sequences_per_step();
    for (int p = 0; p < phases(); ++p) {
      const decode_sink sink = [&pol](int cc, double ctx, double it, double s) { pol.observe_decode(cc, ctx, it, s); };
      phase_outcome out = run_phase(p, rollout, sw, sink);
      out.record.predicted_s = predicted;
      if (sw.direction != policy::stage_action::hold) {
        // Exposed cost: this phase vs the same phase at the new split without switch costs.
        const phase_outcome clean = run_phase(p, rollout, {}, nullptr);
        rl_switch_record rec = sw.record;
        rec.phase = p;
        rec.exposed_s = std::max(0.0, out.duration_s - clean.duration_s);
        rec.hidden_s = std::max(0.0, rec.total_s - rec.exposed_s);
        out.record.switch_total_s = rec.total_s;
        out.record.switch_exposed_s = rec.exposed_s;
        pol.observe_switch(sw.direction, rec.exposed_s);
        r.switch_log.push_back(std::move(rec));
        sw = {};
      }
      observe(pol, p, rollout, out);
      add_phase(r, out);
      // Decide for the next phase (none after the last).
      if (p + 1 >= phases()) break;
      policy::stage_state st;
      st.rollout = rollout;
      st.train = config_.devices - rollout;
      st.step = p;
      st.steps_since_switch = since;
      st.remaining_steps = phases() - 1 - p;
      st.sequences_per_step = n;
      const policy::stage_decision d = pol.decide(st);
      predicted = d.target.step_s;
      ++since;
      if (d.kind != policy::stage_action::hold) {
        sw = make_switch(d.kind, d.moved);
        sw.record.reason = d.reason;
        sw.record.predicted_payback_steps = d.payback_steps;
        rollout = d.rollout;
        since = 0;
      }
    }
    r = finish(std::move(r));
    realise_paybacks(r);
    return r;
  }

  /// The best split of every phase with free switches: a bound no stage-balance policy beats.
  rl_run_result run_oracle() const {
    rl_run_result r = start("oracle");
    for (int p = 0; p < phases(); ++p) {
      phase_outcome best;
      best.duration_s = std::numeric_limits<double>::infinity();
      for (int rollout = 1; rollout < config_.devices; ++rollout) {
        phase_outcome o = run_phase(p, rollout, {}, nullptr);
        if (o.duration_s < best.duration_s) best = std::move(o);
      }
      add_phase(r, best);
    }
    return finish(std::move(r));
  }

  /// Colocated time sharing: every device generates, then every device trains (on-policy).
  rl_run_result run_colocated() const {
    rl_run_result r = start("colocated");
    const auto& c = config_.costs;
    const int n_dev = config_.devices;
    for (int k = 0; k < config_.workload.steps; ++k) {
      const auto& batch = batches_[static_cast<std::size_t>(k)];
      const rollout_outcome ro = simulate_rollout(batch, n_dev, config_.workload.prompt_tokens, c);
      const double tokens = detail::sum_of(batch) + config_.workload.prompt_tokens * static_cast<double>(batch.size());
      const double train = c.train_s(n_dev, tokens);
      phase_outcome o;
      auto& rec = o.record;
      rec.phase = k;
      rec.rollout = n_dev;
      rec.train = n_dev;
      rec.rollout_s = ro.makespan_s;
      rec.train_s = train;
      rec.mean_length = detail::sum_of(batch) / static_cast<double>(batch.size());
      rec.longest = *std::max_element(batch.begin(), batch.end());
      rec.trained_sequences = static_cast<int>(batch.size());
      o.duration_s = ro.makespan_s + c.colocated_switch_s + train + c.weight_sync_s;
      o.generated_tokens = detail::sum_of(batch);
      rec.idle_device_s = n_dev * o.duration_s - ro.busy_device_s - n_dev * train;
      add_phase(r, o);
    }
    return finish(std::move(r));
  }

  /// Every static split, the dynamic policy, the oracle and the colocated baseline. `progress`
  /// (optional) is called with (done, total) after each run.
  rl_sweep_result sweep(const std::function<void(int, int)>& progress = nullptr) const {
    rl_sweep_result out;
    out.length_source = source_;
    const int total = config_.devices - 1 + 3;
    int done = 0;
    for (int rollout = 1; rollout < config_.devices; ++rollout) {
      out.statics.push_back(run_static(rollout));
      if (progress) progress(++done, total);
    }
    for (std::size_t i = 1; i < out.statics.size(); ++i)
      if (out.statics[i].total_s < out.statics[out.best_static].total_s) out.best_static = i;
    out.dynamic = run_dynamic();
    if (progress) progress(++done, total);
    out.oracle = run_oracle();
    if (progress) progress(++done, total);
    out.colocated = run_colocated();
    if (progress) progress(++done, total);
    return out;
  }

 private:
  struct pending_switch {
    policy::stage_action direction = policy::stage_action::hold;
    int moved = 0;
    rl_switch_record record;
  };
  struct phase_outcome {
    double duration_s = 0.0;
    double generated_tokens = 0.0;  // of the batch trained in this phase
    rl_phase_record record;
    // What the policy observes.
    double train_tokens = 0.0, train_step_s = 0.0, train_sync_s = 0.0;
    int train_ranks = 0;
  };

  int phases() const {
    return config_.pipeline == policy::rl_pipeline::one_step_off ? config_.workload.steps + 1 : config_.workload.steps;
  }

  void check_split(int rollout) const {
    if (rollout < 1 || rollout >= config_.devices)
      dra::detail::throw_invalid("rollout", "must lie in [1, devices - 1] = [1, " +
                                                std::to_string(config_.devices - 1) + "], got " +
                                                std::to_string(rollout));
  }

  pending_switch make_switch(policy::stage_action direction, int moved) const {
    const auto& c = config_.costs;
    pending_switch s;
    s.direction = direction;
    s.moved = moved;
    auto& r = s.record;
    r.direction = policy::to_string(direction);
    r.moved = moved;
    r.agree_s = c.switch_agree_s;
    r.rebuild_s = c.switch_rebuild_s;
    if (direction == policy::stage_action::to_train) {
      r.weights_s = c.switch_weights_s;
      r.optimizer_s = c.switch_optimizer_s;
    } else {
      r.rollout_start_s = c.rollout_start_s;
    }
    r.total_s = r.agree_s + r.rebuild_s + r.weights_s + r.optimizer_s + r.rollout_start_s;
    return s;
  }

  // Phase p: in one-step-off, rollout of batch p (p < steps) and training on batch p - 1 (p >= 1);
  // synchronous: rollout of batch p, then training on it.
  phase_outcome run_phase(int p, int rollout, const pending_switch& sw, const decode_sink& sink) const {
    const auto& c = config_.costs;
    const auto& w = config_.workload;
    const bool one_off = config_.pipeline == policy::rl_pipeline::one_step_off;
    const int train = config_.devices - rollout;
    const int gen_batch = p < w.steps ? p : -1;
    const int train_batch = one_off ? p - 1 : p;
    phase_outcome o;
    auto& rec = o.record;
    rec.phase = p;
    rec.rollout = rollout;
    rec.train = train;
    rec.action = sw.direction == policy::stage_action::hold ? "hold" : policy::to_string(sw.direction);

    // Switch parts: what blocks the training stage, when the moved devices start generating.
    double train_block = 0.0, optimizer = 0.0;
    std::vector<double> starts;
    if (sw.direction == policy::stage_action::to_train) {
      train_block = c.switch_agree_s + c.switch_rebuild_s + c.switch_weights_s;
      optimizer = c.switch_optimizer_s;
    } else if (sw.direction == policy::stage_action::to_rollout) {
      train_block = c.switch_agree_s + c.switch_rebuild_s;
      starts.assign(static_cast<std::size_t>(rollout), 0.0);
      for (int i = 0; i < sw.moved && i < rollout; ++i)
        starts[static_cast<std::size_t>(rollout - 1 - i)] = c.rollout_start_s;
    }

    double busy = 0.0;
    if (gen_batch >= 0) {
      const auto& batch = batches_[static_cast<std::size_t>(gen_batch)];
      const rollout_outcome ro = simulate_rollout(batch, rollout, w.prompt_tokens, c, starts, sink);
      rec.rollout_s = ro.makespan_s;
      busy += ro.busy_device_s;
      rec.mean_length = detail::sum_of(batch) / static_cast<double>(batch.size());
      rec.longest = *std::max_element(batch.begin(), batch.end());
    }
    if (train_batch >= 0 && train_batch < w.steps) {
      const auto& batch = batches_[static_cast<std::size_t>(train_batch)];
      const double generated = detail::sum_of(batch);
      const double tokens = generated + w.prompt_tokens * static_cast<double>(batch.size());
      const double step = c.train_s(train, tokens);
      const double compute = step - c.sync_s(train);
      // Deferred optimizer restore: streams while the first step computes.
      const double exposed_optimizer = std::max(0.0, optimizer - compute);
      rec.train_s = train_block + step + exposed_optimizer;
      busy += train * step;
      rec.trained_sequences = static_cast<int>(batch.size());
      o.generated_tokens = generated;
      o.train_tokens = tokens;
      o.train_step_s = step;
      o.train_sync_s = c.sync_s(train);
      o.train_ranks = train;
    } else if (train_block > 0.0) {
      rec.train_s = train_block;
    }
    const double stages = one_off ? std::max(rec.rollout_s, rec.train_s) : rec.rollout_s + rec.train_s;
    const double sync = rec.trained_sequences > 0 ? c.weight_sync_s : 0.0;
    o.duration_s = stages + sync;
    rec.idle_device_s = config_.devices * o.duration_s - busy;
    return o;
  }

  void observe(policy::stage_balance_policy& pol, int p, int rollout, const phase_outcome& o) const {
    (void)rollout;
    const auto& w = config_.workload;
    if (p < w.steps)
      for (double l : batches_[static_cast<std::size_t>(p)]) pol.observe_generation(w.prompt_tokens, l);
    if (o.train_ranks > 0) {
      pol.observe_train(o.train_ranks, o.train_tokens / o.train_ranks, o.train_step_s, o.train_sync_s);
      pol.observe_weight_sync(config_.costs.weight_sync_s);
    }
  }

  rl_run_result start(const char* name) const {
    rl_run_result r;
    r.name = name;
    r.steps = config_.workload.steps;
    return r;
  }

  void add_phase(rl_run_result& r, phase_outcome& o) const {
    o.record.start_s = r.total_s;
    o.record.duration_s = o.duration_s;
    r.total_s += o.duration_s;
    r.generated_tokens_per_s += o.generated_tokens;  // a sum until finish()
    r.mean_rollout_devices += o.record.rollout * o.duration_s;
    r.bubble_fraction += o.record.idle_device_s;
    if (o.record.action != "hold") {
      ++r.switches;
      r.switch_total_s += o.record.switch_total_s;
      r.switch_exposed_s += o.record.switch_exposed_s;
    }
    r.phases.push_back(o.record);
  }

  rl_run_result finish(rl_run_result r) const {
    const double n = static_cast<double>(config_.workload.steps) * config_.workload.sequences_per_step();
    if (r.total_s > 0.0) {
      r.samples_per_s = n / r.total_s;
      r.generated_tokens_per_s /= r.total_s;
      r.mean_rollout_devices /= r.total_s;
      r.bubble_fraction = std::max(0.0, r.bubble_fraction / (config_.devices * r.total_s));  // no -0.0 from rounding
    }
    r.hidden_fraction = hidden_share(r);
    return r;
  }

  // For each switch: phases until the time saved against staying at the old split (same phases,
  // no switch) covers the exposed cost; inf when it never does before the next switch or the end.
  void realise_paybacks(rl_run_result& r) const {
    for (std::size_t i = 0; i < r.switch_log.size(); ++i) {
      auto& s = r.switch_log[i];
      const int first = s.phase;
      const int end = i + 1 < r.switch_log.size() ? r.switch_log[i + 1].phase : phases();
      const int old_rollout = s.direction == "to_rollout" ? r.phases[static_cast<std::size_t>(first)].rollout - s.moved
                                                          : r.phases[static_cast<std::size_t>(first)].rollout + s.moved;
      double saved = -s.exposed_s;
      for (int p = first; p < end; ++p) {
        const double before = saved;
        const phase_outcome stay = run_phase(p, old_rollout, {}, nullptr);
        const auto& rec = r.phases[static_cast<std::size_t>(p)];
        saved += stay.duration_s - (rec.duration_s - rec.switch_exposed_s);
        if (saved >= 0.0) {
          const double step_gain = saved - before;
          s.payback_steps = (p - first) + (step_gain > 0.0 ? (0.0 - before) / step_gain : 1.0);
          break;
        }
      }
    }
  }

  rl_sim_config config_;
  std::vector<std::vector<double>> batches_;
  std::string source_;
};

}  // namespace dra::sim
