#pragma once
// RL post-training pipeline simulator (DESIGN.md §3.6): a fixed set of devices split between
// rollout (generation) and training, run step by step on generation lengths drawn from a real
// distribution, under every static split, the stage-balance policy the live system runs
// (dra::policy::stage_balance_policy, unchanged), an oracle bound and a colocated baseline.
//
// What is simulated (docs/rl.md has the full list of assumptions and their sources):
// - Rollout: each device decodes with continuous batching, at most `max_concurrency` sequences
//   at once, one token per active sequence per iteration; an iteration costs
//   decode_fixed_s + decode_per_sequence_s * c + decode_per_kilotoken_s * S / 1000 (c active
//   sequences holding S tokens of context). A router spreads the batch over the rollout devices
//   (round robin up to the slots: least-loaded dispatch); what does not fit waits in one shared
//   queue and is pulled, in order, as slots free. Exact event simulation: between two
//   completions on a device the iteration cost is an arithmetic series, summed in closed form.
// - Training: train_fixed_s + train_per_token_s * tokens / T, plus sync_fixed_s +
//   sync_per_rank_s (T - 2) for T >= 2 ranks (the Pollux form the policy's model fits).
// - Pipelines: one-step-off (rollout of batch k+1 overlaps training on batch k; the trainer's new
//   weights reach the rollout workers before the next phase, so staleness is exactly one step) or
//   synchronous (rollout, then training). Both end each phase with the weight sync.
// - Switches at phase boundaries. A device joining the trainers: agree + rebuild + weights block
//   the training stage; its optimizer state streams during the first step's forward/backward
//   (deferred restore) and is exposed only where it outlasts that compute. A device leaving the
//   trainers: agree + rebuild block the training stage; it starts as a rollout worker after
//   rollout_start_s (engine, KV cache), already holding the current weights. What a switch adds
//   to the phase (vs the same phase at the new split without switch costs) is its exposed cost;
//   the rest was hidden behind the other stage's work.
// - Every schedule sees the same generation lengths (common random numbers).
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
#include "dra/policy/stage_balance.hpp"
#include "dra/sim/csv.hpp"

namespace dra::sim {

/// An empirical distribution of generation lengths (tokens), e.g. a trace column.
struct length_distribution {
  std::vector<double> values;
  std::string source;

  /// Reads one numeric column of a CSV file (default: the Azure trace's GeneratedTokens).
  static length_distribution from_csv(const std::string& path, const std::string& column = "GeneratedTokens") {
    const csv_table t = csv_table::read(path);
    const std::size_t col = t.column(column);
    length_distribution d;
    d.source = path + ":" + column;
    d.values.reserve(t.rows());
    for (std::size_t r = 0; r < t.rows(); ++r) {
      const double v = t.number(r, col);
      if (!(v >= 1.0)) t.fail(r, col, "a generation length must be >= 1 token");
      d.values.push_back(v);
    }
    if (d.values.empty()) throw std::invalid_argument(path + ": no rows in column '" + column + "'; expected generation lengths");
    return d;
  }

  /// Every sequence the same length (the "no tail" control).
  static length_distribution constant(double tokens) {
    if (!(tokens >= 1.0) || !std::isfinite(tokens))
      dra::detail::throw_invalid("tokens", "a constant generation length must be a finite number >= 1");
    return {{tokens}, "constant"};
  }
};

/// The simulator's ground truth for costs (seconds). Defaults: a 7B-parameter model on 8 GPUs of
/// the A100/H100 class, derived in docs/rl.md (estimates, not measurements).
struct rl_cost_model {
  int max_concurrency = 128;
  double decode_fixed_s = 0.010;
  double decode_per_sequence_s = 1e-4;
  double decode_per_kilotoken_s = 2.5e-4;
  double train_fixed_s = 0.5;
  double train_per_token_s = 5e-4;
  double sync_fixed_s = 0.5;
  double sync_per_rank_s = 0.0;
  double weight_sync_s = 0.5;
  double switch_agree_s = 0.05;
  double switch_rebuild_s = 0.5;
  double switch_weights_s = 1.4;
  double switch_optimizer_s = 8.4;
  double rollout_start_s = 5.0;
  /// Colocated time sharing: per step, releasing the generation engine's memory and taking it
  /// back, on top of the weight sync (refit).
  double colocated_switch_s = 0.0;

