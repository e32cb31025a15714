// The elastic controller's collaborators, each alone (src/elastic/): the store protocol over a
// real c10d TCPStore, the chunked tensor transfer and the state handoff over real Gloo, the
// gradient reducer over real Gloo, and the event log. One std::thread per simulated process;
// doctest assertions only on the test thread.
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/comm/gloo.hpp"
#include "dra/torch/elastic/codec_hook.hpp"
#include "dra/torch/elastic/store_check.hpp"
#include "event_log.hpp"
#include "gradient_reducer.hpp"
#include "handoff.hpp"
#include "store_client.hpp"
#include "store_protocol.hpp"
#include "world_change.hpp"

#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

using namespace dra::elastic;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace ed = dra::elastic::detail;

namespace {

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

launch_info client_of(int port, const std::string& job) {
  launch_info l;
  l.store_host = "127.0.0.1";
  l.store_port = port;
  l.job_prefix = "dra/parts-" + job + "/0";
  return l;
}

void run_threads(int n, const std::function<void(int)>& fn, std::vector<std::string>& errors) {
  errors.assign(static_cast<std::size_t>(n), "");
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
}

// A Gloo world of n threads on loopback: fn(rank, communicator).
void in_gloo_world(int n, const std::string& job, const std::function<void(int, dra::comm::communicator&)>& fn,
                   std::vector<std::string>& errors) {
  auto server = make_server();
  const int port = server->getPort();
  run_threads(
      n,
      [&](int rank) {
        ed::store_protocol store(client_of(port, job), 10s);
        dra::comm::gloo_backend_options o;
        o.hostname = "127.0.0.1";
        dra::comm::gloo_backend backend(o);
        dra::comm::rebuild_request r;
        r.epoch = 1;
        for (int i = 0; i < n; ++i) r.new_members.push_back(i);
        r.self = rank;
        r.timeout = 20s;
        auto comm = backend.rebuild(nullptr, r, store.store());
        fn(rank, *comm);
      },
      errors);
}

// A state provider holding plain tensors (and a manifest string), for the handoff alone.
class tensors_state final : public state_provider {
 public:
  std::vector<at::Tensor> tensors;
  std::string manifest = "manifest-v1";
  std::string loaded_manifest;
  std::size_t deferrable_from = static_cast<std::size_t>(-1);
  bool in_place = false;  ///< prepare() hands out the tensors before deferrable_from themselves (a model's storage)
  std::vector<tensor_spec> signature() override { return {}; }
  snapshot collect() override { return {tensors, manifest, deferrable_from}; }
  std::vector<at::Tensor> prepare(const std::string&) override {
    std::vector<at::Tensor> out;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      out.push_back(in_place && i < deferrable_from ? tensors[i] : torch::empty_like(tensors[i]));
    return out;
  }
  void load(const std::string& m, const std::vector<at::Tensor>& received) override {
    loaded_manifest = m;
    tensors = received;
  }
  void scale_learning_rate(double) override {}
};

}  // namespace

TEST_CASE("elastic.store_protocol.consistency_names_what_differs") {
  auto server = make_server();
  const int port = server->getPort();
  const json mine = {{"policy", "convergence"}, {"decide_every", 10}};
  const std::vector<tensor_spec> sig = {{"w", {2, 3}, "torch.float32"}};
  std::vector<std::string> errors;
  run_threads(
      2,
      [&](int uid) {
        ed::store_protocol store(client_of(port, "cfg"), 10s);
        json cfg = mine;
        if (uid == 1) cfg["decide_every"] = 20;
        store.check_consistency(uid, cfg, sig, {}, {0, 1}, true);
      },
      errors);
  for (const auto& e : errors) {
    CHECK(e.find("inconsistent configuration") != std::string::npos);
    CHECK(e.find("'decide_every'") != std::string::npos);
    CHECK(e.find("'policy'") == std::string::npos);
  }
  run_threads(
      2,
      [&](int uid) {
        ed::store_protocol store(client_of(port, "sig"), 10s);
        auto s = sig;
        if (uid == 1) s[0].shape = {2, 4};
        store.check_consistency(uid, mine, s, {}, {0, 1}, true);
      },
      errors);
  // Each founder names each side by its process, with that process's own shape (not "world" and
  // "joiner", which founders are not, and not swapped).
  CHECK_MESSAGE(errors[0].find("process 0's state differs from process 1's: 'w': process 1 has shape [2, 4] "
                               "torch.float32, process 0 has [2, 3]") != std::string::npos,
                errors[0]);
  CHECK_MESSAGE(errors[1].find("process 1's state differs from process 0's: 'w': process 0 has shape [2, 3] "
                               "torch.float32, process 1 has [2, 4]") != std::string::npos,
                errors[1]);
  // The rest of the state's layout (an optimizer of another class) is compared the same way.
  run_threads(
      2,
      [&](int uid) {
        ed::store_protocol store(client_of(port, "layout"), 10s);
        const state_layout layout = {{"optimizer", uid == 0 ? "torch.optim.sgd.SGD" : "torch.optim.adam.Adam"}};
        store.check_consistency(uid, mine, sig, layout, {0, 1}, true);
      },
      errors);
  CHECK_MESSAGE(errors[0].find("the optimizer differs: process 1 has 'torch.optim.adam.Adam', process 0 has "
                               "'torch.optim.sgd.SGD'") != std::string::npos,
                errors[0]);
}

TEST_CASE("elastic.store_protocol.admission_rejection_and_the_end") {
  auto server = make_server();
  const int port = server->getPort();
  const std::vector<tensor_spec> world_sig = {{"w", {4}, "torch.float32"}};
  ed::store_protocol leader(client_of(port, "admit"), 10s);
  std::vector<std::string> errors;
  std::vector<ed::store_protocol::wait_result> results(3);
  std::atomic<int> registered{0};
  std::thread leader_thread([&] {
    while (registered.load() < 3) std::this_thread::sleep_for(5ms);
    std::vector<std::pair<int, std::string>> rejected;
    const auto cands = leader.admissible_candidates(
        {0}, world_sig, {}, [&](int uid, const std::string& why) { rejected.emplace_back(uid, why); });
    // 11 has another model: rejected on the spot; 10 is admitted; 12 waits until the job is done.
    if (cands == std::vector<int>{10, 12} && rejected.size() == 1 && rejected[0].first == 11) {
      leader.admit({10}, {5, {0, 10}, {10}});
      std::this_thread::sleep_for(50ms);
      leader.mark_done({0, 10});
    }
  });
  run_threads(
      3,
      [&](int i) {
        ed::store_protocol me(client_of(port, "admit"), 10s);
        auto sig = world_sig;
        if (i == 1) sig[0].shape = {5};
        me.register_candidate(10 + i, sig, {});
        ++registered;
        results[static_cast<std::size_t>(i)] = me.wait_for_admission(10 + i);
      },
      errors);
  leader_thread.join();
  for (const auto& e : errors) CHECK(e.empty());
  using outcome = ed::store_protocol::outcome;
  CHECK(results[0].what == outcome::admitted);
  CHECK(results[0].admitted.epoch == 5);
  CHECK(results[0].admitted.members == std::vector<int>{0, 10});
  CHECK(results[1].what == outcome::rejected);
  CHECK(results[1].why.find("model mismatch") != std::string::npos);
  CHECK(results[2].what == outcome::done);
  CHECK_FALSE(leader.any_waiting());  // the one left over withdrew when it saw the end
}

