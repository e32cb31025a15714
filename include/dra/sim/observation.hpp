#pragma once
// What the simulator tells the schedulers after each interval: every job's view (job_view: what a
// real scheduler could know) and its remaining-work estimate, from the one estimator of the core
// (signals/remaining_work.hpp), which learns from the jobs that finish. The truth (true_total_epochs)
// is for oracle_ policies and the calibration report only.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dra/signals/remaining_work.hpp"
#include "dra/sim/cluster.hpp"
#include "dra/sim/job_model.hpp"

namespace dra::sim::detail {

/// The job's true total epochs, as far as the simulator can tell now: its budget, or where its
/// early-stopping rule stops it (on the metric curve of its batches so far), or where it reaches
/// its target. Only oracle_ policies and the calibration report read it.
inline double true_total_epochs(const job_state& j) {
  const auto& app = *j.app;
  const int budget = app.max_epochs();
  if (j.done) return j.epoch;
  const double batch = j.epoch > 0 ? std::exp(j.log_batch_sum / j.epoch) : std::max(j.last_batch, j.spec.batch);
  int stop = budget;
  if (j.spec.stop_patience > 0) {
    double best = std::numeric_limits<double>::quiet_NaN();
    int since = 0;
    for (int e = 1; e <= budget; ++e) {
      const double m = app.metric(batch, e - 1);
      const bool up = app.metric_increases();
      if (std::isnan(best) ||
          (up ? m > best * (1.0 + j.spec.stop_min_delta) : m < best * (1.0 - j.spec.stop_min_delta)))
        best = m, since = 0;
      else if (++since >= j.spec.stop_patience) {
        stop = e;
        break;
      }
    }
  }
  if (!std::isnan(j.spec.target_metric)) {
    const double need = progress_to_target(j, batch);
    for (int e = 1; e <= stop; ++e)
      if (app.progress_at(e) >= need - 1e-9) {
        stop = e;
        break;
      }
  }
  return std::max(stop, j.epoch + 1);
}

/// The estimates a finished job was given at 10, 50 and 90 % of its life (life fraction, epochs
/// done, true remaining epochs, estimated median, estimated tail): the calibration record.
inline void record_calibration(job_state& j) {
  const double total = j.epoch;
  for (double f : {0.1, 0.5, 0.9})
    for (const auto& e : j.estimate_log)
      if (e[0] >= f * total - 1e-9) {
        j.estimate_checks.push_back({f, e[0], total - e[0], e[1], e[2]});
        break;
      }
}

/// Refreshes every submitted job's view and remaining-work estimate; a job that finished since the
/// last call teaches the estimator (and gets its calibration record).
inline void observe_jobs(cluster_state& state, double now) {
  auto& est = state.estimator();
  for (auto& j : state.jobs()) {
    if (j.spec.submit_s > now) continue;
    refresh_view(j);
    if (j.done) {
      if (!j.completion_recorded) {
        j.completion_recorded = true;
        est.record_completion(observation(j.view), static_cast<double>(j.epoch));
        record_calibration(j);
      }
      continue;
    }
    j.view.remaining = est.estimate(observation(j.view));
    j.estimate_log.push_back({j.view.epochs_done, j.view.remaining.median, j.view.remaining.tail});
  }
}

}  // namespace dra::sim::detail
