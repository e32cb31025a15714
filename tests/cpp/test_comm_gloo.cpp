// Gloo backend: real c10d TCPStore on loopback, real ProcessGroupGloo, one thread per rank.
// doctest assertions are not thread-safe, so rank threads only record what they saw and the
// test thread asserts afterwards.
#include <ATen/Functions.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/comm/gloo.hpp"

// c10's logging defines a one-argument CHECK; doctest's must win in this file.
#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

using namespace dra::comm;
using namespace std::chrono_literals;

namespace {

// Healthy worlds get a generous timeout: on a loaded CI machine a rendezvous of 4 threads can
// take seconds. The timeout under test (a hung member, a missing peer) is short.
constexpr std::chrono::milliseconds kLong{15000};
constexpr std::chrono::milliseconds kShort{1500};

gloo_backend_options loopback() {
  gloo_backend_options o;
  o.hostname = "127.0.0.1";
  return o;
}

// The server store of one test, on a free port chosen by the OS.
c10::intrusive_ptr<c10d::TCPStore> make_server() {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = 60s;  // c10d's first connection in a process may wait out a stalled resolver (store_client.cpp)
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  store->setTimeout(10s);
  return store;
}

// One client per rank thread: a TCPStore serialises its blocking calls, so threads sharing one
// client could wait on each other's keys forever.
c10::intrusive_ptr<c10d::Store> make_client(std::uint16_t port) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = 60s;  // c10d's first connection in a process may wait out a stalled resolver (store_client.cpp)
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  store->setTimeout(10s);
  return store;
}

rebuild_request request(std::uint64_t epoch, std::vector<int> old_members, std::vector<int> new_members, int self,
                        bool abortive = false, std::chrono::milliseconds timeout = kLong) {
  rebuild_request r;
  r.epoch = epoch;
  r.old_members = std::move(old_members);
  r.new_members = std::move(new_members);
  r.self = self;
  r.abortive = abortive;
  r.timeout = timeout;
  return r;
}

// Runs fn(i) on n threads; returns each thread's exception message ("" when it returned).
std::vector<std::string> run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = std::string("exception: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void check_no_errors(const std::vector<std::string>& errors) {
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
}

// A one-shot gate the test thread opens once the other ranks are done with a vanished member.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void release() {
    {
      std::lock_guard<std::mutex> lock(m);
      open = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return open; });
  }
};

}  // namespace

TEST_CASE("comm.gloo.first_init") {
  auto server = make_server();
  const std::uint16_t port = server->getPort();
  const std::vector<int> members{0, 1, 2};
  std::vector<int> ranks(3, -1), sizes(3, -1);
  std::vector<at::Tensor> sums(3), strided(3);
  std::vector<std::string> backend_names(3);
  auto errors = run_threads(3, [&](int i) {
    gloo_backend backend(loopback());
    auto comm = backend.rebuild(nullptr, request(1, {}, members, i), make_client(port));
    ranks[i] = comm->rank();
    sizes[i] = comm->size();
    backend_names[i] = comm->c10d_backend() ? comm->c10d_backend()->getBackendName() : "";
    at::Tensor t = at::ones({4}) * (comm->rank() + 1);
    comm->all_reduce_sum(t);
    sums[i] = t;
    // A strided view is reduced in place too (through a contiguous copy).
    at::Tensor m = at::arange(6, at::kFloat).reshape({2, 3}) * (i + 1);
    at::Tensor view = m.t();
    comm->all_reduce_sum(view);
    strided[i] = m;
    comm->barrier();
  });
  check_no_errors(errors);
  const at::Tensor expected_strided = at::arange(6, at::kFloat).reshape({2, 3}) * 6;
  for (int i = 0; i < 3; ++i) {
    CHECK(ranks[i] == i);
    CHECK(sizes[i] == 3);
    CHECK(backend_names[i] == "gloo");
    REQUIRE(sums[i].defined());
    CHECK(at::equal(sums[i], at::full({4}, 6.0)));  // 1 + 2 + 3
    CHECK(at::equal(strided[i], expected_strided));
  }
}

