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
#include "dra/rl/generation_model.hpp"
#include "dra/rl/stage_balance_types.hpp"
#include "dra/signals/quantile_sketch.hpp"

namespace dra::policy {

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

class stage_balance_policy {
 public:
  explicit stage_balance_policy(stage_balance_config config = {})
      : config_((config.validate(), config)),
        lengths_(config_.lengths),
        prompts_(config_.lengths),
        generation_(config_.generation),
        training_(config_.training) {
    batch_fit_.reset(Eigen::Vector2d(1.0, 1.0), config_.generation.prior_weight);
  }

  const stage_balance_config& config() const noexcept { return config_; }

  // ---- observations ------------------------------------------------------------------------
  /// One finished generation (prompt and generated tokens); either out of range is counted in
  /// lengths().rejected() and changes nothing (a rejected length's prompt was taken in).
  void observe_generation(double prompt_tokens, double generated_tokens) noexcept {
    if (!(generated_tokens > 0.0 && generated_tokens <= config_.lengths.max_value) ||
        !(std::isfinite(prompt_tokens) && prompt_tokens >= 0.0 && prompt_tokens <= config_.lengths.max_value)) {
      lengths_.reject();
      return;
    }
    prompts_.add(std::max(prompt_tokens, config_.lengths.min_value));
    lengths_.add(generated_tokens);
  }
  /// Measured decode iterations of one rollout device (see generation_model::observe).
  bool observe_decode(int concurrency, double context_tokens, double iterations, double seconds) noexcept {
    if (!generation_.observe(concurrency, context_tokens, iterations, seconds)) return false;
    // The operating point where the tokens are generated (token-weighted: the tail's many
    // iterations at low concurrency make few tokens), forgetting per observation like the fit.
    const double tokens = iterations * concurrency;
    decode_weight_ = config_.generation.forgetting * decode_weight_ + tokens;
    decode_concurrency_ += (concurrency - decode_concurrency_) * tokens / decode_weight_;
    decode_context_ += (context_tokens - decode_context_) * tokens / decode_weight_;
    decode_peak_ = std::max(static_cast<double>(concurrency), decode_peak_ * config_.generation.forgetting);
    return true;
  }
  /// A batch of `sequences` generated in `seconds` (its first sequence handed out to its last
  /// finished) on `rollout` devices on average: scales the bulk and tail terms of the rollout
  /// model to what the pipeline really takes (queueing, preemption, prefill), and the scale of the
  /// fresh-batch model (fresh_batch_s). False: ignored.
  bool observe_batch(double rollout, int sequences, double seconds) {
    if (!(rollout >= 1.0) || sequences < 1 || !std::isfinite(seconds) || !(seconds > 0.0) ||
        lengths_.observations() == 0 || generation_.observations() == 0)
      return false;
    const auto f = batch_features(rollout, sequences);
    batch_fit_.add(Eigen::Vector2d(f.first, f.second), seconds, config_.generation.forgetting);
    // A device given more sequences than it ever decoded at once was held at that concurrency (its
    // KV cache or its admission rule, whatever the configured limits say); one that never filled
    // up leaves the configured limits in force.
    saturated_at_ = sequences / rollout > 1.05 * decode_peak_ ? decode_peak_ : 0.0;
    const double model = fresh_batch_s(rollout, sequences);
    if (model > 0.0) {
      const double r = std::log(seconds / model);
      batch_log_scale_ = batches_ == 0 ? r : batch_log_scale_ + config_.batch_smoothing * (r - batch_log_scale_);
      ++batches_;
    }
    return true;
  }
  /// A rollout engine started on a device that left the trainers (its own time, not the step's).
  void observe_engine_start(double seconds) noexcept {
    if (!std::isfinite(seconds) || seconds < 0.0) return;
    engine_start_s_ =
        engine_starts_ == 0 ? seconds : engine_start_s_ + config_.switch_cost_smoothing * (seconds - engine_start_s_);
    ++engine_starts_;
  }
  /// A prefill of `tokens` tokens of context (an admission, or a preempted sequence re-admitted)
  /// measured at `seconds`: the per-kilotoken cost, smoothed like the switch costs.
  void observe_prefill(double tokens, double seconds) noexcept {
    if (!(tokens > 0.0) || !std::isfinite(tokens) || !std::isfinite(seconds) || seconds < 0.0) return;
    const double per_kilotoken = 1000.0 * seconds / tokens;
    prefill_per_kilotoken_s_ =
        prefills_ == 0
            ? per_kilotoken
            : prefill_per_kilotoken_s_ + config_.switch_cost_smoothing * (per_kilotoken - prefill_per_kilotoken_s_);
    ++prefills_;
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
    // Best split; ties go to the split nearest the current one (no move without a gain). Outside
    // [min_rollout, devices - min_train] (a start there) the best allowed split wins, at once.
    const int lo = config_.min_rollout, hi = config_.devices - config_.min_train;
    const bool outside = now.rollout < lo || now.rollout > hi;
    int best = outside ? std::clamp(now.rollout, lo, hi) : now.rollout;
    double best_s = outside ? predict(best, now.sequences_per_step).step_s : out.current.step_s;
    for (int r = lo; r <= hi; ++r) {
      const double s = predict(r, now.sequences_per_step).step_s;
      if (s < best_s || (s == best_s && std::abs(r - now.rollout) < std::abs(best - now.rollout))) best = r, best_s = s;
    }
    int target = best;
    if (target > now.rollout) target = std::min(target, now.rollout + config_.max_move);
    if (target < now.rollout) target = std::max(target, now.rollout - config_.max_move);
    out.target = predict(target, now.sequences_per_step);
    const std::string balance = describe(out.current) + " -> " + describe(out.target);
    const stage_action direction = target > now.rollout ? stage_action::to_rollout : stage_action::to_train;
    if (outside) {  // as a world below min_size is restored: no gain, cooldown, hysteresis or payback asked
      out.switch_cost_s = switch_cost_s(direction);
      return switch_to(std::move(out), now, target, direction,
                       "restore: outside min_rollout/min_train (" + balance + ")");
    }
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
    return switch_to(std::move(out), now, target, direction, balance + "; pays back (" + payback + ")");
  }

