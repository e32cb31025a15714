// What an outside program that embeds dra::core ran into, fed odd inputs through the public API
// (a consumer project built with -Wall -Wextra -Werror -pedantic, ASan and UBSan, GCC and Clang,
// C++17 and C++20). Each case was a crash, a hang, undefined behaviour or a silent wrong result.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "dra/compress/codecs.hpp"
#include "dra/engine.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/pool/scheduler.hpp"
#include "dra/signals/remaining_work.hpp"

namespace {

constexpr double nan_d = std::numeric_limits<double>::quiet_NaN();
constexpr double inf_d = std::numeric_limits<double>::infinity();

// A world of `w` ranks holding the same values: a sum is w times the value, a gather w copies.
struct replicated final : dra::compress::collective {
  int w;
  explicit replicated(int n) : w(n) {}
  int world_size() const override { return w; }
  void allreduce_sum(float* d, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) d[i] *= static_cast<float>(w);
  }
  void allgather(const void* in, std::size_t bytes, void* out) override {
    for (int r = 0; r < w; ++r) std::memcpy(static_cast<char*>(out) + static_cast<std::size_t>(r) * bytes, in, bytes);
  }
};

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i % 17) - 8.0f) / 8.0f;
  return v;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

const char* const all_specs[] = {"fp32", "fp16", "bf16", "powersgd:2", "topk:0.25", "random:0.5", "masked"};

}  // namespace

TEST_CASE("outside.codec.make_codec_refuses_malformed_specs") {
  // Each was accepted: the argument ignored (fp32:1, bf16:), truncated (powersgd:2.5), cast out of
  // range (powersgd:1e10 is undefined behaviour; it reported "got -2147483648"), defaulted
  // (topk:) or a codec no spec can configure (random:0 wants set_masks).
  const std::pair<const char*, const char*> cases[] = {
      {"fp32:1", "fp32 takes no argument"},  {"fp16:x", "fp16 takes no argument"},
      {"bf16:", "bf16 takes no argument"},   {"powersgd:2.5", "whole number"},
      {"powersgd:1e10", "whole number"},     {"powersgd:nan", "not a finite number"},
      {"powersgd:", "no number after ':'"},  {"topk:", "no number after ':'"},
      {"topk:inf", "not a finite number"},   {"random:0", "keep fraction must lie in (0, 1]"},
      {"masked:nan", "not a finite number"},
  };
  for (const auto& [spec, said] : cases) {
    CAPTURE(spec);
    const std::string what = message_of([&] { (void)dra::compress::make_codec(spec); });
    CHECK(what.rfind(std::string("codec: '") + spec + "'", 0) == 0);
    CHECK(what.find(said) != std::string::npos);
  }
  CHECK(dra::compress::make_codec("powersgd")->name() == "powersgd");
  CHECK(dra::compress::make_codec("powersgd:8")->name() == "powersgd");
  CHECK(dra::compress::make_codec("masked:0.8")->name() == "masked");
}

TEST_CASE("outside.codec.zero_sized_tensors_do_not_crash") {
  // powersgd divided by a zero leading dimension (SIGFPE); topk and random read past an empty
  // index vector (k was at least 1 for a tensor of 0 elements).
  for (const char* spec : all_specs) {
    CAPTURE(spec);
    auto c = dra::compress::make_codec(spec);
    replicated world(2);
    auto g = ramp(16), want = g;
    std::vector<dra::compress::tensor_ref> t{{g.data(), {0}, nullptr},
                                             {g.data(), {0, 5}, nullptr},
                                             {g.data(), {5, 0}, nullptr},
                                             {g.data(), {4, 4}, nullptr}};
    for (int step = 0; step < 3; ++step) {
      g = want;
      c->reduce(t, world);
      for (float v : g) CHECK(std::isfinite(v));
    }
  }
}

TEST_CASE("outside.codec.bad_tensor_refs_are_named") {
  auto c = dra::compress::make_codec("fp32");
  replicated world(2);
  std::vector<float> g(4);
  std::vector<dra::compress::tensor_ref> negative{{g.data(), {-1, 4}, nullptr}};
  CHECK(message_of([&] { c->reduce(negative, world); }).find("negative dimension (-1)") != std::string::npos);
  std::vector<dra::compress::tensor_ref> no_data{{nullptr, {4}, nullptr}};
  CHECK(message_of([&] { c->reduce(no_data, world); }).find("has 4 elements and no data") != std::string::npos);
}

