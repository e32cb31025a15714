#pragma once
// Inputs and results of the RL pipeline simulator (pipeline.hpp): the generation-length
// distribution, the ground-truth costs, the workload, the configuration and what a run reports.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

/// The simulator's ground truth for costs (seconds). Defaults: a 7B-parameter model on 8 GPUs of
/// the A100/H100 class, derived in docs/guide/rl.md (estimates, not measurements).
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
                                                     {"colocated_switch_s", colocated_switch_s}};
    for (const auto& [name, v] : fields)
      if (!(v >= 0.0) || !std::isfinite(v))
        dra::detail::throw_invalid(name, "must be a finite number >= 0 seconds, got " + std::to_string(v));
    if (!(decode_fixed_s + decode_per_sequence_s > 0.0))
      dra::detail::throw_invalid("decode_fixed_s",
                                 "decode_fixed_s + decode_per_sequence_s must be > 0 (an iteration takes time)");
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
    if (prompts_per_step < 1)
      dra::detail::throw_invalid("prompts_per_step", "must be >= 1, got " + std::to_string(prompts_per_step));
    if (group_size < 1) dra::detail::throw_invalid("group_size", "must be >= 1, got " + std::to_string(group_size));
    if (!(prompt_tokens >= 0.0) || !std::isfinite(prompt_tokens))
      dra::detail::throw_invalid("prompt_tokens", "must be a finite number >= 0");
    if (!(length_scale > 0.0) || !std::isfinite(length_scale))
      dra::detail::throw_invalid("length_scale", "must be a finite number > 0");
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
    if (devices < 2)
      dra::detail::throw_invalid("devices", "must be >= 2 (one per role), got " + std::to_string(devices));
    if (initial_rollout < 0 || initial_rollout >= devices)
      dra::detail::throw_invalid("initial_rollout",
                                 "must lie in [1, devices - 1] (0: half), got " + std::to_string(initial_rollout));
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

}  // namespace dra::sim
