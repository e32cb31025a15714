#pragma once
// Least-squares line over the last N (x, y) points, updated in O(1) per point.
//
// Running sums are kept relative to a reference x (the first point of the current epoch of sums)
// so large step indices do not cancel catastrophically; every `capacity` pushes the sums are
// recomputed from the ring buffer, which bounds floating-point drift at amortised O(1) cost.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dra::signals::detail {

struct line_fit {
  bool valid = false;  ///< at least 3 points with distinct x
  double slope = 0.0;
  double slope_stderr = 0.0;
  double residual_std = 0.0;
  double mean_x = 0.0;  ///< the line passes through (mean_x, mean_y)
  double mean_y = 0.0;
  double at(double x) const noexcept { return mean_y + slope * (x - mean_x); }
};

class windowed_regression {
 public:
  explicit windowed_regression(std::size_t capacity) : xs_(capacity), ys_(capacity) {}

  std::size_t size() const noexcept { return count_; }
  bool full() const noexcept { return count_ == xs_.size(); }

  void push(double x, double y) noexcept {
    const std::size_t cap = xs_.size();
    if (count_ == 0) reference_x_ = x;
    if (count_ == cap) {
      remove_from_sums(xs_[head_], ys_[head_]);
    } else {
      ++count_;
    }
    xs_[head_] = x;
    ys_[head_] = y;
    add_to_sums(x, y);
    if (++head_ == cap) head_ = 0;  // not %: an integer division costs more than the whole fit
    if (++pushes_since_rebuild_ >= cap) rebuild_sums();
  }

  line_fit fit() const noexcept {
    line_fit out;
    if (count_ < 3) return out;
    // Three independent reciprocals instead of six dependent divisions: this runs on every update.
    const double n = static_cast<double>(count_);
    const double inv_n = 1.0 / n;
    const double inv_dof = 1.0 / (n - 2.0);
    const double mean_x = sx_ * inv_n;
    const double mean_y = sy_ * inv_n;
    const double sxx = std::max(0.0, sxx_ - n * mean_x * mean_x);
    const double sxy = sxy_ - n * mean_x * mean_y;
    const double syy = std::max(0.0, syy_ - n * mean_y * mean_y);
    if (!(sxx > 0.0)) return out;
    const double inv_sxx = 1.0 / sxx;
    out.valid = true;
    out.slope = sxy * inv_sxx;
    const double rss = std::max(0.0, syy - out.slope * sxy);
    const double residual_var = rss * inv_dof;
    out.residual_std = std::sqrt(residual_var);
    out.slope_stderr = std::sqrt(residual_var * inv_sxx);
    out.mean_x = reference_x_ + mean_x;
    out.mean_y = mean_y;
    if (!std::isfinite(out.slope) || !std::isfinite(out.slope_stderr)) return line_fit{};
    return out;
  }

 private:
  void add_to_sums(double x, double y) noexcept {
    const double dx = x - reference_x_;
    sx_ += dx;
    sy_ += y;
    sxx_ += dx * dx;
    sxy_ += dx * y;
    syy_ += y * y;
  }
  void remove_from_sums(double x, double y) noexcept {
    const double dx = x - reference_x_;
    sx_ -= dx;
    sy_ -= y;
    sxx_ -= dx * dx;
    sxy_ -= dx * y;
    syy_ -= y * y;
  }
  void rebuild_sums() noexcept {
    pushes_since_rebuild_ = 0;
    sx_ = sy_ = sxx_ = sxy_ = syy_ = 0.0;
    // Oldest point still in the window becomes the new reference.
    const std::size_t cap = xs_.size();
    const std::size_t oldest = count_ == cap ? head_ : 0;
    reference_x_ = xs_[oldest];
    for (std::size_t i = 0; i < count_; ++i) add_to_sums(xs_[(oldest + i) % cap], ys_[(oldest + i) % cap]);
  }

  std::vector<double> xs_, ys_;
  std::size_t head_ = 0, count_ = 0, pushes_since_rebuild_ = 0;
  double reference_x_ = 0.0;
  double sx_ = 0.0, sy_ = 0.0, sxx_ = 0.0, sxy_ = 0.0, syy_ = 0.0;
};

}  // namespace dra::signals::detail
