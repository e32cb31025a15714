// Dynamic sparsification: RigL mask updates as published (drop by |w|, grow by the dense |g|, seeded
// ties), the schedules (phase, cubic ramp, cosine fraction), the noise-scale rank.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>

#include "dra/compress/sparsity.hpp"

using namespace dra::compress;
using dra::signals::training_phase;

TEST_CASE("sparsity.rigl.prunes_to_target_by_magnitude") {
  std::vector<float> w{0.1f, -5.f, 0.3f, 2.f, -0.05f, 1.f, 0.2f, 4.f, -0.4f, 3.f};
  std::vector<float> g(10, 0.f);
  std::vector<std::uint8_t> m(10, 1);
  auto u = rigl_update(m, w.data(), g.data(), 10, 0.5, 0.0);
  CHECK(u.active == 5);
  CHECK(u.dropped == 5);
  CHECK(m == std::vector<std::uint8_t>{0, 1, 0, 1, 0, 1, 0, 1, 0, 1});
}

TEST_CASE("sparsity.rigl.swaps_smallest_weights_for_largest_gradients") {
  std::vector<float> w{5.f, 4.f, 0.1f, 0.f, 0.f, 0.f};
  std::vector<float> g{0.f, 0.f, 0.f, 9.f, -8.f, 0.1f};
  std::vector<std::uint8_t> m{1, 1, 1, 0, 0, 0};
  auto u = rigl_update(m, w.data(), g.data(), 6, 0.5, 0.34);  // floor(0.34 x 3) = 1 swap
  CHECK(u.dropped == 1);
  CHECK(u.regrown == 1);
  CHECK(m == std::vector<std::uint8_t>{1, 1, 0, 1, 0, 0});
}

TEST_CASE("sparsity.rigl.denser_target_regrows_by_gradient") {
  std::vector<float> w(8, 1.f), g{0.f, 0.f, 0.f, 0.f, 1.f, 7.f, 3.f, 5.f};
  std::vector<std::uint8_t> m{1, 1, 1, 1, 0, 0, 0, 0};
  rigl_update(m, w.data(), g.data(), 8, 0.25, 0.0);
  CHECK(m == std::vector<std::uint8_t>{1, 1, 1, 1, 0, 1, 0, 1});
}

TEST_CASE("sparsity.rigl.grows_by_the_dense_gradient_not_by_index") {
  // The old bench's bug: the gradient of inactive entries had been zeroed before the mask update,
  // so "largest |g|" found only ties and grew the lowest indices. With the dense gradient RigL grows
  // where the gradient is large (entries 6 and 7 here), which growth by index (2 and 3) would not.
  std::vector<float> w{3.f, 0.5f, 0.f, 0.f, 2.f, 1.f, 0.f, 0.f};
  std::vector<float> g{0.1f, 0.1f, 0.01f, 0.02f, 0.1f, 0.1f, -4.f, 3.f};
  std::vector<std::uint8_t> m{1, 1, 0, 0, 1, 1, 0, 0};
  auto u = rigl_update(m, w.data(), g.data(), 8, 0.5, 0.5, 11);  // floor(0.5 x 4) = 2 dropped, 2 grown
  CHECK(u.dropped == 2);
  CHECK(u.regrown == 2);
  CHECK(m == std::vector<std::uint8_t>{1, 0, 0, 0, 1, 0, 1, 1});  // dropped |w| 0.5 and 1, grew 6 and 7
  // Where the candidates' gradients tie (all zero here, as when the gradient was masked before the
  // update), the growth is decided by the random tie keys, not by the index.
  std::vector<float> masked_g{0.1f, 0.f, 0.f, 0.f, 0.1f, 0.f, 0.f, 0.f};
  std::set<std::vector<std::uint8_t>> outcomes;
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    std::vector<std::uint8_t> m2{1, 1, 0, 0, 1, 1, 0, 0};
    rigl_update(m2, w.data(), masked_g.data(), 8, 0.5, 0.5, seed);
    outcomes.insert(m2);
  }
  CHECK(outcomes.size() > 2);  // not always the lowest indices
}

TEST_CASE("sparsity.rigl.a_just_dropped_entry_may_be_grown_back") {
  // RigL grows among every entry not kept after the drop: an active entry of small |w| but large
  // |g| is dropped and grown back, so it stays active (and keeps its weight).
  std::vector<float> w{0.1f, 5.f, 0.f, 0.f};
  std::vector<float> g{9.f, 0.f, 1.f, 0.5f};
  std::vector<std::uint8_t> m{1, 1, 0, 0};
  auto u = rigl_update(m, w.data(), g.data(), 4, 0.5, 0.5);
  CHECK(m == std::vector<std::uint8_t>{1, 1, 0, 0});
  CHECK(u.dropped == 0);
  CHECK(u.regrown == 0);
}

