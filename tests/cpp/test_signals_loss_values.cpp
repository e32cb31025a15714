// Divergence of losses that are <= 0 or cross zero (include/dra/signals/convergence_estimator.hpp):
// a negative log-likelihood that blows up is reported, curves that go negative and keep improving,
// noisy ones and positive ones are not.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dra/signals/convergence_estimator.hpp"

using dra::signals::convergence_estimator;
using dra::signals::estimator_config;
using dra::signals::training_phase;

namespace {

estimator_config small_window() {
  estimator_config c;
  c.window = 16;
  c.warmup_steps = 16;
  return c;
}

// Feeds `losses` from step 0; returns the first step reported diverging, or -1.
std::int64_t first_diverging(convergence_estimator& est, const std::vector<double>& losses, std::int64_t from = 0) {
  std::int64_t first = -1;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const auto t = from + static_cast<std::int64_t>(i);
    est.update_loss(t, losses[i]);
    if (first < 0 && est.signals().diverging) first = t;
  }
  return first;
}

}  // namespace

TEST_CASE("signals.loss_values.negative_loss_that_blows_up_diverges") {
  // A Gaussian NLL falling from 1 to -2, then its loss growing 30 % per step (to about +1e3):
  // before, the test needed a best smoothed loss > 0 and never fired.
  std::vector<double> losses;
  for (int i = 0; i < 200; ++i) losses.push_back(1.0 - 3.0 * (1.0 - std::exp(-i / 40.0)));
  convergence_estimator est(small_window());
  REQUIRE(first_diverging(est, losses) < 0);
  const double best = est.signals().best_smoothed_loss;
  REQUIRE(best < -1.5);
  std::vector<double> blowup;
  for (int i = 0; i < 40; ++i) blowup.push_back(best + 0.01 * std::pow(1.3, i));
  const auto at = first_diverging(est, blowup, 200);
  CHECK(at >= 200);
  CHECK(est.signals().diverging);
  CHECK(est.signals().phase == training_phase::diverging);
}

TEST_CASE("signals.loss_values.never_positive_loss_that_blows_up_diverges") {
  // Negative from the first step (-1 to -2), then rising linearly past zero.
  std::vector<double> losses;
  for (int i = 0; i < 100; ++i) losses.push_back(-1.0 - 0.01 * i);
  for (int i = 0; i < 100; ++i) losses.push_back(-2.0 + 0.1 * i);
  convergence_estimator est(small_window());
  const auto at = first_diverging(est, losses);
  REQUIRE(at >= 100);
  CHECK(est.signals().smoothed_loss > 0.0);  // twice as far from zero on the wrong side: about 0
  CHECK(at < 140);
}

TEST_CASE("signals.loss_values.one_wild_value_on_a_negative_loss_is_clipped") {
  // One 1e300 on a negative loss entered the smoothed loss unclipped (the outlier bound needed a
  // positive smoothed loss); with divergence now judged below zero it would raise diverging.
  std::vector<double> losses;
  for (int i = 0; i < 100; ++i) losses.push_back(-1.0 - 0.01 * i);
  convergence_estimator est(small_window());
  REQUIRE(first_diverging(est, losses) < 0);
  est.update_loss(100, 1e300);
  CHECK(est.signals().outlier_count == 1);
  std::vector<double> after;
  for (int i = 101; i < 200; ++i) after.push_back(-1.0 - 0.01 * i);
  const auto at = first_diverging(est, after, 101);
  CHECK(at < 0);
  CHECK_FALSE(est.signals().diverging);
}

TEST_CASE("signals.loss_values.no_false_alarms_and_the_ratio_test_on_positive_losses") {
  // Noisy curves that cross zero were reported diverging near the crossing before (their best
  // smoothed loss just above zero doubled by chance): 2 of these 20 seeds.
  std::mt19937_64 rng(7);
  std::normal_distribution<double> unit(0.0, 1.0);
  auto run = [](const std::vector<double>& losses) {
    convergence_estimator est(small_window());
    return first_diverging(est, losses);
  };
  for (int seed = 0; seed < 20; ++seed) {
    std::vector<double> crossing, crossing_noisy, negative_noisy, zero_noise, positive_noisy;
    for (int i = 0; i < 2000; ++i) {
      const double curve = 2.0 / (1.0 + 0.025 * i) - 1.0;  // crosses zero at 40, falls on to -1
      crossing.push_back(curve);
      crossing_noisy.push_back(curve + 0.2 * unit(rng));
      negative_noisy.push_back(-1.0 - 0.5 * (1.0 - std::exp(-i / 200.0)) + 0.5 * unit(rng));
      zero_noise.push_back(unit(rng));  // a loss that hovers around zero and never improves
      positive_noisy.push_back((1.0 + 5.0 / (1.0 + 0.01 * i)) * std::exp(0.1 * unit(rng)));
    }
    CHECK(run(crossing) < 0);
    CHECK(run(crossing_noisy) < 0);
    CHECK(run(negative_noisy) < 0);
    CHECK(run(zero_noise) < 0);
    CHECK(run(positive_noisy) < 0);
  }
  // Smooth positive losses keep the ratio test: diverging exactly when smoothed > factor x best.
  convergence_estimator est(small_window());
  std::int64_t t = 0;
  for (; t < 100; ++t) est.update_loss(t, 1.0 / (1.0 + 0.05 * static_cast<double>(t)));
  REQUIRE_FALSE(est.signals().diverging);
  for (; t < 200; ++t) {
    est.update_loss(t, 1.0);
    const auto& s = est.signals();
    CHECK(s.diverging == (s.smoothed_loss > est.config().divergence_factor * s.best_smoothed_loss));
  }
  CHECK(est.signals().diverging);
}
