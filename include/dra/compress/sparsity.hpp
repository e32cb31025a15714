#pragma once
// Dynamic sparse training (docs/design/sustainable.md): RigL's mask update (Evci et al., ICML'20:
// drop the smallest-magnitude active weights, regrow the inactive ones whose dense gradient is
// largest, a cosine-decayed fraction per update), its schedules (the target following the
// convergence phase, or Zhu & Gupta's cubic ramp), and the PowerSGD rank from the noise scale. The
// masks read only values every data-parallel rank holds identically (the weights and the
// all-reduced dense gradient) and break ties with a seeded key, so every rank derives the same mask
// without exchanging it. rigl.hpp keeps the masks of a model and syncs its gradients.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"
#include "dra/signals/convergence_estimator.hpp"

namespace dra::compress {

/// A mask update's outcome for one tensor.
struct mask_update {
  std::size_t dropped = 0;  ///< active before, inactive after
  std::size_t regrown = 0;  ///< inactive before, active after
  std::size_t active = 0;
};

/// The tie-break seed of one tensor's update: the job's seed, the step and the tensor's index, so
/// that every rank draws the same keys and successive updates draw different ones.
inline std::uint64_t rigl_tie_seed(std::uint64_t seed, std::int64_t step, std::size_t tensor) noexcept {
  std::uint64_t s = seed;
  dra::elastic::detail::splitmix64(s);
  s ^= static_cast<std::uint64_t>(step) * 0xD1B54A32D192ED03ull;
  dra::elastic::detail::splitmix64(s);
  s ^= static_cast<std::uint64_t>(tensor) * 0x8CB92BA72F3D8DD7ull;
  return dra::elastic::detail::splitmix64(s);
}

/// RigL's update of one tensor's mask (1 active, 0 pruned), in place, to round((1 - sparsity) x n)
/// active entries. First the active count moves to that target (dra's addition, for a target that
/// follows the training phase: the smallest |w| are pruned, or the largest |g| regrown). Then RigL's
/// swap as published: n_drop = floor(update_fraction x active) active entries of smallest |w| are
/// dropped, and n_drop entries of largest |g| are grown among every entry not kept (a just-dropped
/// one may be grown back: it then stays active). `grads` must be the dense gradient (all entries,
/// averaged over the ranks), not the masked one. Exact ties in |w| or |g| are broken by a key
/// drawn from `tie_seed` (rigl_tie_seed): at random, identically on every rank. NaN counts as 0.
inline mask_update rigl_update(std::vector<std::uint8_t>& mask, const float* weights, const float* grads, std::size_t n,
                               double sparsity, double update_fraction, std::uint64_t tie_seed = 0) {
  if (mask.size() != n)
    dra::detail::throw_invalid("mask",
                               "has " + std::to_string(mask.size()) + " entries for " + std::to_string(n) + " weights");
  if (!(sparsity >= 0.0 && sparsity < 1.0))
    dra::detail::throw_invalid("sparsity", "must lie in [0, 1), got " + std::to_string(sparsity));
  if (!(update_fraction >= 0.0 && update_fraction <= 1.0))
    dra::detail::throw_invalid("update_fraction", "must lie in [0, 1], got " + std::to_string(update_fraction));
  if (n > std::numeric_limits<std::uint32_t>::max())  // its index lists are 32-bit: they would wrap
    dra::detail::throw_invalid("mask", "has " + std::to_string(n) +
                                           " entries; RigL's update indexes at most 4294967295 per tensor: split the "
                                           "parameter");
  mask_update out;
  if (n == 0) return out;
  const std::size_t target =
      std::max<std::size_t>(1, static_cast<std::size_t>(std::llround((1.0 - sparsity) * static_cast<double>(n))));
  auto key = [tie_seed](std::uint32_t i) {
    std::uint64_t s = tie_seed ^ (static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull);
    return dra::elastic::detail::splitmix64(s);
  };
  auto magnitude = [](float v) { return std::isnan(v) ? 0.0f : std::fabs(v); };
  // Strict total orders: by magnitude, then the random key, then the index (keys may collide).
  auto smaller_weight = [&](std::uint32_t a, std::uint32_t b) {
    const float x = magnitude(weights[a]), y = magnitude(weights[b]);
    if (x != y) return x < y;
    const auto ka = key(a), kb = key(b);
    return ka != kb ? ka < kb : a < b;
  };
  auto larger_grad = [&](std::uint32_t a, std::uint32_t b) {
    const float x = magnitude(grads[a]), y = magnitude(grads[b]);
    if (x != y) return x > y;
    const auto ka = key(a), kb = key(b);
    return ka != kb ? ka < kb : a < b;
  };
  // The k first of `v` in `order` (any order among them): nth_element, O(n).
  auto first_k = [](std::vector<std::uint32_t>& v, std::size_t k, const auto& order) {
    if (k > 0 && k < v.size())
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k - 1), v.end(), order);
  };
  const std::vector<std::uint8_t> before = mask;
  std::vector<std::uint32_t> active, inactive;
  for (std::size_t i = 0; i < n; ++i) (mask[i] ? active : inactive).push_back(static_cast<std::uint32_t>(i));
  // 1. Move the active count to the target.
  if (active.size() > target) {
    const std::size_t k = active.size() - target;
    first_k(active, k, smaller_weight);
    for (std::size_t i = 0; i < k; ++i) mask[active[i]] = 0;
    inactive.insert(inactive.end(), active.begin(), active.begin() + static_cast<std::ptrdiff_t>(k));
    active.erase(active.begin(), active.begin() + static_cast<std::ptrdiff_t>(k));
  } else if (active.size() < target) {
    const std::size_t k = target - active.size();
    first_k(inactive, k, larger_grad);
    for (std::size_t i = 0; i < k; ++i) mask[inactive[i]] = 1;
    active.insert(active.end(), inactive.begin(), inactive.begin() + static_cast<std::ptrdiff_t>(k));
    inactive.erase(inactive.begin(), inactive.begin() + static_cast<std::ptrdiff_t>(k));
  }
  // 2. RigL's swap: drop by magnitude, then grow by the dense gradient among all entries not kept.
  const auto n_drop = std::min(
      active.size(), static_cast<std::size_t>(std::floor(update_fraction * static_cast<double>(active.size()))));
  if (n_drop > 0) {
    first_k(active, n_drop, smaller_weight);
    for (std::size_t i = 0; i < n_drop; ++i) {
      mask[active[i]] = 0;
      inactive.push_back(active[i]);
    }
    first_k(inactive, n_drop, larger_grad);
    for (std::size_t i = 0; i < n_drop; ++i) mask[inactive[i]] = 1;
  }
  for (std::size_t i = 0; i < n; ++i) {
    out.dropped += before[i] && !mask[i];
    out.regrown += !before[i] && mask[i];
  }
  out.active = target;
  return out;
}