TEST_CASE("outside.codec.a_non_finite_step_does_not_poison_later_steps") {
  // A NaN or inf gradient went into the error-feedback residual (fp16, bf16, topk, random,
  // masked) or PowerSGD's warm start, and every later step of that entry (of the whole matrix for
  // PowerSGD) came out non-finite for good.
  for (const char* spec : all_specs) {
    CAPTURE(spec);
    auto c = dra::compress::make_codec(spec);
    replicated world(2);
    auto g = ramp(64);
    g[5] = std::numeric_limits<float>::quiet_NaN();
    g[9] = std::numeric_limits<float>::infinity();
    std::vector<dra::compress::tensor_ref> t{{g.data(), {8, 8}, nullptr}};
    c->reduce(t, world);  // this step may come out non-finite, as fp32's would: the trainer skips it
    for (int step = 1; step <= 3; ++step) {
      g = ramp(64);
      t[0].data = g.data();
      c->reduce(t, world);
      for (float v : g) CHECK(std::isfinite(v));
    }
    CHECK(std::isfinite(c->error_feedback_norm1()));
  }
  // An fp16 overflow (a finite gradient above 65504) left -inf in the residual.
  auto half = dra::compress::make_codec("fp16");
  replicated one(1);
  std::vector<float> big{1e5f, 1.0f};
  std::vector<dra::compress::tensor_ref> t{{big.data(), {2}, nullptr}};
  half->reduce(t, one);
  big = {1.0f, 1.0f};
  half->reduce(t, one);
  CHECK(big[0] == 1.0f);
}

TEST_CASE("outside.codec.corrupt_state_lengths_are_refused_as_invalid") {
  // A huge length field became std::length_error (or a huge allocation), not the documented
  // std::invalid_argument.
  for (const char* spec : all_specs) {
    CAPTURE(spec);
    auto c = dra::compress::make_codec(spec);
    replicated world(2);
    auto g = ramp(64);
    std::vector<dra::compress::tensor_ref> t{{g.data(), {8, 8}, nullptr}};
    c->reduce(t, world);
    const auto bytes = c->save_state();
    const std::size_t count_at = 4 + 9 + 4 + 4 + c->name().size() + 8;  // tag, version, name, steps
    for (std::uint8_t fill : {std::uint8_t{0xff}, std::uint8_t{0x40}}) {
      auto bad = bytes;
      for (std::size_t i = 0; i < 8; ++i) bad[count_at + i] = fill;
      auto d = dra::compress::make_codec(spec);
      CHECK(message_of([&] { d->load_state(bad); }).rfind("state: codec state truncated", 0) == 0);
      CHECK(d->save_state() == dra::compress::make_codec(spec)->save_state());  // unchanged
    }
  }
}

TEST_CASE("outside.engine.out_of_range_settings_are_refused") {
  auto refused = [](void (*set)(dra::engine_config&)) {
    dra::engine_config c;
    set(c);
    return message_of([&] { dra::resize_engine e(c); });
  };
  CHECK(refused([](dra::engine_config& c) { c.costs.horizon_steps = inf_d; }).rfind("horizon_steps: ", 0) == 0);
  CHECK(refused([](dra::engine_config& c) { c.costs.resize_cost_s = inf_d; }).rfind("resize_cost_s: ", 0) == 0);
  CHECK(refused([](dra::engine_config& c) { c.throughput.gamma = inf_d; }).rfind("gamma: ", 0) == 0);
  CHECK(refused([](dra::engine_config& c) {
          c.throughput.prior_sync_fixed_s = inf_d;
        }).rfind("prior_sync_fixed_s: ", 0) == 0);
  CHECK(refused([](dra::engine_config& c) { c.throughput.prior_weight = inf_d; }).rfind("prior_weight: ", 0) == 0);
  CHECK(refused([](dra::engine_config& c) { c.remaining_work.prior_count = inf_d; }).rfind("prior_count: ", 0) == 0);
}

TEST_CASE("outside.engine.an_empty_world_is_named") {
  // A world of size 0 with capacity to grow threw "leave: every member would leave" from step().
  dra::engine_config c;
  c.limits.max_size = 4;
  dra::resize_engine engine(c);
  engine.world().size = 0;
  engine.capacity().available = 2;
  const std::string what = message_of([&] {
    for (int s = 0; s < 20; ++s) engine.step(s, 1.0);
  });
  CHECK(what.rfind("world.size: must be >= 1", 0) == 0);
  CHECK(what.find("got 0") != std::string::npos);
}