  void validate() const {
    if (max_concurrency < 1) dra::detail::throw_invalid("max_concurrency", "must be >= 1, got " + std::to_string(max_concurrency));
    const std::pair<const char*, double> fields[] = {
        {"decode_fixed_s", decode_fixed_s}, {"decode_per_sequence_s", decode_per_sequence_s},
        {"decode_per_kilotoken_s", decode_per_kilotoken_s}, {"train_fixed_s", train_fixed_s},
        {"train_per_token_s", train_per_token_s}, {"sync_fixed_s", sync_fixed_s}, {"sync_per_rank_s", sync_per_rank_s},
        {"weight_sync_s", weight_sync_s}, {"switch_agree_s", switch_agree_s}, {"switch_rebuild_s", switch_rebuild_s},
        {"switch_weights_s", switch_weights_s}, {"switch_optimizer_s", switch_optimizer_s},
        {"rollout_start_s", rollout_start_s}, {"colocated_switch_s", colocated_switch_s}};
    for (const auto& [name, v] : fields)
      if (!(v >= 0.0) || !std::isfinite(v)) dra::detail::throw_invalid(name, "must be a finite number >= 0 seconds, got " + std::to_string(v));
    if (!(decode_fixed_s + decode_per_sequence_s > 0.0))
      dra::detail::throw_invalid("decode_fixed_s", "decode_fixed_s + decode_per_sequence_s must be > 0 (an iteration takes time)");
  }

  double train_s(int ranks, double tokens) const {
    return train_fixed_s + train_per_token_s * tokens / ranks + sync_s(ranks);
  }
  double sync_s(int ranks) const { return ranks < 2 ? 0.0 : sync_fixed_s + sync_per_rank_s * (ranks - 2); }
};

struct rl_workload {
  int steps = 200;  ///< training steps
  int prompts_per_step = 64;
  int group_size = 8;  ///< samples per prompt (GRPO group)
  double prompt_tokens = 256.0;
  /// Lengths drawn from the distribution are multiplied by this.
  double length_scale = 1.0;
  /// Length drift over training: step k's lengths are scaled by 1 + (drift - 1) k / (steps - 1).
  double drift_final_scale = 1.0;
  /// Generation limit (tokens): longer draws are cut here.
  double max_generation_tokens = 32768.0;
  std::uint64_t seed = 1;

  int sequences_per_step() const { return prompts_per_step * group_size; }

  void validate() const {
    if (steps < 1) dra::detail::throw_invalid("steps", "must be >= 1, got " + std::to_string(steps));
    if (prompts_per_step < 1) dra::detail::throw_invalid("prompts_per_step", "must be >= 1, got " + std::to_string(prompts_per_step));
    if (group_size < 1) dra::detail::throw_invalid("group_size", "must be >= 1, got " + std::to_string(group_size));
    if (!(prompt_tokens >= 0.0) || !std::isfinite(prompt_tokens)) dra::detail::throw_invalid("prompt_tokens", "must be a finite number >= 0");
    if (!(length_scale > 0.0) || !std::isfinite(length_scale)) dra::detail::throw_invalid("length_scale", "must be a finite number > 0");
    if (!(drift_final_scale > 0.0) || !std::isfinite(drift_final_scale))
      dra::detail::throw_invalid("drift_final_scale", "must be a finite number > 0 (1: no drift)");
    if (!(max_generation_tokens >= 1.0)) dra::detail::throw_invalid("max_generation_tokens", "must be >= 1");
  }
};

struct rl_sim_config {
  int devices = 8;
  policy::rl_pipeline pipeline = policy::rl_pipeline::one_step_off;
  rl_workload workload{};
  rl_cost_model costs{};
  /// Rollout devices the dynamic run starts with (0: half of the devices).
  int initial_rollout = 0;
  /// The dynamic run's policy (its `devices` and `pipeline` are set from this config).
  policy::stage_balance_config policy{};

