// The elastic controller in one process: a real c10d TCPStore and real Gloo over loopback, one
// std::thread per process of the job, each with its own controller, model, SGD optimizer (with
// momentum, so the optimizer state handoff matters) and elastic_sampler. doctest assertions are
// not thread-safe, so the rank threads only record what they saw; the test thread asserts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/elastic/controller.hpp"

// c10's logging defines a one-argument CHECK; doctest's must win in this file.
#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "elastic_test_support.hpp"

using namespace dra::elastic;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

using dra_test::free_port;
using dra_test::healthy_options;
using dra_test::launch;

constexpr std::int64_t kDataset = 48;
constexpr std::int64_t kGlobalBatch = 8;  // 6 steps per data epoch

// A store the test owns (it outlives every controller of the test).
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

struct dataset {
  at::Tensor x, y;
};
dataset make_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  dataset d;
  d.x = at::randn({kDataset, 6}, gen);
  d.y = at::randn({kDataset, 2}, gen);
  return d;
}

// One process of the job: its model (initialised differently per uid: the world's first
// handoff must make them identical), optimizer and sampler.
struct trainer {
  torch::nn::Linear model;
  torch::optim::SGD optimizer;
  std::shared_ptr<elastic_sampler> sampler;
  std::shared_ptr<module_state> state;
  std::unique_ptr<controller> ctl;

  struct commit {
    std::int64_t data_epoch, step, world_epoch;
    int rank, world;
    std::vector<std::int64_t> ids;
  };
  std::vector<commit> commits;
  std::map<std::int64_t, std::uint64_t> hash_at;  // step index -> hash of params + momentum there
  std::map<std::int64_t, double> timed;           // committed step -> the step time given (train's `timed`)
  std::string error;
  bool threw_state_mismatch = false;

  explicit trainer(int uid, std::int64_t out = 2)
      : model(torch::nn::LinearOptions(6, out)),
        optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        sampler(std::make_shared<elastic_sampler>(kDataset, kGlobalBatch, 3)),
        state(std::make_shared<module_state>(*model, &optimizer)) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(0.1 * (uid + 1));
  }
};

std::uint64_t fnv(std::uint64_t h, const at::Tensor& tensor) {
  const auto t = tensor.detach().contiguous();
  const auto* b = static_cast<const unsigned char*>(t.data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

std::uint64_t hash_of(trainer& t) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : t.model->parameters()) {
    h = fnv(h, p);
    const auto it = t.optimizer.state().find(p.unsafeGetTensorImpl());
    if (it != t.optimizer.state().end()) {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (s.momentum_buffer().defined()) h = fnv(h, s.momentum_buffer());
    }
  }
  return h;
}

// The training loop of include/dra/torch/elastic/controller.hpp, recording what it saw.
// `vanish_at` >= 0: return at that step, before its gradient all-reduce (the caller then drops the
// controller, as a killed process would). `timed`: each step() is given the time since the
// previous one returned (a script's loop-to-loop timing, as PyTorch's ImageNet example keeps it),
// recorded in t.timed by the step it committed.
void train(trainer& t, const dataset& d, std::int64_t epochs, const std::function<void()>& before_step = {},
           std::int64_t vanish_at = -1, bool timed = false) {
  controller& ctl = *t.ctl;
  if (ctl.is_member()) t.hash_at[ctl.step_index()] = hash_of(t);
  auto last = std::chrono::steady_clock::now();
  while (ctl.next_epoch(epochs)) {
    while (ctl.is_member() && !t.sampler->exhausted()) {
      if (ctl.step_index() == vanish_at) return;
      if (before_step) before_step();
      const auto ids = t.sampler->indices();
      const trainer::commit c{t.sampler->epoch(), ctl.step_index(), ctl.epoch(), ctl.rank(), ctl.world_size(), ids};
      t.optimizer.zero_grad();
      double loss_value = 0.0;
      if (!ids.empty()) {
        const auto index = torch::tensor(ids, torch::kLong);
        const auto loss = torch::mse_loss(t.model->forward(d.x.index_select(0, index)), d.y.index_select(0, index));
        loss.backward();
        loss_value = loss.item<double>();
      }
      if (ctl.reduce_gradients(t.model->parameters())) t.optimizer.step();
      step_signals timing;
      if (timed) timing.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
      const auto r = ctl.step(loss_value, timing);
      last = std::chrono::steady_clock::now();
      if (r.committed) {
        t.commits.push_back(c);
        t.commits.back().step = r.step;
        if (timed) t.timed[r.step] = timing.step_time_s;
      }
      if (ctl.is_member()) t.hash_at[ctl.step_index()] = hash_of(t);
    }
  }
}

