#pragma once
// Stage balance for RL post-training: how many of a fixed set of devices generate (rollout) and how
// many train, and when moving devices between the roles pays. It predicts every split's step time
// from a fitted decode model, the tail of a streaming length sketch and the throughput model, and
// switches only past cooldown, hysteresis and a minimum gain, when the measured switch cost pays
// back. Deterministic, so the live leader and the simulator decide alike. The model, term by term:
// docs/design/rl.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/online_ridge.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/signals/quantile_sketch.hpp"

namespace dra::policy {

enum class rl_pipeline { one_step_off, synchronous };

inline const char* to_string(rl_pipeline p) noexcept {
  return p == rl_pipeline::one_step_off ? "one_step_off" : "synchronous";
}

struct generation_model_config {
  /// Most sequences one rollout device decodes at once (KV-cache slots).
  int max_concurrency = 128;
  // Priors of t_iter = a + b c + k S (S in kilotokens of context) and their weight.
  double prior_iteration_fixed_s = 0.01;
  double prior_iteration_per_sequence_s = 1e-4;
  double prior_iteration_per_kilotoken_s = 0.0;
  double prior_weight = 1.0;
  double forgetting = 0.999;

  void validate() const {
    if (max_concurrency < 1)
      dra::detail::throw_invalid("max_concurrency", "must be >= 1 sequence, got " + std::to_string(max_concurrency));
    for (auto [name, v] : {std::pair{"prior_iteration_fixed_s", prior_iteration_fixed_s},
                           std::pair{"prior_iteration_per_sequence_s", prior_iteration_per_sequence_s},
                           std::pair{"prior_iteration_per_kilotoken_s", prior_iteration_per_kilotoken_s}}) {
      if (!(v >= 0.0) || !std::isfinite(v))
        dra::detail::throw_invalid(name, "must be a finite number >= 0, got " + std::to_string(v));
    }
    if (!(prior_weight > 0.0)) dra::detail::throw_invalid("prior_weight", "must be > 0");
    if (!(forgetting > 0.0 && forgetting <= 1.0)) dra::detail::throw_invalid("forgetting", "must lie in (0, 1]");
  }
};

/// Decode cost of one rollout device, fitted online from measured iterations.
class generation_model {
 public:
  explicit generation_model(generation_model_config config = {}) : config_((config.validate(), config)) {
    fit_.reset(Eigen::Vector3d(config_.prior_iteration_fixed_s, config_.prior_iteration_per_sequence_s,
                               config_.prior_iteration_per_kilotoken_s),
               config_.prior_weight);
  }

  /// `iterations` decode iterations took `seconds` in all, with `concurrency` sequences active
  /// holding `context_tokens` tokens of context (prompt + generated so far) on average. Returns
  /// false (ignored) for non-finite or non-positive values.
  bool observe(int concurrency, double context_tokens, double iterations, double seconds) noexcept {
    if (concurrency < 1 || !std::isfinite(context_tokens) || context_tokens < 0.0 || !std::isfinite(iterations) ||
        !(iterations > 0.0) || !std::isfinite(seconds) || !(seconds > 0.0)) {
      return false;
    }
    fit_.add(features(concurrency, context_tokens), seconds / iterations, config_.forgetting);
    ++observations_;
    return true;
  }

  double iteration_time_s(double concurrency, double context_tokens) const {
    return std::max(0.0, fit_.predict(features(concurrency, context_tokens)));
  }
  double fixed_s() const noexcept { return std::max(0.0, fit_.coef(0)); }
  double per_sequence_s() const noexcept { return std::max(0.0, fit_.coef(1)); }
  double per_kilotoken_s() const noexcept { return std::max(0.0, fit_.coef(2)); }
  unsigned long long observations() const noexcept { return observations_; }
  const generation_model_config& config() const noexcept { return config_; }

