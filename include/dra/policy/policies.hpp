#pragma once
// Resize policies: each maps (signals, world, capacity, costs, throughput) to a proposed size.
// Proposals are then filtered by `constrained_policy` (constraints.hpp), which every live job and
// the simulator use unchanged. Deterministic: plain double arithmetic, ordered containers only,
// so every rank computing the same inputs gets the same decision bit for bit.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <system_error>

#include "dra/error.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/policy/types.hpp"
#include "dra/signals/convergence_estimator.hpp"

namespace dra::policy {

/// Everything a policy may look at for one decision.
struct decision_inputs {
  const signals::convergence_signals& signals;
  const world_state& world;
  const capacity& cap;
  const cost_model& costs;
  const throughput_predictor& throughput;
};

/// A proposal before constraints: a size and, optionally, a new global batch.
struct proposal {
  int target_size = 1;
  double global_batch = 0.0;  ///< 0: keep the current global batch
  std::string reason;
};

class policy {
 public:
  virtual ~policy() = default;
  virtual const char* name() const noexcept = 0;
  /// Search range [lo, hi] is already clamped by the caller to constraints and capacity.
  virtual proposal propose(const decision_inputs& in, int lo, int hi) const = 0;
};

namespace detail {
/// printf-style formatting of up to three doubles for decision reasons. Conversions of the form
/// %.<precision>f/g/e and %% go through std::to_chars (same output as printf, several times
/// faster: reasons are built on every decision, so on dra.step's path); any other conversion
/// falls back to snprintf for the whole string.
inline std::string fmt(const char* format, double a, double b = 0.0, double c = 0.0) {
  const double args[3] = {a, b, c};
  std::string out;
  out.reserve(96);
  int next = 0;
  for (const char* p = format; *p != '\0'; ++p) {
    if (*p != '%') {
      out.push_back(*p);
      continue;
    }
    if (p[1] == '%') {
      out.push_back('%');
      ++p;
      continue;
    }
    const char* q = p + 1;
    int precision = -1;
    if (*q == '.') {
      precision = 0;
      for (++q; *q >= '0' && *q <= '9'; ++q) precision = precision * 10 + (*q - '0');
    }
    std::chars_format style{};
    if (*q == 'f') {
      style = std::chars_format::fixed;
    } else if (*q == 'g') {
      style = std::chars_format::general;
    } else if (*q == 'e') {
      style = std::chars_format::scientific;
    } else {
      precision = -2;  // not ours
    }
    if (precision < 0 || next >= 3) {
      char buf[256];
      std::snprintf(buf, sizeof buf, format, a, b, c);
      return buf;
    }
    char num[64];
    const auto res = std::to_chars(num, num + sizeof num, args[next++], style, precision);
    if (res.ec != std::errc()) {
      char buf[256];
      std::snprintf(buf, sizeof buf, format, a, b, c);
      return buf;
    }
    out.append(num, res.ptr);
    p = q;
  }
  return out;
}
}  // namespace detail

/// Goodput of a world size at a global batch: samples/s x statistical efficiency.
inline double goodput(const decision_inputs& in, int size, double global_batch) {
  const double per_rank = global_batch / size;
  return in.throughput.throughput(size, per_rank) *
         statistical_efficiency(in.signals.gns, in.signals.gns_valid, global_batch, in.world.base_batch);
}

struct goodput_config {
  /// Marginal parallel efficiency a bigger world must clear: going from K to K' is accepted when
  /// (goodput(K')/goodput(K) - 1) / ((K' - K)/K) >= this. 0.5: each added device must bring at least
  /// half of a proportional share of goodput.
  double min_marginal_efficiency = 0.5;
  /// Adapt the global batch too (Pollux co-adaptation, AdaScale LR): candidate global batches are
  /// powers of two times the current per-rank batch between min_ and max_per_rank_batch.
  bool adapt_batch = false;
  double min_per_rank_batch = 1.0;
  double max_per_rank_batch = 1024.0;

  void validate() const {
    if (!(min_marginal_efficiency >= 0.0 && min_marginal_efficiency <= 1.0))
      dra::detail::throw_invalid("min_marginal_efficiency",
                                 "must lie in [0, 1], got " + std::to_string(min_marginal_efficiency));
    if (!(min_per_rank_batch > 0.0 && std::isfinite(min_per_rank_batch)))
      dra::detail::throw_invalid("min_per_rank_batch",
                                 "must be a finite number > 0, got " + detail::fmt("%g", min_per_rank_batch));
    // The candidate batches double from the minimum up to the maximum: an infinite maximum never
    // ended the list (the first decision did not return).
    if (!std::isfinite(max_per_rank_batch))
      dra::detail::throw_invalid(
          "max_per_rank_batch",
          "must be a finite number (the candidates double up to it), got " + detail::fmt("%g", max_per_rank_batch));
    if (!(max_per_rank_batch >= min_per_rank_batch))
      dra::detail::throw_invalid("max_per_rank_batch",
                                 "must be >= min_per_rank_batch (" + std::to_string(min_per_rank_batch) + ")");
  }
};

/// Pollux-style: the size (and optionally batch) that maximises goodput, growing only while the
/// marginal gain of the added devices clears the threshold.
class goodput_policy final : public policy {
 public:
  explicit goodput_policy(goodput_config config = {}) : config_((config.validate(), config)) {}
  const char* name() const noexcept override { return "goodput"; }
  const goodput_config& config() const noexcept { return config_; }

