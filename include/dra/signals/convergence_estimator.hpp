#pragma once
// Streaming convergence-signal estimator (docs/design/policies.md).
//
// Every update is O(1) and allocation-free: the sliding regression window is a ring buffer sized
// once at construction. Non-finite inputs never reach the state; they are counted and surfaced.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/signals/gradient_noise_scale.hpp"
#include "dra/signals/windowed_regression.hpp"

namespace dra::signals {

enum class training_phase { warmup, fast, steady, plateau, diverging };

inline const char* to_string(training_phase phase) noexcept {
  switch (phase) {
    case training_phase::warmup:
      return "warmup";
    case training_phase::fast:
      return "fast";
    case training_phase::steady:
      return "steady";
    case training_phase::plateau:
      return "plateau";
    case training_phase::diverging:
      return "diverging";
  }
  return "unknown";
}

struct estimator_config {
  /// EMA decay of the smoothed loss (bias-corrected, so early values are not pulled to zero).
  double loss_decay = 0.9;
  /// Steps in the least-squares window for the progress rate.
  std::size_t window = 64;
  /// Updates before any phase other than warmup is reported (and before plateau can fire).
  std::size_t warmup_steps = 32;
  /// A window is "flat" when the fitted log-loss improvement over `window` steps is below this
  /// fraction, or when the slope is not significantly negative (t-statistic above
  /// -plateau_t_threshold).
  double plateau_relative_improvement = 0.01;
  double plateau_t_threshold = 2.0;
  /// Consecutive flat updates before the plateau flag is raised. Plateau is therefore reported
  /// between `plateau_patience` and `window + plateau_patience` steps after the true knee.
  std::size_t plateau_patience = 32;
  /// Once raised, the plateau flag clears only on strong evidence of progress: a slope below
  /// -plateau_exit_t_threshold standard errors that also improves by at least
  /// plateau_relative_improvement per window. A stricter exit than entry (a Schmitt trigger) keeps
  /// the flag from flickering on the chance runs of "significant" slopes that pure noise produces
  /// (with t = 2, about one window in 40).
  double plateau_exit_t_threshold = 4.0;
  /// Scale-free guard on the plateau flag (0: off). When > 0, plateau also needs the smoothed loss
  /// to have improved by less than `plateau_history_improvement` since step
  /// `plateau_history_fraction` x the current step (0.25: over the last two doublings of training).
  /// A windowed test alone fires on any slow stretch, e.g. 19 % into a run or at a constant-LR stage
  /// before a decay; a power-law loss keeps improving by a constant fraction per doubling, so this
  /// test fires only once learning has truly stalled. On the shipped Pollux traces (40 runs, fed
  /// once per epoch) it never fires before half of a run (tests/cpp/test_signals.cpp). On by
  /// default, as the simulator runs it: with the windowed test alone the live digits job dropped
  /// to one process at step 130 of 860 (tests/python/test_plateau_digits.py).
  double plateau_history_fraction = 0.25;
  double plateau_history_improvement = 0.02;
  /// Learning counts as "fast" when the log-loss improves by at least this fraction per window.
  double fast_relative_improvement = 0.10;
  /// Diverging: smoothed loss above divergence_factor x the best smoothed loss, or this many
  /// non-finite losses in a row. Once the best smoothed loss is <= 0 (a negative log-likelihood of
  /// a continuous density, an ELBO, a loss that crosses zero) no ratio to it means anything: the
  /// smoothed loss then diverges when it rises above its lowest value since the warmup by more
  /// than (divergence_factor - 1) x the largest of |that value|, the fall to it from the highest
  /// smoothed loss before it, and 4 x the mean absolute deviation of the loss around its smoothed
  /// value (its noise), all taken when that value was reached. With the defaults, a loss that fell
  /// from 1 to -2 diverges once its smoothed value is back above 1, one that went from -1 to -2
  /// once it is back above 0. The ratio test also needs a rise above that noise term, so that a
  /// noisy loss whose best is just above zero does not diverge by doubling by chance.
  double divergence_factor = 2.0;
  std::size_t divergence_nonfinite_streak = 3;
  /// Robust update: a finite loss above outlier_factor x the smoothed loss enters the smoothed
  /// loss and the regression clipped to that bound (and is counted in `outlier_count`); once the
  /// best smoothed loss is <= 0, the bound is the smoothed loss + (outlier_factor - 1) x the
  /// divergence scale above. One wild value (1e308) then moves the smoothed loss by a bounded step
  /// and leaves the regression window after `window` steps, while a real divergence, which keeps
  /// exceeding the bound, still drives the smoothed loss up by a factor of about
  /// 1 + (1 - loss_decay)(outlier_factor - 1) per step.
  double outlier_factor = 10.0;
  /// Spike guard on the trend (0: off): a log-loss more than spike_sigma x max(the window's
  /// residual standard deviation, spike_floor) above the fitted line enters the regression window
  /// clipped to that bound (counted in `spike_count`; the smoothed loss and the divergence test
  /// take it as it is). A single bad batch of 3x the loss otherwise inflated the fit's error for a
  /// whole window, its slope stopped being significant, and plateau was raised some `patience`
  /// steps later on a curve still falling fast. A real knee bends the line step by step and is
  /// not clipped; only upward jumps are (a drop in the loss is progress).
  double spike_sigma = 4.0;
  double spike_floor = 0.05;  ///< in log-loss: a jump of less than about 5 % x spike_sigma is never clipped
  /// EMA decay for the two gradient-noise-scale moments (|G|^2 and tr(Sigma)), smoothed apart.
  double gns_decay = 0.95;