// Runs fn(i) on n threads; an exception is recorded in trainers[i].error.
void run_threads(std::vector<std::unique_ptr<trainer>>& trainers, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < static_cast<int>(trainers.size()); ++i)
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const dra::state_mismatch_error& e) {
        trainers[static_cast<std::size_t>(i)]->threw_state_mismatch = true;
        trainers[static_cast<std::size_t>(i)]->error = e.what();
      } catch (const std::exception& e) {
        trainers[static_cast<std::size_t>(i)]->error = e.what();
      }
    });
  for (auto& th : threads) th.join();
}

// Every committed step's samples, checked against the sampler's definition: per data epoch, each
// index of the dataset exactly once (no fault here, so every commit is the world's).
void check_exactly_once(const std::vector<std::unique_ptr<trainer>>& trainers, std::int64_t epochs) {
  std::map<std::int64_t, std::vector<std::int64_t>> seen;
  for (const auto& t : trainers)
    for (const auto& c : t->commits) seen[c.data_epoch].insert(seen[c.data_epoch].end(), c.ids.begin(), c.ids.end());
  REQUIRE(static_cast<std::int64_t>(seen.size()) == epochs);
  for (auto& [epoch, ids] : seen) {
    CAPTURE(epoch);
    std::sort(ids.begin(), ids.end());
    std::vector<std::int64_t> all(kDataset);
    for (std::int64_t i = 0; i < kDataset; ++i) all[static_cast<std::size_t>(i)] = i;
    CHECK(ids == all);
  }
}

// Every process that was a member at a step boundary holds the same parameters and momentum there.
void check_identical_states(const std::vector<std::unique_ptr<trainer>>& trainers) {
  std::map<std::int64_t, std::set<std::uint64_t>> at_step;
  for (const auto& t : trainers)
    for (const auto& [step, h] : t->hash_at) at_step[step].insert(h);
  for (const auto& [step, hashes] : at_step) {
    CAPTURE(step);
    CHECK(hashes.size() == 1);
  }
}

// A model-mismatch message names a tensor whose shape differs (both weight and bias do here).
bool names_a_differing_tensor(const std::string& message) {
  return (message.find("'weight'") != std::string::npos || message.find("'bias'") != std::string::npos) &&
         message.find(" has shape ") != std::string::npos;
}

std::vector<json> events_of(const controller& c, const std::string& kind) {
  std::vector<json> out;
  for (const auto& line : c.events()) {
    const auto ev = json::parse(line);
    if (ev.at("event") == kind) out.push_back(ev);
  }
  return out;
}

// Three processes train `epochs` data epochs; uid 1 trains until step `die_at`, then vanishes (its
// controller destroyed, as a killed process's would be). `timed`: steps are given their
// loop-to-loop time (train's `timed`); `slow_first`: each process's first step in every world it
// is in takes 0.3 s more (a data loader's restart, a recompile, a lazy connection).
struct vanish_run {
  c10::intrusive_ptr<c10d::TCPStore> server;  // outlives the trainers (members go in reverse order)
  std::vector<std::unique_ptr<trainer>> trainers;
};
vanish_run three_with_a_vanishing_peer(const std::string& job, std::int64_t epochs, std::int64_t die_at,
                                       bool timed = false, bool slow_first = false) {
  at::set_num_threads(1);
  const dataset data = make_data();
  vanish_run run{make_server(), {}};
  const int port = run.server->getPort();
  auto& trainers = run.trainers;
  for (int i = 0; i < 3; ++i) trainers.push_back(std::make_unique<trainer>(i));
  run_threads(trainers, [&](int i) {
    auto o = healthy_options();
    o.fault_timeout_s =
        3.0;  // bounds the survivors' wait for the vanished peer (short, yet no spurious fault under load)
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(o, launch(port, i, 3, job), t.state, t.sampler);
    std::int64_t seen = -1;
    const auto first_in_a_world_is_slow = [&t, &seen] {
      if (t.ctl->epoch() == seen) return;
      seen = t.ctl->epoch();
      std::this_thread::sleep_for(300ms);
    };
    train(t, data, epochs, slow_first ? std::function<void()>(first_in_a_world_is_slow) : std::function<void()>{},
          i == 1 ? die_at : -1, timed);
    if (i == 1) t.ctl.reset();
  });
  return run;
}
}  // namespace