  void validate() const {
    if (devices < 2) dra::detail::throw_invalid("devices", "must be >= 2 (one per role), got " + std::to_string(devices));
    if (initial_rollout < 0 || initial_rollout >= devices)
      dra::detail::throw_invalid("initial_rollout", "must lie in [1, devices - 1] (0: half), got " + std::to_string(initial_rollout));
    workload.validate();
    costs.validate();
    stage_policy().validate();
  }
  policy::stage_balance_config stage_policy() const {
    auto p = policy;
    p.devices = devices;
    p.pipeline = pipeline;
    p.generation.max_concurrency = costs.max_concurrency;
    return p;
  }
  int start_rollout() const { return initial_rollout > 0 ? initial_rollout : std::max(1, devices / 2); }
};

/// One phase of a run: rollout of one batch and/or training on the previous one.
struct rl_phase_record {
  int phase = 0;
  int rollout = 0, train = 0;
  double start_s = 0.0, duration_s = 0.0;
  double rollout_s = 0.0, train_s = 0.0;  ///< stage times (including switch parts that blocked them)
  double idle_device_s = 0.0;
  double switch_total_s = 0.0, switch_exposed_s = 0.0;
  std::string action = "hold";  ///< hold / to_rollout / to_train (the switch at this phase's start)
  double mean_length = 0.0, longest = 0.0;  ///< of the batch generated in this phase (0: none)
  /// Dynamic runs: the policy's prediction of this phase's duration (at the split it chose),
  /// made at the end of the previous phase; 0 where none was made.
  double predicted_s = 0.0;
  int trained_sequences = 0;
};

struct rl_switch_record {
  int phase = 0;
  std::string direction;
  int moved = 0;
  double agree_s = 0.0, rebuild_s = 0.0, weights_s = 0.0, optimizer_s = 0.0, rollout_start_s = 0.0;
  double total_s = 0.0, exposed_s = 0.0, hidden_s = 0.0;
  double payback_steps = std::numeric_limits<double>::infinity();  ///< realised; inf: never paid back
  double predicted_payback_steps = 0.0;
  std::string reason;
};

struct rl_run_result {
  std::string name;  ///< "static" / "dynamic" / "oracle" / "colocated"
  int rollout = 0;   ///< static runs: the split's rollout devices
  int steps = 0;
  double total_s = 0.0;
  double samples_per_s = 0.0, generated_tokens_per_s = 0.0;
  double bubble_fraction = 0.0;
  double mean_rollout_devices = 0.0;  ///< time-weighted
  int switches = 0;
  double switch_total_s = 0.0, switch_exposed_s = 0.0, hidden_fraction = 0.0;
  std::vector<rl_phase_record> phases;
  std::vector<rl_switch_record> switch_log;
};

struct rl_sweep_result {
  std::vector<rl_run_result> statics;  ///< rollout = 1 .. devices - 1
  std::size_t best_static = 0;         ///< index of the static split with the least total time
  rl_run_result dynamic, oracle, colocated;
  std::string length_source;
};

/// Observer of decode segments (concurrency, mean context tokens, iterations, seconds).
using decode_sink = std::function<void(int, double, double, double)>;

struct rollout_outcome {
  double makespan_s = 0.0;
  double busy_device_s = 0.0;  ///< sum over devices of decode time
};

/// Exact continuous-batching simulation of one batch on `devices` rollout devices sharing one
/// queue. `start_s[d]`: when device d can start (empty: all at 0).
inline rollout_outcome simulate_rollout(const std::vector<double>& lengths, int devices, double prompt_tokens,
                                        const rl_cost_model& c, const std::vector<double>& start_s = {},
                                        const decode_sink& sink = nullptr) {
  if (devices < 1) dra::detail::throw_invalid("devices", "a rollout needs >= 1 device, got " + std::to_string(devices));
  struct seq {
    double finish;  // device iteration count at which it completes
    double start;   // device iteration count at which it was admitted
    bool operator>(const seq& o) const { return finish > o.finish; }
  };
  struct device {
    double t = 0.0, begin = 0.0, iteration = 0.0, start_sum = 0.0;
    std::vector<seq> active;  // min-heap on finish
    bool started = false, done = false;
  };
  std::vector<device> dev(static_cast<std::size_t>(devices));
  for (std::size_t d = 0; d < dev.size(); ++d) dev[d].t = dev[d].begin = d < start_s.size() ? start_s[d] : 0.0;
  std::size_t next = 0;
  const auto slots = static_cast<std::size_t>(c.max_concurrency);
  const auto admit = [&](device& d) {
    while (d.active.size() < slots && next < lengths.size()) {
      d.active.push_back({d.iteration + std::max(1.0, std::round(lengths[next++])), d.iteration});
      std::push_heap(d.active.begin(), d.active.end(), std::greater<>());
      d.start_sum += d.iteration;
    }
  };
  // Time at which the device's next completion happens (inf when idle for good).
  const auto next_event = [&](const device& d) {
    if (!d.started) return d.t;
    if (d.active.empty()) return std::numeric_limits<double>::infinity();
    const double m = d.active.front().finish - d.iteration;
    const double cc = static_cast<double>(d.active.size());
    const double s0 = cc * prompt_tokens + cc * d.iteration - d.start_sum;
    return d.t + m * (c.decode_fixed_s + c.decode_per_sequence_s * cc + c.decode_per_kilotoken_s * s0 / 1000.0) +
           c.decode_per_kilotoken_s * cc * m * (m - 1.0) / 2.0 / 1000.0;
  };
  // A router spreads the batch over the devices that are up at the start (round robin, at most
  // `slots` each: least-loaded dispatch); what does not fit waits in the shared queue and is
  // pulled as slots free. A device that starts later pulls from that queue when it comes up.
  std::vector<std::size_t> up;
  for (std::size_t d = 0; d < dev.size(); ++d)
    if (dev[d].t <= 0.0) up.push_back(d), dev[d].started = true;
  for (bool any = true; any && next < lengths.size();) {
    any = false;
    for (std::size_t d : up) {
      device& dv = dev[d];
      if (dv.active.size() >= slots || next >= lengths.size()) continue;
      dv.active.push_back({std::max(1.0, std::round(lengths[next++])), 0.0});
      std::push_heap(dv.active.begin(), dv.active.end(), std::greater<>());
      any = true;
    }
  }
  rollout_outcome out;
  for (;;) {
    std::size_t pick = dev.size();
    double when = std::numeric_limits<double>::infinity();
    for (std::size_t d = 0; d < dev.size(); ++d) {
      const double e = next_event(dev[d]);
      if (e < when) when = e, pick = d;
    }
    if (pick == dev.size()) break;
    device& d = dev[pick];
    if (!d.started) {
      d.started = true;
      admit(d);
      continue;
    }
    const double m = d.active.front().finish - d.iteration;
    const int cc = static_cast<int>(d.active.size());
    const double s0 = cc * prompt_tokens + cc * d.iteration - d.start_sum;
    if (sink) sink(cc, s0 + cc * (m - 1.0) / 2.0, m, when - d.t);
    d.t = when;
    d.iteration += m;
    while (!d.active.empty() && d.active.front().finish <= d.iteration) {
      std::pop_heap(d.active.begin(), d.active.end(), std::greater<>());
      d.start_sum -= d.active.back().start;
      d.active.pop_back();
    }
    admit(d);
  }
  for (const auto& d : dev) {
    const double busy = d.started ? d.t - d.begin : 0.0;
    out.busy_device_s += busy;
    out.makespan_s = std::max(out.makespan_s, d.started && d.t > d.begin ? d.t : 0.0);
  }
  return out;
}

namespace detail {

/// Generation lengths of every batch, drawn once so every schedule sees the same ones.
inline std::vector<std::vector<double>> draw_batches(const length_distribution& dist, const rl_workload& w) {
  if (dist.values.empty()) dra::detail::throw_invalid("lengths", "the length distribution is empty");
  std::mt19937_64 rng(w.seed);
  std::vector<std::vector<double>> batches(static_cast<std::size_t>(w.steps));
  for (int k = 0; k < w.steps; ++k) {
    const double drift = w.steps > 1 ? 1.0 + (w.drift_final_scale - 1.0) * k / (w.steps - 1.0) : 1.0;
    auto& b = batches[static_cast<std::size_t>(k)];
    b.resize(static_cast<std::size_t>(w.sequences_per_step()));
    for (auto& l : b) {
      const double base = dist.values[static_cast<std::size_t>(rng() % dist.values.size())];
      l = std::clamp(std::round(base * w.length_scale * drift), 1.0, std::floor(w.max_generation_tokens));
    }
  }
  return batches;
}

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
      : config_((config.validate(), std::move(config))), batches_(detail::draw_batches(lengths, config_.workload)),
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
      dra::detail::throw_invalid("rollout", "must lie in [1, devices - 1] = [1, " + std::to_string(config_.devices - 1) +
                                                "], got " + std::to_string(rollout));
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
      for (int i = 0; i < sw.moved && i < rollout; ++i) starts[static_cast<std::size_t>(rollout - 1 - i)] = c.rollout_start_s;
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
      r.bubble_fraction /= config_.devices * r.total_s;
    }
    r.hidden_fraction = r.switch_total_s > 0.0 ? 1.0 - r.switch_exposed_s / r.switch_total_s : 0.0;
    return r;
  }

  // For each switch: phases until the time saved against staying at the old split (same phases,
  // no switch) covers the exposed cost; inf when it never does before the next switch or the end.
  void realise_paybacks(rl_run_result& r) const {
    for (std::size_t i = 0; i < r.switch_log.size(); ++i) {
      auto& s = r.switch_log[i];
      const int first = s.phase;
      const int end = i + 1 < r.switch_log.size() ? r.switch_log[i + 1].phase : phases();
      const int old_rollout =
          s.direction == "to_rollout" ? r.phases[static_cast<std::size_t>(first)].rollout - s.moved
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
