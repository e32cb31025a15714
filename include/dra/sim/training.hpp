#pragma once
// How a simulated job trains between two decisions: epoch by epoch, at the step time its profile
// measured for its placement and batch, with AdaScale's gain per step; the exact time it crosses
// each epoch boundary (and completes) is computed, not sampled.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dra/sim/config.hpp"
#include "dra/sim/job_model.hpp"
#include "dra/sim/profile.hpp"

namespace dra::sim::detail {

/// The step time the job's profile measured at a placement and batch split (job's perturbation).
inline step_times measured(const job_state& j, const std::vector<int>& placement, double atomic, int accum) {
  step_times t = j.app->accumulated(placement, atomic, accum);
  t.step_s *= j.spec.throughput_scale;
  t.sync_s *= j.spec.throughput_scale;
  return t;
}

inline void account(job_state& j, double dt, double compute_fraction, bool stepping) {
  j.gpu_s += dt * j.devices;
  j.attained += dt * j.devices;
  j.compute_s += dt * j.devices * compute_fraction;
  if (stepping) j.busy_s += dt * j.devices;
  j.held_s += dt;
}

/// Advances one job from `now` by `seconds`. While it trains, the job measures its step time at
/// its configuration (the reference's update_params): a new configuration refits its model.
inline void advance(job_state& j, double now, double seconds, const sim_config& config) {
  if (j.done || j.devices == 0) return;
  const double delay = std::min(j.rescale_left, seconds);
  account(j, delay, 0.0, false);
  j.rescale_left -= delay;
  seconds -= delay;
  double t = now + delay;
  while (seconds > 0.0 && !j.done) {
    const double batch = j.devices * j.atomic * (j.accum + 1);
    j.last_batch = batch;
    if (!j.step_cached) {
      j.step_cache = measured(j, compact(j.alloc), j.atomic, j.accum), j.step_cached = true;
      const step_times one = measured(j, compact(j.alloc), j.atomic, 0);
      j.model->observe(static_cast<int>(compact(j.alloc).size()), j.devices, j.atomic, one.step_s, one.sync_s);
    }
    const step_times st = j.step_cache;
    const double total = st.step_s;  // includes accumulation passes
    const double compute_fraction = total > 0.0 ? (total - st.sync_s) / total : 0.0;
    const auto [sqr, var] = stats(j, batch, j.epoch);
    const double gain = detail::adascale_gain_from_stats(sqr, var, batch / j.app->init_batch());
    const double rate = gain / total;  // progress per second
    const double next = j.app->progress_at(j.epoch + 1);
    if (j.progress + rate * seconds < next) {
      j.progress += rate * seconds;
      j.steps += seconds / total;
      account(j, seconds, compute_fraction, true);
      seconds = 0.0;
      break;
    }
    const double dt = std::max(0.0, (next - j.progress) / rate);
    account(j, dt, compute_fraction, true);
    j.steps += dt / total;
    j.progress = next;
    t += dt;
    seconds -= dt;
    if (end_epoch(j, batch, next - j.app->progress_at(j.epoch))) {
      j.done = true;
      j.completion_s = t;
      break;
    }
    if (j.fixed_batch <= 0.0) choose_batch(j, config);  // re-optimise between epochs, as the reference does
  }
  // The reference also re-optimises the batch at the end of every interval, with the model as
  // refitted from what the job measured in it.
  if (!j.done && j.fixed_batch <= 0.0) choose_batch(j, config);
}

}  // namespace dra::sim::detail