 private:
  static Eigen::Vector3d features(double concurrency, double context_tokens) {
    return Eigen::Vector3d(1.0, concurrency, context_tokens / 1000.0);
  }
  generation_model_config config_;
  detail::online_ridge<3> fit_;
  unsigned long long observations_ = 0;
};

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

namespace detail {
/// E[max(X, Y)] of independent normals X ~ (m1, s1), Y ~ (m2, s2) (Clark, 1961).
inline double expected_max(double m1, double s1, double m2, double s2) noexcept {
  const double theta = std::sqrt(s1 * s1 + s2 * s2);
  if (!(theta > 1e-12 * std::max(1.0, std::max(std::abs(m1), std::abs(m2))))) return std::max(m1, m2);
  const double a = (m1 - m2) / theta;
  const double cdf = 0.5 * std::erfc(-a / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * a * a) / std::sqrt(2.0 * 3.14159265358979323846);
  return m1 * cdf + m2 * (1.0 - cdf) + theta * pdf;
}
}  // namespace detail

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

class stage_balance_policy {
 public:
  explicit stage_balance_policy(stage_balance_config config = {})
      : config_((config.validate(), config)),
        lengths_(config_.lengths),
        prompts_(config_.lengths),
        generation_(config_.generation),
        training_(config_.training) {}

  const stage_balance_config& config() const noexcept { return config_; }

  // ---- observations ------------------------------------------------------------------------
  /// One finished generation: its prompt and generated lengths in tokens.
  void observe_generation(double prompt_tokens, double generated_tokens) noexcept {
    prompts_.add(std::max(prompt_tokens, config_.lengths.min_value));
    lengths_.add(generated_tokens);
  }
  /// Measured decode iterations of one rollout device (see generation_model::observe).
  bool observe_decode(int concurrency, double context_tokens, double iterations, double seconds) noexcept {
    return generation_.observe(concurrency, context_tokens, iterations, seconds);
  }
  /// One measured training step of `devices` ranks at `tokens_per_device` each.
  bool observe_train(int devices, double tokens_per_device, double step_s, double sync_s) noexcept {
    return training_.observe(devices, tokens_per_device, step_s, sync_s);
  }
  /// Weights trainer -> rollout workers, measured once per step.
  void observe_weight_sync(double seconds) noexcept {
    if (!std::isfinite(seconds) || seconds < 0.0) return;
    weight_sync_s_ =
        weight_syncs_ == 0 ? seconds : weight_sync_s_ + config_.weight_sync_smoothing * (seconds - weight_sync_s_);
    ++weight_syncs_;
  }
  /// A switch in `direction` (to_rollout or to_train) measured: the part of its cost that
  /// lengthened the step (exposed; the rest was hidden behind the other role's work).
  void observe_switch(stage_action direction, double exposed_s) {
    if (direction == stage_action::hold)
      dra::detail::throw_invalid("direction", "a switch is to_rollout or to_train, not hold");
    if (!std::isfinite(exposed_s) || exposed_s < 0.0) return;
    auto& cost = direction == stage_action::to_rollout ? to_rollout_cost_ : to_train_cost_;
    cost.value = cost.count == 0 ? exposed_s : cost.value + config_.switch_cost_smoothing * (exposed_s - cost.value);
    ++cost.count;
  }