  /// Throws std::invalid_argument naming the offending field.
  void validate() const {
    auto in_unit = [](double v) { return v >= 0.0 && v < 1.0; };
    if (!in_unit(loss_decay))
      dra::detail::throw_invalid("loss_decay", "must lie in [0, 1), got " + std::to_string(loss_decay));
    if (!in_unit(gns_decay))
      dra::detail::throw_invalid("gns_decay", "must lie in [0, 1), got " + std::to_string(gns_decay));
    if (window < 3)
      dra::detail::throw_invalid("window",
                                 "needs at least 3 steps for a slope with an error, got " + std::to_string(window));
    // The window is held in memory (a few doubles a step): 2^40 steps asked for 8 TiB.
    if (window > 1000000)
      dra::detail::throw_invalid("window", "must be at most 1000000 steps (it is kept in memory), got " +
                                               std::to_string(window) + "; a slope over more steps moves too late");
    if (!(plateau_relative_improvement >= 0.0))
      dra::detail::throw_invalid("plateau_relative_improvement", "must be >= 0");
    if (!(plateau_t_threshold >= 0.0)) dra::detail::throw_invalid("plateau_t_threshold", "must be >= 0");
    if (!(plateau_exit_t_threshold >= plateau_t_threshold))
      dra::detail::throw_invalid("plateau_exit_t_threshold", "must be >= plateau_t_threshold (" +
                                                                 std::to_string(plateau_t_threshold) + "), got " +
                                                                 std::to_string(plateau_exit_t_threshold));
    if (!(fast_relative_improvement > plateau_relative_improvement))
      dra::detail::throw_invalid("fast_relative_improvement", "must exceed plateau_relative_improvement (" +
                                                                  std::to_string(plateau_relative_improvement) + ")");
    if (!(divergence_factor > 1.0))
      dra::detail::throw_invalid("divergence_factor", "must be > 1, got " + std::to_string(divergence_factor));
    if (divergence_nonfinite_streak < 1) dra::detail::throw_invalid("divergence_nonfinite_streak", "must be >= 1");
    if (!(spike_sigma >= 0.0 && std::isfinite(spike_sigma)))
      dra::detail::throw_invalid("spike_sigma",
                                 "must be a finite number >= 0 (0: off), got " + std::to_string(spike_sigma));
    if (!(spike_floor > 0.0 && std::isfinite(spike_floor)))
      dra::detail::throw_invalid("spike_floor",
                                 "must be a finite number > 0 (log-loss), got " + std::to_string(spike_floor));
    if (!(outlier_factor > divergence_factor))
      dra::detail::throw_invalid("outlier_factor", "must exceed divergence_factor (" +
                                                       std::to_string(divergence_factor) + "), got " +
                                                       std::to_string(outlier_factor));
    if (!(plateau_history_fraction >= 0.0 && plateau_history_fraction < 1.0))
      dra::detail::throw_invalid("plateau_history_fraction",
                                 "must lie in [0, 1) (0: off), got " + std::to_string(plateau_history_fraction));
    if (!(plateau_history_improvement >= 0.0 && plateau_history_improvement < 1.0))
      dra::detail::throw_invalid("plateau_history_improvement",
                                 "must lie in [0, 1), got " + std::to_string(plateau_history_improvement));
  }
};

/// What the estimator knows after the latest update. Every double is finite.
struct convergence_signals {
  std::int64_t step = -1;             ///< step index of the latest accepted loss
  std::uint64_t accepted = 0;         ///< finite losses accepted
  double loss = 0.0;                  ///< latest accepted loss
  double smoothed_loss = 0.0;         ///< bias-corrected EMA of the loss
  double best_loss = 0.0;             ///< lowest accepted loss
  double best_smoothed_loss = 0.0;    ///< lowest smoothed loss
  double progress_rate = 0.0;         ///< slope of log(loss) per step over the window
  double progress_rate_stderr = 0.0;  ///< its standard error
  double relative_improvement = 0.0;  ///< -progress_rate * window: fraction gained per window
  double noise = 0.0;                 ///< std of log(loss) around the fitted trend
  bool plateau = false;
  bool diverging = false;
  std::uint64_t flat_streak = 0;  ///< consecutive flat updates
  training_phase phase = training_phase::warmup;
  // Gradient noise scale (McCandlish et al.): B_simple = tr(Sigma) / |G|^2.
  bool gns_valid = false;
  bool gns_biased = false;  ///< estimated with the single-replica fallback
  double gns = 0.0;
  double grad_sqr = 0.0;  ///< smoothed |G|^2
  double grad_var = 0.0;  ///< smoothed tr(Sigma) (per-sample)
  // Validation metric, when given.
  bool has_validation = false;
  double validation_metric = 0.0;
  // Rejected inputs.
  std::uint64_t nonfinite_count = 0;    ///< NaN/inf losses or gradient norms ignored
  std::uint64_t nonfinite_streak = 0;   ///< consecutive non-finite losses
  std::uint64_t nonpositive_count = 0;  ///< finite losses <= 0 (kept out of the log regression)
  std::uint64_t outlier_count = 0;      ///< losses clipped to outlier_factor x the smoothed loss
  std::uint64_t spike_count = 0;        ///< log-losses clipped to the trend's spike bound (spike_sigma)
};

class convergence_estimator {
 public:
  explicit convergence_estimator(estimator_config config = {})
      : config_((config.validate(), config)), regression_(config.window), gns_(config.gns_decay) {
    if (config_.plateau_history_fraction > 0.0) history_.reserve(history_capacity);
  }