  stage_decision switch_to(stage_decision out, const stage_state& now, int target, stage_action direction,
                           const std::string& why) {
    pending_direction_ = stage_action::hold;
    pending_count_ = 0;
    out.kind = direction;
    out.rollout = target;
    out.train = config_.devices - target;
    out.moved = std::abs(target - now.rollout);
    out.reason = std::string(to_string(direction)) + ": " + why;
    return out;
  }

  // ---- in-step decision (no per-phase barrier) --------------------------------------------
  /// Busy devices' decode cost per token at the observed operating point (seconds).
  double token_cost_s() const {
    const double c = std::max(1.0, decode_concurrency_);
    return generation_.iteration_time_s(c, decode_context_) / c;
  }

  /// One decision at a boundary of the trainers' world (feed every one, in order). It predicts the
  /// pipeline's critical path a few steps ahead (one step stale: batch j opens when step j - 2 has
  /// published; step j starts when batch j is generated and step j - 1 is done) for every trainer
  /// count it may reach now (lend trainers, take idle rollout devices), from the measured models:
  /// the wait for this step's batch (the residual lengths of its sequences in flight), the rest of
  /// the next batch, fresh batches (bulk and tail terms scaled by the measured batch times), and
  /// training. A move between two updates is for the rest of the step; one in the window holds.
  /// It needs every model observed, a predicted saving of min_relative_gain of the horizon, and
  /// must pay back its measured exposed cost within max_payback_steps and the steps left.
  window_decision decide_window(const window_state& now) {
    validate_window(now);
    window_decision out;
    out.train = now.train;
    if (lengths_.observations() == 0 || generation_.observations() == 0 || training_.observations() == 0) {
      out.reason = std::string("hold: no ") +
                   (lengths_.observations() == 0      ? "generation"
                    : generation_.observations() == 0 ? "decode iteration"
                                                      : "training step") +
                   " observed yet";
      return out;
    }
    const length_table table(lengths_);
    const double mean = lengths_.mean();
    const double prompt = prompts_.mean();
    const double tok = token_cost_s();
    const int rollout_busy = std::max(1, now.rollout - now.idle_rollout);
    const double group = std::max(1.0, static_cast<double>(config_.group_size));
    // A batch's tail: the median of the longest residual of its sequences in flight (a group's
    // samples move together), decoded at the concurrency the tail leaves on a device.
    const auto tail_s = [&](const std::vector<double>& flight) {
      if (flight.empty()) return 0.0;
      const double draws = std::max(1.0, static_cast<double>(flight.size()) / group);
      const double q = std::pow(0.5, 1.0 / draws);
      double longest = 0.0, context = 0.0;
      for (double g : flight) longest = std::max(longest, table.residual_quantile(g, q)), context += prompt + g;
      const double c = std::max(1.0, static_cast<double>(flight.size()) / rollout_busy);
      return longest *
             generation_.iteration_time_s(c, c * (context / static_cast<double>(flight.size()) + 0.5 * longest));
    };
    const auto work_tokens = [&](int queued, const std::vector<double>& flight) {
      double w = queued * mean;
      for (double g : flight) w += table.residual_mean(g);
      return w;
    };
    // The measured correction of the rollout model (1, 1 until a batch was observed).
    const double bulk_scale = std::max(0.1, batch_fit_.coef(0)), tail_scale = std::max(0.1, batch_fit_.coef(1));
    const auto queued_tail_s = [&](int queued, double devices) { return tail_scale * fresh_tail_s(queued, devices); };
    const double wait_work = now.wait_complete ? 0.0 : bulk_scale * work_tokens(now.wait_queued, now.wait_in_flight);
    out.wait_s =
        now.wait_complete
            ? 0.0
            : std::max(std::max(tail_scale * tail_s(now.wait_in_flight), queued_tail_s(now.wait_queued, rollout_busy)),
                       wait_work * tok / rollout_busy);
    const double next_work = now.next_exists ? bulk_scale * work_tokens(now.next_queued, now.next_in_flight) : 0.0;
    const double queued_work =
        bulk_scale * mean * ((now.next_exists ? now.next_queued : 0) + (now.wait_complete ? 0 : now.wait_queued));
    const double next_tail = now.next_exists ? tail_scale * tail_s(now.next_in_flight) : 0.0;
    const double engine = engine_starts_ > 0 ? engine_start_s_ : 0.0;
    const double update_tokens = now.sequences_per_step * (prompt + mean) / now.updates_per_step;
    const auto update_s = [&](int train) { return training_.step_time_s(train, update_tokens / train); };
    // A fresh batch on `rollout` devices: the decode model's time at that split, scaled by what the
    // batches really took (one scale: the split's effect comes from the model, which one split's
    // measurements could not identify).
    const double batch_scale = batches_ > 0 ? std::exp(batch_log_scale_) : 1.0;
    const auto batch_s = [&](int rollout) { return batch_scale * fresh_batch_s(rollout, now.sequences_per_step); };
    // Between two updates a move is for the rest of this step (the window decides the next one);
    // in the window it holds for the steps after.
    const bool in_step = now.wait_complete && now.updates_left < now.updates_per_step;
    // The critical path, times from now: this step's end with `train` trainers, then each later
    // step at `later` trainers; the objective is when the last of them ends.
    const std::int64_t steps_ahead =
        now.remaining_steps < 0 ? 6 : std::min<std::int64_t>(6, std::max<std::int64_t>(1, now.remaining_steps));
    const auto objective = [&](int train, int later) {
      const int rollout = config_.devices - train;
      // A move between two updates lasts the rest of this step: its cost counts against the gain
      // within the horizon. One in the window holds for the steps after: the horizon's gain is
      // compared without it, and the cost must pay back within the steps left (below).
      const double cost = !in_step || train == now.train
                              ? 0.0
                              : switch_cost_s(train < now.train ? stage_action::to_rollout : stage_action::to_train);
      const double updates = now.updates_left * update_s(train) + weight_sync_s_;
      double end_prev = out.wait_s + cost + updates;  // this step's end
      // Batch s + 1: what is left of it on the busy devices, lenders after their engine start.
      // Sequences in flight stay on their devices; lenders can only take queued ones.
      double next_done = 0.0;
      if (now.next_exists) {
        const int lenders = std::max(0, rollout - now.rollout);
        const double busy = std::max(1, std::min(rollout_busy, rollout));
        const double work = (next_work + wait_work) * tok;
        double gen = work / busy;
        if (lenders > 0 && gen > engine) {
          const double in_flight = std::max(0.0, work - queued_work * tok);
          gen = std::min(gen, std::max(in_flight / busy, (work + lenders * engine) / (busy + lenders)));
        }
        next_done = std::max(std::max(gen, next_tail),
                             queued_tail_s(now.next_queued, busy + lenders) + (lenders > 0 ? engine : 0.0));
      }
      double done_next = next_done;  // when the batch of the step after is generated
      for (std::int64_t j = 1; j < steps_ahead; ++j) {
        const double end = std::max(done_next, end_prev) + now.updates_per_step * update_s(later) + weight_sync_s_;
        done_next = end_prev + batch_s(config_.devices - later);  // opens once the step before published
        end_prev = end;
      }
      return end_prev;
    };
    const int lo = std::max(config_.min_train, now.train - config_.max_move);
    const int hi =
        std::min(config_.devices - config_.min_rollout, now.train + std::min(now.idle_rollout, config_.max_move));
    out.predicted_current_s = objective(now.train, now.train);
    int best = now.train;
    double best_s = out.predicted_current_s;
    for (int t = lo; t <= hi; ++t) {
      const double j = objective(t, in_step ? now.train : t);
      if (j < best_s || (j == best_s && std::abs(t - now.train) < std::abs(best - now.train))) best = t, best_s = j;
    }
    out.predicted_target_s = best_s;
    const auto at = [](int train, double j) {
      return std::to_string(train) + "T: next step in " + detail::fmt("%.4g s", j);
    };
    const std::string view = detail::fmt("wait %.3g s, ", out.wait_s) + at(now.train, out.predicted_current_s);
    const double saving = out.predicted_current_s - best_s;
    // A move in the window holds for the steps after: it waits until fresh batches calibrated the
    // batch model (on its priors alone, a first guess could hold a split no measurement revisits).
    if (best != now.train && !in_step && batches_ < kCalibrationBatches) {
      out.reason = "hold: the batch model has seen " + std::to_string(batches_) + " of " +
                   std::to_string(kCalibrationBatches) + " batches (" + view + " -> " + at(best, best_s) + ")";
      return out;
    }
    if (best == now.train || !(saving > config_.min_relative_gain * out.predicted_current_s)) {
      out.reason = best == now.train
                       ? "hold: balanced (" + view + ")"
                       : "hold: predicted gain " + detail::fmt("%.1f%%", 100.0 * saving / out.predicted_current_s) +
                             " below min_relative_gain (" + view + " -> " + at(best, best_s) + ")";
      return out;
    }
    const stage_action direction = best < now.train ? stage_action::to_rollout : stage_action::to_train;
    out.switch_cost_s = switch_cost_s(direction);
    const double per_step = saving / static_cast<double>(steps_ahead);
    out.payback_steps = out.switch_cost_s / per_step;
    double horizon = config_.max_payback_steps;
    if (now.remaining_steps >= 0) horizon = std::min(horizon, static_cast<double>(now.remaining_steps));
    const std::string payback = detail::fmt("cost %.3g s / saving %.3g s per step = %.3g steps", out.switch_cost_s,
                                            per_step, out.payback_steps);
    if (!(out.payback_steps <= horizon)) {
      out.reason = "hold: would not pay back (" + payback + detail::fmt(" > %.3g); ", horizon) + view;
      return out;
    }
    out.kind = direction;
    out.moved = std::abs(best - now.train);
    out.train = best;
    out.reason =
        std::string(to_string(direction)) + ": " + view + " -> " + at(best, best_s) + "; pays back (" + payback + ")";
    return out;
  }

