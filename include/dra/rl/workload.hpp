#pragma once
// Inputs and results of the RL pipeline simulator (pipeline.hpp): the generation-length
// distribution, the ground-truth costs, the workload, the configuration and what a run reports.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/rl/stage_balance.hpp"
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
    if (d.values.empty())
      throw std::invalid_argument(path + ": no rows in column '" + column + "'; expected generation lengths");
    return d;
  }

  /// Every sequence the same length (the "no tail" control).
  static length_distribution constant(double tokens) {
    if (!(tokens >= 1.0) || !std::isfinite(tokens))
      dra::detail::throw_invalid("tokens", "a constant generation length must be a finite number >= 1");
    return {{tokens}, "constant"};
  }
};

/// Reasoning-length generations (docs/guide/rl.md, "Workloads"; calibration in
/// data/rl-lengths/README.md): each prompt draws a log-normal base length (a hard prompt, with
/// probability `tail_weight`, `tail_factor` times longer), its samples scatter around it
/// (log-normal, `group_sigma`): GRPO's samples of one prompt are correlated.
struct reasoning_lengths {
  double median_tokens = 2000.0;  ///< median base length of an ordinary prompt at the first step
  double prompt_sigma = 0.7;      ///< log-normal spread between prompts
  double group_sigma = 0.35;      ///< log-normal spread between the samples of one prompt
  double tail_weight = 0.1;       ///< fraction of hard prompts
  double tail_factor = 4.0;       ///< a hard prompt's base length, times an ordinary one's

  void validate() const {
    if (!(median_tokens >= 1.0) || !std::isfinite(median_tokens))
      dra::detail::throw_invalid("median_tokens",
                                 "must be a finite number >= 1 token, got " + std::to_string(median_tokens));
    for (auto [name, v] : {std::pair{"prompt_sigma", prompt_sigma}, std::pair{"group_sigma", group_sigma}})
      if (!(v >= 0.0 && v <= 4.0))
        dra::detail::throw_invalid(name, "must lie in [0, 4] (a log-normal spread), got " + std::to_string(v));
    if (!(tail_weight >= 0.0 && tail_weight <= 1.0))
      dra::detail::throw_invalid("tail_weight", "must lie in [0, 1], got " + std::to_string(tail_weight));
    if (!(tail_factor >= 1.0) || !std::isfinite(tail_factor))
      dra::detail::throw_invalid("tail_factor", "must be a finite number >= 1, got " + std::to_string(tail_factor));
  }
};