  const estimator_config& config() const noexcept { return config_; }
  const convergence_signals& signals() const noexcept { return signals_; }

  /// Feeds the loss of `step`. Steps may have gaps but must not go backwards (a step at or
  /// before the latest one is ignored and counted as rejected). Returns true when accepted.
  /// A streak of non-finite losses starting returns false and sets `nonfinite_streak` to 1,
  /// which callers use to warn once per streak.
  bool update_loss(std::int64_t step, double loss) noexcept {
    auto& s = signals_;
    if (!std::isfinite(loss)) {
      ++s.nonfinite_count;
      ++s.nonfinite_streak;
      if (s.nonfinite_streak >= config_.divergence_nonfinite_streak) {
        s.diverging = true;
        s.phase = training_phase::diverging;
      }
      return false;
    }
    if (s.accepted > 0 && step <= s.step) {
      ++rejected_steps_;
      return false;
    }
    // Robust update: an outlier enters the state clipped to a bound relative to the smoothed loss
    // (the raw value is still reported as `loss`).
    double value = loss;
    if (s.accepted >= 3 && s.best_smoothed_loss > 0.0 && loss > config_.outlier_factor * s.smoothed_loss) {
      value = config_.outlier_factor * s.smoothed_loss;
      ++s.outlier_count;
    } else if (s.best_smoothed_loss <= 0.0 && yard_set_ &&
               loss > s.smoothed_loss + (config_.outlier_factor - 1.0) * divergence_scale()) {
      value = s.smoothed_loss + (config_.outlier_factor - 1.0) * divergence_scale();
      ++s.outlier_count;
    }
    // A finite loss so close to the largest double that the EMA would overflow is as useless as
    // an inf, and an inf in the EMA would never leave it: treat it as non-finite.
    const double ema = config_.loss_decay * ema_ + (1.0 - config_.loss_decay) * value;
    const double decay_power = decay_power_ * config_.loss_decay;
    const double smoothed = ema / (1.0 - decay_power);
    if (!std::isfinite(smoothed)) return update_loss(step, NAN);
    s.nonfinite_streak = 0;
    s.step = step;
    s.loss = loss;
    ++s.accepted;

    ema_ = ema;
    decay_power_ = decay_power;
    if (s.accepted > 1) {
      const double deviation = std::abs(value - s.smoothed_loss);
      deviation_ =
          s.accepted == 2 ? deviation : config_.loss_decay * deviation_ + (1.0 - config_.loss_decay) * deviation;
    }
    s.smoothed_loss = smoothed;
    if (s.accepted == 1) {
      s.best_loss = loss;
      s.best_smoothed_loss = s.smoothed_loss;
      peak_smoothed_ = s.smoothed_loss;
    } else {
      s.best_loss = std::min(s.best_loss, loss);
      s.best_smoothed_loss = std::min(s.best_smoothed_loss, s.smoothed_loss);
    }
    // The divergence yardstick, from the warmup on: earlier smoothed losses are nearly raw values
    // and the noise estimate has seen too few of them.
    if (s.accepted >= std::max<std::size_t>(config_.warmup_steps, 2) && (!yard_set_ || s.smoothed_loss < yard_best_)) {
      yard_set_ = true;
      yard_best_ = s.smoothed_loss;
      yard_fall_ = peak_smoothed_ - s.smoothed_loss;
      yard_noise_ = deviation_;
    }
    peak_smoothed_ = std::max(peak_smoothed_, s.smoothed_loss);

    if (value > 0.0) {
      double y = std::log(value);
      if (config_.spike_sigma > 0.0 && regression_.full()) {
        const auto& trend = fit_;  // the window as the last update left it: fit() again would repeat it
        const double bound = trend.at(static_cast<double>(step)) +
                             config_.spike_sigma * std::max(trend.residual_std, config_.spike_floor);
        if (trend.valid && y > bound) {
          y = bound;
          ++s.spike_count;
        }
      }
      regression_.push(static_cast<double>(step), y);
    } else {
      ++s.nonpositive_count;
    }
    fit_ = regression_.fit();
    const auto& fit = fit_;
    s.progress_rate = fit.slope;
    s.progress_rate_stderr = fit.slope_stderr;
    s.noise = fit.residual_std;
    s.relative_improvement = -fit.slope * static_cast<double>(config_.window);

    const bool significant_decrease = fit.valid && fit.slope < -config_.plateau_t_threshold * fit.slope_stderr;
    const bool flat =
        fit.valid && (!significant_decrease || s.relative_improvement < config_.plateau_relative_improvement);
    s.flat_streak = flat ? s.flat_streak + 1 : 0;

    const bool strong_progress = fit.valid && fit.slope < -config_.plateau_exit_t_threshold * fit.slope_stderr &&
                                 s.relative_improvement >= config_.plateau_relative_improvement;

    const bool warm = s.accepted >= config_.warmup_steps && regression_.full();
    const bool stalled = record_history(step, s.smoothed_loss);
    s.plateau = warm && stalled && (s.flat_streak >= config_.plateau_patience || (s.plateau && !strong_progress));
    const double rise_allowed = config_.divergence_factor - 1.0;
    if (!warm || !yard_set_) {
      s.diverging = false;
    } else if (s.best_smoothed_loss > 0.0) {
      s.diverging = s.smoothed_loss > config_.divergence_factor * s.best_smoothed_loss &&
                    s.smoothed_loss - s.best_smoothed_loss > rise_allowed * noise_floor * yard_noise_;
    } else {
      const double scale = divergence_scale();
      s.diverging = scale > 0.0 && s.smoothed_loss - yard_best_ > rise_allowed * scale;
    }
    if (!warm) {
      s.phase = training_phase::warmup;
    } else if (s.diverging) {
      s.phase = training_phase::diverging;
    } else if (s.plateau) {
      s.phase = training_phase::plateau;
    } else if (significant_decrease && s.relative_improvement >= config_.fast_relative_improvement) {
      s.phase = training_phase::fast;
    } else {
      s.phase = training_phase::steady;
    }
    return true;
  }

