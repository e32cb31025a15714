#pragma once
// Membership and data-partition decisions of the elastic world (docs/design/elastic.md), as small
// side-effect-free functions. Every rank evaluates them on the same inputs (read from the store)
// and so reaches the same answer without further agreement. No torch, no I/O: the Python
// controller and C++ trainers call these same functions.
//
// Vocabulary: a *universe id* (uid) names a process for the life of the job; a *member list* is
// the uids of the active world in rank order (rank = position); the *leader* is rank 0.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "dra/error.hpp"

namespace dra::elastic {

/// Half-open range [begin, end) of positions in an epoch's global sample order.
struct index_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const noexcept { return end - begin; }
  bool operator==(const index_range& o) const noexcept { return begin == o.begin && end == o.end; }
};

namespace detail {
inline void check_unique(const std::vector<int>& ids, const char* field) {
  std::set<int> seen;
  for (int id : ids) {
    if (id < 0) dra::detail::throw_invalid(field, "universe ids must be >= 0, got " + std::to_string(id));
    if (!seen.insert(id).second)
      dra::detail::throw_invalid(field, "universe id " + std::to_string(id) + " appears twice");
  }
}

// splitmix64: a tiny, well-mixed generator whose output is the same on every platform, so the
// sample order is identical in every rank, in Python and in C++.
inline std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace detail

/// Rank of `uid` in `members`, or -1 when it is not a member.
inline int rank_of(const std::vector<int>& members, int uid) noexcept {
  const auto it = std::find(members.begin(), members.end(), uid);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

/// The leader's uid (rank 0). Throws on an empty world.
inline int leader_of(const std::vector<int>& members) {
  if (members.empty()) dra::detail::throw_invalid("members", "an empty world has no leader");
  return members.front();
}

/// Next epoch's member list: the members that stay keep their relative order (so ranks are
/// renumbered contiguously and the leader stays rank 0 unless it leaves), joiners are appended
/// in the order given. Throws std::invalid_argument when a leaver is not a member, a joiner
/// already is one, or the result would be empty.
inline std::vector<int> next_members(const std::vector<int>& current, const std::vector<int>& leave,
                                     const std::vector<int>& join) {
  detail::check_unique(current, "members");
  detail::check_unique(leave, "leave");
  detail::check_unique(join, "join");
  for (int id : leave)
    if (rank_of(current, id) < 0) dra::detail::throw_invalid("leave", "uid " + std::to_string(id) + " is not a member");
  for (int id : join)
    if (rank_of(current, id) >= 0)
      dra::detail::throw_invalid("join", "uid " + std::to_string(id) + " is already a member");
  std::vector<int> out;
  out.reserve(current.size() + join.size());
  for (int id : current)
    if (std::find(leave.begin(), leave.end(), id) == leave.end()) out.push_back(id);
  out.insert(out.end(), join.begin(), join.end());
  if (out.empty()) dra::detail::throw_invalid("leave", "every member would leave; keep at least one");
  return out;
}

/// The members that survive a fault: those of `current` present in `alive`, in rank order.
inline std::vector<int> survivors(const std::vector<int>& current, const std::vector<int>& alive) {
  std::vector<int> out;
  for (int id : current)
    if (std::find(alive.begin(), alive.end(), id) != alive.end()) out.push_back(id);
  return out;
}

/// Where each old rank goes: entry i is the new rank of old rank i, or -1 when it left.
inline std::vector<int> rank_mapping(const std::vector<int>& old_members, const std::vector<int>& new_members) {
  std::vector<int> out;
  out.reserve(old_members.size());
  for (int id : old_members) out.push_back(rank_of(new_members, id));
  return out;
}

/// Samples of one optimizer step: the next `global_batch` positions of the epoch's order from
/// `cursor` (the count already consumed), cut at the end of the epoch.
inline index_range step_batch(std::int64_t cursor, std::int64_t global_batch, std::int64_t epoch_size) {
  if (global_batch < 1) dra::detail::throw_invalid("global_batch", "must be >= 1, got " + std::to_string(global_batch));
  if (epoch_size < 0) dra::detail::throw_invalid("epoch_size", "must be >= 0");
  if (cursor < 0 || cursor > epoch_size)
    dra::detail::throw_invalid(
        "cursor", "must lie in [0, epoch_size=" + std::to_string(epoch_size) + "], got " + std::to_string(cursor));
  return {cursor, std::min(cursor + global_batch, epoch_size)};
}

/// A rank's share of a step's batch: contiguous, sizes differ by at most one, earlier ranks get
/// the larger shares. The shares of ranks 0..world-1 tile the batch exactly, so re-partitioning
/// the not-yet-consumed samples over a new world is just evaluating this with the new world.
inline index_range rank_share(const index_range& batch, int world, int rank) {
  if (world < 1) dra::detail::throw_invalid("world", "must be >= 1, got " + std::to_string(world));
  if (rank < 0 || rank >= world)
    dra::detail::throw_invalid("rank", "must lie in [0, " + std::to_string(world) + "), got " + std::to_string(rank));
  const std::int64_t n = batch.size(), base = n / world, extra = n % world;
  const std::int64_t begin = batch.begin + rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

/// The deterministic global sample order of one data epoch: a permutation of [0, n) that depends
/// only on (seed, epoch). Fisher-Yates over splitmix64; identical on every rank and platform.
inline std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  if (n < 0) dra::detail::throw_invalid("n", "dataset size must be >= 0");
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::uint64_t state = seed * 0x2545F4914F6CDD1Dull + static_cast<std::uint64_t>(epoch) + 1;
  for (std::int64_t i = n - 1; i > 0; --i) {
    // Modulo bias is below 2^-40 for any realistic dataset size: irrelevant for shuffling.
    const auto r = static_cast<std::int64_t>(detail::splitmix64(state) % static_cast<std::uint64_t>(i + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(r)]);
  }
  return order;
}

/// Who to admit when growing to `target`: the first candidates in ascending uid order (so every
/// rank computes the same list); fewer when there are not enough.
inline std::vector<int> pick_joiners(const std::vector<int>& members, std::vector<int> candidates, int target) {
  std::sort(candidates.begin(), candidates.end());
  std::vector<int> out;
  for (int id : candidates) {
    if (static_cast<int>(members.size() + out.size()) >= target) break;
    if (rank_of(members, id) < 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

/// Who sends the state to each joiner of a grow: the members that stay share the work round-robin
/// (they hold bit-identical state), so k joiners are served by up to k senders at once. Entry i
/// is the new rank of the member that sends to joined[i]. Throws when nobody stays.
inline std::vector<int> handoff_sources(const std::vector<int>& new_members, const std::vector<int>& joined) {
  std::vector<int> stayers;
  for (int r = 0; r < static_cast<int>(new_members.size()); ++r)
    if (std::find(joined.begin(), joined.end(), new_members[static_cast<std::size_t>(r)]) == joined.end())
      stayers.push_back(r);
  if (stayers.empty()) dra::detail::throw_invalid("joined", "every member would be a joiner; nobody holds the state");
  std::vector<int> out;
  out.reserve(joined.size());
  for (std::size_t i = 0; i < joined.size(); ++i) out.push_back(stayers[i % stayers.size()]);
  return out;
}

/// Who leaves when shrinking to `target`: the members named in `prefer` first (an outside actor's
/// choice, e.g. the slot that becomes a rollout worker), then the newest ranks; never the leader.
/// Listed in rank order.
inline std::vector<int> pick_leavers(const std::vector<int>& members, int target, const std::vector<int>& prefer = {}) {
  if (target < 1) dra::detail::throw_invalid("target", "must be >= 1, got " + std::to_string(target));
  if (static_cast<std::size_t>(target) >= members.size()) return {};
  std::size_t leaving = members.size() - static_cast<std::size_t>(target);
  std::vector<bool> leaves(members.size(), false);
  for (std::size_t r = 1; r < members.size() && leaving > 0; ++r)
    if (std::find(prefer.begin(), prefer.end(), members[r]) != prefer.end()) leaves[r] = true, --leaving;
  for (std::size_t r = members.size() - 1; r >= 1 && leaving > 0; --r)
    if (!leaves[r]) leaves[r] = true, --leaving;
  std::vector<int> out;
  for (std::size_t r = 0; r < members.size(); ++r)
    if (leaves[r]) out.push_back(members[r]);
  return out;
}

}  // namespace dra::elastic
