// Dynamic sparsification: RigL mask updates, the phase-following target, the noise-scale rank.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <random>

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