TEST_CASE("outside.remaining_work.estimates_stay_finite") {
  // done NaN or inf gave NaN estimates; a done or declaration near the largest double gave inf.
  dra::signals::remaining_work_estimator est;
  for (double done : {nan_d, inf_d, -inf_d, -5.0, 0.0, 1e300, 1.7e308}) {
    for (double declared : {nan_d, inf_d, -1.0, 0.0, 100.0, 1e308}) {
      CAPTURE(done);
      CAPTURE(declared);
      dra::signals::work_observation o;
      o.done = done;
      o.declared = declared;
      const auto e = est.estimate(o);
      for (double v : {e.median, e.mean, e.tail}) {
        CHECK(std::isfinite(v));
        CHECK(v >= 0.0);
      }
      CHECK(std::isfinite(dra::signals::gittins_size(e, done)));
    }
  }
}

TEST_CASE("outside.arbiter.nan_sizes_and_mismatched_allocations") {
  // completion_weights never returned on a NaN size (the grouping of equal sizes never advanced):
  // the device pool's scaler passes each job's remaining size through it.
  const auto w = dra::policy::completion_weights({1.0, nan_d, 3.0, nan_d, 2.0}, 2.0);
  REQUIRE(w.size() == 5);
  for (double v : w) CHECK((std::isfinite(v) && v > 0.0));
  CHECK(w[1] == w[3]);  // unknown sizes count as the largest: the smallest weight
  CHECK(w[1] < w[2]);
  CHECK(w[2] < w[4]);
  CHECK(w[4] < w[0]);
  dra::policy::cluster_arbiter arbiter;
  dra::policy::arbiter_job j;
  j.speedup = {0.0, 1.0};
  CHECK(message_of([&] { (void)arbiter.objective({j, j}, {1}); }).rfind("alloc: needs one allocation per job (2)", 0) ==
        0);
  dra::policy::arbiter_config config;
  config.epsilon = inf_d;
  CHECK(message_of([&] { dra::policy::cluster_arbiter a(config); }).rfind("epsilon: ", 0) == 0);
}

TEST_CASE("outside.scheduler.odd_requests") {
  dra::pool::inventory inv;
  for (int i = 0; i < 4; ++i) {
    dra::pool::device d;
    d.id = "gpu" + std::to_string(i);
    d.type = "gpu";
    inv.add(d);
  }
  dra::pool::scheduler scheduler;
  dra::pool::lease_book book;
  // A tiny fraction: request::validate cast 4e12 slots to int (undefined; it refused the request,
  // "room for -2147483648 such workers") and placement summed rooms in int. With a huge max_size
  // as well (1e-9 and 2^31 - 1), admit ran for minutes. validate now holds the pool's job-spec
  // limits (fraction >= 0.01, max_size <= 1,000,000); the scheduler holds max_size, and still
  // schedules a finer fraction (a pool's stored jobs from before the floor).
  dra::pool::job_entry tiny;
  tiny.req.job = "tiny";
  tiny.req.fraction = 1e-12;
  tiny.req.max_size = 3;
  CHECK(message_of([&] { tiny.req.validate(inv); }).rfind("fraction: must lie in [0.01, 1], got 1e-12", 0) == 0);
  CHECK(scheduler.admit(inv, {tiny}, book, 0.0).grants.size() == 3);
  tiny.req.fraction = dra::pool::min_fraction;
  tiny.req.validate(inv);
  CHECK(scheduler.admit(inv, {tiny}, book, 0.0).grants.size() == 3);
  tiny.req.max_size = 2147483647;
  CHECK(message_of([&] { tiny.req.validate(inv); }) ==
        "max_size: must be <= 1000000, got 2147483647; ask for at most the workers the job can use");
  CHECK(message_of([&] { (void)scheduler.admit(inv, {tiny}, book, 0.0); }).rfind("jobs.min_size: job 'tiny'", 0) == 0);
  // An unvalidated request with fraction 0 divided by zero and cast inf to int.
  dra::pool::job_entry zero;
  zero.req.job = "zero";
  zero.req.fraction = 0.0;
  CHECK(message_of([&] { (void)scheduler.admit(inv, {zero}, book, 0.0); }).rfind("jobs.fraction: job 'zero'", 0) == 0);
  // The same job listed twice: entries are found by name, so which one counted was arbitrary.
  dra::pool::job_entry a, b;
  a.req.job = b.req.job = "same";
  b.order = 1;
  CHECK(message_of([&] { (void)scheduler.admit(inv, {a, b}, book, 0.0); }) ==
        "jobs: job 'same' is listed twice; list each job once");
  CHECK(message_of([&] { (void)scheduler.resize(inv, {a, b}, {{"same", 2}}, book, 0.0); }) ==
        "jobs: job 'same' is listed twice; list each job once");
}