/// RigL's cosine decay of the swapped fraction: alpha/2 (1 + cos(pi t / t_end)), 0 after t_end.
inline double rigl_update_fraction(double alpha, std::int64_t step, std::int64_t end_step) {
  if (end_step <= 0 || step >= end_step) return 0.0;
  return 0.5 * alpha *
         (1.0 + std::cos(3.14159265358979323846 * static_cast<double>(step) / static_cast<double>(end_step)));
}

/// Zhu & Gupta's gradual schedule: 0 until `start`, `final` after start + steps, cubic in between.
inline double cubic_sparsity(std::int64_t step, std::int64_t start, std::int64_t steps, double final_sparsity) {
  if (step <= start) return 0.0;
  if (steps <= 0) return final_sparsity;
  const double done = std::min(1.0, static_cast<double>(step - start) / static_cast<double>(steps));
  return final_sparsity * (1.0 - std::pow(1.0 - done, 3.0));
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

/// How a model's masks move (rigl.hpp). RigL's published defaults: an update every 100 steps,
/// 30 % of the active entries swapped at first, no update after end_step (RigL: 75 % of training).
struct rigl_config {
  double max_sparsity = 0.9;      ///< the sparsest the matrices get
  std::int64_t every = 100;       ///< steps between mask updates (RigL's delta T)
  double alpha = 0.3;             ///< swapped fraction at step 0, cosine-decayed to 0 at end_step
  std::int64_t end_step = 10000;  ///< the last update is before this step; the topology is then fixed
  double step_up = 0.2;           ///< the phase rule (next_sparsity)
  double step_down = 0.3;
  /// ramp_steps > 0: the target follows Zhu & Gupta's cubic ramp from ramp_start to max_sparsity
  /// instead of the phase (the schedule torch.ao's CubicSL uses: a like-for-like comparison).
  std::int64_t ramp_start = 0;
  std::int64_t ramp_steps = 0;

  void validate() const {
    sparsity_schedule_config{max_sparsity, step_up, step_down}.validate();
    if (every < 1) dra::detail::throw_invalid("every", "must be >= 1 step, got " + std::to_string(every));
    if (!(alpha >= 0.0 && alpha <= 1.0))
      dra::detail::throw_invalid("alpha", "must lie in [0, 1], got " + std::to_string(alpha));
    if (end_step < 0) dra::detail::throw_invalid("end_step", "must be >= 0, got " + std::to_string(end_step));
    if (ramp_start < 0 || ramp_steps < 0)
      dra::detail::throw_invalid("ramp_steps", "ramp_start and ramp_steps must be >= 0 (0 steps: follow the phase)");
    // The masks move only at steps k * every < end_step (after ramp_start, with a ramp: before it
    // the ramp's target is dense). With none, training stays dense and nothing says so.
    const std::int64_t k = (ramp_steps > 0 ? ramp_start / every : 0) + 1;  // the first update: step k * every
    if (k > (end_step - 1) / every) {
      const std::string first =
          k <= std::numeric_limits<std::int64_t>::max() / every ? std::to_string(k * every) : std::string("past 2^63");
      dra::detail::throw_invalid(
          "end_step", "the masks would never move: they update at multiples of every (" + std::to_string(every) +
                          ") below end_step (" + std::to_string(end_step) + ")" +
                          (ramp_steps > 0 ? " and, with a ramp, after ramp_start (" + std::to_string(ramp_start) + ")"
                                          : std::string()) +
                          "; the first would be step " + first + "; give end_step > " + first +
                          " (RigL: about 75 % of training)");
    }
  }
  /// The target at a mask update: the cubic ramp, or the phase rule from the current sparsity.
  double target(double current, std::int64_t step, signals::training_phase phase) const {
    if (ramp_steps > 0) return cubic_sparsity(step, ramp_start, ramp_steps, max_sparsity);
    return next_sparsity({max_sparsity, step_up, step_down}, current, phase);
  }
  /// Whether the reduction after `step` completed steps updates the masks.
  bool update_due(std::int64_t step) const { return step > 0 && step % every == 0 && step < end_step; }
  bool operator==(const rigl_config& o) const {
    return max_sparsity == o.max_sparsity && every == o.every && alpha == o.alpha && end_step == o.end_step &&
           step_up == o.step_up && step_down == o.step_down && ramp_start == o.ramp_start && ramp_steps == o.ramp_steps;
  }
};

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
