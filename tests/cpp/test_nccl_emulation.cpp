// The emulated NCCL library (a proof of the protocol against NCCL's API, not of NCCL) and the NCCL
// backend's communicator, transfer and watchdog running on it: ranks are threads here (the
// segment is mapped once per communicator, as by separate processes) and, for a peer's death,
// a forked process. The elastic controller on it runs in tests/python/test_elastic_nccl.py.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifdef DRA_WITH_NCCL
#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"
#endif

#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#ifdef DRA_WITH_NCCL
using namespace dra::comm;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<nccl_api> emulated(int version = nccl_version_code(2, 29, 0), bool peer_death_error = false) {
  nccl_emulation_options o;
  o.version = version;
  o.peer_death_error = peer_death_error;
  return make_emulated_nccl_api(o);
}

/// Runs fn(rank) on n threads and joins them.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

nccl_result wait_ready(nccl_api& api, nccl_handle h) {
  nccl_result state = nccl_result::in_progress;
  for (int i = 0; i < 20000 && state == nccl_result::in_progress; ++i) {
    api.comm_get_async_error(h, &state);
    if (state == nccl_result::in_progress) std::this_thread::sleep_for(100us);
  }
  return state;
}

/// n communicators of one world, initialised from one unique id (non-blocking, polled).
std::vector<nccl_handle> init_world(nccl_api& api, int n) {
  nccl_unique_id id;
  REQUIRE(api.get_unique_id(&id) == nccl_result::success);
  std::vector<nccl_handle> comms(static_cast<std::size_t>(n), nullptr);
  std::vector<nccl_result> started(static_cast<std::size_t>(n)), ready(static_cast<std::size_t>(n));
  on_ranks(n, [&](int r) {
    auto i = static_cast<std::size_t>(r);
    started[i] = api.comm_init_rank(&comms[i], n, id, r, nccl_config{});
    ready[i] = wait_ready(api, comms[i]);
  });
  for (int r = 0; r < n; ++r) {
    CHECK(started[static_cast<std::size_t>(r)] == nccl_result::in_progress);
    CHECK(ready[static_cast<std::size_t>(r)] == nccl_result::success);
  }
  return comms;
}

}  // namespace

TEST_CASE("nccl.emulation.all_reduce_and_broadcast_are_bit_identical") {
  auto api = emulated();
  const int n = 3;
  auto comms = init_world(*api, n);
  // 600k floats: several pieces of the emulation's 1 MiB slots.
  const std::size_t count = 600000;
  std::vector<std::vector<float>> data(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i)
      data[r][i] = 0.1f * static_cast<float>(r + 1) + 1e-7f * static_cast<float>(i);
  std::vector<std::vector<std::int64_t>> ints(n, std::vector<std::int64_t>(5));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < 5; ++i) ints[r][i] = (r + 1) * 1000 + static_cast<std::int64_t>(i);
  std::vector<std::vector<double>> bcast(n, std::vector<double>(7, -1.0));
  for (std::size_t i = 0; i < 7; ++i) bcast[1][i] = 3.5 + static_cast<double>(i);
  on_ranks(n, [&](int r) {
    auto h = comms[static_cast<std::size_t>(r)];
    CHECK(api->all_reduce_sum(data[r].data(), data[r].data(), count, nccl_dtype::float32, h, nullptr) ==
          nccl_result::success);
    CHECK(api->all_reduce_sum(ints[r].data(), ints[r].data(), 5, nccl_dtype::int64, h, nullptr) ==
          nccl_result::success);
    CHECK(api->broadcast(bcast[r].data(), bcast[r].data(), 7, nccl_dtype::float64, 1, h, nullptr) ==
          nccl_result::success);
  });
  const float expect0 = (0.1f * 1 + 0.1f * 2) + 0.1f * 3;  // summed in rank order on every rank
  CHECK(data[0][0] == expect0);
  CHECK(data[0] == data[1]);
  CHECK(data[1] == data[2]);
  CHECK(ints[2][4] == 6000 + 3 * 4);
  for (int r = 0; r < n; ++r) CHECK(bcast[r][6] == 9.5);
  for (auto h : comms) {
    CHECK(api->comm_finalize(h) == nccl_result::success);
    CHECK(api->comm_destroy(h) == nccl_result::success);
  }
}

