#pragma once
// What the leader (rank 0) of an elastic world decides at step boundaries (internal to
// dra::dra): when a decision is due (every decide_every steps, a scheduled step, an outside limit
// the world is outside of), the decision itself (the engine's policy, the schedule or the limit,
// each turned into one policy::decision by the policy layer), and the once-a-second look at the
// outside: the candidates, the limit (a device pool's grant, an RL coordinator's split), and the
// job's report for the pool.
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "dra/engine.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "event_log.hpp"
#include "store_protocol.hpp"

namespace dra::elastic::detail {

/// The world as the leader sees it at a step boundary.
struct world_view {
  std::int64_t step = 0;  ///< committed steps so far
  std::int64_t epoch = 0;
  const std::vector<int>& members;
  const std::vector<tensor_spec>& signature;
  const state_layout& layout;
  std::int64_t global_batch = 1;
  std::int64_t samples = 0;  ///< samples committed since the process started
  double loss = 0.0;
  /// options.heal: the size faults shrank the world from (0: none), and the processes they took
  /// out twice or more (not re-admitted by healing).
  int heal_size = 0;
  std::vector<int> flapping = {};
};

class leader {
 public:
  leader(store_protocol& store, resize_engine& engine, const controller_options& options, event_log& log)
      : store_(store), engine_(engine), options_(options), log_(log) {}

  /// The decision for this boundary, published on the store for the world of `view.epoch`, or
  /// nothing (hold, or not due). Store failures skip the decision (the world trains on; a store
  /// that is gone for good shows at the next operation that needs an answer).
  std::optional<published_decision> decide(const world_view& view);
  /// The latest decision taken (held ones included), for step_status.
  const policy::decision& last() const noexcept { return last_; }
  bool decided() const noexcept { return decided_; }

 private:
  void look_outside(const world_view& view, bool force);
  void publish_report(const world_view& view);
  /// {"rates": {size: samples/s}, "rate_s": {size: seconds measured}}.
  nlohmann::json rates_json() const;

  store_protocol& store_;
  resize_engine& engine_;
  const controller_options& options_;
  event_log& log_;
  std::vector<int> candidates_;
  std::optional<size_limit> limit_;
  std::chrono::steady_clock::time_point outside_read_{};
  std::chrono::steady_clock::time_point report_time_{};
  std::int64_t report_samples_ = 0;
  int report_world_ = 0;  ///< the world size at the last report
  struct measured_rate {
    double samples_per_s = 0.0;  ///< an EMA over the report intervals spent at that size
    double seconds = 0.0;        ///< how long it was measured
  };
  std::map<int, measured_rate> rates_;
  std::int64_t skipped_since_ = -1;  ///< the first step whose decision the store made skip (-1: none)
  /// A scheduled size not reached yet (a grow waits for its processes to stand by again): kept
  /// and retried at every step until the world has that size or the next schedule entry.
  struct scheduled_size {
    int size = 0;
    std::int64_t step = 0;
    std::chrono::steady_clock::time_point since{};
  };
  std::optional<scheduled_size> scheduled_;
  policy::decision last_;
  bool decided_ = false;
};

}  // namespace dra::elastic::detail
