#pragma once
// What the stage-balance policy (stage_balance.hpp) is configured with, what it is told at a
// decision point and what it answers: phase-boundary decisions (stage_state, stage_decision) and
// in-step ones at a boundary of the trainers' world (window_state, window_decision).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/rl/generation_model.hpp"
#include "dra/signals/quantile_sketch.hpp"

namespace dra::policy {

enum class rl_pipeline { one_step_off, synchronous };

inline const char* to_string(rl_pipeline p) noexcept {
  return p == rl_pipeline::one_step_off ? "one_step_off" : "synchronous";
}

struct stage_balance_config {
  int devices = 8;
  int min_rollout = 1;
  int min_train = 1;
  rl_pipeline pipeline = rl_pipeline::one_step_off;
  /// Steps after a switch during which no switch happens.
  std::int64_t cooldown_steps = 10;
  /// The same direction must be wanted this many consecutive decisions.
  int hysteresis_decisions = 3;
  /// Most devices moved by one switch.
  int max_move = 1 << 20;
  /// Ignore predicted improvements of the step time below this fraction (model noise).
  double min_relative_gain = 0.03;
  /// A switch must pay its exposed cost back within this many steps (and within the steps left).
  double max_payback_steps = 11.0;
  /// Exposed switch cost assumed until one of that direction has been measured (seconds).
  double prior_switch_cost_s = 1.0;
  /// Weight of a new measurement in the smoothed switch cost (1: the last one only).
  double switch_cost_smoothing = 0.5;
  /// Weight of a new measurement in the smoothed weight-sync time.
  double weight_sync_smoothing = 0.2;
  /// Weight of a new batch's measured time in the scale applied to the fresh-batch model.
  double batch_smoothing = 0.3;
  /// Generation lengths: half-life in sequences (the recent distribution follows a drift).
  signals::quantile_sketch_config lengths{0.01, 1.0, 1e7, 4096.0};
  /// One-step-off objective: E[max(rollout, train)] over the batches' spread (true), or the max of
  /// the two means (false: blind to the cost of balancing two variable stages).
  bool expected_max = true;
  /// Samples per prompt (GRPO's group): their lengths move together (the prompt sets the answer),
  /// so a step's n sequences vary like n / group_size independent draws. 1: independent.
  int group_size = 1;
  generation_model_config generation{};
  throughput_model_config training{};
  /// How the dynamic run decides in each boundary window, live and in the event simulator:
  /// "window" (decide_window: an analytic model of the critical path) or "lookahead" (every
  /// trainer count within lookahead_max_move tried on the pipeline's own event model, from the
  /// leader's snapshot, with the costs fitted here and lookahead_draws draws of every length not
  /// generated yet, by GRPO group: rl_event_sim::plan; docs/design/rl.md, "The look-ahead planner").
  std::string planner = "window";
  int lookahead_draws = 12;
  int lookahead_max_move = 2;
  /// planner="lookahead": a move's value after the horizon, in steps. A join counts this many more
  /// steps at its split's last simulated step time (or at the current split's after lending the
  /// device back, whichever is less): a handover that pays back only over several steps is then
  /// worth making. A lend is for a tail: after the horizon the split is taken as back where it
  /// was. 0: the horizon alone.
  int lookahead_terminal_steps = 3;

