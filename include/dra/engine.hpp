#pragma once
// The per-job decision engine: estimator + throughput model + constrained policy, fed once per
// step. It is what dra.step() drives in one process, what the elastic controller runs on the
// leader, and what the simulator runs per job. No torch, no I/O.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/constraints.hpp"
#include "dra/policy/convergence_aware.hpp"
#include "dra/policy/energy_policies.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/registry.hpp"
#include "dra/policy/throughput_model.hpp"
#include "dra/signals/convergence_estimator.hpp"
#include "dra/signals/remaining_work.hpp"

namespace dra {

/// The policies an engine can run, by the name engine_config::policy takes (policy/registry.hpp).
inline const std::vector<std::string>& policy_names() {
  return policy::policy_registry::names(true);
}

/// The engine's settings. The policy sections (convergence, goodput, convergence_aware, energy)
/// come from policy::policy_sections, the registry's one list of them.
struct engine_config : policy::policy_sections {
  signals::estimator_config estimator;
  policy::throughput_model_config throughput;
  policy::constraints limits;
  policy::cost_model costs;
  /// A name the registry lets the engine run (policy_names()): "convergence" (the DRA framework's
  /// rule), "goodput" (Pollux-style), "convergence_aware", an energy objective or "none" (resizes
  /// only when asked: a schedule, an outside limit). docs/guide/policy.md describes each.
  std::string policy = "convergence";
  /// Steps between decisions (a decision is cheap, but resizing more often than this is noise).
  std::int64_t decide_every = 10;
  /// The job's declared budget in steps (0: none). With the loss curve, the remaining-work estimator
  /// (signals/remaining_work.hpp, the simulator's and the pool's) then sets world.remaining_steps.
  std::int64_t declared_steps = 0;
  signals::remaining_work_config remaining_work;

  void validate() const {
    estimator.validate();
    throughput.validate();
    limits.validate();
    convergence.validate();
    goodput.validate();
    convergence_aware.validate();
    energy.validate();
    policy::policy_registry::at(policy, true);
    remaining_work.validate();
    if (declared_steps < 0)
      dra::detail::throw_invalid("declared_steps",
                                 "must be >= 0 (0: no budget), got " + std::to_string(declared_steps));
    if (decide_every < 1)
      dra::detail::throw_invalid("decide_every", "must be >= 1, got " + std::to_string(decide_every));
    if (!(costs.resize_cost_s >= 0.0) || !std::isfinite(costs.resize_cost_s))
      dra::detail::throw_invalid("resize_cost_s",
                                 "must be a finite number >= 0 (seconds), got " + std::to_string(costs.resize_cost_s));
    if (!(costs.horizon_steps > 0.0) || !std::isfinite(costs.horizon_steps))
      dra::detail::throw_invalid("horizon_steps",
                                 "must be a finite number > 0 (steps), got " + std::to_string(costs.horizon_steps));
  }
};

/// The policy the config names, built by its registry entry from the config's sections.
inline std::shared_ptr<const policy::policy> make_policy(const engine_config& config) {
  auto made = policy::policy_registry::at(config.policy, true).make(config);
  if (!made)
    dra::detail::throw_invalid("policy", "the factory registered as '" + config.policy +
                                             "' returned null; return the policy it makes (std::make_shared)");
  return made;
}

/// What one step returns: a view into the engine, valid until the next call.
struct engine_status {
  std::int64_t step = 0;
  bool decided = false;  ///< a decision was taken at this step
  policy::decision last_decision;
  std::uint64_t decisions = 0;
};

class resize_engine {
 public:
  explicit resize_engine(engine_config config)
      : config_((config.validate(), std::move(config))),
        estimator_(config_.estimator),
        throughput_(config_.throughput),
        policy_(make_policy(config_), config_.limits) {
    world_.size = 1;
    cap_.available = 1;
  }

  const engine_config& config() const noexcept { return config_; }
  const signals::convergence_signals& signals() const noexcept { return estimator_.signals(); }
  signals::convergence_estimator& estimator() noexcept { return estimator_; }
  policy::throughput_model& throughput() noexcept { return throughput_; }
  policy::world_state& world() noexcept { return world_; }
  policy::capacity& capacity() noexcept { return cap_; }
  policy::cost_model& costs() noexcept { return config_.costs; }
  const engine_status& status() const noexcept { return status_; }
  /// Step index of the latest step() call (accepted or not), -1 before the first.
  std::int64_t last_step() const noexcept { return last_step_; }

  /// One training step's loss. Decides every `decide_every` steps. Never throws on the loss: a
  /// non-finite one is counted in the signals and the step still advances. (A world() set to fewer
  /// than one rank throws std::invalid_argument naming world.size at the decision.)
  const engine_status& step(std::int64_t step, double loss) {
    observe(step, loss);
    if (++steps_since_decision_ >= config_.decide_every) {
      decide();  // a throw leaves the decision due: the next step() decides (this step's loss is taken)
      steps_since_decision_ = 0;
    }
    return status_;
  }

