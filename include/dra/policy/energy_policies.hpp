#pragma once
// Energy-aware choices (docs/design/sustainable.md): one objective chooser used by the live policy
// engine and by the trace replays alike.
//
//   objective            picks, among predicted settings, the one with
//   min_energy_deadline  least energy whose time meets the deadline (none meets it: the fastest)
//   energy_delay         least energy x time (EDP)
//   zeus_cost            least eta x energy + (1 - eta) x max_power x time (Zeus, NSDI'23)
//   energy_budget        least time whose energy fits the budget (none fits: the least energy)
//
// A setting is a point of the knob space: world size, global batch, sparsity, compression rank,
// and a power limit. The power limit exists only for replays of recorded traces: the live policy
// below never proposes one, and dra never changes a real device's power limit, clocks or modes.
// Deterministic: candidates are scored in a fixed order and the first best wins ties.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/policies.hpp"

namespace dra::policy {

struct knob_setting {
  int world_size = 1;
  double global_batch = 0.0;   ///< samples per optimizer step over the world (0: unchanged)
  double sparsity = 0.0;       ///< fraction of weights masked off, [0, 1)
  int compression_rank = 0;    ///< PowerSGD rank (0: uncompressed)
  double power_limit_w = 0.0;  ///< per-device power limit, replay only (0: the device's default)
};

struct knob_space {
  std::vector<int> world_sizes{1};
  std::vector<double> global_batches{0.0};
  std::vector<double> sparsities{0.0};
  std::vector<int> compression_ranks{0};
  std::vector<double> power_limits_w{0.0};

  /// Every combination, world size outermost, power limit innermost.
  std::vector<knob_setting> enumerate() const {
    std::vector<knob_setting> out;
    for (int w : world_sizes)
      for (double b : global_batches)
        for (double s : sparsities)
          for (int r : compression_ranks)
            for (double p : power_limits_w) out.push_back({w, b, s, r, p});
    return out;
  }
};

/// What a setting is predicted to cost to reach the target (or over a fixed amount of work).
struct energy_prediction {
  double time_s = 0.0;
  double energy_j = 0.0;
  double max_power_w = 0.0;  ///< summed maximum power of the devices used (Zeus's MAXPOWER x N)
  bool valid = true;         ///< false: the setting cannot reach the target (excluded)
};

class energy_predictor {
 public:
  virtual ~energy_predictor() = default;
  virtual energy_prediction predict(const knob_setting& s) const = 0;
};

enum class energy_objective_kind { min_energy_deadline, energy_delay, zeus_cost, energy_budget };

inline const char* to_string(energy_objective_kind k) noexcept {
  switch (k) {
    case energy_objective_kind::min_energy_deadline:
      return "min_energy_deadline";
    case energy_objective_kind::energy_delay:
      return "energy_delay";
    case energy_objective_kind::zeus_cost:
      return "zeus_cost";
    case energy_objective_kind::energy_budget:
      return "energy_budget";
  }
  return "unknown";
}

/// The objective a name selects ("zeus_cost", ...), if it names one.
inline bool energy_objective_named(const std::string& name, energy_objective_kind* kind = nullptr) {
  using k = energy_objective_kind;
  for (k candidate : {k::min_energy_deadline, k::energy_delay, k::zeus_cost, k::energy_budget}) {
    if (name == to_string(candidate)) {
      if (kind) *kind = candidate;
      return true;
    }
  }
  return false;
}

struct energy_objective {
  energy_objective_kind kind = energy_objective_kind::zeus_cost;
  double eta = 0.5;                                             ///< zeus_cost: weight of energy against time, in [0, 1]
  double deadline_s = std::numeric_limits<double>::infinity();  ///< min_energy_deadline: time left
  double budget_j = std::numeric_limits<double>::infinity();    ///< energy_budget: joules left

  void validate() const {
    if (!(eta >= 0.0 && eta <= 1.0))
      dra::detail::throw_invalid("eta", "must lie in [0, 1], got " + std::to_string(eta));
    if (!(deadline_s > 0.0))
      dra::detail::throw_invalid("deadline_s",
                                 "must be > 0 (infinity: no deadline), got " + std::to_string(deadline_s));
    if (!(budget_j > 0.0))
      dra::detail::throw_invalid("budget_j", "must be > 0 (infinity: no budget), got " + std::to_string(budget_j));
  }