TEST_CASE("controller.world.grow_then_shrink") {
  at::set_num_threads(1);
  const dataset data = make_data();
  const int port = free_port();
  constexpr std::int64_t kEpochs = 2;
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 3; ++i) trainers.push_back(std::make_unique<trainer>(i));
  std::vector<std::vector<int>> members_at_join(3);
  run_threads(trainers, [&](int i) {
    auto o = healthy_options();
    o.start_size = 2;
    o.resize_schedule = {{4, 3}, {8, 2}};  // grow after 4 committed steps, shrink after 8
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    // uid 0 hosts the store; its controller lives until every thread is done (below).
    t.ctl = std::make_unique<controller>(o, launch(port, i, 3, "grow-shrink", i == 0), t.state, t.sampler);
    members_at_join[static_cast<std::size_t>(i)] = t.ctl->members();
    train(t, data, kEpochs);
  });
  for (const auto& t : trainers) CHECK_MESSAGE(t->error.empty(), t->error);
  REQUIRE(trainers[0]->ctl);
  const controller& leader = *trainers[0]->ctl;

  // uid 2 waited as a candidate and was admitted into the world {0, 1, 2}.
  CHECK(members_at_join[0] == std::vector<int>{0, 1});
  CHECK(members_at_join[2] == std::vector<int>{0, 1, 2});
  const auto starts = events_of(leader, "start");
  REQUIRE(starts.size() == 1);
  CHECK(starts[0]["after"] == 2);
  CHECK(starts[0]["params_identical"] == true);  // uid 1 started from other values: the handoff fixed them

  const auto resizes = events_of(leader, "resize");
  REQUIRE(resizes.size() == 2);
  CHECK(resizes[0]["before"] == 2);
  CHECK(resizes[0]["after"] == 3);
  CHECK(resizes[0]["joined"] == std::vector<int>{2});
  CHECK(resizes[0]["left"] == std::vector<int>{});
  CHECK(resizes[0]["decided_step"] == 4);
  CHECK(resizes[0]["params_identical"] == true);
  CHECK(resizes[0]["state_bytes"].get<std::int64_t>() == (6 * 2 + 2) * 4);
  for (const char* phase : {"agree", "rebuild", "state_transfer", "reshard"})
    CHECK(resizes[0]["cost_s"][phase].get<double>() >= 0.0);
  CHECK(resizes[1]["before"] == 3);
  CHECK(resizes[1]["after"] == 2);
  CHECK(resizes[1]["left"] == std::vector<int>{2});
  CHECK(resizes[1]["joined"] == std::vector<int>{});
  CHECK(resizes[1]["decided_step"] == 8);
  CHECK(resizes[1]["params_identical"] == true);

  // The joiner continued at the world's step: its first commit is the step of the grow event.
  REQUIRE_FALSE(trainers[2]->commits.empty());
  CHECK(trainers[2]->commits.front().step == resizes[0]["step"].get<std::int64_t>());
  CHECK(trainers[2]->commits.front().world == 3);
  // ... and stopped at the shrink: its last commit is the step before the shrink event's.
  CHECK(trainers[2]->commits.back().step == resizes[1]["step"].get<std::int64_t>() - 1);
  // Released with release_mode::standby, it waited and left when the job finished.
  CHECK(trainers[2]->ctl->current_role() == role::finished);
  CHECK(trainers[0]->ctl->current_role() == role::finished);
  CHECK(trainers[0]->ctl->step_index() == kEpochs * kDataset / kGlobalBatch);
  CHECK(trainers[1]->ctl->step_index() == kEpochs * kDataset / kGlobalBatch);
  CHECK(trainers[0]->ctl->resizes() == 2);
  CHECK(trainers[1]->ctl->resizes() == 2);

  check_exactly_once(trainers, kEpochs);
  check_identical_states(trainers);
  // The final members hold identical parameters and momentum buffers.
  CHECK(hash_of(*trainers[0]) == hash_of(*trainers[1]));
  CHECK(trainers[0]->hash_at.rbegin()->first == kEpochs * kDataset / kGlobalBatch);
  // Momentum buffers exist: the joiner received them (it never stepped before joining).
  CHECK(!trainers[2]->optimizer.state().empty());

  // The store's host goes last.
  for (int i = 2; i >= 0; --i) trainers[static_cast<std::size_t>(i)]->ctl.reset();
}