/// The simulator's ground truth for costs (seconds). Defaults: a 7B-parameter model on 8 GPUs of
/// the A100/H100 class, derived in docs/guide/rl.md (estimates, not measurements).
struct rl_cost_model {
  int max_concurrency = 128;
  /// KV-cache budget of one rollout device in tokens of context (0: unlimited). A device admits a
  /// sequence only while its context fits under (1 - kv_watermark) of it, and preempts its newest
  /// sequence when the growing contexts overflow it (recomputed later: prefill again).
  double kv_capacity_tokens = 0.0;
  double kv_watermark = 0.05;
  /// Admission reserves this fraction of each sequence's remaining generation limit (SGLang's
  /// new_token_ratio; 0: admit on the current context alone, as vLLM does, and preempt later).
  double kv_reserve_ratio = 0.0;
  /// Prefill of an admitted sequence's context (prompt, plus what it had generated if it was
  /// preempted), per 1000 tokens; the device decodes nothing meanwhile.
  double prefill_per_kilotoken_s = 0.0;
  /// A rollout device loading a new policy version (event simulator: each device on its own).
  double weight_load_s = 0.0;
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
    if (max_concurrency < 1)
      dra::detail::throw_invalid("max_concurrency", "must be >= 1, got " + std::to_string(max_concurrency));
    const std::pair<const char*, double> fields[] = {{"decode_fixed_s", decode_fixed_s},
                                                     {"decode_per_sequence_s", decode_per_sequence_s},
                                                     {"decode_per_kilotoken_s", decode_per_kilotoken_s},
                                                     {"train_fixed_s", train_fixed_s},
                                                     {"train_per_token_s", train_per_token_s},
                                                     {"sync_fixed_s", sync_fixed_s},
                                                     {"sync_per_rank_s", sync_per_rank_s},
                                                     {"weight_sync_s", weight_sync_s},
                                                     {"switch_agree_s", switch_agree_s},
                                                     {"switch_rebuild_s", switch_rebuild_s},
                                                     {"switch_weights_s", switch_weights_s},
                                                     {"switch_optimizer_s", switch_optimizer_s},
                                                     {"rollout_start_s", rollout_start_s},
                                                     {"colocated_switch_s", colocated_switch_s},
                                                     {"kv_capacity_tokens", kv_capacity_tokens},
                                                     {"prefill_per_kilotoken_s", prefill_per_kilotoken_s},
                                                     {"weight_load_s", weight_load_s}};
    for (const auto& [name, v] : fields)
      if (!(v >= 0.0) || !std::isfinite(v))
        dra::detail::throw_invalid(name, "must be a finite number >= 0 seconds, got " + std::to_string(v));
    if (!(kv_reserve_ratio >= 0.0 && kv_reserve_ratio <= 1.0))
      dra::detail::throw_invalid("kv_reserve_ratio", "must lie in [0, 1], got " + std::to_string(kv_reserve_ratio));
    if (!(kv_watermark >= 0.0 && kv_watermark < 1.0))
      dra::detail::throw_invalid("kv_watermark", "must lie in [0, 1), got " + std::to_string(kv_watermark));
    if (!(decode_fixed_s + decode_per_sequence_s > 0.0))
      dra::detail::throw_invalid("decode_fixed_s",
                                 "decode_fixed_s + decode_per_sequence_s must be > 0 (an iteration takes time)");
  }

  double train_s(int ranks, double tokens) const {
    return train_fixed_s + train_per_token_s * tokens / ranks + sync_s(ranks);
  }
  double sync_s(int ranks) const { return ranks < 2 ? 0.0 : sync_fixed_s + sync_per_rank_s * (ranks - 2); }
  double kv_capacity_or_inf() const {
    return kv_capacity_tokens > 0.0 ? kv_capacity_tokens : std::numeric_limits<double>::infinity();
  }
  /// A device must fit one sequence of `context` tokens (prompt + the longest generation).
  void check_fits(double context) const {
    if (context > kv_admit_limit())
      dra::detail::throw_invalid("kv_capacity_tokens",
                                 "a device must hold one whole sequence: the admission limit " +
                                     std::to_string(kv_admit_limit()) +
                                     " tokens is below prompt + max_generation_tokens = " + std::to_string(context) +
                                     "; raise kv_capacity_tokens or lower max_generation_tokens");
  }
  /// Context tokens a device admits up to (infinite when the KV cache is not modelled).
  double kv_admit_limit() const {
    return kv_capacity_tokens > 0.0 ? kv_capacity_tokens * (1.0 - kv_watermark)
                                    : std::numeric_limits<double>::infinity();
  }
};

/// Where generation lengths come from: a trace column (`length_distribution`) or the parametric
/// reasoning model.
enum class length_model { trace, reasoning };

struct rl_workload {
  int steps = 200;  ///< training steps
  int prompts_per_step = 64;
  int group_size = 8;  ///< samples per prompt (GRPO group)
  /// Optimizer steps per training step (PPO/GRPO mini-batches): the trainers' world may change at
  /// each one's boundary (event simulator; the phase model trains a step as one update).
  int updates_per_step = 1;
  double prompt_tokens = 256.0;
  /// Lengths drawn from the distribution are multiplied by this.
  double length_scale = 1.0;
  /// Length drift over training: step k's lengths are scaled by 1 + (drift - 1) k / (steps - 1).
  double drift_final_scale = 1.0;
  /// Generation limit (tokens): longer draws are cut here.
  double max_generation_tokens = 32768.0;
  std::uint64_t seed = 1;
  length_model lengths = length_model::trace;
  reasoning_lengths reasoning{};

