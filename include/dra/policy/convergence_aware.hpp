#pragma once
// The convergence-aware policy of one job: size and global batch chosen together by goodput (the
// noise scale grows by orders of magnitude over training, so large batches and the devices to run
// them pay off late), a device kept only while it earns its price, the price raised on a plateau
// under contention. The rules, their defaults and why: docs/guide/policy.md
// and docs/design/policies.md. Its cluster form
// (remaining work tilting the arbiter) is completion_config in cluster_arbiter.hpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/policies.hpp"

namespace dra::policy {

struct convergence_aware_config {
  /// Price floor per device, in single-device goodputs (see above). 0 keeps every device that adds
  /// any goodput; 1 keeps only devices that scale perfectly.
  double price_floor = 0.1;
  /// Price while the job is on a plateau and the lender reports contention (device_price > 0).
  double plateau_price = 0.9;
  /// A change must raise the job's net value (goodput - price x devices) by at least this fraction
  /// of its current goodput.
  double min_gain = 0.02;
  /// Batch co-adaptation: the largest global batch (0: keep the current batch, size only), the
  /// smallest per-rank batch, and how many global batches are tried (geometric between
  /// max(base batch, min_per_rank_batch x size) and max_global_batch). Only with a valid noise scale.
  double max_global_batch = 0.0;
  double min_per_rank_batch = 1.0;
  int batch_candidates = 24;

  void validate() const {
    if (!(price_floor >= 0.0 && price_floor <= 1.0))
      dra::detail::throw_invalid("price_floor", "must lie in [0, 1], got " + std::to_string(price_floor));
    if (!(plateau_price >= price_floor && plateau_price <= 1.0))
      dra::detail::throw_invalid("plateau_price", "must lie in [price_floor, 1] = [" + std::to_string(price_floor) +
                                                      ", 1], got " + std::to_string(plateau_price));
    if (!(min_gain >= 0.0)) dra::detail::throw_invalid("min_gain", "must be >= 0, got " + std::to_string(min_gain));
    if (!(max_global_batch >= 0.0))
      dra::detail::throw_invalid("max_global_batch",
                                 "must be >= 0 (0: keep the batch), got " + std::to_string(max_global_batch));
    if (!(min_per_rank_batch > 0.0))
      dra::detail::throw_invalid("min_per_rank_batch", "must be > 0, got " + std::to_string(min_per_rank_batch));
    if (batch_candidates < 1)
      dra::detail::throw_invalid("batch_candidates", "must be >= 1, got " + std::to_string(batch_candidates));
  }
};

/// Net value of holding `size` devices: goodput minus the price of the devices, in goodput units.
inline double net_value(double goodput_at_size, int size, double price, double one_device_goodput) {
  return goodput_at_size - price * one_device_goodput * size;
}

class convergence_aware_policy final : public policy {
 public:
  explicit convergence_aware_policy(convergence_aware_config config = {}) : config_((config.validate(), config)) {}
  const char* name() const noexcept override { return "convergence_aware"; }
  const convergence_aware_config& config() const noexcept { return config_; }

  proposal propose(const decision_inputs& in, int lo, int hi) const override {
    const int current = std::clamp(in.world.size, lo, hi);
    double price = std::max(config_.price_floor, in.cap.device_price);
    const bool contended = in.cap.device_price > 0.0;
    if (in.signals.plateau && contended) price = std::max(price, config_.plateau_price);

    const double one = best(in, 1).second;
    const double g_now = goodput(in, in.world.size, in.world.global_batch);
    proposal out;
    out.target_size = in.world.size;
    if (!(one > 0.0) || !(g_now > 0.0)) {
      out.reason = "convergence_aware: no throughput prediction yet, hold";
      return out;
    }
    const double v_now = net_value(g_now, in.world.size, price, one);
    int best_size = current;
    auto [best_batch, best_g] = best(in, current);
    double best_v = net_value(best_g, current, price, one);
    for (int k = lo; k <= hi; ++k) {
      if (k == current) continue;
      const auto [batch, g] = best(in, k);
      const double v = net_value(g, k, price, one);
      if (v > best_v * (1.0 + 1e-12) + 1e-300 || (v == best_v && k < best_size))
        best_size = k, best_batch = batch, best_g = g, best_v = v;
    }
    const bool batch_changes = adapts(in) && best_batch != in.world.global_batch;
    if (!(best_v - v_now > config_.min_gain * g_now) || (best_size == in.world.size && !batch_changes)) {
      out.reason = detail::fmt("convergence_aware: hold (best net gain %.3g%% of goodput < %.3g%%; price %.2f",
                               100.0 * (best_v - v_now) / g_now, 100.0 * config_.min_gain, price) +
                   (in.signals.plateau && contended ? ", plateau under contention)" : ")");
      return out;
    }
    out.target_size = best_size;
    out.global_batch = batch_changes ? best_batch : 0.0;
    out.reason = "convergence_aware: size " + std::to_string(best_size) +
                 detail::fmt(" at batch %.0f: goodput x%.3f (noise scale %.4g)", best_batch, best_g / g_now,
                             in.signals.gns_valid ? in.signals.gns : 0.0) +
                 detail::fmt(", price %.2f per device", price) +
                 (in.signals.plateau && contended ? " (plateau under contention)" : "");
    return out;
  }

 private:
  bool adapts(const decision_inputs& in) const {
    return config_.max_global_batch > 0.0 && in.signals.gns_valid && in.signals.gns >= 0.0;
  }

  /// Best (global batch, goodput) at `size`; the current batch when the batch is not adapted.
  std::pair<double, double> best(const decision_inputs& in, int size) const {
    if (!adapts(in)) return {in.world.global_batch, goodput(in, size, in.world.global_batch)};
    const double lo = std::max(in.world.base_batch, config_.min_per_rank_batch * size);
    const double hi = config_.max_global_batch;
    std::pair<double, double> out{in.world.global_batch, goodput(in, size, in.world.global_batch)};
    if (lo > hi) return out;
    const int n = config_.batch_candidates;
    for (int i = 0; i < n; ++i) {
      const double batch = n == 1 || hi <= lo ? lo : lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1));
      const double g = goodput(in, size, batch);
      if (g > out.second * (1.0 + 1e-12)) out = {batch, g};
    }
    return out;
  }

  convergence_aware_config config_;
};

}  // namespace dra::policy