TEST_CASE("sparsity.rigl.ties_are_random_but_the_same_on_every_rank") {
  // All weights equal: which ones are pruned depends only on the tie seed.
  std::vector<float> w(1000, 1.f), g(1000, 0.f);
  std::vector<std::uint8_t> a(1000, 1), b(1000, 1), c(1000, 1);
  rigl_update(a, w.data(), g.data(), 1000, 0.5, 0.0, rigl_tie_seed(7, 100, 0));
  rigl_update(b, w.data(), g.data(), 1000, 0.5, 0.0, rigl_tie_seed(7, 100, 0));
  rigl_update(c, w.data(), g.data(), 1000, 0.5, 0.0, rigl_tie_seed(7, 200, 0));
  CHECK(a == b);
  CHECK(a != c);
  // Not the index order: about half of the first 500 entries survive.
  const auto first_half = std::count(a.begin(), a.begin() + 500, 1);
  CHECK(first_half > 200);
  CHECK(first_half < 300);
  CHECK(rigl_tie_seed(7, 100, 0) != rigl_tie_seed(7, 100, 1));
}

TEST_CASE("sparsity.schedules.cubic_ramp_and_the_config") {
  CHECK(cubic_sparsity(50, 50, 200, 0.9) == 0.0);
  CHECK(cubic_sparsity(150, 50, 200, 0.9) == doctest::Approx(0.9 * (1 - 0.125)));
  CHECK(cubic_sparsity(400, 50, 200, 0.9) == doctest::Approx(0.9));
  rigl_config c;
  c.every = 50;
  c.end_step = 300;
  CHECK(!c.update_due(0));
  CHECK(c.update_due(50));
  CHECK(!c.update_due(51));
  CHECK(!c.update_due(300));  // the topology is fixed from end_step on, as in RigL
  CHECK(c.target(0.2, 100, training_phase::steady) == doctest::Approx(0.4));  // the phase rule
  c.ramp_start = 50;
  c.ramp_steps = 200;
  CHECK(c.target(0.0, 150, training_phase::fast) == doctest::Approx(0.9 * (1 - 0.125)));  // the ramp
  c.every = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("every"), std::invalid_argument);
}

TEST_CASE("sparsity.rigl.same_inputs_same_mask_and_bad_input_named") {
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  std::vector<float> w(1000), g(1000);
  for (auto& x : w) x = d(rng);
  for (auto& x : g) x = d(rng);
  std::vector<std::uint8_t> a(1000, 1), b(1000, 1);
  rigl_update(a, w.data(), g.data(), 1000, 0.9, 0.3);
  rigl_update(b, w.data(), g.data(), 1000, 0.9, 0.3);
  CHECK(a == b);
  CHECK(std::count(a.begin(), a.end(), 1) == 100);
  CHECK_THROWS_WITH_AS(rigl_update(a, w.data(), g.data(), 999, 0.9, 0.3), doctest::Contains("mask"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(rigl_update(a, w.data(), g.data(), 1000, 1.0, 0.3), doctest::Contains("sparsity"),
                       std::invalid_argument);
}

TEST_CASE("sparsity.update_fraction.cosine_decay") {
  CHECK(rigl_update_fraction(0.3, 0, 100) == doctest::Approx(0.3));
  CHECK(rigl_update_fraction(0.3, 50, 100) == doctest::Approx(0.15));
  CHECK(rigl_update_fraction(0.3, 100, 100) == 0.0);
}

TEST_CASE("sparsity.schedule.follows_the_phase") {
  sparsity_schedule_config c;
  CHECK(next_sparsity(c, 0.0, training_phase::fast) == 0.0);
  CHECK(next_sparsity(c, 0.0, training_phase::warmup) == 0.0);
  CHECK(next_sparsity(c, 0.0, training_phase::steady) == doctest::Approx(0.2));
  CHECK(next_sparsity(c, 0.8, training_phase::plateau) == doctest::Approx(0.9));
  CHECK(next_sparsity(c, 0.9, training_phase::diverging) == doctest::Approx(0.6));
  CHECK(next_sparsity(c, 0.1, training_phase::diverging) == 0.0);
  c.max_sparsity = 1.0;
  CHECK_THROWS_AS(c.validate(), std::invalid_argument);
}

TEST_CASE("sparsity.rank.follows_the_noise_scale") {
  rank_schedule_config c{1, 8};
  CHECK(rank_for_noise_scale(c, 0.0, false, 64) == 8);
  CHECK(rank_for_noise_scale(c, 0.0, true, 64) == 8);   // all signal
  CHECK(rank_for_noise_scale(c, 64.0, true, 64) == 5);  // half signal: 1 + 3.5
  CHECK(rank_for_noise_scale(c, 1e6, true, 64) == 1);   // all noise
  CHECK(rank_for_noise_scale(c, 1e3, true, 64) < rank_for_noise_scale(c, 1e2, true, 64));
}