  /// Two-batch-size gradient statistics of one step: `small_sqr_norm` is |g|^2 of a gradient
  /// over `small_batch` samples (the mean over ranks of each rank's local |g_i|^2), `big_sqr_norm`
  /// is |g|^2 of the all-reduced gradient over `big_batch` samples. Returns false (and counts)
  /// for non-finite or inconsistent input.
  bool update_gradients(double small_sqr_norm, double small_batch, double big_sqr_norm, double big_batch,
                        bool biased = false) noexcept {
    if (!gns_.update(small_sqr_norm, small_batch, big_sqr_norm, big_batch)) {
      ++signals_.nonfinite_count;
      return false;
    }
    signals_.gns_biased = biased;
    signals_.grad_sqr = gns_.grad_sqr();
    signals_.grad_var = gns_.grad_var();
    signals_.gns_valid = gns_.valid();
    signals_.gns = gns_.noise_scale();
    return true;
  }

  /// Latest validation metric (higher or lower is better depending on the metric; stored as is).
  bool update_validation(double metric) noexcept {
    if (!std::isfinite(metric)) {
      ++signals_.nonfinite_count;
      return false;
    }
    signals_.has_validation = true;
    signals_.validation_metric = metric;
    return true;
  }

  std::uint64_t rejected_steps() const noexcept { return rejected_steps_; }