TEST_CASE("comm.gloo.shrink") {
  auto server = make_server();
  const std::uint16_t port = server->getPort();
  // Universe ids 10, 11, 12; 11 leaves, so 12 becomes rank 1.
  const std::vector<int> uids{10, 11, 12};
  const std::vector<int> after{10, 12};
  std::vector<int> new_rank(3, -2), new_size(3, -2);
  std::vector<std::uint64_t> new_epoch(3, 0);
  std::vector<bool> got_null(3, false);
  std::vector<double> sums(3, -1.0);
  auto errors = run_threads(3, [&](int i) {
    gloo_backend backend(loopback());
    auto store = make_client(port);
    auto comm = backend.rebuild(nullptr, request(1, {}, uids, uids[i]), store);
    at::Tensor t = at::ones({1});
    comm->all_reduce_sum(t);  // the old world works before the change
    auto next = backend.rebuild(std::move(comm), request(2, uids, after, uids[i]), store);
    got_null[i] = next == nullptr;
    if (!next) return;
    new_rank[i] = next->rank();
    new_size[i] = next->size();
    new_epoch[i] = next->epoch();
    at::Tensor s = at::full({3}, static_cast<double>(next->rank() + 1), at::kDouble);
    next->all_reduce_sum(s);
    sums[i] = s[2].item<double>();
  });
  check_no_errors(errors);
  CHECK_FALSE(got_null[0]);
  CHECK(got_null[1]);
  CHECK_FALSE(got_null[2]);
  CHECK(new_rank[0] == 0);
  CHECK(new_rank[2] == 1);
  CHECK(new_size[0] == 2);
  CHECK(new_size[2] == 2);
  CHECK(new_epoch[0] == 2);
  CHECK(sums[0] == 3.0);  // ranks 0 and 1 contribute 1 and 2
  CHECK(sums[2] == 3.0);
}

TEST_CASE("comm.gloo.grow_with_joiners") {
  auto server = make_server();
  const std::uint16_t port = server->getPort();
  const std::vector<int> before{0, 1};
  const std::vector<int> after{0, 1, 5, 7};  // joiners 5 and 7 take ranks 2 and 3
  const std::vector<int> uids{0, 1, 5, 7};
  std::vector<int> new_rank(4, -1);
  std::vector<at::Tensor> received(4);
  std::vector<double> sums(4, -1.0);
  auto errors = run_threads(4, [&](int i) {
    gloo_backend backend(loopback());
    auto store = make_client(port);
    const int self = uids[i];
    std::unique_ptr<communicator> comm;
    if (i < 2) {
      comm = backend.rebuild(nullptr, request(1, {}, before, self), store);
      at::Tensor t = at::ones({1});
      comm->all_reduce_sum(t);
    }
    // Joiners pass no communicator: they only know the old member list.
    comm = backend.rebuild(std::move(comm), request(2, before, after, self), store);
    new_rank[i] = comm->rank();
    // Rank 0 holds the "parameters"; everybody else starts from garbage.
    at::Tensor params = comm->rank() == 0 ? at::arange(5, at::kFloat) * 3.0 + 0.5 : at::full({5}, -1.0f);
    comm->broadcast(params, 0);
    received[i] = params;
    at::Tensor one = at::ones({1});
    comm->all_reduce_sum(one);
    sums[i] = one.item<double>();
  });
  check_no_errors(errors);
  const at::Tensor leader = at::arange(5, at::kFloat) * 3.0 + 0.5;
  for (int i = 0; i < 4; ++i) {
    CHECK(new_rank[i] == i);
    REQUIRE(received[i].defined());
    CHECK(at::equal(received[i], leader));
    CHECK(sums[i] == 4.0);
  }
}

TEST_CASE("comm.gloo.abortive_rebuild_after_a_member_vanished") {
  auto server = make_server();
  const std::uint16_t port = server->getPort();
  const std::vector<int> uids{0, 1, 2};
  const std::vector<int> survivors{0, 1};
  gate vanished_may_exit;
  std::atomic<int> survivors_done{0};
  std::vector<std::string> old_error(3);
  std::vector<bool> was_timeout(3, false);
  std::vector<double> waited_s(3, -1.0), sums(3, -1.0);
  std::vector<int> new_rank(3, -1);
  auto errors = run_threads(3, [&](int i) {
    gloo_backend backend(loopback());
    auto store = make_client(port);
    // A generous rendezvous (the machine may be loaded), then a short bound on collectives.
    auto comm = backend.rebuild(nullptr, request(1, {}, uids, uids[i]), store);
    at::Tensor t = at::ones({1});
    comm->all_reduce_sum(t);
    dynamic_cast<gloo_communicator&>(*comm).set_timeout(kShort);
    if (i == 2) {
      // This member hangs: its group stays open (so peers see no closed connection, only
      // silence) and it never takes part in another collective.
      vanished_may_exit.wait();
      return;
    }
    at::Tensor g = at::ones({8});
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->all_reduce_sum(g);
    } catch (const dra::timeout_error& e) {
      was_timeout[i] = true;
      old_error[i] = e.what();
    } catch (const std::exception& e) {
      old_error[i] = e.what();
    }
    waited_s[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto next = backend.rebuild(std::move(comm), request(2, uids, survivors, uids[i], /*abortive=*/true), store);
    new_rank[i] = next->rank();
    at::Tensor s = at::full({2}, static_cast<float>(next->rank() + 1));
    next->all_reduce_sum(s);
    sums[i] = s[0].item<double>();
    if (++survivors_done == 2) vanished_may_exit.release();
  });
  check_no_errors(errors);
  for (int i = 0; i < 2; ++i) {
    CHECK_MESSAGE(was_timeout[i], old_error[i]);
    CHECK(old_error[i].find("epoch 1") != std::string::npos);
    // Bounded by the configured timeout (plus scheduling slack on a loaded machine), not hung.
    CHECK(waited_s[i] >= 0.9 * std::chrono::duration<double>(kShort).count());
    CHECK(waited_s[i] < 20.0);
    CHECK(new_rank[i] == i);
    CHECK(sums[i] == 3.0);
  }
}