TEST_CASE("controller.world.a_stop_request_ends_every_member_at_the_same_step") {
  // What SIGTERM does under `dra run`: one member asks; the request rides with its next gradient
  // reduction; every member ends training at that step boundary (no step after it anywhere), and
  // after the end each keeps the rank it had, so that "save on rank 0" after the loop works.
  at::set_num_threads(1);
  const dataset data = make_data();
  const int port = free_port();
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 3; ++i) trainers.push_back(std::make_unique<trainer>(i));
  run_threads(trainers, [&](int i) {
    auto o = healthy_options();
    o.start_size = 2;  // uid 2 stands by: the job's end reaches it through the store
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(o, launch(port, i, 3, "stop", i == 0), t.state, t.sampler);
    train(t, data, 3, [&] {
      if (i == 1 && t.ctl->step_index() == 4) t.ctl->request_stop();
    });
  });
  for (const auto& t : trainers) CHECK_MESSAGE(t->error.empty(), t->error);
  // Asked during step 4 (after 4 commits): step 4 commits, then training ends everywhere.
  for (int i = 0; i < 2; ++i) {
    const controller& c = *trainers[static_cast<std::size_t>(i)]->ctl;
    CAPTURE(i);
    CHECK(c.step_index() == 5);
    CHECK(c.stopped());
    CHECK(c.current_role() == role::finished);
    CHECK(c.rank() == i);  // kept after the end
    CHECK(c.world_size() == 2);
    CHECK(c.is_leader() == (i == 0));
    CHECK(trainers[static_cast<std::size_t>(i)]->commits.size() == 5);
  }
  const controller& standby = *trainers[2]->ctl;
  CHECK(standby.current_role() == role::finished);
  CHECK(standby.rank() == -1);  // never in the last world
  CHECK_FALSE(standby.is_leader());
  check_identical_states(trainers);
}