 private:
  static constexpr std::size_t history_capacity = 256;

  // Smoothed loss at geometrically spaced steps (each >= 1.05 x the previous one), so the loss at
  // any fraction of the current step is at hand in O(1) amortised, allocation-free after the
  // constructor's reserve. When full, every other point is dropped (spacing doubles). Returns
  // whether learning has stalled over the configured share of history (always true when off).
  bool record_history(std::int64_t step, double smoothed) noexcept {
    if (config_.plateau_history_fraction <= 0.0) return true;
    const double t = static_cast<double>(step);
    if (history_.empty() || t >= history_.back().first * 1.05 + 1.0) {
      if (history_.size() == history_capacity) {
        std::size_t w = 0;
        for (std::size_t r = 0; r < history_.size(); r += 2) history_[w++] = history_[r];
        history_.resize(w);
        history_cursor_ = 0;
      }
      history_.emplace_back(t, smoothed);
    }
    const double at = config_.plateau_history_fraction * t;
    while (history_cursor_ + 1 < history_.size() && history_[history_cursor_ + 1].first <= at) ++history_cursor_;
    const auto& [then_step, then_loss] = history_[history_cursor_];
    if (then_step > at || !(then_loss > 0.0)) return false;  // not enough history yet
    return 1.0 - smoothed / then_loss < config_.plateau_history_improvement;
  }

  // How far the smoothed loss may rise above a best <= 0, in units of (divergence_factor - 1):
  // zero anchors no ratio there, so the rise is judged against the scale of the losses seen when
  // that best was reached (frozen then, so that a blow-up does not widen its own yardstick).
  double divergence_scale() const noexcept { return std::max({-yard_best_, yard_fall_, noise_floor * yard_noise_}); }
  // A rise of 4 mean absolute deviations (about 3 standard deviations of the loss, 13 of its
  // smoothed value) is never noise.
  static constexpr double noise_floor = 4.0;

  std::vector<std::pair<double, double>> history_;
  std::size_t history_cursor_ = 0;
  estimator_config config_;
  detail::windowed_regression regression_;
  detail::line_fit fit_{};  // regression_.fit() as of the last push (only update_loss pushes)
  gradient_noise_scale gns_;
  convergence_signals signals_{};
  double ema_ = 0.0;
  double decay_power_ = 1.0;
  double deviation_ = 0.0;      // EMA of |loss - smoothed loss| (the loss's noise, in its units)
  double peak_smoothed_ = 0.0;  // highest smoothed loss so far
  // The divergence yardstick, taken when the lowest smoothed loss since the warmup was reached:
  bool yard_set_ = false;
  double yard_best_ = 0.0;   // that smoothed loss
  double yard_fall_ = 0.0;   // the fall to it from the highest smoothed loss before it
  double yard_noise_ = 0.0;  // deviation_ then
  std::uint64_t rejected_steps_ = 0;
};

}  // namespace dra::signals