  // ---- prediction --------------------------------------------------------------------------
  /// Predicted stage times at a split for a step of `sequences` sequences (NaN-free once a
  /// generation was observed; before that every time is 0).
  stage_prediction predict(int rollout, int sequences) const {
    stage_prediction p;
    p.rollout = rollout;
    p.train = config_.devices - rollout;
    p.weight_sync_s = weight_sync_s_;
    if (lengths_.observations() == 0 || sequences < 1 || rollout < 1 || p.train < 1) return p;
    const double n = sequences;
    const double mean = lengths_.mean();
    const double second = lengths_.second_moment();
    // Samples of one prompt move together: a step holds n / g independent lengths.
    const double group = std::min(static_cast<double>(config_.group_size), n);
    const double draws = std::max(1.0, n / group);
    const double longest = std::max(mean, lengths_.expected_max_of(draws));
    const double prompt = prompts_.mean();
    const double per_device = std::ceil(n / rollout);
    const double slots = config_.generation.max_concurrency;
    // Queued (more sequences than slots): the bulk keeps every slot busy for m E[L] / C
    // iterations while admissions continue; the longest sequence starts at a random admission
    // (with probability C / m at once, else uniformly while the queue drains) and runs L_max.
    const double bulk = per_device * mean / slots;
    const double late = per_device <= slots ? 0.0 : 1.0 - slots / per_device;
    const double iterations = std::max(bulk, longest + 0.5 * late * late * bulk);
    p.rollout_s = generation_.fixed_s() * iterations + generation_.per_sequence_s() * per_device * mean +
                  generation_.per_kilotoken_s() * per_device * (prompt * mean + 0.5 * second) / 1000.0;
    const double tokens = n * (prompt + mean) / p.train;
    p.train_s = training_.step_time_s(p.train, tokens);
    // Batch-to-batch spread: the longest draw (or the busiest device's total) for rollout, the
    // batch's total tokens for training.
    const double sd = std::sqrt(std::max(0.0, second - mean * mean));
    const double longest_sd = 0.5 * std::max(0.0, lengths_.quantile(std::pow(0.8413, 1.0 / draws)) -
                                                      lengths_.quantile(std::pow(0.1587, 1.0 / draws)));
    // The sd of a total of k lengths drawn in groups of g that move together: sqrt(k g) sd(L).
    const double device_total_sd = std::sqrt(per_device * std::min(group, per_device)) * sd;
    const bool tail_bound = longest + 0.5 * late * late * bulk >= bulk;
    const double iterations_sd = tail_bound ? longest_sd : device_total_sd / slots;
    const double fixed = generation_.fixed_s() * iterations_sd;
    const double per_sequence = generation_.per_sequence_s() * device_total_sd;
    p.rollout_sd_s = std::sqrt(fixed * fixed + per_sequence * per_sequence);
    const double slope = training_.step_time_s(p.train, tokens + 1.0) - p.train_s;
    p.train_sd_s = std::max(0.0, slope) * std::sqrt(n * group) * sd / p.train;
    const double both = config_.pipeline != rl_pipeline::one_step_off ? p.rollout_s + p.train_s
                        : config_.expected_max
                            ? detail::expected_max(p.rollout_s, p.rollout_sd_s, p.train_s, p.train_sd_s)
                            : std::max(p.rollout_s, p.train_s);
    p.step_s = both + weight_sync_s_;
    return p;
  }

  /// Predictions for every split the limits allow, rollout ascending.
  std::vector<stage_prediction> predict_all(int sequences) const {
    std::vector<stage_prediction> out;
    for (int r = config_.min_rollout; r <= config_.devices - config_.min_train; ++r)
      out.push_back(predict(r, sequences));
    return out;
  }

  /// Exposed cost of a switch in `direction`: the smoothed measurement, or the prior.
  double switch_cost_s(stage_action direction) const noexcept {
    const auto& c = direction == stage_action::to_rollout ? to_rollout_cost_ : to_train_cost_;
    return c.count > 0 ? c.value : config_.prior_switch_cost_s;
  }

