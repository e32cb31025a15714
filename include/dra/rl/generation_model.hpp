#pragma once
// The decode cost of one rollout device, t_iter = a + b c + k S for c active sequences holding S
// tokens of context, fitted online with forgetting from measured decode iterations (the
// stage-balance policy's rollout model, stage_balance.hpp; docs/design/rl.md).
#include <cmath>
#include <string>
#include <utility>

#include "dra/error.hpp"
#include "dra/policy/online_ridge.hpp"

namespace dra::policy {

struct generation_model_config {
  /// Most sequences one rollout device decodes at once (KV-cache slots).
  int max_concurrency = 128;
  /// Tokens of context one rollout device's KV cache holds (0: not limited). With it, a device
  /// decodes at most this many tokens' worth of sequences at once (vLLM reports its cache size).
  double kv_capacity_tokens = 0.0;
  // Priors of t_iter = a + b c + k S (S in kilotokens of context) and their weight.
  double prior_iteration_fixed_s = 0.01;
  double prior_iteration_per_sequence_s = 1e-4;
  double prior_iteration_per_kilotoken_s = 0.0;
  double prior_weight = 1.0;
  double forgetting = 0.999;

  void validate() const {
    if (max_concurrency < 1)
      dra::detail::throw_invalid("max_concurrency", "must be >= 1 sequence, got " + std::to_string(max_concurrency));
    for (auto [name, v] : {std::pair{"kv_capacity_tokens", kv_capacity_tokens},
                           std::pair{"prior_iteration_fixed_s", prior_iteration_fixed_s},
                           std::pair{"prior_iteration_per_sequence_s", prior_iteration_per_sequence_s},
                           std::pair{"prior_iteration_per_kilotoken_s", prior_iteration_per_kilotoken_s}}) {
      if (!(v >= 0.0) || !std::isfinite(v))
        dra::detail::throw_invalid(name, "must be a finite number >= 0, got " + std::to_string(v));
    }
    if (!(prior_weight > 0.0)) dra::detail::throw_invalid("prior_weight", "must be > 0");
    if (!(forgetting > 0.0 && forgetting <= 1.0)) dra::detail::throw_invalid("forgetting", "must lie in (0, 1]");
  }
};

/// Decode cost of one rollout device, fitted online from measured iterations.
class generation_model {
 public:
  explicit generation_model(generation_model_config config = {}) : config_((config.validate(), config)) {
    fit_.reset(Eigen::Vector3d(config_.prior_iteration_fixed_s, config_.prior_iteration_per_sequence_s,
                               config_.prior_iteration_per_kilotoken_s),
               config_.prior_weight);
  }

  /// `iterations` decode iterations took `seconds` in all, with `concurrency` sequences active
  /// holding `context_tokens` tokens of context (prompt + generated so far) on average. Returns
  /// false (ignored) for non-finite or non-positive values.
  bool observe(int concurrency, double context_tokens, double iterations, double seconds) noexcept {
    if (concurrency < 1 || !std::isfinite(context_tokens) || context_tokens < 0.0 || !std::isfinite(iterations) ||
        !(iterations > 0.0) || !std::isfinite(seconds) || !(seconds > 0.0)) {
      return false;
    }
    fit_.add(features(concurrency, context_tokens), seconds / iterations, config_.forgetting);
    ++observations_;
    return true;
  }

  double iteration_time_s(double concurrency, double context_tokens) const {
    return std::max(0.0, fit_.predict(features(concurrency, context_tokens)));
  }
  double fixed_s() const noexcept { return std::max(0.0, fit_.coef(0)); }
  double per_sequence_s() const noexcept { return std::max(0.0, fit_.coef(1)); }
  double per_kilotoken_s() const noexcept { return std::max(0.0, fit_.coef(2)); }
  unsigned long long observations() const noexcept { return observations_; }
  const generation_model_config& config() const noexcept { return config_; }

 private:
  static Eigen::Vector3d features(double concurrency, double context_tokens) {
    return Eigen::Vector3d(1.0, concurrency, context_tokens / 1000.0);
  }
  generation_model_config config_;
  detail::online_ridge<3> fit_;
  unsigned long long observations_ = 0;
};

}  // namespace dra::policy
