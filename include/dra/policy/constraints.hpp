#pragma once
// Constraints around any policy, and the one entry point that turns a proposal into a Decision:
//   decide(signals, world, capacity, costs, throughput) -> decision
// The same object decides for a live job (on the leader, published to all ranks) and for each
// job in the simulator.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"
#include "dra/policy/policies.hpp"
#include "dra/policy/types.hpp"

namespace dra::policy {

struct constraints {
  int min_size = 1;
  int max_size = 1 << 20;
  /// Sizes the world may take (e.g. divisors of the global batch); empty: any size.
  std::vector<int> allowed_sizes;
  /// Steps after a resize during which no voluntary resize happens.
  std::int64_t cooldown_steps = 0;
  /// A proposal must point the same way for this many consecutive decisions before it is acted on.
  int hysteresis_decisions = 1;
  /// Most devices added or removed by one decision.
  int max_change = 1 << 20;
  /// Act only when the predicted gain over the cost model's horizon exceeds the resize cost:
  /// for a grow, the wall time saved making `horizon` steps' worth of progress against the
  /// resize's wall time; for a shrink, the device time released over the horizon's wall time,
  /// (current - target) x horizon x step time, against the device time the resize stalls,
  /// current x resize cost. A run shorter than the horizon (remaining_steps) counts only what is left.
  bool amortise = true;

  /// Throws std::invalid_argument naming the field and the fix.
  void validate() const {
    if (min_size < 1) dra::detail::throw_invalid("min_size", "must be >= 1, got " + std::to_string(min_size));
    if (max_size < min_size)
      dra::detail::throw_invalid("min_size", "min_size (" + std::to_string(min_size) + ") > max_size (" +
                                                 std::to_string(max_size) + "); lower min_size or raise max_size");
    if (cooldown_steps < 0)
      dra::detail::throw_invalid("cooldown_steps", "must be >= 0, got " + std::to_string(cooldown_steps));
    if (hysteresis_decisions < 1)
      dra::detail::throw_invalid("hysteresis_decisions", "must be >= 1, got " + std::to_string(hysteresis_decisions));
    if (max_change < 1) dra::detail::throw_invalid("max_change", "must be >= 1, got " + std::to_string(max_change));
    if (!allowed_sizes.empty()) {
      for (int s : allowed_sizes)
        if (s < 1) dra::detail::throw_invalid("allowed_sizes", "sizes must be >= 1, got " + std::to_string(s));
      const bool any = std::any_of(allowed_sizes.begin(), allowed_sizes.end(),
                                   [&](int s) { return s >= min_size && s <= max_size; });
      if (!any)
        dra::detail::throw_invalid("allowed_sizes", "no allowed size lies within [min_size, max_size] = [" +
                                                        std::to_string(min_size) + ", " + std::to_string(max_size) +
                                                        "]");
    }
  }

