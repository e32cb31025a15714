#pragma once
// Membership -> NCCL call mapping for the NCCL backend's rebuild routine. Everything here is
// pure (no NCCL, no CUDA, no torch, no I/O) so each rule is unit-tested on its own; the routine
// in src/comm/nccl/ only executes the plan these functions produce.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dra::comm {

/// NCCL's version code for 2.9 and later: major*10000 + minor*100 + patch (what ncclGetVersion
/// reports and NCCL_VERSION_CODE holds).
constexpr int nccl_version_code(int major, int minor, int patch) {
  return major * 10000 + minor * 100 + patch;
}

/// "2.27.3" from 22703; "unknown" for codes that cannot be a 2.x version.
inline std::string nccl_version_string(int code) {
  if (code < 20900) return "unknown";
  return std::to_string(code / 10000) + "." + std::to_string((code / 100) % 100) + "." + std::to_string(code % 100);
}

/// Run-time gates: the NCCL release that introduced each entry point (docs/design/nccl.md, "Version gates").
constexpr int nccl_nonblocking_min = nccl_version_code(2, 14, 0);
constexpr int nccl_shrink_min = nccl_version_code(2, 27, 0);
constexpr int nccl_revoke_min = nccl_version_code(2, 28, 0);
constexpr int nccl_grow_min = nccl_version_code(2, 29, 0);

/// What the loaded library offers: its version (ncclGetVersion of the library actually loaded,
/// never the header's) and whether the entry points of each fast path were resolved.
struct nccl_features {
  int runtime_version = 0;
  bool shrink_symbol = false;  ///< ncclCommShrink
  bool grow_symbols = false;   ///< ncclCommGrow and ncclCommGetUniqueId
  bool revoke_symbol = false;  ///< ncclCommRevoke

  bool nonblocking() const { return runtime_version >= nccl_nonblocking_min; }
  bool shrink() const { return shrink_symbol && runtime_version >= nccl_shrink_min; }
  bool grow() const { return grow_symbols && runtime_version >= nccl_grow_min; }
  bool revoke() const { return revoke_symbol && runtime_version >= nccl_revoke_min; }
};

/// The NCCL path a rebuild takes on this rank.
enum class nccl_path {
  leave,       ///< self is not in the new world: release the old communicator, build nothing
  keep,        ///< same members, no fault: keep the communicator, only the epoch changes
  fresh_init,  ///< ncclGetUniqueId (new rank 0) + ncclCommInitRankConfig on every new member
  shrink,      ///< ncclCommShrink of the old communicator (survivors only)
  grow,        ///< ncclCommGrow: old ranks keep their numbers, joiners take the new ones
};

inline const char* to_string(nccl_path p) {
  switch (p) {
    case nccl_path::leave:
      return "leave";
    case nccl_path::keep:
      return "keep";
    case nccl_path::fresh_init:
      return "fresh_init";
    case nccl_path::shrink:
      return "shrink";
    case nccl_path::grow:
      return "grow";
  }
  return "?";
}

/// One rank's plan for one rebuild.
struct nccl_plan {
  nccl_path path = nccl_path::fresh_init;
  bool abortive = false;  ///< in-flight work must be aborted (NCCL_SHRINK_ABORT; parent released by abort)
  int old_rank = -1;      ///< self's rank in the old world, -1 when not a member
  int new_rank = -1;      ///< self's rank in the new world, -1 for a leaver
  int new_size = 0;
  std::vector<int> exclude_ranks;          ///< shrink: old ranks that are not in the new world, ascending
  bool grow_root = false;                  ///< grow: old rank 0, which creates and publishes the single-use grow id
  bool joiner = false;                     ///< grow: self was not in the old world (joins without a parent)
  bool release_parent_with_abort = false;  ///< teardown of the old communicator: abort (else finalize+destroy)
  std::string reason;                      ///< why this path, for the decision log
};

