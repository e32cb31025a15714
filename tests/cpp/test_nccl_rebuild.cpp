// NCCL backend: the membership -> call mapping (pure functions) and the rebuild routine driven
// through a recording nccl_api. The double only proves which NCCL calls are made, in which
// order, with which arguments, on every rank; it says nothing about GPU behaviour (that is
// benchmarks/gpu/check.sh's job). The store is a real c10d::HashStore shared by rank threads.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dra/comm/nccl_plan.hpp"

#ifdef DRA_WITH_NCCL
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "dra/error.hpp"
#include "dra/torch/build_info.hpp"
#include "dra/torch/comm/nccl.hpp"
#endif

// c10's logging defines a one-argument CHECK; doctest's must win in this file.
#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

using namespace dra::comm;

namespace {
nccl_features features_at(int version, bool symbols = true) {
  nccl_features f;
  f.runtime_version = version;
  f.shrink_symbol = f.grow_symbols = f.revoke_symbol = symbols;
  return f;
}
}  // namespace

// ---- pure mapping -----------------------------------------------------------------------------

TEST_CASE("nccl.plan.version_code_and_gates") {
  CHECK((nccl_version_code(2, 27, 3) == 22703));
  CHECK(nccl_version_string(22903) == "2.29.3");
  CHECK(nccl_version_string(0) == "unknown");
  CHECK_FALSE(features_at(nccl_version_code(2, 26, 9)).shrink());
  CHECK((features_at(nccl_version_code(2, 27, 0)).shrink()));
  CHECK_FALSE(features_at(nccl_version_code(2, 28, 9)).grow());
  CHECK((features_at(nccl_version_code(2, 29, 0)).grow()));
  CHECK_FALSE(features_at(nccl_version_code(2, 27, 9)).revoke());
  CHECK((features_at(nccl_version_code(2, 28, 0)).revoke()));
  // A new-enough version without the entry point is not enough.
  CHECK_FALSE(features_at(nccl_version_code(2, 30, 0), false).shrink());
  CHECK_FALSE(features_at(nccl_version_code(2, 30, 0), false).grow());
}

TEST_CASE("nccl.plan.shrink_exclusions") {
  CHECK((shrink_exclusions({10, 11, 12, 13}, {10, 12}) == std::vector<int>{1, 3}));
  CHECK((shrink_exclusions({10, 11, 12}, {11, 12}) == std::vector<int>{0}));
  CHECK_FALSE(shrink_exclusions({10, 11, 12}, {12, 10}).has_value());      // reordered: shrink keeps the order
  CHECK_FALSE(shrink_exclusions({10, 11, 12}, {10, 13}).has_value());      // a joiner
  CHECK_FALSE(shrink_exclusions({10, 11, 12}, {10, 11, 12}).has_value());  // nothing removed
  CHECK_FALSE(shrink_exclusions({10, 11}, {}).has_value());
}

TEST_CASE("nccl.plan.prefix_grow_and_rank_map") {
  CHECK((is_prefix_grow({10, 11}, {10, 11, 12})));
  CHECK_FALSE(is_prefix_grow({10, 11}, {11, 10, 12}));  // old ranks would change number
  CHECK_FALSE(is_prefix_grow({10, 11}, {10, 11}));
  CHECK_FALSE(is_prefix_grow({}, {10}));
  CHECK((shrink_rank_map(4, {1, 3}) == std::vector<int>{0, -1, 1, -1}));
  CHECK((shrink_rank_map(3, {0}) == std::vector<int>{-1, 0, 1}));
}