  /// Zeus's cost of one prediction (also used to report any choice in Zeus's units).
  double zeus_cost(const energy_prediction& p) const {
    return eta * p.energy_j + (1.0 - eta) * p.max_power_w * p.time_s;
  }
};

struct energy_choice {
  knob_setting setting;
  energy_prediction prediction;
  std::size_t index = 0;       ///< position in the candidate list
  bool constraint_met = true;  ///< deadline / budget satisfied (always true for EDP and Zeus)
  std::string reason;
};

/// The one chooser: scores every valid candidate (its prediction at the same index) and returns
/// the best. Throws when none is valid.
inline energy_choice choose_setting(const energy_objective& obj, const std::vector<knob_setting>& candidates,
                                    const std::vector<energy_prediction>& preds) {
  obj.validate();
  if (preds.size() != candidates.size())
    dra::detail::throw_invalid("predictions", std::to_string(preds.size()) + " predictions for " +
                                                  std::to_string(candidates.size()) +
                                                  " candidates; give one per candidate");
  auto usable = [&](std::size_t i) {
    const auto& p = preds[i];
    // Zeus's cost reads max_power_w too: a NaN (or negative) one would make a cost no comparison
    // can rank, and the first such candidate would win by default. Such a prediction is skipped.
    return p.valid && std::isfinite(p.time_s) && std::isfinite(p.energy_j) && std::isfinite(p.max_power_w) &&
           p.time_s >= 0.0 && p.energy_j >= 0.0 && p.max_power_w >= 0.0;
  };
  auto argmin = [&](auto&& key, auto&& keep) {
    std::size_t best = candidates.size();
    double best_v = 0.0;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (!usable(i) || !keep(preds[i])) continue;
      const double v = key(preds[i]);
      if (best == candidates.size() || v < best_v) best = i, best_v = v;
    }
    return best;
  };
  auto all = [](const energy_prediction&) { return true; };
  const auto by_time = [](const energy_prediction& p) { return p.time_s; };
  const auto by_energy = [](const energy_prediction& p) { return p.energy_j; };

  std::size_t best = candidates.size();
  bool met = true;
  std::string why;
  switch (obj.kind) {
    case energy_objective_kind::min_energy_deadline:
      best = argmin(by_energy, [&](const energy_prediction& p) { return p.time_s <= obj.deadline_s; });
      why = detail::fmt("least energy meeting the deadline (%.4g s left)", obj.deadline_s);
      if (best == candidates.size()) {
        best = argmin(by_time, all), met = false;
        why = detail::fmt("no setting meets the deadline (%.4g s left): the fastest", obj.deadline_s);
      }
      break;
    case energy_objective_kind::energy_delay:
      best = argmin([](const energy_prediction& p) { return p.energy_j * p.time_s; }, all);
      why = "least energy x time";
      break;
    case energy_objective_kind::zeus_cost:
      best = argmin([&](const energy_prediction& p) { return obj.zeus_cost(p); }, all);
      why = detail::fmt("least Zeus cost at eta %.2f", obj.eta);
      break;
    case energy_objective_kind::energy_budget:
      best = argmin(by_time, [&](const energy_prediction& p) { return p.energy_j <= obj.budget_j; });
      why = detail::fmt("fastest within the energy budget (%.4g J left)", obj.budget_j);
      if (best == candidates.size()) {
        best = argmin(by_energy, all), met = false;
        why = detail::fmt("no setting fits the energy budget (%.4g J left): the least energy", obj.budget_j);
      }
      break;
  }
  if (best == candidates.size())
    dra::detail::throw_invalid("candidates", "no candidate setting has a valid prediction (" +
                                                 std::to_string(candidates.size()) + " tried); widen the knob space");
  energy_choice out{candidates[best], preds[best], best, met, {}};
  out.reason = why + detail::fmt(": %.4g J, %.4g s", out.prediction.energy_j, out.prediction.time_s);
  return out;
}

inline energy_choice choose_setting(const energy_objective& obj, const std::vector<knob_setting>& candidates,
                                    const energy_predictor& predictor) {
  std::vector<energy_prediction> preds;
  preds.reserve(candidates.size());
  for (const auto& c : candidates) preds.push_back(predictor.predict(c));
  return choose_setting(obj, candidates, preds);
}

struct energy_policy_config {
  energy_objective objective;
  /// Average power of one busy device (W), from dra's energy meter (measured where NVML/RAPL can be
  /// read, estimated otherwise) or configured.
  double watts_per_device = 300.0;
  /// Maximum power of one device (W): Zeus's MAXPOWER, the time term's price.
  double max_watts_per_device = 300.0;
  /// Also choose the global batch among powers of two times the per-rank range (as goodput does).
  bool adapt_batch = false;
  double min_per_rank_batch = 1.0;
  double max_per_rank_batch = 1024.0;
  /// Deadline and budget are for the whole job; what is left is deadline - elapsed, budget - spent.
  double job_deadline_s = std::numeric_limits<double>::infinity();
  double job_budget_j = std::numeric_limits<double>::infinity();