  proposal propose(const decision_inputs& in, int lo, int hi) const override {
    int best_size = lo;
    double best_batch = best_global_batch(in, lo);
    double best_goodput = goodput(in, lo, best_batch);
    for (int size = lo + 1; size <= hi; ++size) {
      const double batch = best_global_batch(in, size);
      const double g = goodput(in, size, batch);
      if (!(best_goodput > 0.0)) {
        if (g > best_goodput) best_size = size, best_batch = batch, best_goodput = g;
        continue;
      }
      const double marginal = (g / best_goodput - 1.0) / (static_cast<double>(size - best_size) / best_size);
      if (marginal >= config_.min_marginal_efficiency) best_size = size, best_batch = batch, best_goodput = g;
    }
    proposal out;
    out.target_size = best_size;
    out.global_batch = config_.adapt_batch ? best_batch : 0.0;
    const double current = goodput(in, in.world.size, in.world.global_batch);
    out.reason =
        "goodput: size " + std::to_string(best_size) +
        detail::fmt(" maximises goodput (%.4g samples/s effective, x%.3f vs current) at marginal efficiency >= %.2f",
                    best_goodput, current > 0.0 ? best_goodput / current : 1.0, config_.min_marginal_efficiency);
    return out;
  }

 private:
  double best_global_batch(const decision_inputs& in, int size) const {
    if (!config_.adapt_batch) return in.world.global_batch;
    double best = in.world.global_batch, best_g = goodput(in, size, best);
    for (double per_rank = config_.min_per_rank_batch; per_rank <= config_.max_per_rank_batch; per_rank *= 2.0) {
      const double batch = per_rank * size;
      const double g = goodput(in, size, batch);
      if (g > best_g) best = batch, best_g = g;
    }
    return best;
  }
  goodput_config config_;
};

struct convergence_phase_config {
  /// Devices added per grow decision.
  int grow_step = 1;
  /// Grow only while the predicted parallel efficiency of the bigger world stays above this:
  /// (goodput(K')/goodput(K)) / (K'/K).
  double min_parallel_efficiency = 0.6;
  /// On plateau, shrink to this size (clamped to the constraints' minimum).
  int plateau_size = 1;

  void validate() const {
    if (grow_step < 1) dra::detail::throw_invalid("grow_step", "must be >= 1, got " + std::to_string(grow_step));
    if (!(min_parallel_efficiency >= 0.0 && min_parallel_efficiency <= 1.0))
      dra::detail::throw_invalid("min_parallel_efficiency",
                                 "must lie in [0, 1], got " + std::to_string(min_parallel_efficiency));
    if (plateau_size < 1)
      dra::detail::throw_invalid("plateau_size", "must be >= 1, got " + std::to_string(plateau_size));
  }
};

/// The DRA framework's rule: grow while learning is fast and parallel efficiency holds; shrink and
/// release on plateau; hold while warming up, steady or diverging.
class convergence_phase_policy final : public policy {
 public:
  explicit convergence_phase_policy(convergence_phase_config config = {}) : config_((config.validate(), config)) {}
  const char* name() const noexcept override { return "convergence"; }
  const convergence_phase_config& config() const noexcept { return config_; }

  proposal propose(const decision_inputs& in, int lo, int hi) const override {
    using signals::training_phase;
    const int current = in.world.size;
    proposal out;
    out.target_size = std::clamp(current, lo, hi);
    switch (in.signals.phase) {
      case training_phase::warmup:
        out.reason = "convergence: warming up, hold";
        return out;
      case training_phase::diverging:
        out.reason = "convergence: loss diverging, hold (never resize a diverging run)";
        return out;
      case training_phase::steady:
        out.reason = detail::fmt("convergence: steady progress (%.3g%% per window), hold",
                                 100.0 * in.signals.relative_improvement);
        return out;
      case training_phase::plateau:
        out.target_size = std::max(lo, std::min(config_.plateau_size, hi));
        out.reason = detail::fmt("convergence: plateau for %.0f updates (%.3g%% per window), release devices",
                                 static_cast<double>(in.signals.flat_streak), 100.0 * in.signals.relative_improvement);
        return out;
      case training_phase::fast: {
        const int bigger = std::min(current + config_.grow_step, hi);
        if (bigger <= current) {
          out.reason = "convergence: fast progress but no room to grow, hold";
          return out;
        }
        const double g_now = goodput(in, current, in.world.global_batch);
        const double g_big = goodput(in, bigger, in.world.global_batch);
        const double efficiency = g_now > 0.0 ? (g_big / g_now) / (static_cast<double>(bigger) / current) : 0.0;
        if (efficiency >= config_.min_parallel_efficiency) {
          out.target_size = bigger;
          out.reason =
              detail::fmt("convergence: fast progress (%.3g%% per window) and parallel efficiency %.2f >= %.2f, grow",
                          100.0 * in.signals.relative_improvement, efficiency, config_.min_parallel_efficiency);
        } else {
          out.reason =
              detail::fmt("convergence: fast progress but parallel efficiency %.2f < %.2f at the next size, hold",
                          efficiency, config_.min_parallel_efficiency);
        }
        return out;
      }
    }
    out.reason = "convergence: hold";
    return out;
  }

 private:
  convergence_phase_config config_;
};

/// No policy: the world changes only when asked (a resize schedule, a device pool's limit).
class hold_policy final : public policy {
 public:
  const char* name() const noexcept override { return "none"; }
  proposal propose(const decision_inputs& in, int lo, int hi) const override {
    proposal out;
    out.target_size = std::clamp(in.world.size, lo, hi);
    out.reason = "none: no policy, hold (resizes come from the schedule or the pool)";
    return out;
  }
};

}  // namespace dra::policy