TEST_CASE("nccl.emulation.grouped_send_recv_to_and_from_one_peer") {
  auto api = emulated();
  const int n = 2;
  auto comms = init_world(*api, n);
  const std::size_t count = 1 << 20;  // 4 MiB of int32: 8x the pair's ring, so the group must interleave
  std::vector<std::vector<std::int32_t>> out(n, std::vector<std::int32_t>(count)),
      in(n, std::vector<std::int32_t>(count));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) out[r][i] = static_cast<std::int32_t>(r * 7 + static_cast<int>(i % 1000));
  on_ranks(n, [&](int r) {
    auto h = comms[static_cast<std::size_t>(r)];
    const int peer = 1 - r;
    CHECK(api->group_start() == nccl_result::success);
    CHECK(api->send(out[r].data(), count, nccl_dtype::int32, peer, h, nullptr) == nccl_result::success);
    CHECK(api->recv(in[r].data(), count, nccl_dtype::int32, peer, h, nullptr) == nccl_result::success);
    CHECK(api->group_end() == nccl_result::success);
  });
  CHECK(in[0] == out[1]);
  CHECK(in[1] == out[0]);
  for (auto h : comms) api->comm_destroy(h);
}

TEST_CASE("nccl.emulation.shrink_renumbers_and_grow_keeps_ranks") {
  auto api = emulated();
  auto comms = init_world(*api, 3);
  // Shrink: rank 1 is excluded; 0 and 2 become 0 and 1.
  std::vector<nccl_handle> shrunk(3, nullptr);
  on_ranks(3, [&](int r) {
    if (r == 1) return;
    auto i = static_cast<std::size_t>(r);
    CHECK(api->comm_shrink(comms[i], {1}, &shrunk[i], nccl_config{}, false) == nccl_result::in_progress);
    CHECK(wait_ready(*api, shrunk[i]) == nccl_result::success);
    float v = static_cast<float>(r);  // 0 + 2
    CHECK(api->all_reduce_sum(&v, &v, 1, nccl_dtype::float32, shrunk[i], nullptr) == nccl_result::success);
    CHECK(v == 2.0f);
    double b = r == 2 ? 42.0 : 0.0;  // new rank 1 is old rank 2
    CHECK(api->broadcast(&b, &b, 1, nccl_dtype::float64, 1, shrunk[i], nullptr) == nccl_result::success);
    CHECK(b == 42.0);
  });
  // Grow the 2-rank world to 3: the root makes the single-use id, the joiner takes rank 2.
  nccl_unique_id grow_id;
  REQUIRE(api->comm_get_grow_id(shrunk[0], &grow_id) == nccl_result::success);
  std::vector<nccl_handle> grown(3, nullptr);
  on_ranks(3, [&](int r) {
    auto i = static_cast<std::size_t>(r);
    if (r == 1)
      CHECK(api->comm_grow(nullptr, 3, &grow_id, 2, &grown[i], nccl_config{}) == nccl_result::in_progress);
    else
      CHECK(api->comm_grow(shrunk[i], 3, r == 0 ? &grow_id : nullptr, -1, &grown[i], nccl_config{}) ==
            nccl_result::in_progress);
    CHECK(wait_ready(*api, grown[i]) == nccl_result::success);
    float v = 1.0f;
    CHECK(api->all_reduce_sum(&v, &v, 1, nccl_dtype::float32, grown[i], nullptr) == nccl_result::success);
    CHECK(v == 3.0f);
  });
  for (auto* set : {&comms, &shrunk, &grown})
    for (auto h : *set)
      if (h) api->comm_destroy(h);
}

TEST_CASE("nccl.emulation.a_missing_peer_hangs_until_revoked_from_another_thread") {
  auto api = emulated();
  auto comms = init_world(*api, 2);
  std::atomic<bool> returned{false};
  nccl_result r = nccl_result::success;
  std::thread blocked([&] {
    float v = 1.0f;
    r = api->all_reduce_sum(&v, &v, 1, nccl_dtype::float32, comms[0], nullptr);  // rank 1 never comes
    returned = true;
  });
  std::this_thread::sleep_for(200ms);
  CHECK_FALSE(returned.load());  // a hang, as NCCL's, not an error
  CHECK(api->comm_revoke(comms[0]) == nccl_result::success);
  blocked.join();
  CHECK(r == nccl_result::invalid_usage);
  float v = 1.0f;  // revoked: no more work, but it can still be shrunk or aborted
  CHECK(api->all_reduce_sum(&v, &v, 1, nccl_dtype::float32, comms[0], nullptr) == nccl_result::invalid_usage);
  CHECK(api->comm_abort(comms[0]) == nccl_result::success);
  CHECK(api->comm_abort(comms[1]) == nccl_result::success);
}

