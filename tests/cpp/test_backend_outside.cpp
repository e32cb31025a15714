// The communicator backend interface (include/dra/torch/comm/communicator.hpp) used from outside, as
// a user with a backend of their own would: register it by name, run an elastic world on it that
// grows and shrinks, replace a built-in, and get clear errors for bad registrations. The example of
// docs/guide/backend.md ("Your own backend") is compiled here, between the guide markers, and a test
// checks that the guide shows it verbatim. One std::thread per process of the job, as in
// test_controller.cpp; the rank threads only record what they saw, the test thread asserts.
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
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/comm/communicator.hpp"
#include "dra/torch/comm/gloo.hpp"
#include "dra/torch/elastic/controller.hpp"

// c10's logging defines a one-argument CHECK; doctest's must win in this file.
#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "elastic_test_support.hpp"
#include "guide_example.hpp"

// [guide:your-own-backend]
#include <atomic>
#include <dra/torch.hpp>
#include <memory>

// Gloo underneath; counts the bytes this process all-reduces and sends, and the worlds it built.
struct traffic {
  std::atomic<std::int64_t> reduced{0}, sent{0}, rebuilds{0};
};

class counting_communicator final : public dra::comm::communicator {
 public:
  counting_communicator(std::unique_ptr<communicator> inner, std::shared_ptr<traffic> t)
      : inner_(std::move(inner)), traffic_(std::move(t)) {}
  std::unique_ptr<communicator> unwrap() { return std::move(inner_); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::uint64_t epoch() const override { return inner_->epoch(); }
  void all_reduce_sum(at::Tensor& t) override {
    traffic_->reduced += static_cast<std::int64_t>(t.nbytes());
    inner_->all_reduce_sum(t);
  }
  void broadcast(at::Tensor& t, int root) override { inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  // Point-to-point: the state handoff to joiners needs it (without it, see below).
  void send(const at::Tensor& t, const std::vector<int>& dsts, int tag) override {
    traffic_->sent += static_cast<std::int64_t>(t.nbytes() * dsts.size());
    inner_->send(t, dsts, tag);
  }
  void recv(at::Tensor& t, int src, int tag) override { inner_->recv(t, src, tag); }
  void send_batch(const std::vector<at::Tensor>& ts, const std::vector<int>& dsts, int first_tag) override {
    for (const auto& t : ts) traffic_->sent += static_cast<std::int64_t>(t.nbytes() * dsts.size());
    inner_->send_batch(ts, dsts, first_tag);
  }
  void recv_batch(const std::vector<at::Tensor>& ts, int src, int first_tag) override {
    inner_->recv_batch(ts, src, first_tag);
  }
  void abort() noexcept override { inner_->abort(); }

 private:
  std::unique_ptr<communicator> inner_;
  std::shared_ptr<traffic> traffic_;
};

class counting_backend final : public dra::comm::backend {
 public:
  counting_backend(const dra::comm::backend_config& config, std::shared_ptr<traffic> t) : traffic_(std::move(t)) {
    dra::comm::gloo_backend_options o;
    o.hostname = config.address;       // controller_options::backend_address
    o.key_prefix = config.key_prefix;  // keeps each world's rendezvous keys apart
    gloo_ = std::make_unique<dra::comm::gloo_backend>(o);
  }
  std::string name() const override { return "counting"; }  // what the events' "backend" says
  std::unique_ptr<dra::comm::communicator> rebuild(std::unique_ptr<dra::comm::communicator> current,
                                                   const dra::comm::rebuild_request& request,
                                                   const c10::intrusive_ptr<c10d::Store>& store) override {
    ++traffic_->rebuilds;
    // `current` is the communicator this backend built for the previous world (or null).
    std::unique_ptr<dra::comm::communicator> inner;
    if (current) inner = static_cast<counting_communicator&>(*current).unwrap();
    auto next = gloo_->rebuild(std::move(inner), request, store);
    if (!next) return nullptr;  // this process left the world
    return std::make_unique<counting_communicator>(std::move(next), traffic_);
  }

 private:
  std::unique_ptr<dra::comm::gloo_backend> gloo_;
  std::shared_ptr<traffic> traffic_;
};

// Once, before the first controller; every process of the job registers the same name.
void register_counting_backend(const std::shared_ptr<traffic>& t) {
  dra::comm::register_backend("counting", [t](const dra::comm::backend_config& config) {
    return std::make_shared<counting_backend>(config, t);
  });
}
// then: options.backend = "counting"; dra::elastic::controller ctl(options, launch, state, sampler);
// [guide:your-own-backend]

using namespace dra::elastic;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

using dra_test::free_port;
using dra_test::healthy_options;
using dra_test::launch;

// ---- replacing a built-in before anything looked a backend up ----------------------------------
// Registered while static objects are built, before main(): before any lookup, whatever order
// doctest runs the test cases in. The built-ins are registered at the first lookup; this
// registration must still win. It is Gloo itself underneath, so every other test here runs on it.
std::atomic<int> replacement_gloo_made{0};
const bool gloo_replaced = [] {
  dra::comm::register_backend("gloo", [](const dra::comm::backend_config& config) {
    ++replacement_gloo_made;
    dra::comm::gloo_backend_options o;
    o.hostname = config.address;
    o.key_prefix = config.key_prefix;
    return std::make_shared<dra::comm::gloo_backend>(o);
  });
  return true;
}();

constexpr std::int64_t kDataset = 48;
constexpr std::int64_t kGlobalBatch = 8;  // 6 steps per data epoch

struct trainer {
  torch::nn::Linear model;
  torch::optim::SGD optimizer;
  std::shared_ptr<elastic_sampler> sampler;
  std::shared_ptr<module_state> state;
  std::unique_ptr<controller> ctl;
  std::int64_t commits = 0;
  std::string error;

  explicit trainer(int uid)
      : model(torch::nn::LinearOptions(6, 2)),
        optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)),
        sampler(std::make_shared<elastic_sampler>(kDataset, kGlobalBatch, 3)),
        state(std::make_shared<module_state>(*model, &optimizer)) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(0.1 * (uid + 1));
  }
};

