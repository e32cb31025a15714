#pragma once
// Inputs and output of a resize decision (docs/design/policies.md). Plain data, no behaviour.
#include <cstdint>
#include <string>
#include <vector>

namespace dra::policy {

/// The job's data-parallel world as the leader sees it at a step boundary.
struct world_state {
  int size = 1;                 ///< ranks in the active world
  std::vector<int> active;      ///< their universe ids, ascending (empty: 0..size-1)
  std::vector<int> candidates;  ///< standby / late-joiner ids that could be admitted, ascending
  std::int64_t step = 0;
  std::int64_t steps_since_resize = 0;
  std::int64_t remaining_steps = -1;  ///< steps left in the job, -1 when unknown
  double global_batch = 1.0;          ///< samples per optimizer step over the whole world
  double base_batch = 1.0;            ///< batch at which the gradient noise scale is expressed (M0)
  double elapsed_s = 0.0;             ///< wall time the job has run (energy policies: deadline)
  double energy_spent_j = 0.0;        ///< energy the job has used so far (energy policies: budget)
};

/// Devices the job may have right now.
struct capacity {
  int available = 1;  ///< active + admissible candidates (the most the job could grow to now)
  /// Price of one device set by whoever lends them (a pool, a cluster), in units of one device's
  /// goodput: a device is worth holding only if it adds at least this fraction of what one device
  /// alone achieves. 0: no contention (a policy applies its own floor).
  double device_price = 0.0;
};

/// What a resize costs and how far ahead a gain is counted.
struct cost_model {
  double resize_cost_s = 0.0;    ///< measured (or configured) wall time of one resize
  double horizon_steps = 500.0;  ///< steps over which a resize must pay for itself
};

enum class action { hold, grow, shrink };

inline const char* to_string(action a) noexcept {
  switch (a) {
    case action::hold:
      return "hold";
    case action::grow:
      return "grow";
    case action::shrink:
      return "shrink";
  }
  return "unknown";
}

/// One resize decision: made once by the policy layer (constrained_policy::decide, or
/// plan_resize for a schedule or a pool's limit), published once by a live job's leader, and
/// applied as is by every member. The member lists come from the membership functions
/// (dra/elastic/membership.hpp), so nobody computes who joins or leaves a second time.
struct decision {
  action kind = action::hold;
  int target_size = 1;
  std::vector<int> members;        ///< the world after the decision, in rank order (the current one on hold)
  std::vector<int> leave;          ///< active ids that leave the world (rank order)
  std::vector<int> join;           ///< candidate ids admitted (ascending)
  double batch_scale = 1.0;        ///< new global batch / current global batch
  double lr_scale = 1.0;           ///< new learning rate / current learning rate
  double predicted_speedup = 1.0;  ///< goodput(target) / goodput(current), as the model sees it
  std::string reason;
  std::string policy;  ///< name of the policy that proposed it
};

}  // namespace dra::policy