/// Position of `id` in `members` (its rank), or -1.
inline int rank_of(const std::vector<int>& members, int id) {
  const auto it = std::find(members.begin(), members.end(), id);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

/// ncclCommShrink keeps the survivors in their old order and renumbers them contiguously. It
/// can produce `new_members` only when that list is `old_members` with some entries removed and
/// the order kept. Returns the old ranks to exclude (ascending), or nullopt when the new world
/// is not such a subsequence (a joiner, a reordering, or nothing removed).
inline std::optional<std::vector<int>> shrink_exclusions(const std::vector<int>& old_members,
                                                         const std::vector<int>& new_members) {
  if (new_members.empty() || new_members.size() >= old_members.size()) return std::nullopt;
  std::vector<int> excluded;
  std::size_t next = 0;  // next new member still to be matched, in order
  for (std::size_t r = 0; r < old_members.size(); ++r) {
    if (next < new_members.size() && old_members[r] == new_members[next]) {
      ++next;
    } else {
      excluded.push_back(static_cast<int>(r));
    }
  }
  if (next != new_members.size()) return std::nullopt;
  return excluded;
}

/// ncclCommGrow keeps every old rank's number and gives joiners ranks >= old size, so it can
/// produce `new_members` only when `old_members` is a proper prefix of it.
inline bool is_prefix_grow(const std::vector<int>& old_members, const std::vector<int>& new_members) {
  return !old_members.empty() && new_members.size() > old_members.size() &&
         std::equal(old_members.begin(), old_members.end(), new_members.begin());
}

/// Renumbering of a shrink: new rank of every old rank (-1 for the excluded), for the
/// membership layer to map ranks after ncclCommShrink.
inline std::vector<int> shrink_rank_map(int old_size, const std::vector<int>& exclude_ranks) {
  std::vector<int> map(static_cast<std::size_t>(std::max(old_size, 0)), -1);
  int next = 0;
  for (int r = 0; r < old_size; ++r) {
    if (!std::binary_search(exclude_ranks.begin(), exclude_ranks.end(), r)) map[static_cast<std::size_t>(r)] = next++;
  }
  return map;
}

/// The decision. `has_parent`: this rank holds a usable NCCL communicator of `old_members`.
/// Every rank computes it from the same request and (NCCL requires it) the same library
/// version; only `has_parent` is local, which is why the routine votes before a fast path.
inline nccl_plan plan_rebuild(const std::vector<int>& old_members, const std::vector<int>& new_members, int self,
                              bool abortive, bool has_parent, const nccl_features& features) {
  nccl_plan plan;
  plan.abortive = abortive;
  plan.old_rank = rank_of(old_members, self);
  plan.new_rank = rank_of(new_members, self);
  plan.new_size = static_cast<int>(new_members.size());
  plan.release_parent_with_abort = abortive;
  const std::string version = "runtime NCCL " + nccl_version_string(features.runtime_version);
  const bool parent = has_parent && plan.old_rank >= 0;

  if (plan.new_rank < 0) {
    plan.path = nccl_path::leave;
    plan.reason = "self is not in the new world";
    return plan;
  }
  if (old_members.empty()) {
    plan.path = nccl_path::fresh_init;
    plan.reason = "first initialisation";
    return plan;
  }
  if (old_members == new_members) {
    if (parent && !abortive) {
      plan.path = nccl_path::keep;
      plan.reason = "membership unchanged";
      return plan;
    }
    plan.path = nccl_path::fresh_init;
    plan.release_parent_with_abort = true;
    plan.reason = parent ? "membership unchanged but a fault was reported: rebuild from scratch"
                         : "membership unchanged but this rank holds no usable communicator";
    return plan;
  }
  if (auto excluded = shrink_exclusions(old_members, new_members)) {
    if (!features.shrink()) {
      plan.path = nccl_path::fresh_init;
      plan.reason = "shrink requested but " + version + (features.shrink_symbol ? " < 2.27" : " lacks ncclCommShrink");
      return plan;
    }
    if (!parent) {
      plan.path = nccl_path::fresh_init;
      plan.reason = "shrink requested but this rank holds no usable parent communicator";
      return plan;
    }
    plan.path = nccl_path::shrink;
    plan.exclude_ranks = std::move(*excluded);
    plan.reason =
        std::string(abortive ? "abortive shrink (NCCL_SHRINK_ABORT)" : "shrink") + ", " + version + " >= 2.27";
    return plan;
  }
  if (is_prefix_grow(old_members, new_members)) {
    if (abortive) {
      plan.path = nccl_path::fresh_init;
      plan.release_parent_with_abort = true;
      plan.reason = "grow requested together with a fault: rebuild from scratch";
      return plan;
    }
    if (!features.grow()) {
      plan.path = nccl_path::fresh_init;
      plan.reason = "grow requested but " + version + (features.grow_symbols ? " < 2.29" : " lacks ncclCommGrow");
      return plan;
    }
    plan.joiner = plan.old_rank < 0;
    if (!plan.joiner && !parent) {
      plan.path = nccl_path::fresh_init;
      plan.reason = "grow requested but this rank holds no usable parent communicator";
      return plan;
    }
    plan.path = nccl_path::grow;
    plan.grow_root = plan.old_rank == 0;
    plan.reason = std::string(plan.joiner ? "grow (joiner)" : "grow") + ", " + version + " >= 2.29";
    return plan;
  }
  plan.path = nccl_path::fresh_init;
  plan.reason = "membership change is neither an order-keeping shrink nor a prefix grow";
  return plan;
}

/// Whether this rank's plan is a fast path that needs every new member to agree before it runs.
inline bool needs_agreement(const nccl_plan& plan) {
  return plan.path == nccl_path::keep || plan.path == nccl_path::shrink || plan.path == nccl_path::grow;
}

}  // namespace dra::comm