  /// One training step's loss, without deciding: the members of a live world that are not the
  /// leader keep their signals current this way (the leader decides for all).
  void observe(std::int64_t step, double loss) {
    last_step_ = step;
    estimator_.update_loss(step, loss);
    status_.step = step;
    world_.step = step;
    ++world_.steps_since_resize;
    status_.decided = false;
  }

  /// How many more step() calls until the engine decides (1: at the next one).
  std::int64_t steps_to_decision() const noexcept {
    return std::max<std::int64_t>(1, config_.decide_every - steps_since_decision_);
  }

  /// Whether the leader of a live world decides after `committed_steps` steps.
  bool decision_due(std::int64_t committed_steps) const noexcept {
    return committed_steps > 0 && committed_steps % config_.decide_every == 0;
  }

  /// The remaining-work estimate at the latest decision (steps; median, mean, tail). Without a
  /// declared budget the policy does not read it, so it is computed here, when asked for (the
  /// curve fit costs tens of microseconds: at every decision it made dra.step 10x dearer).
  const signals::work_estimate& remaining() const {
    if (remaining_stale_) {
      remaining_estimate_ = remaining_.estimate(remaining_observation_);
      remaining_stale_ = false;
    }
    return remaining_estimate_;
  }

  /// Takes a decision now from the current signals and world.
  const policy::decision& decide() {
    update_remaining();
    status_.last_decision = policy_.decide(estimator_.signals(), world_, cap_, config_.costs, throughput_);
    status_.decided = true;
    ++status_.decisions;
    return status_.last_decision;
  }

  /// The size the policy would choose if every device it might want were free (capacity up to
  /// max_size): what a job asks a device pool for. No side effects (hysteresis untouched).
  int desired_size() const {
    const auto& limits = policy_.limits();
    policy::capacity unlimited;
    unlimited.available = limits.max_size;
    const policy::decision_inputs in{estimator_.signals(), world_, unlimited, config_.costs, throughput_};
    const int lo = std::max(limits.min_size, 1);
    const int hi = std::max(lo, limits.max_size);
    const int want = std::clamp(policy::propose_named(policy_.inner(), in, lo, hi).target_size, lo, hi);
    if (limits.allows(want)) return want;
    // A size the job may not take (allowed_sizes) would have the pool plan a device it never
    // uses: the largest allowed size below it, else the smallest above it.
    int below = 0, above = 0;
    for (int s : limits.allowed_sizes) {
      if (!limits.allows(s)) continue;
      if (s < want && s > below) below = s;
      if (s > want && (above == 0 || s < above)) above = s;
    }
    return below > 0 ? below : above;
  }

  /// Tells the engine a resize happened (resets the cooldown clock).
  void resized(int new_size, double new_global_batch) {
    if (new_size < 1) dra::detail::throw_invalid("new_size", "must be >= 1, got " + std::to_string(new_size));
    if (!(new_global_batch > 0.0 && std::isfinite(new_global_batch)))
      dra::detail::throw_invalid("new_global_batch",
                                 "must be a finite number of samples > 0, got " + std::to_string(new_global_batch));
    world_.size = new_size;
    world_.global_batch = new_global_batch;
    world_.steps_since_resize = 0;
  }

 private:
  /// Feeds the smoothed loss to the remaining-work estimator's curve (thinned to at most 256
  /// points) and, when the job declared a budget, the estimate's median to the policy's world.
  void update_remaining() {
    const auto& sig = estimator_.signals();
    if (sig.step >= 0 && std::isfinite(sig.smoothed_loss) && sig.smoothed_loss > 0.0 &&
        (curve_.empty() || curve_.back().first < static_cast<double>(sig.step))) {
      curve_.emplace_back(static_cast<double>(sig.step), sig.smoothed_loss);
      if (curve_.size() > 256) {
        std::vector<std::pair<double, double>> half;
        for (std::size_t i = 0; i < curve_.size(); i += 2) half.push_back(curve_[i]);
        curve_ = std::move(half);
      }
    }
    auto& o = remaining_observation_;
    o.declared = config_.declared_steps > 0 ? static_cast<double>(config_.declared_steps) : std::nan("");
    o.done = std::max(static_cast<double>(world_.step) + 1.0, 0.0);
    o.curve = curve_;
    remaining_stale_ = true;
    // Only a declared budget reaches the policy (world.remaining_steps); otherwise remaining()
    // computes the same estimate from this observation when someone asks.
    if (config_.declared_steps > 0 && (remaining().sources & 1))
      world_.remaining_steps = std::llround(remaining_estimate_.median);
  }

  engine_config config_;
  signals::convergence_estimator estimator_;
  policy::throughput_model throughput_;
  policy::constrained_policy policy_;
  policy::world_state world_;
  policy::capacity cap_;
  engine_status status_;
  std::int64_t steps_since_decision_ = 0;
  std::int64_t last_step_ = -1;
  signals::remaining_work_estimator remaining_{config_.remaining_work};
  std::vector<std::pair<double, double>> curve_;
  signals::work_observation remaining_observation_;  ///< what the latest decision knew
  mutable signals::work_estimate remaining_estimate_;
  mutable bool remaining_stale_ = false;
};

}  // namespace dra