  /// The most sequences one step may generate: every one is drawn and held for the step (1e8 ran
  /// a host out of memory; 1431655766 x 3 wrapped an int to 2, run without a word).
  static constexpr long long max_sequences_per_step = 1'000'000;

  int sequences_per_step() const { return prompts_per_step * group_size; }  // bounded by validate()

  void validate() const {
    if (steps < 1) dra::detail::throw_invalid("steps", "must be >= 1, got " + std::to_string(steps));
    if (prompts_per_step < 1)
      dra::detail::throw_invalid("prompts_per_step", "must be >= 1, got " + std::to_string(prompts_per_step));
    if (group_size < 1) dra::detail::throw_invalid("group_size", "must be >= 1, got " + std::to_string(group_size));
    const long long sequences = static_cast<long long>(prompts_per_step) * group_size;
    if (sequences > max_sequences_per_step)
      dra::detail::throw_invalid("prompts_per_step", "prompts_per_step x group_size = " + std::to_string(sequences) +
                                                         " sequences per step, above the bound " +
                                                         std::to_string(max_sequences_per_step) +
                                                         "; give fewer prompts or a smaller group");
    if (updates_per_step < 1 || updates_per_step > sequences)
      dra::detail::throw_invalid("updates_per_step",
                                 "must lie in [1, sequences per step = " + std::to_string(sequences) + "], got " +
                                     std::to_string(updates_per_step));
    if (!(prompt_tokens >= 0.0) || !std::isfinite(prompt_tokens))
      dra::detail::throw_invalid("prompt_tokens", "must be a finite number >= 0");
    if (!(length_scale > 0.0) || !std::isfinite(length_scale))
      dra::detail::throw_invalid("length_scale", "must be a finite number > 0");
    if (!(drift_final_scale > 0.0) || !std::isfinite(drift_final_scale))
      dra::detail::throw_invalid("drift_final_scale", "must be a finite number > 0 (1: no drift)");
    // The stage-balance policy observes lengths up to 1e7 tokens (signals::quantile_sketch): longer
    // ones would be generated but never seen, and the policy would hold its first split blind.
    if (!(max_generation_tokens >= 1.0 && max_generation_tokens <= 1e7))
      dra::detail::throw_invalid("max_generation_tokens",
                                 "must lie in [1, 1e7] tokens (the longest length the "
                                 "policy observes), got " +
                                     std::to_string(max_generation_tokens));
    if (lengths == length_model::reasoning) reasoning.validate();
  }
};