void train(trainer& t, const at::Tensor& x, const at::Tensor& y, std::int64_t epochs) {
  controller& ctl = *t.ctl;
  while (ctl.next_epoch(epochs)) {
    while (ctl.is_member() && !t.sampler->exhausted()) {
      const auto ids = t.sampler->indices();
      t.optimizer.zero_grad();
      double loss_value = 0.0;
      if (!ids.empty()) {
        const auto index = torch::tensor(ids, torch::kLong);
        const auto loss = torch::mse_loss(t.model->forward(x.index_select(0, index)), y.index_select(0, index));
        loss.backward();
        loss_value = loss.item<double>();
      }
      if (ctl.reduce_gradients(t.model->parameters())) t.optimizer.step();
      if (ctl.step(loss_value).committed) ++t.commits;
    }
  }
}

// Runs fn(i) on one thread per trainer; an exception is recorded in trainers[i]->error.
void run_threads(std::vector<std::unique_ptr<trainer>>& trainers, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < static_cast<int>(trainers.size()); ++i)
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        trainers[static_cast<std::size_t>(i)]->error = e.what();
      }
    });
  for (auto& th : threads) th.join();
}

std::vector<json> events_of(const controller& c, const std::string& kind) {
  std::vector<json> out;
  for (const auto& line : c.events()) {
    const auto ev = json::parse(line);
    if (ev.at("event") == kind) out.push_back(ev);
  }
  return out;
}

