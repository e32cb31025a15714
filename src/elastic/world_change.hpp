#pragma once
// A change of the elastic world (internal to dra::dra): the value the controller's state machine
// carries from a decision, an admission or a recovery's agreement through rebuild, state transfer
// and reshard, and the route the state takes to the processes that need it.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dra::elastic::detail {

/// Why a process enters a world.
enum class change_cause { start, admit, resize, fault };
const char* to_string(change_cause c) noexcept;

/// One world change, as the controller's state machine carries it from the decision (or the
/// recovery's agreement) through rebuild, state handoff and reshard.
struct world_change {
  world_change() = default;
  world_change(change_cause c, std::int64_t e, std::vector<int> m) : cause(c), epoch(e), members(std::move(m)) {}
  change_cause cause = change_cause::start;
  std::int64_t epoch = 0;
  std::vector<int> members;  ///< the new world, in rank order
  std::vector<int> joined;   ///< who receives the state (a grow's or an admission's joiners)
  std::vector<int> left;
  std::string reason;
  int before = 0;  ///< size of the world that was running
  /// After a fault: the size the world would have without it (the running world's, or a shrink's
  /// decided world's when the fault interrupted that shrink): what options.heal grows back to.
  /// 0: `before`.
  int heal_to = 0;
  double agree_s = 0.0;  ///< time to agree on it (decision or recovery)
  std::int64_t decided_step = -1;
};

/// Who sends the state to whom in a world change, from this process's point of view.
struct handoff_route {
  int receive_from = -1;     ///< the rank this process receives the state from (-1: none)
  std::vector<int> send_to;  ///< the ranks this process sends it to
};

/// The route of `change` for the process `uid` at `rank` of a world of `size`: at a start or after
/// a fault the new rank 0 sends to everyone (survivors may disagree on whether the interrupted step
/// was applied: the leader's state wins); in a grow or an admission the members that stay share the
/// sending round-robin over the joiners (handoff_sources); otherwise nothing moves.
handoff_route route_handoff(const world_change& change, int rank, int size, int uid);

}  // namespace dra::elastic::detail