TEST_CASE("controller.options.validate_names_the_field") {
  auto bad = [](const std::function<void(controller_options&)>& edit, const std::string& field) {
    controller_options o;
    edit(o);
    CAPTURE(field);
    try {
      o.validate();
      FAIL("validate() accepted a bad " << field);
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).rfind(field + ":", 0) == 0);
    }
  };
  const controller_options defaults;
  CHECK_NOTHROW(defaults.validate());
  bad([](controller_options& o) { o.engine.decide_every = 0; }, "decide_every");
  bad([](controller_options& o) { o.fault_timeout_s = 0.0; }, "fault_timeout_s");
  bad([](controller_options& o) { o.store_timeout_s = -1.0; }, "store_timeout_s");
  bad([](controller_options& o) { o.chunk_mb = 1e-4; }, "chunk_mb");
  bad([](controller_options& o) { o.capacity_poll_s = -0.5; }, "capacity_poll_s");
  bad([](controller_options& o) { o.deferred_handoff = true, o.verify = true; }, "handoff");
  bad([](controller_options& o) { o.start_size = -1; }, "start_size");
  bad([](controller_options& o) { o.batch = batch_mode::adascale; }, "batch_mode");
  bad([](controller_options& o) { o.resize_schedule = {{3, 5}}, o.engine.limits.max_size = 4; }, "resize_schedule");
  bad([](controller_options& o) { o.max_resize_retries = -1; }, "max_resize_retries");
  bad([](controller_options& o) { o.status_every = -1; }, "status_every");
  bad([](controller_options& o) { o.resize_schedule = {{0, 2}}; }, "resize_schedule");
  bad([](controller_options& o) { o.resize_schedule = {{5, 0}}; }, "resize_schedule");
  bad([](controller_options& o) { o.engine.limits.min_size = 0; }, "min_size");
  bad([](controller_options& o) { o.engine.policy = "fastest"; }, "policy");

  // The constructor checks its other inputs before it touches a store.
  trainer t(0);
  auto o = healthy_options();
  CHECK_THROWS_WITH_AS(controller(o, launch(1, 3, 2, "bad"), t.state, t.sampler), doctest::Contains("RANK:"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(controller(o, launch(1, 0, 2, "bad"), t.state, nullptr), doctest::Contains("sampler:"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(controller(o, launch(1, 0, 0, "bad"), t.state, t.sampler), doctest::Contains("WORLD_SIZE:"),
                       std::invalid_argument);
  // start_size beyond the processes launched (a world of one with a private store).
  o.start_size = 2;
  CHECK_THROWS_WITH_AS(controller(o, launch(0, 0, 1, "bad", true), t.state, t.sampler),
                       doctest::Contains("start_size:"), std::invalid_argument);
}

TEST_CASE("controller.start.config_mismatch_is_refused") {
  at::set_num_threads(1);
  auto server = make_server();
  const int port = server->getPort();
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 2; ++i) trainers.push_back(std::make_unique<trainer>(i));
  run_threads(trainers, [&](int i) {
    auto o = healthy_options();
    o.engine.decide_every = i == 0 ? 10 : 20;  // process 1 was started with other options
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(o, launch(port, i, 2, "cfg-mismatch"), t.state, t.sampler);
  });
  for (const auto& t : trainers) {
    CHECK_FALSE(t->ctl);
    CHECK_MESSAGE(t->error.find("configuration") != std::string::npos, t->error);
    CHECK_MESSAGE(t->error.find("'decide_every'") != std::string::npos, t->error);
    CHECK(t->error.find("'verify'") == std::string::npos);  // only what differs is named
  }
}

TEST_CASE("controller.start.model_mismatch_is_refused") {
  at::set_num_threads(1);
  auto server = make_server();
  const int port = server->getPort();
  std::vector<std::unique_ptr<trainer>> trainers;
  trainers.push_back(std::make_unique<trainer>(0, 2));
  trainers.push_back(std::make_unique<trainer>(1, 3));  // a different output size
  run_threads(trainers, [&](int i) {
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(healthy_options(), launch(port, i, 2, "sig-mismatch"), t.state, t.sampler);
  });
  for (const auto& t : trainers) {
    CHECK_FALSE(t->ctl);
    CHECK(t->threw_state_mismatch);
    CHECK_MESSAGE(names_a_differing_tensor(t->error), t->error);
    // Founding processes are named by their uid, each with its own shape (no "world"/"joiner").
    CHECK_MESSAGE(t->error.find("world has") == std::string::npos, t->error);
  }
}

TEST_CASE("controller.admission.mismatched_joiner_is_rejected") {
  at::set_num_threads(1);
  const dataset data = make_data();
  auto server = make_server();
  const int port = server->getPort();
  constexpr std::int64_t kEpochs = 1;
  std::vector<std::unique_ptr<trainer>> trainers;
  trainers.push_back(std::make_unique<trainer>(0));
  trainers.push_back(std::make_unique<trainer>(1));
  trainers.push_back(std::make_unique<trainer>(2, 3));  // the late joiner's model differs
  bool saw_candidate[2] = {false, false};
  run_threads(trainers, [&](int i) {
    auto o = healthy_options();
    o.resize_schedule = {{2, 3}};  // the leader looks at the candidates after 2 steps and asks for 3
    o.engine.limits.max_size = 3;  // beyond the 2 launched: a late joiner is expected
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    if (i == 2) {
      t.ctl = std::make_unique<controller>(o, launch(port, 0, 1, "reject", false, true), t.state, t.sampler);
      return;
    }
    t.ctl = std::make_unique<controller>(o, launch(port, i, 2, "reject"), t.state, t.sampler);
    // Both members wait (bounded) until the joiner is registered, so the decision at step 2 sees it.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (t.ctl->registered_candidates().empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    saw_candidate[i] = !t.ctl->registered_candidates().empty();
    train(t, data, kEpochs);
  });
  CHECK(saw_candidate[0]);
  CHECK(saw_candidate[1]);
  CHECK_MESSAGE(trainers[0]->error.empty(), trainers[0]->error);
  CHECK_MESSAGE(trainers[1]->error.empty(), trainers[1]->error);
  // The joiner: refused with the reason.
  CHECK_FALSE(trainers[2]->ctl);
  CHECK(trainers[2]->threw_state_mismatch);
  CHECK_MESSAGE(names_a_differing_tensor(trainers[2]->error), trainers[2]->error);
  // The leader logged the rejection; the world was untouched.
  REQUIRE(trainers[0]->ctl);
  const auto rejected = events_of(*trainers[0]->ctl, "rejected");
  REQUIRE(rejected.size() == 1);
  CHECK(rejected[0]["uid"] == 10000);  // late joiners number themselves from 10000
  CHECK(names_a_differing_tensor(rejected[0]["reason"].get<std::string>()));
  CHECK(events_of(*trainers[0]->ctl, "resize").empty());
  CHECK(trainers[0]->ctl->members() == std::vector<int>{0, 1});
  CHECK(trainers[0]->ctl->resizes() == 0);
  CHECK(trainers[0]->ctl->step_index() == kEpochs * kDataset / kGlobalBatch);
  CHECK(hash_of(*trainers[0]) == hash_of(*trainers[1]));
  trainers.pop_back();
  check_exactly_once(trainers, kEpochs);
  check_identical_states(trainers);
}

TEST_CASE("controller.store.unreachable_names_the_address") {
  trainer t(0);
  auto o = healthy_options();
  o.store_timeout_s = 1.5;
  const int port = free_port();  // nothing listens there
  try {
    controller c(o, launch(port, 0, 2, "unreachable"), t.state, t.sampler);
    FAIL("a controller was built without a store");
  } catch (const dra::timeout_error& e) {
    CHECK_MESSAGE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)) != std::string::npos, e.what());
  }
}