TEST_CASE("elastic.store_protocol.decision_roundtrip") {
  auto server = make_server();
  ed::store_protocol store(client_of(server->getPort(), "dec"), 10s);
  dra::policy::world_state w;
  w.size = 3;
  w.active = {0, 1, 5};
  w.candidates = {7, 9};
  ed::published_decision d{dra::policy::plan_resize(w, 5, 2.0, 1.5, "grow to 5"), store.next_epoch(0), 42};
  d.decision.policy = "goodput";
  CHECK_FALSE(store.try_read_decision(3).has_value());
  store.publish_decision(3, d);
  const auto back = store.read_decision(3, 1s);
  CHECK(back.epoch == d.epoch);
  CHECK(back.decided_step == 42);
  CHECK(back.decision.kind == dra::policy::action::grow);
  CHECK(back.decision.members == std::vector<int>{0, 1, 5, 7, 9});
  CHECK(back.decision.join == std::vector<int>{7, 9});
  CHECK(back.decision.batch_scale == 2.0);
  CHECK(back.decision.lr_scale == 1.5);
  CHECK(back.decision.reason == "grow to 5");
  CHECK(back.decision.policy == "goodput");
  CHECK(store.try_read_decision(3).has_value());
  CHECK_THROWS_AS(store.read_decision(4, 200ms), dra::timeout_error);
}

TEST_CASE("elastic.store_protocol.survivors_agree_without_a_single_decider") {
  auto server = make_server();
  const int port = server->getPort();
  std::vector<ed::agreement> agreed(3);
  std::vector<std::string> errors;
  // Old world {0, 1, 2, 3}: 2 is dead (never checks in); 3 is a joiner whose handoff was cut off
  // (it holds no state), so the agreed world starts with the state holders.
  run_threads(
      3,
      [&](int i) {
        const int uid = i == 2 ? 3 : i;
        ed::store_protocol store(client_of(port, "fault"), 10s);
        agreed[static_cast<std::size_t>(i)] = store.agree_on_survivors(7, {3, 0, 1, 2}, uid, uid != 3, 12, 600ms);
      },
      errors);
  for (const auto& e : errors) CHECK(e.empty());
  for (const auto& a : agreed) {
    CHECK(a.members == std::vector<int>{0, 1, 3});
    CHECK(a.epoch == agreed[0].epoch);
  }
  // Nobody who holds the state survived: the job cannot go on, and says so.
  run_threads(
      1,
      [&](int) {
        ed::store_protocol store(client_of(port, "lost"), 10s);
        store.agree_on_survivors(2, {0, 4}, 4, false, 0, 200ms);
      },
      errors);
  CHECK(errors[0].find("training state is lost") != std::string::npos);
}

TEST_CASE("elastic.store_protocol.the_state_furthest_on_leads_the_recovery") {
  auto server = make_server();
  const int port = server->getPort();
  std::vector<std::string> errors;
  // A reduction finished on 2 and 3, which applied step 40 (41 committed), and failed on 0 and 1
  // (40 committed). 5 is a joiner without state whose count says nothing. The holders furthest
  // on lead, in the old world's order; then the other holders; then the process without state.
  const std::vector<int> uids = {0, 1, 2, 3, 5};
  const std::vector<std::int64_t> committed = {40, 40, 41, 41, 99};
  std::vector<ed::agreement> agreed(uids.size());
  run_threads(
      static_cast<int>(uids.size()),
      [&](int i) {
        const auto k = static_cast<std::size_t>(i);
        ed::store_protocol store(client_of(port, "ahead"), 10s);
        agreed[k] = store.agree_on_survivors(3, {5, 0, 1, 2, 3}, uids[k], uids[k] != 5, committed[k], 600ms);
      },
      errors);
  for (const auto& e : errors) CHECK(e.empty());
  for (const auto& a : agreed) CHECK(a.members == std::vector<int>{2, 3, 0, 1, 5});
  // Equal counts keep the old world's order (the ordinary recovery: every holder at one step).
  run_threads(
      2,
      [&](int i) {
        ed::store_protocol store(client_of(port, "even"), 10s);
        agreed[static_cast<std::size_t>(i)] = store.agree_on_survivors(3, {1, 0}, i, true, 7, 600ms);
      },
      errors);
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(agreed[0].members == std::vector<int>{1, 0});
  CHECK(agreed[1].members == std::vector<int>{1, 0});
}

TEST_CASE("elastic.store_protocol.a_members_end_of_the_loop_is_read_by_its_world_only") {
  auto server = make_server();
  ed::store_protocol finisher(client_of(server->getPort(), "ended"), 10s);
  ed::store_protocol straggler(client_of(server->getPort(), "ended"), 10s);
  CHECK_FALSE(straggler.loop_ended(2).has_value());
  finisher.mark_loop_ended(2, 7, 10);
  server->get("dra/parts-ended/0/ended/2");  // c10d's set is not acknowledged: wait until it landed
  const auto seen = straggler.loop_ended(2);
  REQUIRE(seen.has_value());
  CHECK(seen->uid == 7);
  CHECK(seen->step == 10);
  CHECK_FALSE(straggler.loop_ended(3).has_value());  // a later world's members trained on together
  // Another client's value there is not a member's end (warned, ignored).
  server->set("dra/parts-ended/0/ended/4", [] {
    const std::string v = R"({"uid": "seven"})";
    return std::vector<std::uint8_t>(v.begin(), v.end());
  }());
  server->get("dra/parts-ended/0/ended/4");
  CHECK_FALSE(straggler.loop_ended(4).has_value());
  CHECK(straggler.ignored_values() == 1);
}