TEST_CASE("nccl.plan.decisions") {
  const auto modern = features_at(nccl_version_code(2, 29, 3));
  SUBCASE("first init") {
    const auto p = plan_rebuild({}, {5, 6}, 6, false, false, modern);
    CHECK(p.path == nccl_path::fresh_init);
    CHECK(p.new_rank == 1);
    CHECK(p.new_size == 2);
  }
  SUBCASE("leaver, graceful and abortive") {
    CHECK((plan_rebuild({5, 6}, {5}, 6, false, true, modern).path == nccl_path::leave));
    const auto p = plan_rebuild({5, 6}, {5}, 6, true, true, modern);
    CHECK(p.path == nccl_path::leave);
    CHECK(p.release_parent_with_abort);
  }
  SUBCASE("unchanged membership keeps, unless a fault or no parent") {
    CHECK((plan_rebuild({5, 6}, {5, 6}, 5, false, true, modern).path == nccl_path::keep));
    CHECK((plan_rebuild({5, 6}, {5, 6}, 5, true, true, modern).path == nccl_path::fresh_init));
    CHECK((plan_rebuild({5, 6}, {5, 6}, 5, false, false, modern).path == nccl_path::fresh_init));
  }
  SUBCASE("shrink and abortive shrink") {
    auto p = plan_rebuild({5, 6, 7}, {5, 7}, 7, false, true, modern);
    CHECK(p.path == nccl_path::shrink);
    CHECK((p.exclude_ranks == std::vector<int>{1}));
    CHECK(p.old_rank == 2);
    CHECK(p.new_rank == 1);
    CHECK_FALSE(p.release_parent_with_abort);
    p = plan_rebuild({5, 6, 7}, {5, 7}, 5, true, true, modern);
    CHECK(p.path == nccl_path::shrink);
    CHECK(p.abortive);
    CHECK(p.release_parent_with_abort);
  }
  SUBCASE("shrink gated on the runtime version and the parent") {
    const auto p = plan_rebuild({5, 6, 7}, {5, 7}, 5, false, true, features_at(nccl_version_code(2, 26, 5)));
    CHECK(p.path == nccl_path::fresh_init);
    CHECK(p.reason.find("2.26.5 < 2.27") != std::string::npos);
    CHECK((plan_rebuild({5, 6, 7}, {5, 7}, 5, false, false, modern).path == nccl_path::fresh_init));
  }
  SUBCASE("grow: root, other old rank, joiner") {
    auto p = plan_rebuild({5, 6}, {5, 6, 7}, 5, false, true, modern);
    CHECK(p.path == nccl_path::grow);
    CHECK(p.grow_root);
    CHECK_FALSE(p.joiner);
    p = plan_rebuild({5, 6}, {5, 6, 7}, 6, false, true, modern);
    CHECK(p.path == nccl_path::grow);
    CHECK_FALSE(p.grow_root);
    p = plan_rebuild({5, 6}, {5, 6, 7}, 7, false, false, modern);
    CHECK(p.path == nccl_path::grow);
    CHECK(p.joiner);
    CHECK(p.new_rank == 2);
  }
  SUBCASE("grow gated on 2.29, and never together with a fault") {
    const auto p = plan_rebuild({5, 6}, {5, 6, 7}, 7, false, false, features_at(nccl_version_code(2, 28, 9)));
    CHECK(p.path == nccl_path::fresh_init);
    CHECK(p.reason.find("< 2.29") != std::string::npos);
    CHECK((plan_rebuild({5, 6}, {5, 6, 7}, 5, true, true, modern).path == nccl_path::fresh_init));
  }
  SUBCASE("mixed leave+join and reordering fall back to fresh init") {
    CHECK((plan_rebuild({5, 6}, {5, 7}, 5, false, true, modern).path == nccl_path::fresh_init));
    CHECK((plan_rebuild({5, 6, 7}, {7, 5}, 5, false, true, modern).path == nccl_path::fresh_init));
  }
  SUBCASE("only fast paths need a vote") {
    CHECK((needs_agreement(plan_rebuild({5, 6}, {5}, 5, false, true, modern))));
    CHECK_FALSE(needs_agreement(plan_rebuild({}, {5}, 5, false, false, modern)));
  }
}

#ifdef DRA_WITH_NCCL
// ---- the routine, through a recording double -------------------------------------------------