// What `f` threw, as "<type>: <message>" ("" when it did not throw).
std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return std::string("invalid_argument: ") + e.what();
  } catch (const dra::timeout_error& e) {
    return std::string("timeout_error: ") + e.what();
  } catch (const dra::comm_error& e) {
    return std::string("comm_error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A backend whose communicators have no point-to-point: Gloo's collectives only (send and recv
// are the interface's defaults, which throw).
class collectives_only_communicator final : public dra::comm::communicator {
 public:
  explicit collectives_only_communicator(std::unique_ptr<communicator> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<communicator> unwrap() { return std::move(inner_); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::uint64_t epoch() const override { return inner_->epoch(); }
  void all_reduce_sum(at::Tensor& t) override { inner_->all_reduce_sum(t); }
  void broadcast(at::Tensor& t, int root) override { inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  void abort() noexcept override { inner_->abort(); }

 private:
  std::unique_ptr<communicator> inner_;
};

class collectives_only_backend final : public dra::comm::backend {
 public:
  explicit collectives_only_backend(const dra::comm::backend_config& config, bool says_so)
      : gloo_(dra::comm::gloo_backend_options{config.address, "", config.key_prefix}), says_so_(says_so) {}
  std::string name() const override { return "collectives_only"; }
  std::unique_ptr<dra::comm::communicator> rebuild(std::unique_ptr<dra::comm::communicator> current,
                                                   const dra::comm::rebuild_request& request,
                                                   const c10::intrusive_ptr<c10d::Store>& store) override {
    std::unique_ptr<dra::comm::communicator> inner;
    if (current) inner = static_cast<collectives_only_communicator&>(*current).unwrap();
    auto next = gloo_.rebuild(std::move(inner), request, store);
    if (!next) return nullptr;
    return std::make_unique<collectives_only_communicator>(std::move(next));
  }
  std::unique_ptr<dra::comm::tensor_transfer> make_transfer(std::size_t chunk_bytes) const override {
    if (says_so_) return nullptr;  // the documented way to say "no point-to-point"
    return backend::make_transfer(chunk_bytes);
  }

 private:
  dra::comm::gloo_backend gloo_;
  bool says_so_;
};

}  // namespace

TEST_CASE("backend_outside.a_registered_backend_runs_a_world_that_grows_and_shrinks") {
  at::set_num_threads(1);
  auto counted = std::make_shared<traffic>();
  register_counting_backend(counted);
  const auto names = dra::comm::backend_names();
  CHECK(std::count(names.begin(), names.end(), "counting") == 1);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x = at::randn({kDataset, 6}, gen), y = at::randn({kDataset, 2}, gen);
  const int port = free_port();
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 3; ++i) trainers.push_back(std::make_unique<trainer>(i));
  run_threads(trainers, [&](int i) {
    auto o = healthy_options("counting");
    o.start_size = 2;
    o.resize_schedule = {{4, 3}, {8, 2}};  // grow after 4 committed steps, shrink after 8
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(o, launch(port, i, 3, "grow-shrink", i == 0), t.state, t.sampler);
    train(t, x, y, 2);
  });
  for (const auto& t : trainers) CHECK_MESSAGE(t->error.empty(), t->error);
  REQUIRE(trainers[0]->ctl);
  const controller& leader = *trainers[0]->ctl;
  const auto starts = events_of(leader, "start");
  REQUIRE(starts.size() == 1);
  CHECK(starts[0]["backend"] == "counting");
  CHECK(starts[0]["params_identical"] == true);  // uid 1 started from other values: handed over
  const auto resizes = events_of(leader, "resize");
  REQUIRE(resizes.size() == 2);
  CHECK(resizes[0]["after"] == 3);
  CHECK(resizes[0]["joined"] == std::vector<int>{2});
  CHECK(resizes[0]["params_identical"] == true);
  CHECK(resizes[0]["backend"] == "counting");
  CHECK(resizes[1]["after"] == 2);
  CHECK(resizes[1]["left"] == std::vector<int>{2});
  CHECK(trainers[0]->ctl->step_index() == 2 * kDataset / kGlobalBatch);
  CHECK(trainers[0]->ctl->resizes() == 2);
  // Everything went through the backend: the handoffs (point-to-point), every step's reduction,
  // and every world (start: 2 members, grow: 3, shrink: 2) was built by it.
  CHECK(counted->sent.load() > 0);
  CHECK(counted->reduced.load() > 0);
  CHECK(counted->rebuilds.load() >= 2 + 3 + 2);
  for (int i = 2; i >= 0; --i) trainers[static_cast<std::size_t>(i)]->ctl.reset();  // the store's host last
}

TEST_CASE("backend_outside.a_registration_wins_over_the_builtin_of_that_name") {
  // `gloo_replaced` registered "gloo" before anything looked a backend up; the first lookup
  // registers the built-ins, which must not overwrite it.
  REQUIRE(gloo_replaced);
  const int before = replacement_gloo_made.load();
  const auto gloo = dra::comm::make_backend("gloo", {"127.0.0.1", "pg"});
  REQUIRE(gloo);
  CHECK(replacement_gloo_made.load() == before + 1);
  const auto names = dra::comm::backend_names();
  CHECK(std::count(names.begin(), names.end(), "gloo") == 1);
#ifdef DRA_WITH_NCCL
  CHECK(std::count(names.begin(), names.end(), "nccl") == 1);  // the other built-ins are still registered
#endif
  // A registration after the first lookup replaces too (the latest registration of a name wins).
  std::atomic<int> second{0};
  dra::comm::register_backend("gloo", [&second](const dra::comm::backend_config& config) {
    ++second;
    return std::make_shared<dra::comm::gloo_backend>(dra::comm::gloo_backend_options{config.address, "", "pg"});
  });
  CHECK(dra::comm::make_backend("gloo"));
  CHECK(second.load() == 1);
  // Back to the first replacement, for the other test cases of this process.
  dra::comm::register_backend("gloo", [](const dra::comm::backend_config& config) {
    ++replacement_gloo_made;
    return std::make_shared<dra::comm::gloo_backend>(
        dra::comm::gloo_backend_options{config.address, "", config.key_prefix});
  });
}

TEST_CASE("backend_outside.bad_registrations_name_the_value_and_the_fix") {
  const auto factory = [](const dra::comm::backend_config& config) {
    return std::make_shared<dra::comm::gloo_backend>(dra::comm::gloo_backend_options{config.address, "", "pg"});
  };
  // An empty name.
  auto e = thrown([&] { dra::comm::register_backend("", factory); });
  CAPTURE(e);
  CHECK(e.rfind("invalid_argument: name: ", 0) == 0);
  CHECK(contains(e, "''"));
  // A null factory.
  e = thrown([&] { dra::comm::register_backend("nothing", nullptr); });
  CHECK(e.rfind("invalid_argument: factory: ", 0) == 0);
  CHECK(contains(e, "'nothing'"));
  CHECK(contains(e, "make_shared"));
  // Names an option, an event line or a shell would mangle.
  for (const std::string odd : {"my backend", " gloo", "gl/oo", "gloo\n", "a\"b", "née", "-x", "x,y"}) {
    e = thrown([&] { dra::comm::register_backend(odd, factory); });
    CAPTURE(odd);
    CHECK(e.rfind("invalid_argument: name: ", 0) == 0);
    CHECK(contains(e, "letters, digits"));
  }
  const auto names = dra::comm::backend_names();
  CHECK(std::find(names.begin(), names.end(), "my backend") == names.end());
  for (const std::string fine : {"gloo_counting", "my-transport", "ucx.v2", "B2"})
    CHECK_NOTHROW(dra::comm::register_backend(fine, factory));

  // A factory that throws: the error names the backend and keeps what the factory said (and its type).
  dra::comm::register_backend("throws_runtime",
                              [](const dra::comm::backend_config&) -> std::shared_ptr<dra::comm::backend> {
                                throw std::runtime_error("libfoo.so not found");
                              });
  e = thrown([] { dra::comm::make_backend("throws_runtime"); });
  CHECK(e.rfind("comm_error: ", 0) == 0);
  CHECK(contains(e, "'throws_runtime'"));
  CHECK(contains(e, "libfoo.so not found"));
  dra::comm::register_backend("throws_invalid",
                              [](const dra::comm::backend_config&) -> std::shared_ptr<dra::comm::backend> {
                                throw std::invalid_argument("address: 'x' is not an interface");
                              });
  e = thrown([] { dra::comm::make_backend("throws_invalid"); });
  CHECK(e.rfind("invalid_argument: backend: ", 0) == 0);
  CHECK(contains(e, "'throws_invalid'"));
  CHECK(contains(e, "address: 'x' is not an interface"));
  dra::comm::register_backend("throws_timeout",
                              [](const dra::comm::backend_config&) -> std::shared_ptr<dra::comm::backend> {
                                throw dra::timeout_error("device did not answer");
                              });
  e = thrown([] { dra::comm::make_backend("throws_timeout"); });
  CHECK(e.rfind("timeout_error: ", 0) == 0);
  CHECK(contains(e, "'throws_timeout'"));
  // Something that is not a std::exception: named too (it escaped unnamed).
  dra::comm::register_backend("throws_int",
                              [](const dra::comm::backend_config&) -> std::shared_ptr<dra::comm::backend> { throw 7; });
  e = thrown([] { dra::comm::make_backend("throws_int"); });
  CHECK(e.rfind("comm_error: ", 0) == 0);
  CHECK(contains(e, "'throws_int'"));
  CHECK(contains(e, "not a std::exception"));

  // A factory that returns null: refused by name, not dereferenced later.
  dra::comm::register_backend("returns_null", [](const dra::comm::backend_config&) { return nullptr; });
  e = thrown([] { dra::comm::make_backend("returns_null"); });
  CHECK(e.rfind("invalid_argument: backend: ", 0) == 0);
  CHECK(contains(e, "'returns_null'"));
  CHECK(contains(e, "null"));
  // ... and the controller says the same before it touches a store (it crashed here).
  trainer t(0);
  auto o = healthy_options("returns_null");
  e = thrown([&] { controller(o, launch(1, 0, 2, "null"), t.state, t.sampler); });
  CHECK(e.rfind("invalid_argument: backend: ", 0) == 0);
  CHECK(contains(e, "'returns_null'"));

  // An unknown name lists the known ones and says how to add one.
  o.backend = "countnig";
  e = thrown([&] { controller(o, launch(1, 0, 2, "unknown"), t.state, t.sampler); });
  CHECK(e.rfind("invalid_argument: backend: unknown backend 'countnig'", 0) == 0);
  CHECK(contains(e, "'gloo'"));
  CHECK(contains(e, "register_backend"));
}

TEST_CASE("backend_outside.a_backend_without_point_to_point_is_refused_at_start") {
  at::set_num_threads(1);
  trainer t(0);
  // Saying so (make_transfer returns null): refused before any store or world.
  dra::comm::register_backend("collectives_only", [](const dra::comm::backend_config& config) {
    return std::make_shared<collectives_only_backend>(config, true);
  });
  auto o = healthy_options("collectives_only");
  auto e = thrown([&] { controller(o, launch(1, 0, 2, "no-p2p"), t.state, t.sampler); });
  CAPTURE(e);
  CHECK(e.rfind("invalid_argument: backend: ", 0) == 0);
  CHECK(contains(e, "'collectives_only'"));
  CHECK(contains(e, "point-to-point"));
}

TEST_CASE("backend_outside.a_communicator_without_point_to_point_fails_the_first_handoff_with_the_fix") {
  // Not saying so (the default make_transfer over a communicator that keeps the interface's
  // send/recv): the first world's handoff (uid 0's state to uid 1) fails, with an error that says
  // point-to-point is missing, on every process, within the store timeout.
  at::set_num_threads(1);
  dra::comm::register_backend("collectives_only_silent", [](const dra::comm::backend_config& config) {
    return std::make_shared<collectives_only_backend>(config, false);
  });
  const int port = free_port();
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 2; ++i) trainers.push_back(std::make_unique<trainer>(i));
  const auto t0 = std::chrono::steady_clock::now();
  run_threads(trainers, [&](int i) {
    auto o = healthy_options("collectives_only_silent");
    o.fault_timeout_s = 2.0;
    o.store_timeout_s = 5.0;
    o.max_resize_retries = 0;
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(o, launch(port, i, 2, "no-p2p-silent", i == 0), t.state, t.sampler);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took < 60.0);
  for (const auto& t : trainers) {
    CAPTURE(t->error);
    CHECK_FALSE(t->ctl);
  }
  CHECK(contains(trainers[0]->error, "point-to-point"));
  CHECK(contains(trainers[0]->error, "backend::make_transfer"));  // the fix
  for (int i = 1; i >= 0; --i) trainers[static_cast<std::size_t>(i)]->ctl.reset();
}

TEST_CASE("backend_outside.a_communicator_without_point_to_point_ends_the_job_at_its_first_grow") {
  // A world of one needs no handoff and trains; the first grow needs one: its failure is taken for
  // a fault, every recovery fails the same way, and both processes end with the reason (not a
  // retry loop), within the store and fault timeouts.
  at::set_num_threads(1);
  dra::comm::register_backend("collectives_only_silent", [](const dra::comm::backend_config& config) {
    return std::make_shared<collectives_only_backend>(config, false);
  });
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x = at::randn({kDataset, 6}, gen), y = at::randn({kDataset, 2}, gen);
  const int port = free_port();
  std::vector<std::unique_ptr<trainer>> trainers;
  for (int i = 0; i < 2; ++i) trainers.push_back(std::make_unique<trainer>(i));
  const auto t0 = std::chrono::steady_clock::now();
  run_threads(trainers, [&](int i) {
    auto o = healthy_options("collectives_only_silent");
    o.fault_timeout_s = 2.0;
    o.store_timeout_s = 5.0;
    o.start_size = 1;
    o.resize_schedule = {{2, 2}};
    trainer& t = *trainers[static_cast<std::size_t>(i)];
    t.ctl = std::make_unique<controller>(o, launch(port, i, 2, "no-p2p-grow", i == 0), t.state, t.sampler);
    train(t, x, y, 2);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took < 60.0);
  CHECK(trainers[0]->commits >= 1);  // the world of one trained up to the grow
  for (const auto& t : trainers) {
    CAPTURE(t->error);
    CHECK(contains(t->error, "no point-to-point"));
    CHECK(contains(t->error, "backend::make_transfer"));
  }
  for (int i = 1; i >= 0; --i) trainers[static_cast<std::size_t>(i)]->ctl.reset();
}

TEST_CASE("backend_outside.the_guide_shows_this_example") {
  dra_test::check_guide_shows_example("tests/cpp/test_backend_outside.cpp", "// [guide:your-own-backend]",
                                      "docs/guide/backend.md", "## Your own backend");
}