TEST_CASE("elastic.store_protocol.pool_limit_and_report") {
  auto server = make_server();
  ed::store_protocol store(client_of(server->getPort(), "pool"), 10s);
  CHECK_FALSE(store.limit().has_value());
  server->set("dra/parts-pool/0/capacity", [] {
    const std::string v = R"({"max_size": 2, "min_size": 1, "leave": [10001]})";
    return std::vector<std::uint8_t>(v.begin(), v.end());
  }());
  server->get("dra/parts-pool/0/capacity");  // c10d's set is not acknowledged: wait until it landed
  const auto l = store.limit();
  REQUIRE(l.has_value());
  CHECK(l->max_size == 2);
  CHECK(l->min_size == 1);
  CHECK(l->leave == std::vector<int>{10001});
  // A candidate named in "leave" is dismissed: its wait ends with the reason, not an admission.
  store.register_candidate(10001, {}, {});
  store.dismiss(10001, "its device is being taken back");
  const auto r = store.wait_for_admission(10001);
  CHECK(r.what == ed::store_protocol::outcome::dismissed);
  CHECK(r.why == "its device is being taken back");
  CHECK_FALSE(store.any_waiting());
  store.publish_report({{"step", 12}, {"desired_size", 4}});
  const auto raw = server->get("dra/parts-pool/0/report");
  CHECK(json::parse(std::string(raw.begin(), raw.end()))["desired_size"] == 4);
}

TEST_CASE("elastic.store_protocol.an_interrupted_wait_withdraws_and_an_admission_it_missed_is_said_gone") {
  // Ctrl-C in a waiting candidate (controller_options::interrupt_check throws): its registration
  // is withdrawn and the exception comes out of the wait. An admission that landed between the
  // last poll and the check named it in the world being built: it is then marked gone, so the
  // members' rebuild fails at once instead of waiting out the rendezvous for it.
  auto server = make_server();
  struct interrupted : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  for (const bool admitted_meanwhile : {false, true}) {
    CAPTURE(admitted_meanwhile);
    const std::string name = admitted_meanwhile ? "int-late" : "int";
    ed::store_protocol store(client_of(server->getPort(), name), 10s);
    store.register_candidate(10001, {}, {});
    CHECK(store.any_waiting());
    int checks = 0;
    const auto check = [&] {
      if (++checks < 3) return;
      if (admitted_meanwhile) store.admit({10001}, {4, {0, 10001}, {10001}});  // lands after the poll
      throw interrupted("KeyboardInterrupt");
    };
    CHECK_THROWS_AS(store.wait_for_admission(10001, check), interrupted);
    CHECK(checks == 3);
    CHECK_FALSE(store.any_waiting());
    const std::string gone = "dra/parts-" + name + "/0/gone/10001";
    CHECK(server->check({gone}) == admitted_meanwhile);
  }
}

TEST_CASE("elastic.transfer.chunked_pieces_arrive_bit_identical") {
  at::set_num_threads(1);
  for (const std::size_t chunk : {std::size_t{1024}, std::size_t{16} << 20}) {
    CAPTURE(chunk);
    std::vector<at::Tensor> sent, received;
    std::vector<std::string> errors;
    in_gloo_world(
        3, "xfer-" + std::to_string(chunk),
        [&](int rank, dra::comm::communicator& comm) {
          auto transfer = dra::comm::make_chunked_transfer(chunk);
          auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
          // Big tensors go straight from/into storage, small ones are packed, an empty one is fine.
          std::vector<at::Tensor> t = {at::randn({300000}, gen), at::randn({7}, gen), at::empty({0}),
                                       at::randint(0, 100, {33}, gen).to(at::kLong), at::randn({64, 65}, gen)};
          if (rank == 0) {
            transfer->send(comm, t, {1, 2});
            sent = t;
          } else {
            std::vector<at::Tensor> dst;
            for (const auto& x : t) dst.push_back(at::zeros_like(x));
            transfer->recv(comm, dst, 0);
            if (rank == 2) received = dst;
          }
        },
        errors);
    for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
    REQUIRE(sent.size() == received.size());
    for (std::size_t i = 0; i < sent.size(); ++i) CHECK(at::equal(sent[i], received[i]));
  }
  CHECK_THROWS_AS(dra::comm::make_chunked_transfer(100), std::invalid_argument);
}

