#pragma once
// Step-time prediction for a world size and per-rank batch, and statistical efficiency.
//
// The model follows Pollux (OSDI'21):
//   T_grad(m)  = alpha_c + beta_c * m                 (compute, per-rank batch m)
//   T_sync(K)  = alpha_s + beta_s * max(K - 2, 0)      (K >= 2; zero for one rank)
//   T_iter     = (T_grad^gamma + T_sync^gamma)^(1/gamma)
// Documented simplification: gamma is configured, not fitted (default 1: no overlap of compute
// and synchronisation, the conservative choice for DDP on Gloo), and the two linear parts are
// fitted separately from the measured compute time (step - sync) and sync time, each by ridge
// regression pulled towards a prior, so a job that has only ever run on one size still predicts
// other sizes (from the prior) and the prior fades as measurements arrive.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>

#include "dra/error.hpp"
#include "dra/policy/online_ridge.hpp"

namespace dra::policy {

/// Anything that predicts seconds per optimizer step. The live job uses the online model below;
/// the simulator plugs in measured profiles.
class throughput_predictor {
 public:
  virtual ~throughput_predictor() = default;
  virtual double step_time_s(int world_size, double per_rank_batch) const = 0;
  /// Samples per second of the whole world.
  double throughput(int world_size, double per_rank_batch) const {
    const double t = step_time_s(world_size, per_rank_batch);
    return t > 0.0 ? world_size * per_rank_batch / t : 0.0;
  }
};

/// Statistical efficiency of global batch M relative to base batch M0, from the gradient noise
/// scale B (in samples): E = (B + M0) / (B + M). This is Pollux's gain(M)/scale with
/// var/sqr = B/M0. Without a valid noise scale, efficiency is taken as 1 (batch-size neutral).
inline double statistical_efficiency(double noise_scale, bool valid, double global_batch, double base_batch) {
  if (!valid || !(noise_scale >= 0.0) || !(global_batch > 0.0) || !(base_batch > 0.0)) return 1.0;
  return (noise_scale + base_batch) / (noise_scale + global_batch);
}

/// AdaScale gain r = (var + sqr) / (var/s + sqr) with s = M/M0, expressed with B = var/sqr at M0:
/// r = (B/M0 + 1) / (B/(M0 s) + 1). The LR multiplier for global batch M.
inline double adascale_gain(double noise_scale, bool valid, double global_batch, double base_batch) {
  if (!valid || !(noise_scale >= 0.0) || !(global_batch > 0.0) || !(base_batch > 0.0)) return 1.0;
  const double phi = noise_scale / base_batch;
  const double scale = global_batch / base_batch;
  return (phi + 1.0) / (phi / scale + 1.0);
}

struct throughput_model_config {
  double gamma = 1.0;
  // Priors (seconds) and their weight in pseudo-observations.
  double prior_compute_fixed_s = 1e-3;
  double prior_compute_per_sample_s = 1e-4;
  double prior_sync_fixed_s = 2e-3;
  double prior_sync_per_rank_s = 5e-4;
  double prior_weight = 1.0;
  /// Older observations fade: each new one multiplies the weight of the past by this.
  double forgetting = 0.99;

  void validate() const {
    if (!(gamma >= 1.0) || !std::isfinite(gamma))
      dra::detail::throw_invalid("gamma", "must be a finite number >= 1, got " + std::to_string(gamma));
    for (auto [name, v] : {std::pair{"prior_compute_fixed_s", prior_compute_fixed_s},
                           std::pair{"prior_compute_per_sample_s", prior_compute_per_sample_s},
                           std::pair{"prior_sync_fixed_s", prior_sync_fixed_s},
                           std::pair{"prior_sync_per_rank_s", prior_sync_per_rank_s}}) {
      if (!(v >= 0.0) || !std::isfinite(v))
        dra::detail::throw_invalid(name, "must be a finite number >= 0 (seconds), got " + std::to_string(v));
    }
    if (!(prior_weight > 0.0) || !std::isfinite(prior_weight))
      dra::detail::throw_invalid("prior_weight", "must be a finite number > 0, got " + std::to_string(prior_weight));
    if (!(forgetting > 0.0 && forgetting <= 1.0)) dra::detail::throw_invalid("forgetting", "must lie in (0, 1]");
  }
};

/// Online-fitted Pollux throughput model. O(1) per observation, no allocation.
class throughput_model final : public throughput_predictor {
 public:
  explicit throughput_model(throughput_model_config config = {}) : config_((config.validate(), config)) {
    compute_.reset(config_.prior_compute_fixed_s, config_.prior_compute_per_sample_s, config_.prior_weight);
    sync_.reset(config_.prior_sync_fixed_s, config_.prior_sync_per_rank_s, config_.prior_weight);
  }

  /// One measured step. Returns false (ignored) for non-finite or non-positive values.
  bool observe(int world_size, double per_rank_batch, double step_time_s, double sync_time_s) noexcept {
    if (world_size < 1 || !(per_rank_batch > 0.0) || !std::isfinite(per_rank_batch) || !std::isfinite(step_time_s) ||
        !(step_time_s > 0.0) || !std::isfinite(sync_time_s) || sync_time_s < 0.0 || sync_time_s > step_time_s) {
      return false;
    }
    compute_.add(per_rank_batch, step_time_s - sync_time_s, config_.forgetting);
    if (world_size >= 2) sync_.add(std::max(world_size - 2, 0), sync_time_s, config_.forgetting);
    ++observations_;
    return true;
  }

  double compute_time_s(double per_rank_batch) const { return std::max(0.0, compute_.predict(per_rank_batch)); }
  double sync_time_s(int world_size) const {
    return world_size < 2 ? 0.0 : std::max(0.0, sync_.predict(std::max(world_size - 2, 0)));
  }

  double step_time_s(int world_size, double per_rank_batch) const override {
    const double grad = compute_time_s(per_rank_batch);
    const double sync = sync_time_s(world_size);
    if (config_.gamma == 1.0) return grad + sync;
    return std::pow(std::pow(grad, config_.gamma) + std::pow(sync, config_.gamma), 1.0 / config_.gamma);
  }

  unsigned long long observations() const noexcept { return observations_; }
  const throughput_model_config& config() const noexcept { return config_; }

 private:
  // y = a + b x by ridge regression towards the prior (a0, b0).
  struct line {
    detail::online_ridge<2> fit;
    void reset(double a0, double b0, double w0) { fit.reset(Eigen::Vector2d(a0, b0), w0); }
    void add(double x, double y, double forgetting) { fit.add(Eigen::Vector2d(1.0, x), y, forgetting); }
    double predict(double x) const { return fit.predict(Eigen::Vector2d(1.0, x)); }
  };

  throughput_model_config config_;
  line compute_, sync_;
  unsigned long long observations_ = 0;
};

}  // namespace dra::policy
