#pragma once
// Dynamic sparsification (docs/design/sustainable.md): masks updated every few hundred steps in the manner of
// RigL (Evci et al., ICML'20: drop the smallest-magnitude active weights, regrow the inactive ones
// with the largest gradient), derived only from values every rank holds identically (the weights,
// which data-parallel ranks keep equal, and the all-reduced gradient), with ties broken by index,
// so every rank computes the same mask without exchanging it. How sparse the model should be
// follows the convergence phase; how much PowerSGD may compress follows the gradient noise scale.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/signals/convergence_estimator.hpp"

namespace dra::compress {

/// A mask update's outcome for one tensor.
struct mask_update {
  std::size_t dropped = 0;
  std::size_t regrown = 0;
  std::size_t active = 0;
};

/// RigL's update for one tensor. `mask` (1 active, 0 pruned) is changed in place to have
/// round((1 - sparsity) x n) active entries: first the active count is moved to that target
/// (pruning the smallest |w| or regrowing the largest |g|), then `update_fraction` of the active
/// entries are swapped: the smallest-|w| active dropped, the largest-|g| inactive regrown (a
/// just-dropped entry is not regrown in the same update). Deterministic: ties go to the lower index.
inline mask_update rigl_update(std::vector<std::uint8_t>& mask, const float* weights, const float* grads, std::size_t n,
                               double sparsity, double update_fraction) {
  if (mask.size() != n)
    dra::detail::throw_invalid("mask",
                               "has " + std::to_string(mask.size()) + " entries for " + std::to_string(n) + " weights");
  if (!(sparsity >= 0.0 && sparsity < 1.0))
    dra::detail::throw_invalid("sparsity", "must lie in [0, 1), got " + std::to_string(sparsity));
  if (!(update_fraction >= 0.0 && update_fraction <= 1.0))
    dra::detail::throw_invalid("update_fraction", "must lie in [0, 1], got " + std::to_string(update_fraction));
  const std::size_t target =
      std::max<std::size_t>(1, static_cast<std::size_t>(std::llround((1.0 - sparsity) * static_cast<double>(n))));
  std::vector<std::uint32_t> active, inactive;
  for (std::size_t i = 0; i < n; ++i) (mask[i] ? active : inactive).push_back(static_cast<std::uint32_t>(i));
  auto by_weight = [&](std::uint32_t a, std::uint32_t b) {  // smallest |w| first
    const float x = std::fabs(weights[a]), y = std::fabs(weights[b]);
    return x < y || (x == y && a < b);
  };
  auto by_grad = [&](std::uint32_t a, std::uint32_t b) {  // largest |g| first
    const float x = std::fabs(grads[a]), y = std::fabs(grads[b]);
    return x > y || (x == y && a < b);
  };
  mask_update out;
  // 1. Move the active count to the target.
  if (active.size() > target) {
    const std::size_t k = active.size() - target;
    std::partial_sort(active.begin(), active.begin() + static_cast<std::ptrdiff_t>(k), active.end(), by_weight);
    for (std::size_t i = 0; i < k; ++i) mask[active[i]] = 0;
    out.dropped += k;
    active.erase(active.begin(), active.begin() + static_cast<std::ptrdiff_t>(k));
  } else if (active.size() < target) {
    const std::size_t k = target - active.size();
    std::partial_sort(inactive.begin(), inactive.begin() + static_cast<std::ptrdiff_t>(k), inactive.end(), by_grad);
    for (std::size_t i = 0; i < k; ++i) mask[inactive[i]] = 1;
    out.regrown += k;
    inactive.erase(inactive.begin(), inactive.begin() + static_cast<std::ptrdiff_t>(k));
  }
  // 2. Swap a fraction: drop by magnitude, regrow by gradient.
  const std::size_t swap =
      std::min({static_cast<std::size_t>(std::floor(update_fraction * static_cast<double>(target))), active.size(),
                inactive.size()});
  if (swap > 0) {
    std::partial_sort(active.begin(), active.begin() + static_cast<std::ptrdiff_t>(swap), active.end(), by_weight);
    std::partial_sort(inactive.begin(), inactive.begin() + static_cast<std::ptrdiff_t>(swap), inactive.end(), by_grad);
    for (std::size_t i = 0; i < swap; ++i) mask[active[i]] = 0;
    for (std::size_t i = 0; i < swap; ++i) mask[inactive[i]] = 1;
    out.dropped += swap;
    out.regrown += swap;
  }
  out.active = target;
  return out;
}

/// RigL's cosine decay of the swapped fraction: alpha/2 (1 + cos(pi t / t_end)), 0 after t_end.
inline double rigl_update_fraction(double alpha, std::int64_t step, std::int64_t end_step) {
  if (end_step <= 0 || step >= end_step) return 0.0;
  return 0.5 * alpha * (1.0 + std::cos(M_PI * static_cast<double>(step) / static_cast<double>(end_step)));
}

struct sparsity_schedule_config {
  double max_sparsity = 0.9;  ///< the sparsest the model gets (steady or plateau)
  double step_up = 0.2;       ///< added per mask update while steady or on a plateau
  double step_down = 0.3;     ///< removed per mask update on divergence
  void validate() const {
    if (!(max_sparsity >= 0.0 && max_sparsity < 1.0))
      dra::detail::throw_invalid("max_sparsity", "must lie in [0, 1), got " + std::to_string(max_sparsity));
    if (!(step_up > 0.0 && step_up <= 1.0)) dra::detail::throw_invalid("step_up", "must lie in (0, 1]");
    if (!(step_down > 0.0 && step_down <= 1.0)) dra::detail::throw_invalid("step_down", "must lie in (0, 1]");
  }
};

/// Target sparsity from the convergence phase: dense while warming up or learning fast, sparser
/// (by step_up per update, up to max_sparsity) once steady or on a plateau, denser again (by
/// step_down) when the loss diverges.
inline double next_sparsity(const sparsity_schedule_config& c, double current, signals::training_phase phase) {
  using signals::training_phase;
  switch (phase) {
    case training_phase::warmup:
    case training_phase::fast:
      return current;  // keep what we have: never prune while learning fast
    case training_phase::steady:
    case training_phase::plateau:
      return std::min(c.max_sparsity, current + c.step_up);
    case training_phase::diverging:
      return std::max(0.0, current - c.step_down);
  }
  return current;
}

struct rank_schedule_config {
  int min_rank = 1;
  int max_rank = 8;
  void validate() const {
    if (min_rank < 1) dra::detail::throw_invalid("min_rank", "must be >= 1, got " + std::to_string(min_rank));
    if (max_rank < min_rank)
      dra::detail::throw_invalid("max_rank", "must be >= min_rank (" + std::to_string(min_rank) + ")");
  }
};

/// PowerSGD rank from the gradient noise scale B (McCandlish et al.): the signal fraction of a
/// batch-M gradient is M / (M + B). A noise-dominated gradient (B >> M) carries little signal per
/// step, so a low rank keeps it (the rest is noise that error feedback carries anyway); a
/// signal-dominated one gets up to max_rank. Without a valid noise scale: max_rank (the safe side).
inline int rank_for_noise_scale(const rank_schedule_config& c, double noise_scale, bool valid, double global_batch) {
  if (!valid || !(noise_scale >= 0.0) || !(global_batch > 0.0)) return c.max_rank;
  const double signal = global_batch / (global_batch + noise_scale);
  const int r = static_cast<int>(std::lround(c.min_rank + signal * (c.max_rank - c.min_rank)));
  return std::clamp(r, c.min_rank, c.max_rank);
}

}  // namespace dra::compress