TEST_CASE("controller.world.late_joiner_and_standby_readmission") {
  at::set_num_threads(1);
  const dataset data = make_data();
  auto server = make_server();
  std::mutex server_mutex;  // the test thread's own client, shared by the two member threads
  const int port = server->getPort();
  constexpr std::int64_t kEpochs = 2;
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 3; ++i) trainers.push_back(std::make_unique<trainer>(i));
  int joiner_uid = -1;
  std::atomic<bool> joiner_wait_timed_out{false};
  run_threads(trainers, [&](int i) {
    auto o = healthy_options();
    o.resize_schedule = {{3, 3}, {6, 2}, {9, 3}};  // admit the late joiner, release it, admit it again
    o.engine.limits.max_size = 3;
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    if (i == 2) {
      // Started later with the job's store address (DRA_JOIN=1): a candidate with a uid >= 10000.
      t.ctl = std::make_unique<controller>(o, launch(port, 0, 1, "late", false, true), t.state, t.sampler);
      joiner_uid = t.ctl->uid();
      train(t, data, kEpochs);
      return;
    }
    t.ctl = std::make_unique<controller>(o, launch(port, i, 2, "late"), t.state, t.sampler);
    // Before the steps that end in a grow decision (after 3 and 9 commits), wait (bounded) until
    // the joiner is registered as waiting: a schedule entry is one decision, taken once.
    auto wait_for_joiner = [&] {
      const auto deadline = std::chrono::steady_clock::now() + 20s;
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(server_mutex);
          // c10d's PrefixStore joins prefix and key with a '/'.
          if (server->check({"dra/test-late/0/waiting/10000"})) return;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          joiner_wait_timed_out = true;
          return;
        }
        std::this_thread::sleep_for(5ms);
      }
    };
    wait_for_joiner();
    train(t, data, kEpochs, [&] {
      if (t.ctl->step_index() == 8) wait_for_joiner();
    });
  });
  for (const auto& t : trainers) CHECK_MESSAGE(t->error.empty(), t->error);
  CHECK(joiner_uid == 10000);
  CHECK_FALSE(joiner_wait_timed_out.load());
  REQUIRE(trainers[0]->ctl);
  const auto resizes = events_of(*trainers[0]->ctl, "resize");
  REQUIRE(resizes.size() == 3);
  CHECK(resizes[0]["joined"] == std::vector<int>{10000});
  CHECK(resizes[1]["left"] == std::vector<int>{10000});
  CHECK(resizes[2]["joined"] == std::vector<int>{10000});
  for (const auto& ev : resizes) CHECK(ev["params_identical"] == true);
  // The joiner committed exactly the steps it was a member for: [4, 7) and from 10 to the end.
  std::vector<std::int64_t> steps;
  for (const auto& c : trainers[2]->commits) steps.push_back(c.step);
  CHECK(steps == std::vector<std::int64_t>{4, 5, 6, 10, 11});
  CHECK(trainers[2]->ctl->step_index() == kEpochs * kDataset / kGlobalBatch);
  CHECK(trainers[2]->ctl->resizes() == 3);
  check_exactly_once(trainers, kEpochs);
  check_identical_states(trainers);
  CHECK(hash_of(*trainers[0]) == hash_of(*trainers[2]));
}

