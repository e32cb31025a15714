#pragma once
// The convergence-aware policy: goodput over world size and global batch together, with a price
// per device (docs/design/policies.md).
//
//  - Goodput = throughput x statistical efficiency from the gradient noise scale (AdaScale). The
//    noise scale grows by orders of magnitude over training (cifar10: 72 -> 38,658 samples), so a
//    large batch, and the devices to run it, pay off late rather than early: the policy starts small
//    and grows as the noise scale rises, and co-adapts the batch (with the AdaScale LR gain).
//  - A device is held only while it earns its price: going from k to k' devices must add at least
//    `price x (k' - k)` single-device goodputs. The price is the larger of a floor (the device's
//    opportunity cost: 0.1 = each device must bring a tenth of what one device alone brings) and the
//    price set by whoever lends the devices (capacity::device_price), which rises with contention.
//    The floor is the job's trade between time and device-hours: 0 minimises time; the default
//    0.1 keeps a device only if it adds a tenth of what one device alone does (docs/guide/simulator.md
//    reports the trade-off measured at 0, 0.1 and 0.25).
//  - A change happens only when its predicted gain clears `min_gain`; a grow is therefore always a
//    predicted speedup (> 1 + min_gain), and constrained_policy's amortisation then charges its cost.
//  - The loss curve is used for what it is good at: on a plateau (estimator_config's scale-free
//    history test) while devices are contended, the price rises to `plateau_price`, so the job
//    gives devices back to jobs still learning. Ranking jobs by predicted remaining work is the
//    cluster's part (remaining_work_weight below; the simulator and the pool use it).
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

/// The devices a job should hold on a goodput curve g[k] (k = 0..K, g[0] = 0) at a price: the size
/// with the largest net value, ties to the smaller size. The cluster uses it to cut each job's
/// curve where its devices stop earning their price.
inline int priced_size(const std::vector<double>& goodput, double price) {
  if (goodput.size() < 2 || !(goodput[1] > 0.0)) return goodput.size() < 2 ? 0 : 1;
  int best = 1;
  double best_v = net_value(goodput[1], 1, price, goodput[1]);
  for (std::size_t k = 2; k < goodput.size(); ++k) {
    const double v = net_value(goodput[k], static_cast<int>(k), price, goodput[1]);
    if (v > best_v * (1.0 + 1e-12) + 1e-300) best = static_cast<int>(k), best_v = v;
  }
  return best;
}

/// Optimus-style weight for ranking jobs by predicted remaining work: completing a job sooner is
/// worth more the less work it has left, so a cluster maximising sum_j goodput_j / remaining_j
/// favours jobs close to done (shortest remaining work first, for malleable jobs).
inline double remaining_work_weight(double remaining_progress, double floor = 1e-9) {
  return 1.0 / std::max(remaining_progress, floor);
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