  void validate() const {
    objective.validate();
    if (!(watts_per_device > 0.0 && std::isfinite(watts_per_device)))
      dra::detail::throw_invalid("watts_per_device",
                                 "must be a finite number > 0 (W), got " + std::to_string(watts_per_device));
    if (!(max_watts_per_device >= watts_per_device && std::isfinite(max_watts_per_device)))
      dra::detail::throw_invalid("max_watts_per_device", "must be a finite number >= watts_per_device (" +
                                                             std::to_string(watts_per_device) + "), got " +
                                                             std::to_string(max_watts_per_device));
    if (!(min_per_rank_batch > 0.0 && std::isfinite(min_per_rank_batch)))
      dra::detail::throw_invalid("min_per_rank_batch",
                                 "must be a finite number > 0, got " + std::to_string(min_per_rank_batch));
    // The batch candidates double from min to max: an infinite max would never end the list.
    if (!(max_per_rank_batch >= min_per_rank_batch && std::isfinite(max_per_rank_batch)))
      dra::detail::throw_invalid("max_per_rank_batch", "must be a finite number >= min_per_rank_batch (" +
                                                           std::to_string(min_per_rank_batch) + "), got " +
                                                           std::to_string(max_per_rank_batch));
    if (!(job_deadline_s > 0.0)) dra::detail::throw_invalid("job_deadline_s", "must be > 0 (infinity: none)");
    if (!(job_budget_j > 0.0)) dra::detail::throw_invalid("job_budget_j", "must be > 0 (infinity: none)");
  }
};

/// Predicts the rest of a live job at a (world size, global batch): the remaining progress,
/// counted in current steps, divided by the goodput of the setting (throughput model x statistical
/// efficiency), times the devices' power.
class live_energy_predictor final : public energy_predictor {
 public:
  live_energy_predictor(const decision_inputs& in, const energy_policy_config& config) : in_(in), config_(config) {}
  energy_prediction predict(const knob_setting& s) const override {
    const double batch = s.global_batch > 0.0 ? s.global_batch : in_.world.global_batch;
    const double steps_left =
        in_.world.remaining_steps >= 0 ? static_cast<double>(in_.world.remaining_steps) : in_.costs.horizon_steps;
    // Samples of progress left, measured at the current batch and its efficiency.
    const double work =
        steps_left * in_.world.global_batch *
        statistical_efficiency(in_.signals.gns, in_.signals.gns_valid, in_.world.global_batch, in_.world.base_batch);
    const double g = goodput(in_, s.world_size, batch);
    energy_prediction p;
    if (!(g > 0.0)) {
      p.valid = false;
      return p;
    }
    p.time_s = work / g;
    p.energy_j = p.time_s * s.world_size * config_.watts_per_device;
    p.max_power_w = s.world_size * config_.max_watts_per_device;
    return p;
  }

 private:
  const decision_inputs& in_;
  const energy_policy_config& config_;
};

/// The energy-aware resize policy: world size (and optionally batch) chosen by one objective over
/// the rest of the job. Never proposes a power limit.
class energy_policy final : public policy {
 public:
  explicit energy_policy(energy_policy_config config = {}) : config_((config.validate(), config)) {}
  const char* name() const noexcept override { return to_string(config_.objective.kind); }
  const energy_policy_config& config() const noexcept { return config_; }

  proposal propose(const decision_inputs& in, int lo, int hi) const override {
    std::vector<knob_setting> candidates;
    for (int size = lo; size <= hi; ++size) {
      candidates.push_back({size, in.world.global_batch});
      if (!config_.adapt_batch) continue;
      for (double m = config_.min_per_rank_batch; m <= config_.max_per_rank_batch; m *= 2.0)
        candidates.push_back({size, m * size});
    }
    energy_objective obj = config_.objective;
    obj.deadline_s = std::max(1e-9, config_.job_deadline_s - in.world.elapsed_s);
    obj.budget_j = std::max(1e-9, config_.job_budget_j - in.world.energy_spent_j);
    if (config_.objective.kind == energy_objective_kind::min_energy_deadline && std::isinf(config_.job_deadline_s))
      obj.deadline_s = config_.objective.deadline_s;
    if (config_.objective.kind == energy_objective_kind::energy_budget && std::isinf(config_.job_budget_j))
      obj.budget_j = config_.objective.budget_j;
    const live_energy_predictor predictor(in, config_);
    const energy_choice c = choose_setting(obj, candidates, predictor);
    proposal out;
    out.target_size = c.setting.world_size;
    out.global_batch = config_.adapt_batch ? c.setting.global_batch : 0.0;
    out.reason = std::string(name()) + ": size " + std::to_string(c.setting.world_size) + ", " + c.reason;
    return out;
  }

 private:
  energy_policy_config config_;
};

}  // namespace dra::policy