  const signals::quantile_sketch& lengths() const noexcept { return lengths_; }
  const signals::quantile_sketch& prompts() const noexcept { return prompts_; }
  const generation_model& generation() const noexcept { return generation_; }
  const throughput_model& training() const noexcept { return training_; }
  double weight_sync_s() const noexcept { return weight_sync_s_; }
  /// Engine start on a device leaving the trainers: measured, else the prior switch cost.
  double engine_start_s() const noexcept { return engine_starts_ > 0 ? engine_start_s_ : config_.prior_switch_cost_s; }
  /// Prefill per 1000 tokens of context: measured, else 0.
  double prefill_per_kilotoken_s() const noexcept { return prefill_per_kilotoken_s_; }

 private:
  // A fresh batch's longest sequence on `devices` devices: it starts when a decode slot frees
  // (late when a device holds more sequences than it decodes at once: the queue's delay of the
  // phase model), among the others at the observed operating point, and ends nearly alone.
  double fresh_tail_s(int queued, double devices) const {
    if (queued <= 0) return 0.0;
    const double group = std::max(1.0, static_cast<double>(config_.group_size));
    const double mean = lengths_.mean(), prompt = prompts_.mean();
    const double slots = std::max(1.0, decode_concurrency_);
    const double longest = lengths_.expected_max_of(std::max(1.0, queued / group));
    const double per_device = queued / std::max(1.0, devices);
    const double late =
        per_device <= slots ? 0.0 : 0.5 * std::pow(1.0 - slots / per_device, 2.0) * per_device * mean / slots;
    const double c = std::max(1.0, 0.5 * std::min(slots, per_device));
    return late * generation_.iteration_time_s(slots, slots * (prompt + 0.5 * mean)) +
           longest * generation_.iteration_time_s(c, c * (prompt + 0.5 * longest));
  }
  // The rollout model's two terms for a batch: its bulk spread over the devices, its tail.
  std::pair<double, double> batch_features(double rollout, int sequences) const {
    return {sequences * lengths_.mean() * token_cost_s() / std::max(1.0, rollout), fresh_tail_s(sequences, rollout)};
  }
  // A fresh batch's time on `rollout` devices, before the measured scale: its bulk decoded at the
  // concurrency the split leaves each device (the slots, the KV cache or the sequences it holds,
  // whichever is fewest; an iteration's fixed cost is shared by the sequences it decodes), plus its
  // longest sequence started late (the drain after the bulk, at low concurrency). Fewer rollout
  // devices each decode more at once, so short generations gain little from more devices, and the
  // tail does not shrink with them. Combined by max instead of the sum, the model held a drifting
  // workload's split too long and lent trainers under SGLang-like admission (results/rl/issue24).
  double fresh_batch_s(double rollout, int sequences) const {
    if (sequences <= 0 || lengths_.observations() == 0) return 0.0;
    const double mean = lengths_.mean();
    const double context = prompts_.mean() + 0.5 * mean;
    const double per_device = sequences / std::max(1.0, rollout);
    double cap = config_.generation.max_concurrency;
    if (config_.generation.kv_capacity_tokens > 0.0)
      cap = std::min(cap, config_.generation.kv_capacity_tokens / std::max(1.0, context));
    if (saturated_at_ > 0.0) cap = std::min(cap, saturated_at_);
    const double c = std::max(1.0, std::min(cap, per_device));
    const double bulk = per_device * mean / c * generation_.iteration_time_s(c, c * context);
    return bulk + fresh_tail_s(sequences, rollout);
  }