  void validate() const {
    if (devices < 2)
      dra::detail::throw_invalid("devices", "must be >= 2 (one per role), got " + std::to_string(devices));
    if (min_rollout < 1) dra::detail::throw_invalid("min_rollout", "must be >= 1, got " + std::to_string(min_rollout));
    if (min_train < 1) dra::detail::throw_invalid("min_train", "must be >= 1, got " + std::to_string(min_train));
    if (min_rollout + min_train > devices)
      dra::detail::throw_invalid("min_rollout", "min_rollout + min_train (" + std::to_string(min_rollout + min_train) +
                                                    ") exceeds devices (" + std::to_string(devices) +
                                                    "); lower one of them");
    if (cooldown_steps < 0)
      dra::detail::throw_invalid("cooldown_steps", "must be >= 0, got " + std::to_string(cooldown_steps));
    if (hysteresis_decisions < 1)
      dra::detail::throw_invalid("hysteresis_decisions", "must be >= 1, got " + std::to_string(hysteresis_decisions));
    if (max_move < 1) dra::detail::throw_invalid("max_move", "must be >= 1, got " + std::to_string(max_move));
    if (planner != "window" && planner != "lookahead")
      dra::detail::throw_invalid("planner", "must be 'window' or 'lookahead', got '" + planner + "'");
    if (lookahead_draws < 1 || lookahead_draws > 64)
      dra::detail::throw_invalid("lookahead_draws",
                                 "must lie in [1, 64] draws per decision, got " + std::to_string(lookahead_draws));
    if (lookahead_terminal_steps < 0)
      dra::detail::throw_invalid("lookahead_terminal_steps",
                                 "must be >= 0 steps, got " + std::to_string(lookahead_terminal_steps));
    if (lookahead_max_move < 1)
      dra::detail::throw_invalid("lookahead_max_move",
                                 "must be >= 1 device, got " + std::to_string(lookahead_max_move));
    if (group_size < 1)
      dra::detail::throw_invalid("group_size", "must be >= 1 (samples per prompt), got " + std::to_string(group_size));
    if (!(min_relative_gain >= 0.0 && min_relative_gain < 1.0))
      dra::detail::throw_invalid("min_relative_gain", "must lie in [0, 1), got " + std::to_string(min_relative_gain));
    if (!(max_payback_steps > 0.0))
      dra::detail::throw_invalid("max_payback_steps", "must be > 0, got " + std::to_string(max_payback_steps));
    if (!(prior_switch_cost_s >= 0.0) || !std::isfinite(prior_switch_cost_s))
      dra::detail::throw_invalid("prior_switch_cost_s", "must be a finite number >= 0 seconds");
    if (!(switch_cost_smoothing > 0.0 && switch_cost_smoothing <= 1.0))
      dra::detail::throw_invalid("switch_cost_smoothing", "must lie in (0, 1]");
    if (!(weight_sync_smoothing > 0.0 && weight_sync_smoothing <= 1.0))
      dra::detail::throw_invalid("weight_sync_smoothing", "must lie in (0, 1]");
    if (!(batch_smoothing > 0.0 && batch_smoothing <= 1.0))
      dra::detail::throw_invalid("batch_smoothing", "must lie in (0, 1], got " + std::to_string(batch_smoothing));
    lengths.validate();
    generation.validate();
    training.validate();
  }
};

/// Where the pipeline stands at a decision point (a step boundary).
struct stage_state {
  int rollout = 1;  ///< devices generating now
  int train = 1;    ///< devices training now
  std::int64_t step = 0;
  std::int64_t steps_since_switch = std::numeric_limits<std::int64_t>::max() / 2;
  std::int64_t remaining_steps = -1;  ///< -1: unknown
  int sequences_per_step = 1;         ///< sequences generated and trained on per step (prompts x group)
};

struct stage_prediction {
  int rollout = 0, train = 0;
  double rollout_s = 0.0, train_s = 0.0, weight_sync_s = 0.0, step_s = 0.0;
  double rollout_sd_s = 0.0, train_sd_s = 0.0;  ///< batch-to-batch spread of each stage
};

enum class stage_action { hold, to_rollout, to_train };

inline const char* to_string(stage_action a) noexcept {
  switch (a) {
    case stage_action::hold:
      return "hold";
    case stage_action::to_rollout:
      return "to_rollout";
    case stage_action::to_train:
      return "to_train";
  }
  return "unknown";
}

struct stage_decision {
  stage_action kind = stage_action::hold;
  int rollout = 1, train = 1;  ///< the split after the decision
  int moved = 0;               ///< devices that change role
  stage_prediction current, target;
  double switch_cost_s = 0.0;  ///< exposed cost assumed for this direction
  double payback_steps = std::numeric_limits<double>::infinity();
  std::string reason;
};

/// A boundary of the trainers' world in a pipeline without a per-phase barrier: before a training
/// step (its window: the trainers published the previous step's weights and wait for the step's
/// batch) or between two of its updates (PPO/GRPO mini-batches). The world may change once there.
/// What the leader knows: each role's size, the rollout devices with nothing to generate, the
/// updates left, and the progress of the step's batch and of the next one (sequences not started,
/// tokens generated so far by each one in flight).
struct window_state {
  int rollout = 1, train = 1;
  int idle_rollout = 0;               ///< rollout devices with nothing to generate now
  std::int64_t step = 0;              ///< the training step about to run or running
  std::int64_t remaining_steps = -1;  ///< steps left, this one included (-1: unknown)
  int sequences_per_step = 1;
  int updates_per_step = 1;
  int updates_left = 1;                ///< updates of this step not started (all of them in the window)
  bool wait_complete = true;           ///< the step's batch is generated (always, once it trains)
  int wait_queued = 0;                 ///< sequences of the step's batch not started yet
  std::vector<double> wait_in_flight;  ///< tokens generated so far by its sequences in flight
  bool next_exists = true;             ///< the next step's batch exists (false at the last step)
  int next_queued = 0;
  std::vector<double> next_in_flight;
};

/// What to do at a boundary: lend trainers to rollout, take idle rollout devices into training,
/// or hold. `predicted_*`: when the next step can start (the later of this step's end and the
/// next batch's last sequence) at the current split and at the chosen one.
struct window_decision {
  stage_action kind = stage_action::hold;
  int moved = 0;
  int train = 1;        ///< trainers after the decision
  double wait_s = 0.0;  ///< predicted wait for the step's batch
  double predicted_current_s = 0.0, predicted_target_s = 0.0;
  double switch_cost_s = 0.0;
  double payback_steps = std::numeric_limits<double>::infinity();
  std::string reason;
};

/// A measurement smoothed over its observations (stage_balance_policy's switch costs).
struct smoothed_value {
  double value = 0.0;
  unsigned long long count = 0;
};

}  // namespace dra::policy