TEST_CASE("nccl.emulation.a_dead_process_is_an_asynchronous_error_when_asked") {
  auto api = emulated(nccl_version_code(2, 29, 0), /*peer_death_error=*/true);
  nccl_unique_id id;
  REQUIRE(api->get_unique_id(&id) == nccl_result::success);
  const pid_t child = ::fork();
  if (child == 0) {
    // The peer process: joins, then dies without taking part in the collective.
    auto peer = emulated();
    nccl_handle h = nullptr;
    peer->comm_init_rank(&h, 2, id, 1, nccl_config{});
    wait_ready(*peer, h);
    std::_Exit(0);
  }
  nccl_handle h = nullptr;
  CHECK(api->comm_init_rank(&h, 2, id, 0, nccl_config{}) == nccl_result::in_progress);
  CHECK(wait_ready(*api, h) == nccl_result::success);
  int status = 0;
  ::waitpid(child, &status, 0);  // reaped: the pid is gone
  float v = 1.0f;
  CHECK(api->all_reduce_sum(&v, &v, 1, nccl_dtype::float32, h, nullptr) == nccl_result::remote_error);
  nccl_result state = nccl_result::success;
  api->comm_get_async_error(h, &state);
  CHECK(state == nccl_result::remote_error);
  CHECK(api->last_error(h).find("is gone") != std::string::npos);
  api->comm_abort(h);
}

// ---- the backend on the emulated library: communicator, transfer, watchdog -------------------------

namespace {
struct world {
  std::shared_ptr<nccl_api> api = emulated();
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<nccl_backend>> backends;
  std::vector<std::unique_ptr<communicator>> comms;
  std::vector<std::string> logs;
  std::mutex mutex;