  bool allows(int size) const {
    return size >= min_size && size <= max_size &&
           (allowed_sizes.empty() ||
            std::find(allowed_sizes.begin(), allowed_sizes.end(), size) != allowed_sizes.end());
  }
};

/// The active ids of a world in rank order (0..size-1 when the world names none, as in the
/// simulator).
inline std::vector<int> active_ids(const world_state& world) {
  if (!world.active.empty()) return world.active;
  std::vector<int> ids;
  for (int i = 0; i < world.size; ++i) ids.push_back(i);
  return ids;
}

/// The decision that takes `world` to `target` members: the first candidates (ascending ids)
/// join; the members in `prefer_leave`, then the newest, leave (never the leader). Used by constrained_policy and for
/// changes the policy does not choose (a resize schedule, a pool lowering the job's limit). A grow with fewer
/// candidates than asked admits those there are; a world without named candidates (the simulator, a pool that starts
/// workers later) keeps the target alone.
/// `p.propose(in, lo, hi)`, with an exception from it named: its message starts with the policy's
/// name (std::invalid_argument stays one, anything else becomes std::runtime_error), so that a
/// failing policy is found from the engine's, the simulator's or the pool's error alone.
inline proposal propose_named(const policy& p, const decision_inputs& in, int lo, int hi) {
  const auto named = [&](const char* what) {
    return std::string("policy '") + p.name() + "' failed to propose a size (sizes " + std::to_string(lo) + ".." +
           std::to_string(hi) + "): " + what;
  };
  try {
    return p.propose(in, lo, hi);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(named(e.what()));
  } catch (const std::exception& e) {
    throw std::runtime_error(named(e.what()));
  } catch (...) {
    throw std::runtime_error(named("it threw something that is not a std::exception; throw one"));
  }
}

inline decision plan_resize(const world_state& world, int target, double batch_scale, double lr_scale,
                            std::string reason, const std::vector<int>& prefer_leave = {}) {
  if (target < 1) dra::detail::throw_invalid("target", "must be >= 1, got " + std::to_string(target));
  decision out;
  out.target_size = target;
  out.batch_scale = batch_scale > 0.0 ? batch_scale : 1.0;
  out.lr_scale = lr_scale;
  out.reason = std::move(reason);
  const std::vector<int> active = active_ids(world);
  const int current = static_cast<int>(active.size());
  if (target > current) {
    out.kind = action::grow;
    out.join = elastic::pick_joiners(active, world.candidates, target);
  } else if (target < current) {
    out.kind = action::shrink;
    out.leave = elastic::pick_leavers(active, target, prefer_leave);
  }
  out.members = elastic::next_members(active, out.leave, out.join);
  return out;
}

/// The world a decision is asked for, checked before anything is decided or counted: a world
/// naming an id twice, or fewer ids than its size, was acted on (a hold listing the duplicate as a
/// member; a shrink of a world of 4 that named 2), and a batch of 0 surfaced as a policy's
/// "widen the knob space".
inline void check_world(const world_state& world) {
  if (world.size < 1)
    dra::detail::throw_invalid("world.size", "must be >= 1 (the ranks in the active world, the leader included), got " +
                                                 std::to_string(world.size));
  if (!world.active.empty()) {
    if (static_cast<int>(world.active.size()) != world.size)
      dra::detail::throw_invalid("world.active", "names " + std::to_string(world.active.size()) +
                                                     " ids for a world of size " + std::to_string(world.size) +
                                                     "; name every member once, or none (ids 0..size-1)");
    std::vector<int> ids = world.active;
    std::sort(ids.begin(), ids.end());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0) dra::detail::throw_invalid("world.active", "ids must be >= 0, got " + std::to_string(ids[i]));
      if (i > 0 && ids[i] == ids[i - 1])
        dra::detail::throw_invalid("world.active",
                                   "id " + std::to_string(ids[i]) + " appears twice; name every member once");
    }
  }
  for (int c : world.candidates)
    if (c < 0) dra::detail::throw_invalid("world.candidates", "ids must be >= 0, got " + std::to_string(c));
  if (!(world.global_batch > 0.0 && std::isfinite(world.global_batch)))
    dra::detail::throw_invalid("world.global_batch",
                               "must be a finite number of samples > 0, got " + detail::fmt("%g", world.global_batch));
  if (!(world.base_batch > 0.0 && std::isfinite(world.base_batch)))
    dra::detail::throw_invalid("world.base_batch",
                               "must be a finite number of samples > 0, got " + detail::fmt("%g", world.base_batch));
}

/// A policy wrapped in constraints. Holds the hysteresis counter, so feed it every decision
/// point in order (the leader does; every rank then reads the leader's decision).
class constrained_policy {
 public:
  constrained_policy(std::shared_ptr<const policy> inner, constraints limits)
      : inner_(std::move(inner)), limits_((limits.validate(), std::move(limits))) {
    if (!inner_) dra::detail::throw_invalid("policy", "must not be null");
  }