TEST_CASE("elastic.handoff.state_and_position_reach_the_joiner") {
  at::set_num_threads(1);
  tensors_state src, dst;
  ed::handoff_header got;
  std::uint64_t sent_bytes = 0, got_bytes = 0;
  std::vector<std::string> errors;
  in_gloo_world(
      2, "handoff",
      [&](int rank, dra::comm::communicator& comm) {
        auto transfer = dra::comm::make_chunked_transfer(4096);
        if (rank == 0) {
          src.tensors = {at::arange(5000, at::kFloat), at::ones({3}, at::kDouble)};
          ed::handoff_header h;
          h.step_index = 17;
          h.sampler = {2, 48, 16, 9};
          h.num_epochs = 5;
          h.resizes = 3;
          h.energy_j = 12.5;
          h.energy_known = true;
          h.energy_measured = false;
          h.hook_state = {7, 0, 255, 3};
          sent_bytes = ed::send_state(comm, *transfer, {1}, src, h, false).bytes;
        } else {
          dst.tensors = {at::zeros({5000}, at::kFloat), at::zeros({3}, at::kDouble)};
          got_bytes = ed::recv_state(comm, *transfer, 0, dst, got, false).bytes;
        }
      },
      errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  CHECK(sent_bytes == 5000 * 4 + 3 * 8);
  CHECK(got_bytes == sent_bytes);
  CHECK(dst.loaded_manifest == "manifest-v1");
  CHECK(at::equal(dst.tensors[0], at::arange(5000, at::kFloat)));
  CHECK(got.step_index == 17);
  CHECK(got.sampler.epoch == 2);
  CHECK(got.sampler.cursor == 48);
  CHECK(got.sampler.global_batch == 16);
  CHECK(got.sampler.seed == 9);
  CHECK(got.num_epochs == 5);
  CHECK(got.resizes == 3);
  CHECK(got.energy_j == 12.5);
  CHECK(got.energy_known);
  CHECK_FALSE(got.energy_measured);
  CHECK(got.hook_state == std::vector<std::uint8_t>{7, 0, 255, 3});
  CHECK(state_digest(src) == state_digest(dst));
}

TEST_CASE("elastic.handoff.deferred_skips_what_the_joiners_hold_and_sends_the_rest_later") {
  // Two joiners: one holds the first tensor (same digest), neither holds the second; the third
  // (deferrable: the optimizer's) arrives after the change, on a thread, and only then is loaded.
  at::set_num_threads(1);
  tensors_state src, dst1, dst2;
  std::vector<ed::handoff_result> results(3);
  std::vector<std::string> waits(3);
  std::vector<std::string> errors;
  bool loaded_before_wait = true;
  in_gloo_world(
      3, "deferred",
      [&](int rank, dra::comm::communicator& comm) {
        auto transfer = dra::comm::make_chunked_transfer(4096);
        ed::handoff_header h;
        if (rank == 0) {
          src.tensors = {at::arange(5000, at::kFloat), at::ones({3}, at::kDouble), at::full({100}, 2.5f)};
          src.deferrable_from = 2;
          h.step_index = 4;
          results[0] = ed::send_state(comm, *transfer, {1, 2}, src, h, true);
          waits[0] = results[0].deferred ? results[0].deferred->wait() : "no deferred part";
          return;
        }
        auto& dst = rank == 1 ? dst1 : dst2;
        dst.in_place = true;
        dst.deferrable_from = 2;
        dst.tensors = {rank == 1 ? at::arange(5000, at::kFloat) : at::zeros({5000}, at::kFloat),
                       at::zeros({3}, at::kDouble), at::zeros({100}, at::kFloat)};
        auto r = ed::recv_state(comm, *transfer, 0, dst, h, true);
        if (rank == 1) loaded_before_wait = !dst.loaded_manifest.empty();
        waits[rank] = r.deferred ? r.deferred->wait() : "no deferred part";
        if (r.deferred) dst.load(r.deferred->manifest(), r.deferred->targets());
        results[rank] = std::move(r);
      },
      errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  for (const auto& w : waits) CHECK_MESSAGE(w.empty(), w);
  CHECK_FALSE(loaded_before_wait);  // the provider's load waits for the deferred tensors
  // Rank 2 lacked the first tensor, so the sender sends it to both (the union of what they lack).
  CHECK(results[0].bytes == 5000 * 4 + 3 * 8);
  CHECK(results[0].skipped_bytes == 0);
  CHECK(results[0].deferred->bytes() == 100 * 4);
  for (auto* dst : {&dst1, &dst2}) {
    CHECK(dst->loaded_manifest == "manifest-v1");
    CHECK(at::equal(dst->tensors[0], at::arange(5000, at::kFloat)));
    CHECK(at::equal(dst->tensors[1], at::ones({3}, at::kDouble)));
    CHECK(at::equal(dst->tensors[2], at::full({100}, 2.5f)));
  }
}

TEST_CASE("elastic.handoff.deferred_sends_nothing_a_joiner_holds") {
  at::set_num_threads(1);
  tensors_state src, dst;
  std::vector<ed::handoff_result> results(2);
  std::vector<std::string> errors;
  in_gloo_world(
      2, "skip",
      [&](int rank, dra::comm::communicator& comm) {
        auto transfer = dra::comm::make_chunked_transfer(4096);
        ed::handoff_header h;
        if (rank == 0) {
          src.tensors = {at::arange(5000, at::kFloat), at::full({10}, 3.0f)};
          src.deferrable_from = 1;
          results[0] = ed::send_state(comm, *transfer, {1}, src, h, true);
          if (results[0].deferred) results[0].deferred->wait();
          return;
        }
        dst.in_place = true;
        dst.deferrable_from = 1;
        dst.tensors = {at::arange(5000, at::kFloat), at::zeros({10}, at::kFloat)};
        results[1] = ed::recv_state(comm, *transfer, 0, dst, h, true);
        if (results[1].deferred) {
          results[1].deferred->wait();
          dst.load(results[1].deferred->manifest(), results[1].deferred->targets());
        }
      },
      errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  CHECK(results[0].bytes == 0);
  CHECK(results[0].skipped_bytes == 5000 * 4);
  CHECK(results[1].bytes == 0);
  CHECK(results[1].skipped_bytes == 5000 * 4);
  CHECK(at::equal(dst.tensors[1], at::full({10}, 3.0f)));
}

TEST_CASE("elastic.reducer.weighted_mean_with_the_tail") {
  at::set_num_threads(1);
  std::vector<at::Tensor> grads(2), loners(2);
  std::vector<ed::reduction_tail> tails(2);
  std::vector<std::string> errors;
  in_gloo_world(
      2, "reduce",
      [&](int rank, dra::comm::communicator& comm) {
        auto w = at::full({4}, 1.0).set_requires_grad(true);
        auto unused = at::zeros({2}).set_requires_grad(true);  // no gradient this step: counts as zero
        w.mutable_grad() = at::full({4}, rank == 0 ? 2.0 : 6.0);
        ed::gradient_reducer reducer;
        // Rank 0 holds a quarter of the step's samples, rank 1 three quarters; its loss (mean over its
        // share) rides along as loss x count.
        ed::tail_input mine;
        mine.loss_value = rank == 0 ? 1.0 : 3.0;
        mine.count = rank == 0 ? 1.0 : 3.0;
        mine.decision_flag = rank == 0;
        reducer.begin(comm, {w, unused}, rank == 0 ? 0.25 : 0.75, mine);
        CHECK(reducer.buckets() == 1);  // a synchronous communicator (Gloo): one bucket, one all-reduce
        reducer.ready(0);               // `unused` is never reported: finish() counts it as zero
        tails[static_cast<std::size_t>(rank)] = ed::read_tail(reducer.finish());
        CHECK_FALSE(reducer.active());
        grads[static_cast<std::size_t>(rank)] = w.grad().clone();
        loners[static_cast<std::size_t>(rank)] = unused.grad().clone();
      },
      errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  for (int r = 0; r < 2; ++r) {
    CHECK(at::allclose(grads[static_cast<std::size_t>(r)], at::full({4}, 0.25 * 2.0 + 0.75 * 6.0)));
    CHECK(at::equal(loners[static_cast<std::size_t>(r)], at::zeros({2})));
    CHECK(tails[static_cast<std::size_t>(r)].loss_sum == 10.0);
    CHECK(tails[static_cast<std::size_t>(r)].count == 4.0);
    CHECK(tails[static_cast<std::size_t>(r)].decision_flag);
  }
}

TEST_CASE("elastic.reducer.float64_and_complex_gradients_keep_their_precision_and_imaginary_part") {
  // A float64 model's gradients were reduced in float32 buckets (1e-6 relative error; torch's DDP
  // reduces in the parameter's dtype), and a complex weight's imaginary part was dropped. Mixed
  // types in one model: float32, float64, complex64, complex128 (first in forward order: the tail
  // then needs a float32 bucket of its own), one of them without a gradient on rank 1.
  at::set_num_threads(1);
  struct out {
    std::vector<at::Tensor> grads;
    ed::reduction_tail tail;
    std::size_t buckets = 0;
  };
  std::vector<out> outs(2);
  std::vector<std::string> errors;
  const double third = 1.0 / 3.0;
  const auto value = [&](int rank, at::ScalarType t) {
    // float64 values no float32 can hold; complex ones with an imaginary part.
    const double v = rank == 0 ? third : 2.0 * third + 1e-12;
    if (t == at::kComplexFloat || t == at::kComplexDouble) return at::full({3}, c10::complex<double>(v, -2.0 * v), t);
    return at::full({3}, v, t);
  };
  const std::vector<at::ScalarType> types{at::kComplexDouble, at::kFloat, at::kDouble, at::kComplexFloat};
  in_gloo_world(
      2, "reduce-types",
      [&](int rank, dra::comm::communicator& comm) {
        std::vector<at::Tensor> params;
        for (auto t : types) params.push_back(at::zeros({3}, t).set_requires_grad(true));
        for (std::size_t i = 0; i < params.size(); ++i)
          if (!(rank == 1 && types[i] == at::kComplexFloat)) params[i].mutable_grad() = value(rank, types[i]);
        ed::gradient_reducer reducer;
        ed::tail_input mine;
        mine.loss_value = 1.0;
        mine.count = 1.0;
        reducer.begin(comm, params, 0.5, mine);
        for (std::size_t i = params.size(); i-- > 0;) reducer.ready(i);
        auto& o = outs[static_cast<std::size_t>(rank)];
        o.tail = ed::read_tail(reducer.finish());
        o.buckets = reducer.buckets();
        for (const auto& p : params) o.grads.push_back(p.grad().clone());
      },
      errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  const double mean = 0.5 * (third + 2.0 * third + 1e-12);
  for (const auto& o : outs) {
    // Backward's order: complex64 | float64 | float32 | complex128 | the tail's own float32 bucket.
    CHECK(o.buckets == 5);
    CHECK(o.tail.count == 2.0);
    CHECK(o.tail.loss_sum == 2.0);
    CHECK((o.grads[0].scalar_type() == at::kComplexDouble));
    CHECK(std::abs(at::real(o.grads[0]).max().item<double>() - mean) < 1e-15);        // float64 precision kept
    CHECK(std::abs(at::imag(o.grads[0]).max().item<double>() + 2.0 * mean) < 1e-15);  // and its imaginary part
    CHECK(std::abs(o.grads[2].max().item<double>() - mean) < 1e-15);
    CHECK(std::abs(o.grads[1].max().item<double>() - mean) < 1e-6);  // float32 as before
    CHECK((o.grads[3].scalar_type() == at::kComplexFloat));
    CHECK(std::abs(at::imag(o.grads[3]).max().item<double>() + third) < 1e-6);  // rank 1 had none: half of rank 0's
  }
  CHECK(at::equal(outs[0].grads[0], outs[1].grads[0]));
}

TEST_CASE("elastic.event_log.one_json_line_per_event") {
  const std::string path = (std::filesystem::temp_directory_path() / "test_elastic_parts_events.jsonl").string();
  std::remove(path.c_str());
  ed::event_log log(path);
  ed::world_event e;
  e.change.cause = ed::change_cause::resize;
  e.change.epoch = 4;
  e.change.members = {0, 1, 2};
  e.change.joined = {2};
  e.change.reason = "schedule: size 3 at step 8";
  e.change.before = 2;
  e.change.agree_s = 0.5;
  e.change.decided_step = 8;
  e.step = 9;
  e.after = 3;
  e.rebuild_s = 0.25;
  e.transfer_s = 0.125;
  e.reshard_s = 0.125;
  e.state_bytes = 1000000;
  e.global_batch = 16;
  e.batch_mode = "fixed";
  e.params_identical = true;
  e.backend = "gloo";
  log.world(e);
  log.rejected(9, 4, 10000, "model mismatch");
  REQUIRE(log.lines().size() == 2);
  const auto ev = json::parse(log.lines()[0]);
  CHECK(ev["event"] == "resize");
  CHECK(ev["joined"] == std::vector<int>{2});
  CHECK(ev["decided_step"] == 8);
  CHECK(ev["total_s"] == 1.0);
  CHECK(ev["state_gbps"] == doctest::Approx(0.008));
  CHECK(ev["params_identical"] == true);
  CHECK(ev.contains("time"));
  CHECK(json::parse(log.last())["event"] == "rejected");
  std::ifstream f(path);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) CHECK(line == log.lines()[static_cast<std::size_t>(n++)]);
  CHECK(n == 2);
  // An events file that cannot be written never stops training: the event is kept (in memory and
  // on stderr) and the next write tries again.
  ed::event_log broken("/nonexistent-dir/events.jsonl");
  CHECK_NOTHROW(broken.rejected(0, 0, 1, "x"));
  CHECK_NOTHROW(broken.rejected(1, 0, 2, "y"));
  CHECK(broken.lines().size() == 2);
}

TEST_CASE("elastic.event_log.a_record_is_written_whole_or_not_at_all") {
  // A file size limit stands for a full disk: the write stops mid-line (EFBIG after a short write,
  // as ENOSPC does when the last page fills). The partial line is cut back; later lines that fit
  // are whole; nothing throws.
  const std::string path = (std::filesystem::temp_directory_path() / "test_elastic_parts_full.jsonl").string();
  std::remove(path.c_str());
  ed::event_log log(path);
  log.rejected(0, 1, 10000, "first");
  const auto first = std::filesystem::file_size(path);
  struct rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = first + 40;  // room for 40 bytes of the next ~100-byte line
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  CHECK_NOTHROW(log.rejected(1, 1, 10001, std::string(60, 'x')));
  CHECK_NOTHROW(log.rejected(2, 1, 10002, std::string(60, 'y')));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK(std::filesystem::file_size(path) == first);  // the partial lines were cut back
  log.rejected(3, 1, 10003, "after");                // room again: written
  std::ifstream f(path);
  std::string line;
  std::vector<json> lines;
  while (std::getline(f, line)) lines.push_back(json::parse(line));  // every line whole
  REQUIRE(lines.size() == 2);
  CHECK(lines[1]["reason"] == "after");
  CHECK(log.lines().size() == 4);  // nothing lost in memory
}

TEST_CASE("elastic.event_log.memory_keeps_the_latest_events_the_file_keeps_all") {
  // A job whose world changed every few seconds for days kept every event line in memory
  // (about 600 bytes a change, never returned: an outside long-run review). Memory now keeps the
  // latest (at least kept_lines), the file every one, and count() counts them all.
  const std::string path = (std::filesystem::temp_directory_path() / "test_elastic_parts_kept.jsonl").string();
  std::remove(path.c_str());
  ed::event_log log(path);
  const std::size_t n = 2 * ed::event_log::kept_lines + 500;
  for (std::size_t i = 0; i < n; ++i) log.rejected(static_cast<std::int64_t>(i), 1, 10000, "r" + std::to_string(i));
  CHECK(log.count() == n);
  CHECK(log.lines().size() >= ed::event_log::kept_lines);
  CHECK(log.lines().size() <= 2 * ed::event_log::kept_lines);
  CHECK(json::parse(log.lines().back())["reason"] == "r" + std::to_string(n - 1));
  CHECK(json::parse(log.lines().front())["reason"] == "r" + std::to_string(n - log.lines().size()));
  std::ifstream f(path);
  std::size_t in_file = 0;
  for (std::string line; std::getline(f, line);) ++in_file;
  CHECK(in_file == n);
  std::remove(path.c_str());
}

TEST_CASE("elastic.store_client.a_bad_counter_is_reported_and_the_connection_lives") {
  // c10d's store closes the connection of a client whose add() meets a value that is not a
  // counter; the client reconnects once and reports the value, and the store is not "gone".
  auto server = make_server();
  ed::store_client c("127.0.0.1", server->getPort(), false, "dra/parts-counter/0", 10s);
  c.set_text("n", "garbage");
  try {
    c.add("n", 1);
    FAIL("add() on garbage did not throw");
  } catch (const ed::bad_counter& e) {
    CHECK(e.value() == "garbage");
  }
  CHECK_FALSE(c.gone());
  c.set_text("n", "5");
  CHECK(c.add("n", 1) == 6);
}

TEST_CASE("elastic.store_client.a_store_that_is_gone_fails_at_once") {
  // The leader's store ops run inside its step: a store that died must fail them at once (a
  // refused connection), not after a reconnect loop its peers' collectives time out on.
  auto server = make_server();
  // The reconnection may take 20 s here: a loop that waited for it would last that long, while a
  // refused connection ends it at once (5 s of margin for a loaded host, never close to 20 s).
  ed::store_client c("127.0.0.1", server->getPort(), false, "dra/parts-gone/0", 30s);
  c.set_reconnect_within(20s);
  c.set_text("k", "1");
  CHECK(c.exists("k"));
  server.reset();  // the store process dies: its port refuses connections
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(c.try_get("k"), dra::membership_error);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(c.gone());
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(c.set_text("k", "2"), dra::membership_error);  // later ops: at once, no connection tried
  CHECK(std::chrono::steady_clock::now() - t1 < 1s);
}

TEST_CASE("elastic.store_client.a_dying_store_that_accepts_then_resets_is_given_up_within_the_bound") {
  // The faults campaign's kill_store losses: a store killed while its listening socket lingers
  // accepts the reconnection and then resets it, and c10d retried that for its whole 2 s
  // timeout inside the leader's step; its peers (fault timeout 2 s) declared it dead and had no
  // store left to recover through. A reconnection now stays within set_reconnect_within().
  auto server = make_server();
  const int port = server->getPort();
  ed::store_client c("127.0.0.1", port, false, "dra/parts-dying/0", 10s);
  c.set_reconnect_within(200ms);
  c.set_text("k", "1");
  server.reset();
  // What the dying store's port does: accept, then reset (SO_LINGER 0), for as long as the test needs.
  const int lsn = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lsn >= 0);
  const int one = 1;
  ::setsockopt(lsn, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lsn, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(lsn, 16) == 0);
  std::atomic<bool> stop{false};
  std::atomic<int> resets{0};
  std::thread resetter([&] {
    const auto until = std::chrono::steady_clock::now() + 10s;  // bounded whatever happens
    while (!stop && std::chrono::steady_clock::now() < until) {
      pollfd p{lsn, POLLIN, 0};
      if (::poll(&p, 1, 20) != 1) continue;
      const int fd = ::accept(lsn, nullptr, nullptr);
      if (fd < 0) continue;
      const linger hard{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
      ::close(fd);
      ++resets;
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(c.try_get("k"), dra::membership_error);
  const auto took = std::chrono::steady_clock::now() - t0;
  stop = true;
  resetter.join();
  ::close(lsn);
  CHECK(resets.load() >= 1);  // the reconnection met the resetting listener
  CHECK(took < 650ms);        // c10d sleeps 0.5-1.5 s between its own attempts: it took up to 2 s
  CHECK(c.gone());
}

TEST_CASE("elastic.store_protocol.a_claim_written_over_still_stops_a_second_world") {
  // The faults campaign (trial 57:store_fuzz:py on 36886ff): the first world after epoch 0 claimed
  // child/0, another client wrote garbage over it, and a second group of survivors took the
  // garbage for "no claim" and trained as a second world. The claim is held in two keys.
  auto server = make_server();
  const int port = server->getPort();
  ed::store_protocol first(client_of(port, "split"), 10s);
  ed::store_protocol second(client_of(port, "split"), 10s);
  CHECK(first.claim_child(0, 7));
  CHECK(first.claim_child(0, 7));  // a member of the same world claims it again
  const std::string garbage = "[[[[";
  server->set("dra/parts-split/0/child/0", std::vector<std::uint8_t>(garbage.begin(), garbage.end()));
  CHECK_FALSE(second.claim_child(0, 9));  // the other key still holds world 7's claim
  // Garbage before any claim is no claim: the first world replaces it.
  server->set("dra/parts-split/0/child/1", std::vector<std::uint8_t>(garbage.begin(), garbage.end()));
  server->set("dra/parts-split/0/child/1/again", std::vector<std::uint8_t>(garbage.begin(), garbage.end()));
  CHECK(second.claim_child(1, 11));
  CHECK_FALSE(first.claim_child(1, 12));
}

TEST_CASE("elastic.store_protocol.values_another_client_wrote_are_ignored_or_handled") {
  // The values the fault campaign found other clients could write (issue 23): none may raise
  // anything but a dra::error the controller handles.
  auto server = make_server();
  const int port = server->getPort();
  const auto raw_set = [&](const std::string& job, const std::string& key, const std::string& v) {
    server->set("dra/parts-" + job + "/0/" + key, std::vector<std::uint8_t>(v.begin(), v.end()));
    server->get("dra/parts-" + job + "/0/" + key);  // landed
  };
  ed::store_protocol p(client_of(port, "values"), 10s);
  // capacity: a wrong type keeps the last good limit.
  raw_set("values", "capacity", R"({"max_size": 2})");
  REQUIRE(p.limit().has_value());
  raw_set("values", "capacity", R"({"max_size": "2"})");
  REQUIRE(p.limit().has_value());
  CHECK(p.limit()->max_size == 2);
  raw_set("values", "capacity", R"({"max_size": 3, "leave": [1.5]})");
  CHECK(p.limit()->max_size == 2);
  // cands: items that are not uids are left out.
  raw_set("values", "cands", "xx,1e9,10000,");
  CHECK(p.registered_candidates() == std::vector<int>{10000});
  // epoch_seq: garbage (c10d cannot add to it) or an old value: set far past the known epoch.
  raw_set("values", "epoch_seq", "garbage");
  const auto e = p.next_epoch(40);
  CHECK(e > 40);
  raw_set("values", "epoch_seq", "3");
  CHECK(p.next_epoch(e) > e);
  // dec/<epoch>: not a decision. A member that must read it fails with a handled error; a recovery
  // following the decisions stops there.
  raw_set("values", "dec/5", R"({"decision": {"action": "grow", "target": "x"}, "epoch": 6, "decided_step": 1})");
  CHECK_THROWS_AS(p.read_decision(5, 1s), dra::membership_error);
  CHECK_FALSE(p.try_read_decision(5).has_value());
  CHECK(p.latest_decided_world(5, {0, 1}).epoch == 5);
  // fault/<epoch>/result and beat/<uid> garbage: the survivors agree in the next room.
  raw_set("values", "fault/7/result", "\xff{");
  raw_set("values", "beat/1", "not a counter");
  const auto a = p.agree_on_survivors(7, {0, 1}, 0, true, 0, 50ms);
  CHECK(a.members == std::vector<int>{0});
  CHECK(a.epoch > 7);
  // admit/<uid>: not an admission: the candidate keeps waiting.
  p.register_candidate(10000, {}, {});
  raw_set("values", "admit/10000", "[1, 2]");
  CHECK_FALSE(p.poll_admission(10000, true).has_value());
  // universe: the launched size instead.
  raw_set("values", "universe", "\"two\"");
  CHECK(p.universe(3) == 3);
  // Every family with values of every kind: read, ignored, or handled; never anything else.
  const std::vector<std::string> values = {"",
                                           "garbage",
                                           "[]",
                                           "{}",
                                           "-1",
                                           "1e400",
                                           R"({"epoch": "x"})",
                                           std::string(1 << 20, 'x'),
                                           "\xff\xfe",
                                           "99999999999999999999999"};
  int n = 0;
  for (const auto& family : dra::elastic::testing::store_key_families())
    for (const auto& v : values) {
      std::string outcome;
      CHECK_NOTHROW(outcome = dra::elastic::testing::read_store_value("127.0.0.1", port,
                                                                      "dra/fuzz/" + std::to_string(n++), family, v));
      CHECK_MESSAGE((outcome == "read" || outcome == "ignored" || outcome.rfind("handled: ", 0) == 0),
                    family << " [value " << (n - 1) % static_cast<int>(values.size()) << "]: " << outcome);
    }
}

TEST_CASE("elastic.handoff.route_of_each_cause") {
  ed::world_change start;
  start.members = {0, 1, 2};
  CHECK(ed::route_handoff(start, 0, 3, 0).send_to == std::vector<int>{1, 2});
  CHECK(ed::route_handoff(start, 2, 3, 2).receive_from == 0);
  ed::world_change grow;
  grow.cause = ed::change_cause::resize;
  grow.joined = {7, 9, 5};  // 5 rejoins: it holds stale state and receives like the others
  grow.members = {0, 1, 7, 9, 5};
  // The members that stay (ranks 0, 1) share the sending round-robin over the joiners.
  CHECK(ed::route_handoff(grow, 0, 5, 0).send_to == std::vector<int>{2, 4});
  CHECK(ed::route_handoff(grow, 1, 5, 1).send_to == std::vector<int>{3});
  CHECK(ed::route_handoff(grow, 2, 5, 7).receive_from == 0);
  CHECK(ed::route_handoff(grow, 3, 5, 9).receive_from == 1);
  CHECK(ed::route_handoff(grow, 4, 5, 5).receive_from == 0);
  CHECK(ed::route_handoff(grow, 2, 5, 7).send_to.empty());
  ed::world_change shrink;
  shrink.cause = ed::change_cause::resize;
  shrink.members = {0, 1};
  CHECK(ed::route_handoff(shrink, 0, 2, 0).send_to.empty());
  CHECK(ed::route_handoff(shrink, 1, 2, 1).receive_from == -1);
  ed::world_change fault = start;
  fault.cause = ed::change_cause::fault;
  CHECK(ed::route_handoff(fault, 1, 3, 1).receive_from == 0);
}

// ---- the codec hook (issue 13): dra's codecs on the reducer's buckets over real Gloo ----------------
namespace {

struct hooked_step {
  at::Tensor w_grad, b_grad;
  ed::reduction_tail tail;
  std::vector<std::uint8_t> shared;
  dra::elastic::hook_bytes bytes;
  double ef = 0.0;
};

// Two ranks, a 16x8 matrix and a bias, `steps` reductions through `spec`'s codec hook.
std::vector<hooked_step> hooked_world(const std::string& spec, int steps, std::vector<std::string>& errors) {
  std::vector<hooked_step> out(2);
  in_gloo_world(
      2, "hook-" + spec,
      [&](int rank, dra::comm::communicator& comm) {
        auto w = at::zeros({16, 8}).set_requires_grad(true);
        auto b = at::zeros({16}).set_requires_grad(true);
        auto hook = std::make_shared<dra::elastic::codec_hook>(spec);
        ed::gradient_reducer reducer;
        reducer.set_hook(hook);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
        for (int s = 0; s < steps; ++s) {
          w.mutable_grad() = at::randn({16, 8}, gen);
          b.mutable_grad() = at::randn({16}, gen);
          ed::tail_input mine;
          mine.loss_value = 1.0 + rank;
          mine.count = 2.0;
          mine.energy_j = rank == 0 ? 1.5 : 2.5;
          mine.energy_measured = rank == 0;
          reducer.begin(comm, {w, b}, 0.5, mine);
          reducer.ready(0);
          reducer.ready(1);
          out[static_cast<std::size_t>(rank)].tail = ed::read_tail(reducer.finish());
        }
        auto& o = out[static_cast<std::size_t>(rank)];
        o.w_grad = w.grad().clone();
        o.b_grad = b.grad().clone();
        o.shared = hook->shared_state();
        o.bytes = hook->bytes();
        o.ef = hook->error_feedback_norm1();
      },
      errors);
  return out;
}

}  // namespace

TEST_CASE("elastic.codec_hook.identical_on_every_rank_with_the_tail_exact") {
  at::set_num_threads(1);
  for (const std::string spec : {"powersgd:2", "fp16", "topk:0.25", "random:0.5"}) {
    CAPTURE(spec);
    std::vector<std::string> errors;
    const auto r = hooked_world(spec, 3, errors);
    for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
    // Every rank decodes the same sum: the model stays identical.
    CHECK(at::equal(r[0].w_grad, r[1].w_grad));
    CHECK(at::equal(r[0].b_grad, r[1].b_grad));
    CHECK(r[0].shared == r[1].shared);
    // What rides with the last bucket arrives exact, uncompressed.
    CHECK(r[0].tail.loss_sum == 2.0 * 1.0 + 2.0 * 2.0);
    CHECK(r[0].tail.count == 4.0);
    CHECK(r[0].tail.energy_j == 4.0);
    CHECK(r[0].tail.not_measured == 1.0);
    CHECK(r[0].bytes.sent > 0);
    CHECK(r[0].bytes.sent < r[0].bytes.dense);
    CHECK(r[0].bytes.dense == 3 * 4 * (16 * 8 + 16));
    CHECK(r[0].ef > 0.0);  // every lossy codec carries a residual
  }
}

TEST_CASE("elastic.codec_hook.fp32_equals_the_plain_weighted_mean") {
  at::set_num_threads(1);
  std::vector<std::string> errors;
  const auto coded = hooked_world("fp32", 1, errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  // The same gradients reduced without a hook.
  auto g0 = at::randn({16, 8}, at::make_generator<at::CPUGeneratorImpl>(100));
  auto g1 = at::randn({16, 8}, at::make_generator<at::CPUGeneratorImpl>(101));
  CHECK(at::allclose(coded[0].w_grad, 0.5 * g0 + 0.5 * g1, 1e-6, 1e-6));
  CHECK(coded[0].ef == 0.0);
  CHECK(coded[0].bytes.sent == coded[0].bytes.dense);
}

TEST_CASE("elastic.codec_hook.masked_prunes_the_weights_identically_on_every_rank") {
  at::set_num_threads(1);
  dra::compress::rigl_config cfg;
  cfg.every = 2;
  cfg.ramp_steps = 1;  // 80 % at the first update (step 2)
  cfg.max_sparsity = 0.8;
  cfg.end_step = 100;
  std::vector<std::string> errors;
  std::vector<at::Tensor> weights(2), grads(2);
  std::vector<ed::reduction_tail> tails(2);
  std::vector<std::vector<std::uint8_t>> shared(2);
  std::vector<double> sparsity(2);
  in_gloo_world(
      2, "hook-masked",
      [&](int rank, dra::comm::communicator& comm) {
        auto w = at::randn({16, 8}, at::make_generator<at::CPUGeneratorImpl>(5)).set_requires_grad(true);
        auto b = at::zeros({16}).set_requires_grad(true);
        auto hook = std::make_shared<dra::elastic::codec_hook>("masked", 9, cfg);
        ed::gradient_reducer reducer;
        reducer.set_hook(hook);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
        dra::signals::convergence_signals signals;
        for (int s = 0; s < 4; ++s) {
          w.mutable_grad() = at::randn({16, 8}, gen);
          b.mutable_grad() = at::randn({16}, gen);
          ed::tail_input mine;
          mine.loss_value = 1.0 + rank;
          mine.count = 2.0;
          reducer.begin(comm, {w, b}, 0.5, mine);
          reducer.ready(0);
          reducer.ready(1);
          tails[static_cast<std::size_t>(rank)] = ed::read_tail(reducer.finish());
          hook->step_committed(signals);  // the step boundary: pruned weights are zeroed
        }
        weights[static_cast<std::size_t>(rank)] = w.detach().clone();
        grads[static_cast<std::size_t>(rank)] = w.grad().clone();
        shared[static_cast<std::size_t>(rank)] = hook->shared_state();
        sparsity[static_cast<std::size_t>(rank)] = hook->sparsity();
      },
      errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  CHECK(shared[0] == shared[1]);  // the masks are the same on both ranks
  CHECK(sparsity[0] == doctest::Approx(0.8).epsilon(0.01));
  CHECK(at::equal(weights[0], weights[1]));
  const auto zeros = (weights[0] == 0).sum().item<std::int64_t>();
  CHECK(zeros == 102);                                                             // round(0.2 x 128) = 26 active
  CHECK(at::equal((grads[0] == 0), (grads[0] == 0).logical_or(weights[0] == 0)));  // no gradient where pruned
  CHECK(tails[0].loss_sum == 2.0 * 1.0 + 2.0 * 2.0);  // the tail rides exact with the sparse payload
  CHECK(tails[0].count == 4.0);
}

TEST_CASE("elastic.codec_hook.shared_state_and_the_rule_on_a_world_change") {
  at::set_num_threads(1);
  std::vector<std::string> errors;
  const auto r = hooked_world("powersgd:2", 2, errors);
  for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  // A joiner loads the shared part: its own residual is zero, what it shares equals the sender's.
  dra::elastic::codec_hook joiner("powersgd:2");
  joiner.load_shared_state(r[0].shared);
  CHECK(joiner.shared_state() == r[0].shared);
  CHECK(joiner.error_feedback_norm1() == 0.0);
  REQUIRE(joiner.codec(0) != nullptr);
  CHECK(joiner.codec(0)->steps() == 2);
  // Another codec's state is refused, naming the option, and changes nothing.
  dra::elastic::codec_hook other("powersgd:3");
  const auto before = other.shared_state();
  CHECK_THROWS_WITH_AS(other.load_shared_state(r[0].shared), doctest::Contains("compress"), dra::state_mismatch_error);
  CHECK(other.shared_state() == before);
  CHECK_THROWS_AS(dra::elastic::codec_hook("fp16").load_shared_state({1, 2, 3}), dra::state_mismatch_error);
  // Bad specs name the option and the fix.
  CHECK_THROWS_WITH_AS(dra::elastic::codec_hook("masked:2"), doctest::Contains("max_sparsity"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dra::elastic::codec_hook::validate_spec("lz4"), doctest::Contains("compress"),
                       std::invalid_argument);
}
