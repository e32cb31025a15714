#pragma once
// Gradient noise scale B_simple = tr(Sigma) / |G|^2 from two batch sizes (McCandlish et al. 2018,
// appendix A.1), numerator and denominator each smoothed by its own bias-corrected EMA (a ratio of
// averages is far less biased than an average of ratios). With one replica the caller may pair
// consecutive steps' gradients: flagged biased, since they are correlated. The estimators:
// docs/design/policies.md.
#include <cmath>

namespace dra::signals {

class gradient_noise_scale {
 public:
  explicit gradient_noise_scale(double decay) noexcept : decay_(decay) {}

  /// Returns false (and leaves the state untouched) for non-finite or negative norms, non-positive
  /// batches, big_batch <= small_batch, or values so large that the smoothed moments would overflow.
  bool update(double small_sqr_norm, double small_batch, double big_sqr_norm, double big_batch) noexcept {
    if (!std::isfinite(small_sqr_norm) || !std::isfinite(big_sqr_norm) || !std::isfinite(small_batch) ||
        !std::isfinite(big_batch) || small_sqr_norm < 0.0 || big_sqr_norm < 0.0 || !(small_batch > 0.0) ||
        !(big_batch > small_batch)) {
      return false;
    }
    const double grad_sqr = (big_batch * big_sqr_norm - small_batch * small_sqr_norm) / (big_batch - small_batch);
    const double grad_var = (small_sqr_norm - big_sqr_norm) / (1.0 / small_batch - 1.0 / big_batch);
    if (!std::isfinite(grad_sqr) || !std::isfinite(grad_var)) return false;
    // Commit only if the smoothed, bias-corrected moments stay finite: inputs near the largest
    // double can overflow in the average or the correction, and an inf would never leave the EMA.
    const double sqr_ema = decay_ * sqr_ema_ + (1.0 - decay_) * grad_sqr;
    const double var_ema = decay_ * var_ema_ + (1.0 - decay_) * grad_var;
    const double decay_power = decay_power_ * decay_;
    if (!std::isfinite(sqr_ema / (1.0 - decay_power)) || !std::isfinite(var_ema / (1.0 - decay_power))) return false;
    sqr_ema_ = sqr_ema;
    var_ema_ = var_ema;
    decay_power_ = decay_power;
    ++updates_;
    return true;
  }

  double grad_sqr() const noexcept { return updates_ ? sqr_ema_ / (1.0 - decay_power_) : 0.0; }
  double grad_var() const noexcept { return updates_ ? var_ema_ / (1.0 - decay_power_) : 0.0; }
  /// Positive smoothed |G|^2 and non-negative tr(Sigma): only then is the ratio meaningful.
  bool valid() const noexcept { return updates_ > 0 && grad_sqr() > 0.0 && grad_var() >= 0.0; }
  double noise_scale() const noexcept {
    if (!valid()) return 0.0;
    const double b = grad_var() / grad_sqr();
    return std::isfinite(b) ? b : 0.0;
  }
  unsigned long long updates() const noexcept { return updates_; }

 private:
  double decay_;
  double sqr_ema_ = 0.0, var_ema_ = 0.0, decay_power_ = 1.0;
  unsigned long long updates_ = 0;
};

}  // namespace dra::signals