TEST_CASE("controller.fault.a_vanished_peer_is_survived") {
  // A process that vanishes at a step boundary while its peers enter the step's gradient
  // all-reduce: its thread destroys its controller, which closes its Gloo connections and store client, as a
  // killed process's would. The survivors detect it, agree, shrink and redo the step.
  constexpr std::int64_t kEpochs = 2, kDieAt = 7;
  const auto run = three_with_a_vanishing_peer("fault", kEpochs, kDieAt);
  const auto& trainers = run.trainers;
  for (const auto& t : trainers) CHECK_MESSAGE(t->error.empty(), t->error);
  REQUIRE(trainers[0]->ctl);
  const auto faults = events_of(*trainers[0]->ctl, "fault");
  REQUIRE(faults.size() == 1);
  CHECK(faults[0]["before"] == 3);
  CHECK(faults[0]["after"] == 2);
  CHECK(faults[0]["left"] == std::vector<int>{1});
  CHECK(faults[0]["step"] == kDieAt);  // the interrupted step is redone in the new world
  CHECK(faults[0]["params_identical"] == true);
  CHECK(trainers[0]->ctl->members() == std::vector<int>{0, 2});
  CHECK(trainers[2]->ctl->step_index() == kEpochs * kDataset / kGlobalBatch);
  // uid 1 committed steps 0..kDieAt-1 with the others, then nothing: every sample still once.
  CHECK(trainers[1]->commits.size() == static_cast<std::size_t>(kDieAt));
  check_exactly_once(trainers, kEpochs);
  check_identical_states(trainers);
  CHECK(hash_of(*trainers[0]) == hash_of(*trainers[2]));
}

TEST_CASE("controller.signals.the_first_step_of_each_world_is_not_timed") {
  // The first step in a world is slow for reasons of the world, not of its size: a script's data
  // loader restarts its workers for the new shard, torch.compile recompiles for the new per-rank
  // batch, a backend connects lazily. Here it sleeps 0.3 s, against steps of milliseconds, in
  // the job's first world and in the world left after a peer vanished. The throughput model takes
  // every other step and not those two. Before, it took both, and the one at the size just reached
  // set that size's predicted step time (a pool shrank a healthy job on such a fit).
  constexpr std::int64_t kEpochs = 2, kDieAt = 7;
  const auto run = three_with_a_vanishing_peer("timed", kEpochs, kDieAt, true, true);
  const auto& trainers = run.trainers;
  for (const auto& t : trainers) CHECK_MESSAGE(t->error.empty(), t->error);
  for (int i : {0, 2}) {
    CAPTURE(i);
    const trainer& t = *trainers[static_cast<std::size_t>(i)];
    REQUIRE(t.commits.size() == static_cast<std::size_t>(kEpochs * kDataset / kGlobalBatch));
    CHECK(t.timed.at(0) >= 0.3);
    CHECK(t.timed.at(kDieAt) >= 0.3);  // the step redone in the world of two
    auto& model = t.ctl->engine().throughput();
    CHECK(model.observations() == t.commits.size() - 2);  // all but steps 0 and kDieAt
    double slowest = 0.0;
    for (const auto& [step, s] : t.timed)
      if (step != 0 && step != kDieAt) slowest = std::max(slowest, s);
    CAPTURE(slowest);
    // What it predicts at the new size is what the steps there took.
    CHECK(model.step_time_s(2, kGlobalBatch / 2.0) <= 2.0 * slowest + 1e-3);
  }
}