  explicit world(int n, std::shared_ptr<nccl_api> a = emulated()) : api(std::move(a)) {
    for (int r = 0; r < n; ++r) {
      nccl_backend_options o;
      o.log = [this](const std::string& line) {
        std::lock_guard<std::mutex> lock(mutex);
        logs.push_back(line);
      };
      backends.push_back(std::make_unique<nccl_backend>(api, o));
      comms.emplace_back();
    }
  }
  /// Rebuilds on the given ranks (universe ids = indices) concurrently; returns the errors.
  std::vector<std::string> rebuild(const std::vector<int>& who, std::uint64_t epoch,
                                   const std::vector<int>& old_members, const std::vector<int>& new_members,
                                   bool abortive = false) {
    std::vector<std::string> errors(comms.size());
    std::vector<std::thread> threads;
    for (int id : who) {
      threads.emplace_back([&, id] {
        rebuild_request req;
        req.epoch = epoch;
        req.old_members = old_members;
        req.new_members = new_members;
        req.self = id;
        req.abortive = abortive;
        req.timeout = 5s;
        req.collective_timeout = 500ms;
        try {
          comms[static_cast<std::size_t>(id)] = backends[static_cast<std::size_t>(id)]->rebuild(
              std::move(comms[static_cast<std::size_t>(id)]), req, store);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(id)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    return errors;
  }
  communicator& at(int r) { return *comms[static_cast<std::size_t>(r)]; }
};
}  // namespace

TEST_CASE("nccl.backend_on_emulation.collectives_point_to_point_and_transfer") {
  world w(3);
  for (const auto& e : w.rebuild({0, 1, 2}, 1, {}, {0, 1, 2})) CHECK(e.empty());
  CHECK(w.at(0).asynchronous());
  CHECK(w.at(0).device().is_cpu());
  // Every rank hands the same list to the transfer: rank 0 sends, 1 and 2 receive.
  std::vector<std::vector<at::Tensor>> state(3);
  for (int r = 0; r < 3; ++r) {
    const double fill = r == 0 ? 1.5 : 0.0;
    state[static_cast<std::size_t>(r)] = {at::full({300000}, fill, at::kFloat), at::full({3}, fill + 1, at::kDouble),
                                          at::full({5, 7}, static_cast<std::int64_t>(fill * 10), at::kLong)};
  }
  on_ranks(3, [&](int r) {
    auto& c = w.at(r);
    at::Tensor t = at::full({4}, static_cast<float>(r + 1));
    c.all_reduce_sum(t);
    CHECK(t[0].item<float>() == 6.0f);
    auto transfer = make_nccl_transfer(4096);  // small chunks: pieces cut across chunks and packed
    if (r == 0)
      transfer->send(c, state[0], {1, 2});
    else
      transfer->recv(c, state[static_cast<std::size_t>(r)], 0);
    c.barrier();
  });
  for (int r = 1; r < 3; ++r) {
    const auto& s = state[static_cast<std::size_t>(r)];
    CHECK(at::equal(s[0], state[0][0]));
    CHECK(at::equal(s[1], state[0][1]));
    CHECK(at::equal(s[2], state[0][2]));
  }
}

TEST_CASE("nccl.backend_on_emulation.watchdog_revokes_a_hung_collective_then_survivors_shrink_abortively") {
  world w(3);
  for (const auto& e : w.rebuild({0, 1, 2}, 1, {}, {0, 1, 2})) CHECK(e.empty());
  // Rank 2 hangs (never calls): 0 and 1 must fail within the collective timeout (500 ms), not hang.
  std::vector<std::string> errors(2);
  const auto t0 = std::chrono::steady_clock::now();
  on_ranks(2, [&](int r) {
    at::Tensor t = at::ones({8});
    try {
      w.at(r).all_reduce_sum(t);
    } catch (const dra::timeout_error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited < 3s);
  for (const auto& e : errors) {
    CHECK(e.find("all_reduce") != std::string::npos);
    CHECK(e.find("did not complete within 500 ms") != std::string::npos);
  }
  auto* c0 = dynamic_cast<nccl_communicator*>(&w.at(0));
  REQUIRE(c0);
  CHECK(c0->revoked());  // 2.29: revoked, so still shrinkable
  CHECK_FALSE(c0->healthy());
  for (const auto& e : w.rebuild({0, 1}, 2, {0, 1, 2}, {0, 1}, /*abortive=*/true)) CHECK(e.empty());
  CHECK(w.backends[0]->last_path() == nccl_path::shrink);
  CHECK(w.backends[0]->last_plan().abortive);
  on_ranks(2, [&](int r) {
    at::Tensor t = at::ones({2});
    w.at(r).all_reduce_sum(t);
    CHECK(t[1].item<float>() == 2.0f);
  });
  w.comms[2]->abort();
}

TEST_CASE("nccl.backend_on_emulation.before_2_28_the_watchdog_aborts_and_the_survivors_fresh_init") {
  world w(2, emulated(nccl_version_code(2, 27, 5)));
  for (const auto& e : w.rebuild({0, 1}, 1, {}, {0, 1})) CHECK(e.empty());
  at::Tensor t = at::ones({1});
  CHECK_THROWS_AS(w.at(0).all_reduce_sum(t), dra::timeout_error);  // rank 1 never comes
  auto* c0 = dynamic_cast<nccl_communicator*>(&w.at(0));
  CHECK(c0->handle() == nullptr);  // no revoke before 2.28: aborted
  for (const auto& e : w.rebuild({0}, 2, {0, 1}, {0}, true)) CHECK(e.empty());
  CHECK(w.backends[0]->last_path() == nccl_path::fresh_init);
  w.comms[1]->abort();
}

TEST_CASE("nccl.backend_on_emulation.a_world_s_rendezvous_keys_are_erased_two_worlds_later") {
  // Shrink, grow and fresh worlds one after the other: each world's ids and votes are erased by
  // its rank 0 once it has built two worlds since; only the last two worlds' keys stay.
  world w(3);
  const std::vector<int> all{0, 1, 2};
  const std::vector<int> two{0, 1};
  for (const auto& e : w.rebuild(all, 1, {}, all)) CHECK(e.empty());
  for (std::uint64_t e = 2; e <= 7; ++e) {
    const bool shrink = e % 2 == 0;
    for (const auto& err : w.rebuild(all, e, shrink ? all : two, shrink ? two : all)) CHECK(err.empty());
    if (!shrink) {
      on_ranks(3, [&](int r) {
        at::Tensor t = at::ones({1});
        w.at(r).all_reduce_sum(t);
        CHECK(t.item<float>() == 3.0f);
      });
    }
  }
  std::set<std::string> epochs;
  for (const auto& k : w.store->listKeys()) {
    INFO(k);
    REQUIRE(k.rfind("dra/nccl/", 0) == 0);
    epochs.insert(k.substr(9, k.find('/', 9) - 9));
  }
  CHECK(epochs == std::set<std::string>{"6", "7"});
}

TEST_CASE("nccl.backend_on_emulation.grow_through_the_backend") {
  world w(3);
  for (const auto& e : w.rebuild({0, 1}, 1, {}, {0, 1})) CHECK(e.empty());
  for (const auto& e : w.rebuild({0, 1, 2}, 2, {0, 1}, {0, 1, 2})) CHECK(e.empty());
  CHECK(w.backends[2]->last_path() == nccl_path::grow);
  CHECK(w.at(2).rank() == 2);
  on_ranks(3, [&](int r) {
    at::Tensor t = at::full({1}, static_cast<double>(r), at::kDouble);
    w.at(r).all_reduce_sum(t);
    CHECK(t.item<double>() == 3.0);
  });
}
#endif