  // ---- decision ----------------------------------------------------------------------------
  /// Feed every decision point in order (the hysteresis counter lives here).
  stage_decision decide(const stage_state& now) {
    validate_state(now);
    stage_decision out;
    out.rollout = now.rollout;
    out.train = now.train;
    out.current = predict(now.rollout, now.sequences_per_step);
    out.target = out.current;
    if (lengths_.observations() == 0 || generation_.observations() == 0 || training_.observations() == 0) {
      out.reason = std::string("hold: no ") +
                   (lengths_.observations() == 0      ? "generation"
                    : generation_.observations() == 0 ? "decode iteration"
                                                      : "training step") +
                   " observed yet";
      return out;
    }
    // Best split; ties go to the split nearest the current one (no move without a gain).
    int best = now.rollout;
    double best_s = out.current.step_s;
    for (int r = config_.min_rollout; r <= config_.devices - config_.min_train; ++r) {
      const double s = predict(r, now.sequences_per_step).step_s;
      if (s < best_s || (s == best_s && std::abs(r - now.rollout) < std::abs(best - now.rollout))) best = r, best_s = s;
    }
    int target = best;
    if (target > now.rollout) target = std::min(target, now.rollout + config_.max_move);
    if (target < now.rollout) target = std::max(target, now.rollout - config_.max_move);
    out.target = predict(target, now.sequences_per_step);
    const std::string balance = describe(out.current) + " -> " + describe(out.target);
    const double saving = out.current.step_s - out.target.step_s;
    if (target == now.rollout || !(saving > config_.min_relative_gain * out.current.step_s)) {
      pending_direction_ = stage_action::hold;
      pending_count_ = 0;
      out.target = out.current;
      out.reason = target == now.rollout
                       ? "hold: balanced (" + describe(out.current) + ")"
                       : "hold: predicted gain " + detail::fmt("%.1f%%", 100.0 * saving / out.current.step_s) +
                             " below min_relative_gain (" + balance + ")";
      return out;
    }
    const stage_action direction = target > now.rollout ? stage_action::to_rollout : stage_action::to_train;
    const std::string want = std::string("wanted ") + to_string(direction) + " (" + balance + ")";
    if (now.steps_since_switch < config_.cooldown_steps) {
      out.reason = "hold: cooldown (" + std::to_string(now.steps_since_switch) + " of " +
                   std::to_string(config_.cooldown_steps) + " steps); " + want;
      return out;
    }
    pending_count_ = direction == pending_direction_ ? pending_count_ + 1 : 1;
    pending_direction_ = direction;
    if (pending_count_ < config_.hysteresis_decisions) {
      out.reason = "hold: hysteresis (" + std::to_string(pending_count_) + " of " +
                   std::to_string(config_.hysteresis_decisions) + " consecutive decisions); " + want;
      return out;
    }
    out.switch_cost_s = switch_cost_s(direction);
    out.payback_steps = out.switch_cost_s / saving;
    double horizon = config_.max_payback_steps;
    if (now.remaining_steps >= 0) horizon = std::min(horizon, static_cast<double>(now.remaining_steps));
    const std::string payback =
        detail::fmt("cost %.3g s / saving %.3g s per step = %.3g steps", out.switch_cost_s, saving, out.payback_steps);
    if (!(out.payback_steps <= horizon)) {
      out.reason = "hold: would not pay back (" + payback + detail::fmt(" > %.3g); ", horizon) + want;
      return out;
    }
    pending_direction_ = stage_action::hold;
    pending_count_ = 0;
    out.kind = direction;
    out.rollout = target;
    out.train = config_.devices - target;
    out.moved = std::abs(target - now.rollout);
    out.reason = std::string(to_string(direction)) + ": " + balance + "; pays back (" + payback + ")";
    return out;
  }

  const signals::quantile_sketch& lengths() const noexcept { return lengths_; }
  const signals::quantile_sketch& prompts() const noexcept { return prompts_; }
  const generation_model& generation() const noexcept { return generation_; }
  const throughput_model& training() const noexcept { return training_; }
  double weight_sync_s() const noexcept { return weight_sync_s_; }

 private:
  struct smoothed {
    double value = 0.0;
    unsigned long long count = 0;
  };

  void validate_state(const stage_state& s) const {
    if (s.rollout < 1 || s.train < 1 || s.rollout + s.train != config_.devices)
      dra::detail::throw_invalid("stage_state", "rollout (" + std::to_string(s.rollout) + ") + train (" +
                                                    std::to_string(s.train) + ") must equal devices (" +
                                                    std::to_string(config_.devices) +
                                                    ") with at least one device per role");
    if (s.sequences_per_step < 1)
      dra::detail::throw_invalid("sequences_per_step", "must be >= 1, got " + std::to_string(s.sequences_per_step));
    if (s.steps_since_switch < 0)
      dra::detail::throw_invalid("steps_since_switch", "must be >= 0, got " + std::to_string(s.steps_since_switch));
  }

  static std::string describe(const stage_prediction& p) {
    return std::to_string(p.rollout) + "R/" + std::to_string(p.train) + "T " +
           detail::fmt("rollout %.3g s, train %.3g s, step %.3g s", p.rollout_s, p.train_s, p.step_s);
  }

  stage_balance_config config_;
  signals::quantile_sketch lengths_, prompts_;
  generation_model generation_;
  throughput_model training_;
  double weight_sync_s_ = 0.0;
  unsigned long long weight_syncs_ = 0;
  smoothed to_rollout_cost_, to_train_cost_;
  stage_action pending_direction_ = stage_action::hold;
  int pending_count_ = 0;
};

}  // namespace dra::policy
