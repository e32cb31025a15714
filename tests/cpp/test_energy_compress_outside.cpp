// Energy chooser, energy policy settings and RigL masks fed odd inputs by an outside reviewer:
// each case was a silent wrong result, a hang or a half-applied change before its fix.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dra/compress/codecs.hpp"
#include "dra/compress/rigl.hpp"
#include "dra/policy/energy_policies.hpp"

using namespace dra::policy;
using dra::compress::rigl_config;
using dra::compress::rigl_masks;

TEST_CASE("choose_setting skips a prediction whose max power is NaN or negative, as it skips a NaN time") {
  // zeus_cost reads max_power_w: a NaN one made the first candidate's cost NaN, which no later
  // candidate compares below, so it won whatever the others cost.
  const energy_objective obj{energy_objective_kind::zeus_cost, 0.5};
  const std::vector<knob_setting> cands{{1}, {2}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {nan, -1000.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    const auto c = choose_setting(obj, cands, {{1.0, 1.0, bad, true}, {1.0, 1.0, 1.0, true}});
    CHECK(c.index == 1);
  }
  CHECK_THROWS_WITH_AS(choose_setting(obj, {{1}}, {{1.0, 1.0, nan, true}}), doctest::Contains("no candidate"),
                       std::invalid_argument);
}

TEST_CASE("energy_policy_config refuses infinite knobs by name (an infinite max batch hung propose)") {
  energy_policy_config c;
  c.adapt_batch = true;
  c.max_per_rank_batch = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("max_per_rank_batch"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(energy_policy{c}, doctest::Contains("inf"), std::invalid_argument);
  energy_policy_config w;
  w.watts_per_device = w.max_watts_per_device = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(w.validate(), doctest::Contains("watts_per_device"), std::invalid_argument);
  energy_policy_config m;
  m.min_per_rank_batch = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH_AS(m.validate(), doctest::Contains("min_per_rank_batch"), std::invalid_argument);
}

TEST_CASE("rigl_masks::update refuses before changing any mask") {
  rigl_config cfg;
  cfg.every = 1;
  rigl_masks masks(cfg, 7);
  masks.fit({{10, 10}, {10, 10}});
  std::vector<float> w(100), g(100);
  for (int i = 0; i < 100; ++i) w[i] = static_cast<float>(i), g[i] = static_cast<float>(100 - i);
  // The second sparsified tensor lacks its weights: the first one's mask was already updated.
  CHECK_THROWS_WITH_AS(masks.update(1, 0.5, {w.data(), nullptr}, {g.data(), nullptr}), doctest::Contains("tensor 1"),
                       std::invalid_argument);
  CHECK(masks.sparse_fraction() == 0.0);
  CHECK(masks.version() == 0);
  CHECK_THROWS_WITH_AS(masks.update(1, std::nan(""), {w.data(), w.data()}, {g.data(), g.data()}),
                       doctest::Contains("target"), std::invalid_argument);
  CHECK(masks.sparse_fraction() == 0.0);
  masks.update(1, 0.5, {w.data(), w.data()}, {g.data(), g.data()});
  CHECK(masks.sparse_fraction() == doctest::Approx(0.5));
}

namespace {
struct no_world final : dra::compress::collective {
  int world_size() const override { return 2; }
  void allreduce_sum(float*, std::size_t) override { FAIL("nothing may be sent"); }
  void allgather(const void*, std::size_t, void*) override { FAIL("nothing may be sent"); }
};
}  // namespace

TEST_CASE("codecs with 32-bit indices refuse a tensor of more than 2^32 elements before touching it") {
  // top-k's (index, value) pairs and the random / RigL index lists are 32-bit: such a tensor's
  // indices wrapped, silently sending (or placing) the wrong entries. The data is never read here.
  static float one = 0.0f;
  for (const char* spec : {"topk:0.01", "random:0.1", "masked"}) {
    CAPTURE(spec);
    auto codec = dra::compress::make_codec(spec);
    std::vector<dra::compress::tensor_ref> grads(1);
    grads[0].data = &one;
    grads[0].shape = {65536, 65537};
    no_world world;
    CHECK_THROWS_WITH_AS(codec->reduce(grads, world), doctest::Contains("4294967295"), std::invalid_argument);
    CHECK(codec->steps() == 0);
  }
}

TEST_CASE("rigl_config refuses a schedule whose masks would never move (training stayed dense, silently)") {
  auto what = [](const dra::compress::rigl_config& c) {
    try {
      c.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  dra::compress::rigl_config c;  // RigL's defaults: every 100, end_step 10000
  CHECK(what(c).empty());
  c.end_step = 100;  // the first update would be step 100, not below end_step
  CHECK(what(c) ==
        "end_step: the masks would never move: they update at multiples of every (100) below end_step (100); the "
        "first would be step 100; give end_step > 100 (RigL: about 75 % of training)");
  c.end_step = 0;
  CHECK(what(c).rfind("end_step: the masks would never move", 0) == 0);
  c.end_step = 101;
  CHECK(what(c).empty());
  c.ramp_steps = 50;  // a ramp that starts after the last update
  c.ramp_start = 100;
  c.end_step = 150;
  CHECK(what(c).find("after ramp_start (100); the first would be step 200; give end_step > 200") != std::string::npos);
  c.end_step = 201;
  CHECK(what(c).empty());
  c.ramp_start = std::numeric_limits<std::int64_t>::max() - 1;  // no overflow on the way
  CHECK(what(c).find("the first would be step past 2^63") != std::string::npos);
}