  // The sketch as a table: conditional quantiles and means of the residual length L - g given L > g.
  class length_table {
   public:
    explicit length_table(const signals::quantile_sketch& s) {
      double w = 0.0, m = 0.0;
      s.for_each_bin([&](double v, double weight) {
        w += weight;
        m += weight * v;
        value_.push_back(v);
        cum_.push_back(w);
        moment_.push_back(m);
      });
    }
    // Weight at or below g.
    double below(double g) const {
      const auto it = std::upper_bound(value_.begin(), value_.end(), g);
      return it == value_.begin() ? 0.0 : cum_[static_cast<std::size_t>(it - value_.begin()) - 1];
    }
    double residual_quantile(double g, double q) const {
      if (value_.empty()) return 0.0;
      const double total = cum_.back(), b = below(g);
      if (!(total - b > 0.0)) return 0.0;  // longer than anything seen: no view of its end
      const double target = b + q * (total - b);
      const auto it = std::lower_bound(cum_.begin(), cum_.end(), target);
      const double v = value_[std::min(value_.size() - 1, static_cast<std::size_t>(it - cum_.begin()))];
      return std::max(0.0, v - g);
    }
    double residual_mean(double g) const {
      if (value_.empty()) return 0.0;
      const auto it = std::upper_bound(value_.begin(), value_.end(), g);
      const std::size_t i = static_cast<std::size_t>(it - value_.begin());
      const double w = cum_.back() - (i == 0 ? 0.0 : cum_[i - 1]);
      const double m = moment_.back() - (i == 0 ? 0.0 : moment_[i - 1]);
      return w > 0.0 ? std::max(0.0, m / w - g) : 0.0;
    }

