#pragma once
// Streaming quantiles of a positive quantity (generation lengths, latencies) with exponential
// forgetting, so the recent distribution follows a drift: log-spaced bins as in DDSketch (Masson et
// al., VLDB'19: relative error at most `a` inside [min_value, max_value]; values outside are clamped
// and counted). Forgetting grows the weight of each new observation instead of decaying every bin,
// so an update is O(1) and allocation-free; the decayed mean and second moment are exact.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"

namespace dra::signals {

struct quantile_sketch_config {
  double relative_accuracy = 0.01;
  double min_value = 1.0;
  double max_value = 1e7;
  /// Observations after which an observation's weight has halved; 0: no forgetting.
  double half_life = 0.0;

  void validate() const {
    if (!(relative_accuracy > 0.0 && relative_accuracy < 0.5))
      dra::detail::throw_invalid("relative_accuracy", "must lie in (0, 0.5), got " + std::to_string(relative_accuracy));
    if (!(min_value > 0.0) || !std::isfinite(min_value))
      dra::detail::throw_invalid("min_value", "must be a finite number > 0, got " + std::to_string(min_value));
    if (!(max_value > min_value) || !std::isfinite(max_value))
      dra::detail::throw_invalid("max_value", "must be finite and > min_value (" + std::to_string(min_value) +
                                                  "), got " + std::to_string(max_value));
    if (!(half_life >= 0.0) || !std::isfinite(half_life))
      dra::detail::throw_invalid("half_life",
                                 "must be >= 0 observations (0: no forgetting), got " + std::to_string(half_life));
    // Each observation's weight grows by 2^(1/half_life): below 0.01 that is over 2^100 a step and
    // every result was NaN.
    if (half_life > 0.0 && half_life < 0.01)
      dra::detail::throw_invalid("half_life",
                                 "must be 0 (no forgetting) or >= 0.01 observations, got " + std::to_string(half_life));
    if (std::log(max_value / min_value) / std::log((1.0 + relative_accuracy) / (1.0 - relative_accuracy)) > 1e6)
      dra::detail::throw_invalid("relative_accuracy",
                                 "needs more than 1e6 bins for [min_value, max_value]; "
                                 "raise relative_accuracy or narrow the range");
  }
};

class quantile_sketch {
 public:
  explicit quantile_sketch(quantile_sketch_config config = {}) : config_((config.validate(), config)) {
    log_gamma_ = std::log((1.0 + config_.relative_accuracy) / (1.0 - config_.relative_accuracy));
    const auto bins =
        static_cast<std::size_t>(std::ceil(std::log(config_.max_value / config_.min_value) / log_gamma_)) + 1;
    bins_.assign(bins, 0.0);
    growth_ = config_.half_life > 0.0 ? std::exp2(1.0 / config_.half_life) : 1.0;
  }

  /// Counts an observation its caller refused (see rejected()).
  void reject() noexcept { ++rejected_; }

  /// One observation. Non-finite or non-positive values are counted as rejected and ignored.
  void add(double x) noexcept {
    if (!std::isfinite(x) || !(x > 0.0)) {
      ++rejected_;
      return;
    }
    if (x < config_.min_value || x > config_.max_value) ++clamped_;
    // The mean and second moment take the value as the bins hold it: one 1e200 among hundreds of
    // 100s made the mean 5e197 for good.
    x = std::clamp(x, config_.min_value, config_.max_value);
    bins_[index(x)] += increment_;
    total_ += increment_;
    sum_ += increment_ * x;
    sum_sq_ += increment_ * x * x;
    ++observations_;
    increment_ *= growth_;
    if (increment_ > 1e200) rescale();
  }

  /// The q-quantile (q in [0, 1]) of the decayed distribution, within the relative accuracy;
  /// NaN before the first observation.
  double quantile(double q) const noexcept {
    if (!(total_ > 0.0)) return std::numeric_limits<double>::quiet_NaN();
    q = std::clamp(std::isfinite(q) ? q : 1.0, 0.0, 1.0);
    const double target = q * total_;
    double seen = 0.0;
    std::size_t last = 0;
    for (std::size_t i = 0; i < bins_.size(); ++i) {
      if (bins_[i] <= 0.0) continue;
      last = i;
      seen += bins_[i];
      if (seen >= target) return value_of(i);
    }
    return value_of(last);  // rounding: q = 1 lands on the highest non-empty bin
  }

  /// Median of the longest of n independent draws: the quantile 0.5^(1/n).
  double expected_max_of(double n) const noexcept { return quantile(n >= 1.0 ? std::pow(0.5, 1.0 / n) : 0.5); }

  /// Mean of the decayed distribution, of the values as the bins hold them (clamped to
  /// [min_value, max_value], counted in clamped()).
  double mean() const noexcept { return total_ > 0.0 ? sum_ / total_ : std::numeric_limits<double>::quiet_NaN(); }
  double second_moment() const noexcept {
    return total_ > 0.0 ? sum_sq_ / total_ : std::numeric_limits<double>::quiet_NaN();
  }
  /// Weight of everything seen, in units of the newest observation's weight.
  double effective_count() const noexcept { return total_ > 0.0 ? total_ / increment_ * growth_ : 0.0; }
  unsigned long long observations() const noexcept { return observations_; }
  unsigned long long rejected() const noexcept { return rejected_; }
  unsigned long long clamped() const noexcept { return clamped_; }
  std::size_t bin_count() const noexcept { return bins_.size(); }
  const quantile_sketch_config& config() const noexcept { return config_; }
  /// Calls f(value, weight) for every non-empty bin, values ascending (weights are relative).
  template <class F>
  void for_each_bin(F f) const {
    for (std::size_t i = 0; i < bins_.size(); ++i)
      if (bins_[i] > 0.0) f(value_of(i), bins_[i]);
  }

 private:
  std::size_t index(double x) const noexcept {
    if (x <= config_.min_value) return 0;
    const double i = std::ceil(std::log(x / config_.min_value) / log_gamma_);
    return static_cast<std::size_t>(std::min(i, static_cast<double>(bins_.size() - 1)));
  }
  // The value whose relative distance to both bin edges is the accuracy: 2 gamma^i / (gamma + 1).
  double value_of(std::size_t i) const noexcept {
    if (i == 0) return config_.min_value;
    const double gamma = std::exp(log_gamma_);
    return config_.min_value * 2.0 * std::exp(static_cast<double>(i) * log_gamma_) / (gamma + 1.0);
  }
  void rescale() noexcept {
    const double s = 1.0 / increment_;
    for (double& b : bins_) b *= s;
    total_ *= s;
    sum_ *= s;
    sum_sq_ *= s;
    increment_ = 1.0;
  }

  quantile_sketch_config config_;
  double log_gamma_ = 0.0;
  double growth_ = 1.0;
  double increment_ = 1.0;
  double total_ = 0.0, sum_ = 0.0, sum_sq_ = 0.0;
  std::vector<double> bins_;
  unsigned long long observations_ = 0, rejected_ = 0, clamped_ = 0;
};

}  // namespace dra::signals
