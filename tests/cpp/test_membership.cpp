#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "dra/elastic/membership.hpp"

using namespace dra::elastic;

TEST_CASE("membership.next_members.renumbering") {
  const std::vector<int> current{0, 1, 2, 3};
  CHECK(next_members(current, {3, 1}, {}) == std::vector<int>{0, 2});
  CHECK(next_members(current, {}, {7, 5}) == std::vector<int>{0, 1, 2, 3, 7, 5});
  CHECK(next_members(current, {0}, {9}) == std::vector<int>{1, 2, 3, 9});
  CHECK(rank_mapping(current, next_members(current, {1}, {})) == std::vector<int>{0, -1, 1, 2});
  CHECK(leader_of(next_members(current, {0}, {})) == 1);
}

TEST_CASE("membership.next_members.bad_input") {
  CHECK_THROWS_AS(next_members({0, 1}, {2}, {}), std::invalid_argument);
  CHECK_THROWS_AS(next_members({0, 1}, {}, {1}), std::invalid_argument);
  CHECK_THROWS_AS(next_members({0, 1}, {0, 1}, {}), std::invalid_argument);
  CHECK_THROWS_AS(next_members({0, 0}, {}, {}), std::invalid_argument);
  CHECK_THROWS_AS(leader_of({}), std::invalid_argument);
}

TEST_CASE("membership.survivors.keep_rank_order") {
  CHECK(survivors({4, 0, 2, 7}, {7, 0, 9}) == std::vector<int>{0, 7});
  CHECK(survivors({1, 2}, {}).empty());
}

TEST_CASE("membership.pick.joiners_and_leavers") {
  CHECK(pick_joiners({0, 1}, {9, 4, 1, 6}, 4) == std::vector<int>{4, 6});
  CHECK(pick_joiners({0, 1}, {9}, 4) == std::vector<int>{9});
  CHECK(pick_leavers({0, 1, 2, 3}, 2) == std::vector<int>{2, 3});
  CHECK(pick_leavers({0, 1}, 2).empty());
  CHECK_THROWS_AS(pick_leavers({0, 1}, 0), std::invalid_argument);
}

TEST_CASE("membership.partition.shares_tile_the_batch") {
  for (int world = 1; world <= 7; ++world) {
    for (std::int64_t n : {0, 1, 5, 64, 65}) {
      const index_range batch{100, 100 + n};
      std::int64_t next = batch.begin, smallest = n, largest = 0;
      for (int r = 0; r < world; ++r) {
        const auto share = rank_share(batch, world, r);
        CHECK(share.begin == next);
        next = share.end;
        smallest = std::min(smallest, share.size());
        largest = std::max(largest, share.size());
      }
      CHECK(next == batch.end);
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK_THROWS_AS(rank_share({0, 4}, 2, 2), std::invalid_argument);
  CHECK_THROWS_AS(rank_share({0, 4}, 0, 0), std::invalid_argument);
}

TEST_CASE("membership.partition.exactly_once_over_resizes") {
  // An epoch consumed by steps whose world size changes at every step: every position is
  // covered exactly once.
  const std::int64_t n = 1000, global_batch = 64;
  std::vector<int> seen(n, 0);
  std::int64_t cursor = 0;
  int world = 4;
  while (cursor < n) {
    const auto batch = step_batch(cursor, global_batch, n);
    for (int r = 0; r < world; ++r) {
      const auto share = rank_share(batch, world, r);
      for (auto i = share.begin; i < share.end; ++i) ++seen[i];
    }
    cursor = batch.end;
    world = world % 5 + 1;
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  CHECK(step_batch(990, 64, 1000) == index_range{990, 1000});
  CHECK_THROWS_AS(step_batch(1001, 64, 1000), std::invalid_argument);
  CHECK_THROWS_AS(step_batch(0, 0, 1000), std::invalid_argument);
}

TEST_CASE("membership.epoch_order.deterministic_permutation") {
  const auto a = epoch_order(500, 42, 3), b = epoch_order(500, 42, 3), c = epoch_order(500, 42, 4);
  CHECK(a == b);
  CHECK(a != c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> iota(500);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);
  CHECK(epoch_order(0, 1, 0).empty());
  CHECK(a != iota);  // actually shuffled
}

TEST_CASE("membership.handoff_sources.stayers_share_the_sending") {
  // Grow 2 -> 4: members 0 and 5 stay (ranks 0, 1), joiners 7 and 9 get one sender each.
  CHECK(handoff_sources({0, 5, 7, 9}, {7, 9}) == std::vector<int>{0, 1});
  // One stayer serves every joiner; more joiners than stayers wrap around.
  CHECK(handoff_sources({3, 4, 6, 8}, {4, 6, 8}) == std::vector<int>{0, 0, 0});
  CHECK(handoff_sources({0, 1, 2, 3, 4}, {2, 3, 4}) == std::vector<int>{0, 1, 0});
  CHECK(handoff_sources({0, 1}, {}).empty());
  CHECK_THROWS_AS(handoff_sources({7, 9}, {7, 9}), std::invalid_argument);
}

TEST_CASE("membership.pick_leavers.prefers_the_named_members_never_the_leader") {
  CHECK(pick_leavers({0, 1, 2, 3}, 3, {1}) == std::vector<int>{1});
  CHECK(pick_leavers({0, 1, 2, 3}, 2, {1}) == std::vector<int>{1, 3});
  CHECK(pick_leavers({0, 1, 2, 3}, 3, {0}) == std::vector<int>{3});  // the leader stays
  CHECK(pick_leavers({0, 1, 2, 3}, 3, {7}) == std::vector<int>{3});  // not a member: ignored
  CHECK(pick_leavers({5, 1, 2}, 1, {2, 1}) == std::vector<int>{1, 2});
}