   private:
    std::vector<double> value_, cum_, moment_;
  };

  void validate_window(const window_state& s) const {
    if (s.rollout < 1 || s.train < 1 || s.rollout + s.train != config_.devices)
      dra::detail::throw_invalid("window_state", "rollout (" + std::to_string(s.rollout) + ") + train (" +
                                                     std::to_string(s.train) + ") must equal devices (" +
                                                     std::to_string(config_.devices) +
                                                     ") with at least one device per role");
    if (s.idle_rollout < 0 || s.idle_rollout > s.rollout)
      dra::detail::throw_invalid("idle_rollout", "must lie in [0, rollout = " + std::to_string(s.rollout) + "], got " +
                                                     std::to_string(s.idle_rollout));
    if (s.sequences_per_step < 1 || s.wait_queued < 0 || s.next_queued < 0)
      dra::detail::throw_invalid("window_state", "sequences_per_step must be >= 1 and the queue depths >= 0");
    if (s.updates_per_step < 1 || s.updates_left < 0 || s.updates_left > s.updates_per_step)
      dra::detail::throw_invalid(
          "updates_left", "must lie in [0, updates_per_step = " + std::to_string(s.updates_per_step) + "], got " +
                              std::to_string(s.updates_left));
  }

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
  smoothed_value to_rollout_cost_, to_train_cost_;
  double decode_weight_ = 0.0, decode_concurrency_ = 0.0, decode_context_ = 0.0;
  double engine_start_s_ = 0.0;
  unsigned long long engine_starts_ = 0;
  double prefill_per_kilotoken_s_ = 0.0;
  unsigned long long prefills_ = 0;
  detail::online_ridge<2> batch_fit_;  // scales the bulk and tail terms (work in flight)
  static constexpr unsigned long long kCalibrationBatches = 2;
  double batch_log_scale_ = 0.0;  // log of measured / fresh_batch_s, smoothed
  double decode_peak_ = 0.0;      // most sequences decoded at once, forgetting like the fit
  double saturated_at_ = 0.0;     // the concurrency devices were held at (0: never full)
  unsigned long long batches_ = 0;
  stage_action pending_direction_ = stage_action::hold;
  int pending_count_ = 0;
};

}  // namespace dra::policy