namespace detail {

/// Portable draws of the RL length model (std::normal_distribution differs between standard
/// libraries); mt19937_64-based, unlike the simulator's splitmix64 portable_rng (sim/workload.hpp).
struct length_rng {
  std::mt19937_64 engine;
  explicit length_rng(std::uint64_t seed) : engine(seed) {}
  double uniform() { return static_cast<double>(engine() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                             // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace detail

/// Generation lengths of every step's batch, drawn once so every schedule sees the same ones.
/// Batch k holds prompts_per_step groups of group_size samples, a group's samples adjacent.
inline std::vector<std::vector<double>> draw_batches(const length_distribution& dist, const rl_workload& w) {
  const bool reasoning = w.lengths == length_model::reasoning;
  if (!reasoning && dist.values.empty()) dra::detail::throw_invalid("lengths", "the length distribution is empty");
  std::mt19937_64 rng(w.seed);
  detail::length_rng draw(w.seed);
  const double cap = std::floor(w.max_generation_tokens);
  std::vector<std::vector<double>> batches(static_cast<std::size_t>(w.steps));
  for (int k = 0; k < w.steps; ++k) {
    const double drift = w.steps > 1 ? 1.0 + (w.drift_final_scale - 1.0) * k / (w.steps - 1.0) : 1.0;
    auto& b = batches[static_cast<std::size_t>(k)];
    b.resize(static_cast<std::size_t>(w.sequences_per_step()));
    if (!reasoning) {
      for (auto& l : b) {
        const double base = dist.values[static_cast<std::size_t>(rng() % dist.values.size())];
        l = std::clamp(std::round(base * w.length_scale * drift), 1.0, cap);
      }
      continue;
    }
    const auto& r = w.reasoning;
    for (int i = 0; i < w.prompts_per_step; ++i) {
      const bool hard = draw.uniform() < r.tail_weight;
      const double base = r.median_tokens * w.length_scale * drift * std::exp(r.prompt_sigma * draw.normal()) *
                          (hard ? r.tail_factor : 1.0);
      for (int j = 0; j < w.group_size; ++j)
        b[static_cast<std::size_t>(i * w.group_size + j)] =
            std::clamp(std::round(base * std::exp(r.group_sigma * draw.normal())), 1.0, cap);
    }
  }
  return batches;
}

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
    if (devices < 2)
      dra::detail::throw_invalid("devices", "must be >= 2 (one per role), got " + std::to_string(devices));
    if (initial_rollout < 0 || initial_rollout >= devices)
      dra::detail::throw_invalid("initial_rollout",
                                 "must lie in [1, devices - 1] (0: half), got " + std::to_string(initial_rollout));
    workload.validate();
    costs.validate();
    costs.check_fits(workload.prompt_tokens + workload.max_generation_tokens);
    stage_policy().validate();
  }
  policy::stage_balance_config stage_policy() const {
    auto p = policy;
    p.devices = devices;
    p.pipeline = pipeline;
    p.generation.max_concurrency = costs.max_concurrency;
    p.generation.kv_capacity_tokens = costs.kv_capacity_tokens > 0.0 ? costs.kv_admit_limit() : 0.0;
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
  std::string action = "hold";              ///< hold / to_rollout / to_train (the switch at this phase's start)
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

/// The roles at one instant of a run (for the roles-over-time plot).
struct rl_role_sample {
  double t = 0.0;
  int rollout = 0, train = 0, moving = 0;  ///< moving: leaving the trainers (engine starting)
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
  // Event simulator: the ledger (every sequence generated once and trained once) and the roles.
  int generated_sequences = 0, trained_sequences = 0;
  bool exactly_once = false;
  /// Colocated runs: the share of the rollout time its last 10 % of sequences took, and of the
  /// step time the rollout took (the published figures the workload is checked against).
  double tail_share = 0.0, rollout_share = 0.0;
  std::vector<rl_role_sample> roles;
};

/// The share of the run's switch time hidden behind the other stage: each switch's hidden part
/// (its cost minus what it delayed, at least 0 and at most its cost) over the switches' cost; 0
/// without switches. A switch that delayed its phase by more than its own cost (a knock-on delay)
/// counts as wholly exposed here; switch_exposed_s keeps the whole delay.
inline double hidden_share(const rl_run_result& r) {
  double total = 0.0, hidden = 0.0;
  for (const auto& w : r.switch_log) {
    total += w.total_s;
    hidden += std::clamp(w.total_s - w.exposed_s, 0.0, std::max(0.0, w.total_s));
  }
  return total > 0.0 ? hidden / total : 0.0;
}

struct rl_sweep_result {
  std::vector<rl_run_result> statics;  ///< rollout = 1 .. devices - 1
  std::size_t best_static = 0;         ///< index of the static split with the least total time
  rl_run_result dynamic, oracle, colocated;
  std::string length_source;
};

}  // namespace dra::sim