  const constraints& limits() const noexcept { return limits_; }
  const policy& inner() const noexcept { return *inner_; }

  /// Throws std::invalid_argument on a malformed world (check_world) or proposal, leaving the
  /// hysteresis counter as it was.
  decision decide(const signals::convergence_signals& sig, const world_state& world, const capacity& cap,
                  const cost_model& costs, const throughput_predictor& throughput) {
    check_world(world);
    const int direction = pending_direction_, count = pending_count_;
    try {
      return decide_checked(sig, world, cap, costs, throughput);
    } catch (...) {
      pending_direction_ = direction;
      pending_count_ = count;
      throw;
    }
  }

 private:
  decision decide_checked(const signals::convergence_signals& sig, const world_state& world, const capacity& cap,
                          const cost_model& costs, const throughput_predictor& throughput) {
    const decision_inputs in{sig, world, cap, costs, throughput};
    decision out;
    out.policy = inner_->name();
    out.target_size = world.size;
    out.members = active_ids(world);
    const int current = world.size;
    const int most = std::min(limits_.max_size, std::max(cap.available, current));

    // Below the minimum (after a failure): grow back to it as soon as candidates allow, no
    // cooldown; to the smallest allowed size at or above it where min_size itself is not allowed
    // (min 2 with allowed sizes {4, 8}: a world of 1 waited for size 2 forever).
    if (current < limits_.min_size) {
      int restore_to = limits_.max_size;  // validate() keeps an allowed size within [min_size, max_size]
      if (limits_.allowed_sizes.empty()) restore_to = limits_.min_size;
      for (int s : limits_.allowed_sizes)
        if (limits_.allows(s)) restore_to = std::min(restore_to, s);
      if (restore_to <= most)
        return finish(std::move(out), world, restore_to, 0.0, 1.0,
                      "restore: world below min_size " + std::to_string(limits_.min_size) +
                          (restore_to != limits_.min_size ? ", to the smallest allowed size above it" : ""));
      out.reason = "hold: below min_size " + std::to_string(limits_.min_size) + ": restoring takes size " +
                   std::to_string(restore_to) + " and " + std::to_string(most) + " are available";
      return out;
    }

    const int lo = std::max(limits_.min_size, 1);
    const int hi = std::max(lo, most);
    proposal p = propose_named(*inner_, in, lo, hi);
    if (p.reason.empty()) p.reason = std::string(inner_->name()) + ": (no reason given)";  // a decision always says why
    // A size outside [lo, hi] is clamped (built-in policies rely on it), but a batch has no range
    // to clamp to: an infinite one became batch_scale inf (a live world's batch collapsed to 1,
    // and inf does not survive the decision's JSON), and NaN or a negative one passed for "keep".
    if (!std::isfinite(p.global_batch) || p.global_batch < 0.0)
      dra::detail::throw_invalid("global_batch", std::string("policy '") + inner_->name() + "' proposed " +
                                                     detail::fmt("%g", p.global_batch) +
                                                     "; propose a finite batch > 0, or 0 to keep the current one");
    int target = std::clamp(p.target_size, lo, hi);
    if (target > current) target = std::min(target, current + limits_.max_change);
    if (target < current) target = std::max(target, current - limits_.max_change);
    target = target > current ? snap_down(target, current) : target < current ? snap_up(target, current) : current;
    const double new_batch = p.global_batch > 0.0 ? p.global_batch : world.global_batch;

    if (target == current && new_batch == world.global_batch) {
      pending_direction_ = 0;
      pending_count_ = 0;
      const int wanted = std::clamp(p.target_size, lo, hi);
      out.reason = std::move(p.reason);
      if (wanted != current)
        out.reason += "; held at " + std::to_string(current) + ": no allowed size between it and " +
                      std::to_string(wanted) + " (allowed_sizes)";
      return out;
    }
    if (world.steps_since_resize < limits_.cooldown_steps) {
      out.reason = "hold: cooldown (" + std::to_string(world.steps_since_resize) + " of " +
                   std::to_string(limits_.cooldown_steps) + " steps) after last resize; wanted: " + p.reason;
      return out;
    }
    const int direction = target > current ? 1 : target < current ? -1 : 2;
    pending_count_ = direction == pending_direction_ ? pending_count_ + 1 : 1;
    pending_direction_ = direction;
    if (pending_count_ < limits_.hysteresis_decisions) {
      out.reason = "hold: hysteresis (" + std::to_string(pending_count_) + " of " +
                   std::to_string(limits_.hysteresis_decisions) + " consecutive decisions); wanted: " + p.reason;
      return out;
    }

    const double g_now = goodput(in, current, world.global_batch);
    const double g_new = goodput(in, target, new_batch);
    const double speedup = g_now > 0.0 ? g_new / g_now : 1.0;
    // A batch-only change (same size) resizes nothing, so it has no resize cost to pay back.
    if (limits_.amortise && costs.resize_cost_s > 0.0 && target != current) {
      double horizon = costs.horizon_steps;
      if (world.remaining_steps >= 0) horizon = std::min(horizon, static_cast<double>(world.remaining_steps));
      const double step_now = throughput.step_time_s(current, world.global_batch / current);
      // Time to make `horizon` steps' worth of progress now vs at the target.
      const double time_now = horizon * step_now;
      const double time_new = speedup > 0.0 ? time_now / speedup : INFINITY;
      double gain = 0.0, cost = 0.0;
      const char* unit;
      if (target > current) {
        gain = time_now - time_new;  // wall seconds saved
        cost = costs.resize_cost_s;
        unit = "s";
      } else {
        // Device seconds released while the job runs on for the horizon. Not "device time for
        // the same progress": on a plateau progress is worth little, and with near-linear scaling
        // that measure is zero for every shrink, so a plateau could never release devices.
        gain = static_cast<double>(current - target) * time_now;
        cost = current * costs.resize_cost_s;
        unit = "device-s";
      }
      if (!(gain > cost)) {
        out.reason = "hold: resize would not pay back (" + policy_detail_gain(gain, cost, horizon, unit) +
                     "); wanted: " + p.reason;
        return out;
      }
      p.reason += "; pays back (" + policy_detail_gain(gain, cost, horizon, unit) + ")";
    }
    const double lr_scale = adascale_gain(sig.gns, sig.gns_valid, new_batch, world.base_batch) /
                            adascale_gain(sig.gns, sig.gns_valid, world.global_batch, world.base_batch);
    pending_direction_ = 0;
    pending_count_ = 0;
    out.predicted_speedup = speedup;
    return finish(std::move(out), world, target, new_batch / world.global_batch, p.global_batch > 0.0 ? lr_scale : 1.0,
                  std::move(p.reason));
  }

  static std::string policy_detail_gain(double gain, double cost, double horizon, const char* unit) {
    return detail::fmt("gain %.3g", gain) + unit + detail::fmt(" over %.0f steps vs cost %.3g", horizon, cost) + unit;
  }

  // Largest allowed size in (current, target]; current when none.
  int snap_down(int target, int current) const {
    for (int s = target; s > current; --s)
      if (limits_.allows(s)) return s;
    return current;
  }
  // Smallest allowed size in [target, current); current when none.
  int snap_up(int target, int current) const {
    for (int s = target; s < current; ++s)
      if (limits_.allows(s)) return s;
    return current;
  }

  static decision finish(decision out, const world_state& world, int target, double batch_scale, double lr_scale,
                         std::string reason) {
    decision planned = plan_resize(world, target, batch_scale, lr_scale, std::move(reason));
    planned.policy = std::move(out.policy);
    planned.predicted_speedup = out.predicted_speedup;
    return planned;
  }

  std::shared_ptr<const policy> inner_;
  constraints limits_;
  int pending_direction_ = 0;
  int pending_count_ = 0;
};

}  // namespace dra::policy