namespace {

std::string join(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

/// Records every NCCL call of one rank. Communicators are named c1, c2, ... in creation order;
/// ids carry a tag ("I0" = init id made by the rank with tag 0, "G0" = grow id) so a test can
/// check who created the id a rank used. ncclCommGetAsyncError polls are counted, not recorded.
class recording_nccl final : public nccl_api {
 public:
  explicit recording_nccl(int version, char tag) : tag_(tag) { features_ = features_at(version); }

  std::vector<std::string> calls;
  int polls_until_ready = 2;  ///< in_progress answers before a new communicator is ready
  bool never_ready = false;   ///< init/shrink/grow never complete (a peer that never comes)
  bool fail_shrink = false;   ///< ncclCommShrink returns an error
  int polls = 0;

  nccl_features features() const override { return features_; }
  nccl_result get_unique_id(nccl_unique_id* id) override {
    stamp(id, 'I');
    calls.push_back("get_unique_id");
    return nccl_result::success;
  }
  nccl_result comm_init_rank(nccl_handle* comm, int nranks, const nccl_unique_id& id, int rank,
                             const nccl_config& config) override {
    *comm = create();
    calls.push_back("init(n=" + std::to_string(nranks) + ",rank=" + std::to_string(rank) + ",id=" + tag_of(&id) +
                    ",blocking=" + std::to_string(config.blocking) + ")->" + name(*comm));
    return nccl_result::in_progress;
  }
  nccl_result comm_get_async_error(nccl_handle comm, nccl_result* state) override {
    ++polls;
    auto& left = pending_[comm];
    if (never_ready || left > 0) {
      if (left > 0) --left;
      *state = nccl_result::in_progress;
    } else {
      *state = nccl_result::success;
    }
    return nccl_result::success;
  }
  nccl_result comm_finalize(nccl_handle comm) override { return record("finalize", comm); }
  nccl_result comm_destroy(nccl_handle comm) override { return record("destroy", comm); }
  nccl_result comm_abort(nccl_handle comm) override { return record("abort", comm); }
  nccl_result comm_revoke(nccl_handle comm) override { return record("revoke", comm); }
  nccl_result comm_shrink(nccl_handle comm, const std::vector<int>& exclude_ranks, nccl_handle* new_comm,
                          const nccl_config&, bool abort_in_flight) override {
    if (fail_shrink) {
      calls.push_back("shrink(" + name(comm) + ")->error");
      *new_comm = nullptr;
      return nccl_result::internal_error;
    }
    *new_comm = create();
    calls.push_back("shrink(" + name(comm) + ",exclude=[" + join(exclude_ranks) +
                    "],abort=" + std::to_string(abort_in_flight) + ")->" + name(*new_comm));
    return nccl_result::in_progress;
  }
  nccl_result comm_get_grow_id(nccl_handle comm, nccl_unique_id* id) override {
    stamp(id, 'G');
    calls.push_back("get_grow_id(" + name(comm) + ")");
    return nccl_result::success;
  }
  nccl_result comm_grow(nccl_handle comm, int nranks, const nccl_unique_id* id, int rank, nccl_handle* new_comm,
                        const nccl_config&) override {
    *new_comm = create();
    calls.push_back("grow(" + (comm ? name(comm) : std::string("null")) + ",n=" + std::to_string(nranks) +
                    ",id=" + tag_of(id) + ",rank=" + std::to_string(rank) + ")->" + name(*new_comm));
    return nccl_result::in_progress;
  }
  nccl_result all_reduce_sum(const void*, void*, std::size_t, nccl_dtype, nccl_handle, void*) override {
    return nccl_result::invalid_usage;  // collectives need a GPU: not exercised here
  }
  nccl_result broadcast(const void*, void*, std::size_t, nccl_dtype, int, nccl_handle, void*) override {
    return nccl_result::invalid_usage;
  }
  nccl_result group_start() override { return nccl_result::success; }
  nccl_result group_end() override { return nccl_result::success; }
  nccl_result send(const void*, std::size_t, nccl_dtype, int, nccl_handle, void*) override {
    return nccl_result::invalid_usage;  // point-to-point is proven on the emulated library
  }
  nccl_result recv(void*, std::size_t, nccl_dtype, int, nccl_handle, void*) override {
    return nccl_result::invalid_usage;
  }
  std::string error_string(nccl_result r) const override { return "recorded error " + std::to_string(int(r)); }
  std::string last_error(nccl_handle) const override { return ""; }

  bool called(const std::string& prefix) const {
    return std::any_of(calls.begin(), calls.end(), [&](const std::string& c) { return c.rfind(prefix, 0) == 0; });
  }

 private:
  nccl_handle create() {
    auto h = reinterpret_cast<nccl_handle>(next_++);
    pending_[h] = polls_until_ready;
    return h;
  }
  std::string name(nccl_handle h) const { return "c" + std::to_string(reinterpret_cast<std::uintptr_t>(h)); }
  nccl_result record(const char* what, nccl_handle comm) {
    calls.push_back(std::string(what) + "(" + name(comm) + ")");
    return nccl_result::success;
  }
  void stamp(nccl_unique_id* id, char kind) {
    id->bytes.fill(0);
    id->bytes[0] = kind;
    id->bytes[1] = tag_;
  }
  static std::string tag_of(const nccl_unique_id* id) {
    if (!id) return "none";
    return std::string{id->bytes[0], id->bytes[1]};
  }

  nccl_features features_;
  char tag_;
  std::uintptr_t next_ = 1;
  std::map<nccl_handle, int> pending_;
};

struct rank_ctx {
  std::shared_ptr<recording_nccl> api;
  std::unique_ptr<nccl_backend> backend;
  std::vector<std::string> log;
  std::unique_ptr<communicator> comm;
  std::string error;
};

/// One simulated process per universe id; the double's tag is the id's last digit.
struct world_sim {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::map<int, rank_ctx> ranks;

  rank_ctx& add(int id, int version) {
    auto& r = ranks[id];
    r.api = std::make_shared<recording_nccl>(version, static_cast<char>('0' + id % 10));
    nccl_backend_options o;
    o.log = [&r](const std::string& line) { r.log.push_back(line); };
    r.backend = std::make_unique<nccl_backend>(r.api, o);
    return r;
  }

  /// Runs rebuild on each of `who` concurrently (as separate processes would).
  void rebuild(const std::vector<int>& who, std::uint64_t epoch, const std::vector<int>& old_members,
               const std::vector<int>& new_members, bool abortive = false,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    std::vector<std::thread> threads;
    for (int id : who) {
      threads.emplace_back([&, id] {
        auto& r = ranks.at(id);
        rebuild_request req;
        req.epoch = epoch;
        req.old_members = old_members;
        req.new_members = new_members;
        req.self = id;
        req.abortive = abortive;
        req.timeout = timeout;
        r.error.clear();
        try {
          r.comm = r.backend->rebuild(std::move(r.comm), req, store);
        } catch (const dra::timeout_error& e) {
          r.error = std::string("timeout: ") + e.what();
        } catch (const std::exception& e) {
          r.error = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  void clear_calls() {
    for (auto& [id, r] : ranks) r.api->calls.clear();
  }
  std::vector<std::string>& calls(int id) { return ranks.at(id).api->calls; }
};

using strings = std::vector<std::string>;

bool logged(const rank_ctx& r, const std::string& text) {
  return std::any_of(r.log.begin(), r.log.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}
constexpr int v2_26 = nccl_version_code(2, 26, 2);
constexpr int v2_27 = nccl_version_code(2, 27, 3);
constexpr int v2_28 = nccl_version_code(2, 28, 9);
constexpr int v2_29 = nccl_version_code(2, 29, 1);

void start_world(world_sim& w, const std::vector<int>& members, int version) {
  for (int id : members) w.add(id, version);
  w.rebuild(members, 1, {}, members);
  for (int id : members) REQUIRE_MESSAGE(w.ranks.at(id).error.empty(), w.ranks.at(id).error);
  w.clear_calls();
}

}  // namespace

TEST_CASE("nccl.rebuild.fresh_init") {
  world_sim w;
  for (int id : {10, 11, 12}) w.add(id, v2_29);
  w.rebuild({10, 11, 12}, 1, {}, {10, 11, 12});
  // New rank 0 creates the id; everyone inits non-blocking with that id and its own rank.
  CHECK((w.calls(10) == strings{"get_unique_id", "init(n=3,rank=0,id=I0,blocking=0)->c1"}));
  CHECK((w.calls(11) == strings{"init(n=3,rank=1,id=I0,blocking=0)->c1"}));
  CHECK((w.calls(12) == strings{"init(n=3,rank=2,id=I0,blocking=0)->c1"}));
  for (int id : {10, 11, 12}) {
    auto& r = w.ranks.at(id);
    REQUIRE(r.comm);
    CHECK(r.comm->rank() == id - 10);
    CHECK(r.comm->size() == 3);
    CHECK(r.comm->epoch() == 1);
    CHECK(r.backend->last_path() == nccl_path::fresh_init);
    CHECK(r.api->polls >= 3);  // polled through the in_progress answers
    REQUIRE(r.log.size() == 2);
    CHECK(r.log[0].find("\"event\":\"nccl_rebuild_plan\"") != std::string::npos);
    CHECK(r.log[1].find("\"path\":\"fresh_init\"") != std::string::npos);
  }
  // Releasing a communicator: finalize, then destroy.
  w.ranks.at(11).comm.reset();
  CHECK(w.calls(11).back() == "destroy(c1)");
  CHECK(w.calls(11)[w.calls(11).size() - 2] == "finalize(c1)");
}

TEST_CASE("nccl.rebuild.shrink") {
  world_sim w;
  start_world(w, {10, 11, 12}, v2_27);
  w.rebuild({10, 11, 12}, 2, {10, 11, 12}, {10, 12});
  // Survivors shrink with old rank 1 excluded, then release the parent gracefully.
  CHECK((w.calls(10) == strings{"shrink(c1,exclude=[1],abort=0)->c2", "finalize(c1)", "destroy(c1)"}));
  CHECK((w.calls(12) == strings{"shrink(c1,exclude=[1],abort=0)->c2", "finalize(c1)", "destroy(c1)"}));
  // The leaver takes no part in the shrink and releases its communicator.
  CHECK((w.calls(11) == strings{"finalize(c1)", "destroy(c1)"}));
  CHECK_FALSE(w.ranks.at(11).comm);
  // Renumbered contiguously, in the old order.
  CHECK(w.ranks.at(10).comm->rank() == 0);
  CHECK(w.ranks.at(12).comm->rank() == 1);
  CHECK(w.ranks.at(12).comm->size() == 2);
  CHECK(w.ranks.at(12).comm->epoch() == 2);
  CHECK(w.ranks.at(12).backend->last_path() == nccl_path::shrink);
}

TEST_CASE("nccl.rebuild.abortive_shrink") {
  world_sim w;
  start_world(w, {10, 11, 12, 13}, v2_29);
  // 11 died: it never calls rebuild. Survivors shrink with NCCL_SHRINK_ABORT, then abort the parent.
  w.rebuild({10, 12, 13}, 2, {10, 11, 12, 13}, {10, 12, 13}, /*abortive=*/true);
  for (int id : {10, 12, 13}) {
    INFO("rank " << id);
    CHECK(w.ranks.at(id).error.empty());
    CHECK((w.calls(id) == strings{"shrink(c1,exclude=[1],abort=1)->c2", "abort(c1)"}));
    CHECK_FALSE(w.ranks.at(id).api->called("destroy(c1)"));
    CHECK_FALSE(w.ranks.at(id).api->called("finalize(c1)"));
  }
  CHECK(w.ranks.at(13).comm->rank() == 2);
  CHECK(w.ranks.at(13).comm->size() == 3);
}

TEST_CASE("nccl.rebuild.abortive_leaver_aborts") {
  world_sim w;
  start_world(w, {10, 11}, v2_29);
  w.rebuild({10, 11}, 2, {10, 11}, {10}, /*abortive=*/true);
  CHECK((w.calls(11) == strings{"abort(c1)"}));
  CHECK((w.calls(10) == strings{"shrink(c1,exclude=[1],abort=1)->c2", "abort(c1)"}));
}

TEST_CASE("nccl.rebuild.grow") {
  world_sim w;
  start_world(w, {10, 11}, v2_29);
  w.add(12, v2_29);
  w.rebuild({10, 11, 12}, 2, {10, 11}, {10, 11, 12});
  // Old rank 0 makes the single-use grow id; old ranks grow with rank -1, the joiner with its new rank.
  CHECK((w.calls(10) == strings{"get_grow_id(c1)", "grow(c1,n=3,id=G0,rank=-1)->c2", "finalize(c1)", "destroy(c1)"}));
  CHECK((w.calls(11) == strings{"grow(c1,n=3,id=none,rank=-1)->c2", "finalize(c1)", "destroy(c1)"}));
  CHECK((w.calls(12) == strings{"grow(null,n=3,id=G0,rank=2)->c1"}));
  // Existing ranks keep their numbers; the joiner takes the next one.
  CHECK(w.ranks.at(10).comm->rank() == 0);
  CHECK(w.ranks.at(11).comm->rank() == 1);
  CHECK(w.ranks.at(12).comm->rank() == 2);
  CHECK(w.ranks.at(12).comm->size() == 3);
  for (int id : {10, 11, 12}) CHECK(w.ranks.at(id).backend->last_path() == nccl_path::grow);
}

TEST_CASE("nccl.rebuild.grow_unavailable_reinits") {
  world_sim w;
  start_world(w, {10, 11}, v2_28);
  w.add(12, v2_28);
  w.rebuild({10, 11, 12}, 2, {10, 11}, {10, 11, 12});
  CHECK((w.calls(10) ==
         strings{"finalize(c1)", "destroy(c1)", "get_unique_id", "init(n=3,rank=0,id=I0,blocking=0)->c2"}));
  CHECK((w.calls(11) == strings{"finalize(c1)", "destroy(c1)", "init(n=3,rank=1,id=I0,blocking=0)->c2"}));
  CHECK((w.calls(12) == strings{"init(n=3,rank=2,id=I0,blocking=0)->c1"}));
  CHECK(logged(w.ranks.at(12), "2.28.9 < 2.29"));
  CHECK(logged(w.ranks.at(10), "2.28.9 < 2.29"));
}

TEST_CASE("nccl.rebuild.shrink_unavailable_reinits_with_the_runtime_version") {
  // Built against a header that has ncclCommShrink; the loaded library is older: the routine
  // must go by the library.
  const auto header = dra::get_build_info().nccl_header_version;
  REQUIRE_FALSE(header.empty());
  CHECK(std::stoi(header.substr(header.find('.') + 1)) >= 27);
  world_sim w;
  start_world(w, {10, 11, 12}, v2_26);
  w.rebuild({10, 11, 12}, 2, {10, 11, 12}, {10, 12});
  CHECK((w.calls(10) ==
         strings{"finalize(c1)", "destroy(c1)", "get_unique_id", "init(n=2,rank=0,id=I0,blocking=0)->c2"}));
  CHECK((w.calls(12) == strings{"finalize(c1)", "destroy(c1)", "init(n=2,rank=1,id=I0,blocking=0)->c2"}));
  CHECK((w.calls(11) == strings{"finalize(c1)", "destroy(c1)"}));
  CHECK_FALSE(w.ranks.at(10).api->called("shrink"));
  CHECK(logged(w.ranks.at(10), "2.26.2 < 2.27"));
}

TEST_CASE("nccl.rebuild.init_timeout_aborts") {
  world_sim w;
  auto& r = w.add(10, v2_29);
  r.api->never_ready = true;
  w.rebuild({10}, 1, {}, {10}, false, std::chrono::milliseconds(80));
  CHECK((r.error.rfind("timeout:", 0) == 0));
  CHECK(r.error.find("ncclCommInitRankConfig") != std::string::npos);
  CHECK((r.api->calls == strings{"get_unique_id", "init(n=1,rank=0,id=I0,blocking=0)->c1", "abort(c1)"}));
  CHECK_FALSE(r.comm);
}

TEST_CASE("nccl.rebuild.missing_peer_times_out") {
  // Rank 1 of a two-rank init never shows up: rank 0 cannot finish (its init never completes),
  // and rank 1's counterpart waiting for the id would time out in the store.
  world_sim w;
  auto& r0 = w.add(10, v2_29);
  r0.api->never_ready = true;
  auto& r1 = w.add(11, v2_29);
  w.rebuild({11}, 1, {}, {10, 11}, false, std::chrono::milliseconds(80));
  CHECK((r1.error.rfind("timeout:", 0) == 0));
  CHECK(r1.error.find("store key") != std::string::npos);
  CHECK(r1.api->calls.empty());
  w.rebuild({10}, 1, {}, {10, 11}, false, std::chrono::milliseconds(80));
  CHECK((r0.error.rfind("timeout:", 0) == 0));
  CHECK(r0.api->calls.back() == "abort(c1)");
}

TEST_CASE("nccl.rebuild.fast_path_failure_falls_back_on_every_rank") {
  world_sim w;
  start_world(w, {10, 11, 12}, v2_29);
  w.ranks.at(12).api->fail_shrink = true;
  w.rebuild({10, 11, 12}, 2, {10, 11, 12}, {10, 12});
  CHECK(w.ranks.at(10).error.empty());
  CHECK(w.ranks.at(12).error.empty());
  // 10's shrink succeeded, 12's failed: both abort what they hold and fresh-init together.
  CHECK((w.calls(10) == strings{"shrink(c1,exclude=[1],abort=0)->c2", "abort(c2)", "abort(c1)", "get_unique_id",
                                "init(n=2,rank=0,id=I0,blocking=0)->c3"}));
  CHECK((w.calls(12) == strings{"shrink(c1)->error", "abort(c1)", "init(n=2,rank=1,id=I0,blocking=0)->c2"}));
  CHECK(w.ranks.at(10).backend->last_path() == nccl_path::fresh_init);
  CHECK(w.ranks.at(12).comm->rank() == 1);
  CHECK(logged(w.ranks.at(12), "nccl_rebuild_fallback"));
  CHECK(logged(w.ranks.at(10), "another member's fast path failed"));
}

TEST_CASE("nccl.rebuild.disagreement_falls_back") {
  world_sim w;
  start_world(w, {10, 11, 12}, v2_29);
  w.ranks.at(12).comm->abort();  // 12 lost its communicator (a fault it handled alone)
  w.clear_calls();
  w.rebuild({10, 11, 12}, 2, {10, 11, 12}, {10, 12});
  CHECK((w.calls(10) ==
         strings{"finalize(c1)", "destroy(c1)", "get_unique_id", "init(n=2,rank=0,id=I0,blocking=0)->c2"}));
  CHECK((w.calls(12) == strings{"init(n=2,rank=1,id=I0,blocking=0)->c2"}));
  CHECK(w.ranks.at(10).backend->last_plan().path == nccl_path::shrink);
  CHECK(w.ranks.at(10).backend->last_path() == nccl_path::fresh_init);
  CHECK(logged(w.ranks.at(10), "another member cannot take this path"));
}

TEST_CASE("nccl.rebuild.unchanged_membership_keeps") {
  world_sim w;
  start_world(w, {10, 11}, v2_29);
  const communicator* before = w.ranks.at(11).comm.get();
  w.rebuild({10, 11}, 5, {10, 11}, {10, 11});
  CHECK(w.calls(10).empty());
  CHECK(w.calls(11).empty());
  CHECK(w.ranks.at(11).comm.get() == before);
  CHECK(w.ranks.at(11).comm->epoch() == 5);
  // The same members with a fault reported: abort and fresh init.
  w.rebuild({10, 11}, 6, {10, 11}, {10, 11}, true);
  CHECK((w.calls(11) == strings{"abort(c1)", "init(n=2,rank=1,id=I0,blocking=0)->c2"}));
}

TEST_CASE("nccl.rebuild.bad_input_changes_nothing") {
  world_sim w;
  start_world(w, {10}, v2_29);
  auto& r = w.ranks.at(10);
  rebuild_request req;
  req.epoch = 2;
  req.old_members = {10};
  req.self = 10;
  CHECK_THROWS_AS(r.backend->rebuild(nullptr, req, w.store), std::invalid_argument);  // empty new world
  req.new_members = {10, 10};
  CHECK_THROWS_AS(r.backend->rebuild(nullptr, req, w.store), std::invalid_argument);
  req.new_members = {10};
  req.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(r.backend->rebuild(nullptr, req, w.store), doctest::Contains("timeout"), std::invalid_argument);
  CHECK(r.api->calls.empty());
  CHECK_THROWS_AS(nccl_backend(nullptr), std::invalid_argument);
}

TEST_CASE("nccl.runtime.load_reports_version_or_why_not") {
  // On a machine with libnccl (the wheel or torch's), the loaded version is reported; without
  // one the error says what was tried. Either way nothing throws here.
  const int v = nccl_runtime_version();
  if (v > 0) {
    CHECK(v >= nccl_nonblocking_min);
    CHECK(nccl_load_error().empty());
  } else {
    CHECK(nccl_load_error().find("cannot load NCCL") != std::string::npos);
  }
}

TEST_CASE("nccl.runtime.real_library_resolves_the_fast_paths_of_its_version") {
  // The real dlopen'd table: each fast path is on exactly when the loaded library's version has
  // it (the entry points resolve), whatever header dra was compiled against. No GPU needed.
  if (nccl_runtime_version() == 0) return;  // no libnccl here: nothing to check
  const auto api = load_nccl_api();
  const auto f = api->features();
  CHECK(f.runtime_version == nccl_runtime_version());
  CHECK(f.shrink_symbol == (f.runtime_version >= nccl_shrink_min));
  CHECK(f.grow_symbols == (f.runtime_version >= nccl_grow_min));
  CHECK(f.revoke_symbol == (f.runtime_version >= nccl_revoke_min));
  CHECK(api->error_string(nccl_result::invalid_argument).size() > 0);
}
#endif