TEST_CASE("comm.gloo.rendezvous_timeout") {
  // A new member that never arrives: the rebuild gives up after the timeout with timeout_error.
  auto server = make_server();
  gloo_backend backend(loopback());
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  bool timed_out = false;
  try {
    backend.rebuild(nullptr, request(1, {}, {0, 1}, 0, false, kShort), make_client(server->getPort()));
  } catch (const dra::timeout_error& e) {
    timed_out = true;
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_MESSAGE(timed_out, message);
  CHECK(waited < 20.0);
}

TEST_CASE("comm.gloo.bad_requests") {
  auto server = make_server();
  auto store = make_client(server->getPort());
  gloo_backend backend(loopback());
  // Self in neither list.
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(1, {}, {0, 1}, 4), store), std::invalid_argument);
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(2, {0, 1}, {0, 2}, 3), store), std::invalid_argument);
  // Duplicate members, in the new or the old list.
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(1, {}, {0, 1, 0}, 0), store), std::invalid_argument);
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(2, {3, 3}, {0, 1}, 0), store), std::invalid_argument);
  // Empty new world, missing store, a member without its communicator.
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(1, {}, {}, 0), store), std::invalid_argument);
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(1, {}, {0}, 0), {}), std::invalid_argument);
  CHECK_THROWS_AS(backend.rebuild(nullptr, request(2, {0, 1}, {0, 1}, 0), store), std::invalid_argument);
  // A world of one needs no peers: a stale epoch or a mismatched old list is rejected.
  auto solo = backend.rebuild(nullptr, request(5, {}, {0}, 0), store);
  REQUIRE(solo != nullptr);
  at::Tensor t = at::full({2}, 7.0f);
  solo->all_reduce_sum(t);
  CHECK(at::equal(t, at::full({2}, 7.0f)));
  CHECK_THROWS_AS(backend.rebuild(std::move(solo), request(5, {0}, {0}, 0), store), std::invalid_argument);
  auto solo2 = backend.rebuild(nullptr, request(6, {}, {0}, 0), store);
  CHECK_THROWS_AS(backend.rebuild(std::move(solo2), request(7, {1, 0}, {0}, 0), store), std::invalid_argument);
  // Broadcast root out of range.
  auto solo3 = backend.rebuild(nullptr, request(8, {}, {0}, 0), store);
  at::Tensor b = at::ones({1});
  CHECK_THROWS_AS(solo3->broadcast(b, 1), std::invalid_argument);
  CHECK_THROWS_AS(dynamic_cast<gloo_communicator&>(*solo3).set_timeout(0ms), std::invalid_argument);
  // An aborted communicator refuses collectives with comm_error instead of crashing.
  solo3->abort();
  CHECK_THROWS_AS(solo3->all_reduce_sum(b), dra::comm_error);
}

TEST_CASE("comm.gloo.a_world_s_rendezvous_keys_are_erased_two_worlds_later") {
  // A job that changes its world often: its store kept every world's Gloo addresses for the
  // job's life. Each process now erases its own key two worlds after it wrote it. Process 1
  // leaves at every even epoch and returns at the next odd one.
  auto server = make_server();
  const std::uint16_t port = server->getPort();
  const std::vector<int> all{0, 1, 2};
  const std::vector<int> two{0, 2};
  constexpr std::uint64_t kEpochs = 8;
  std::vector<double> sums(3, 0.0);
  auto errors = run_threads(3, [&](int i) {
    gloo_backend backend(loopback());
    auto store = make_client(port);
    std::unique_ptr<communicator> comm;
    for (std::uint64_t e = 1; e <= kEpochs; ++e) {
      const bool odd = e % 2 == 1;
      comm = backend.rebuild(std::move(comm),
                             request(e,
                                     e == 1 ? std::vector<int>{}
                                     : odd  ? two
                                            : all,
                                     odd ? all : two, i),
                             store);
      if (!comm) continue;  // process 1, between worlds
      at::Tensor one = at::ones({1});
      comm->all_reduce_sum(one);
      sums[static_cast<std::size_t>(i)] += one.item<double>();
    }
  });
  check_no_errors(errors);
  CHECK(sums == std::vector<double>{20.0, 12.0, 20.0});  // 4 worlds of 3 and 4 of 2; process 1 in 4 of them
  std::vector<std::string> keys = server->listKeys();
  std::sort(keys.begin(), keys.end());
  // Left: each process's key of the last two worlds it built (rank within that world).
  const std::vector<std::string> expected{"dra/epoch/5/0/1", "dra/epoch/7/0/0", "dra/epoch/7/0/1",
                                          "dra/epoch/7/0/2", "dra/epoch/8/0/0", "dra/epoch/8/0/1"};
  CHECK(keys == expected);
}
