#pragma once
// The cluster simulator's loop: jobs arrive, the policy decides every interval, jobs advance
// analytically in between (training.hpp). The model and its parts: docs/design/simulator.md;
// every deviation from Pollux's reference simulator: docs/guide/simulator.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dra/sim/arbitration.hpp"
#include "dra/sim/cluster.hpp"
#include "dra/sim/config.hpp"
#include "dra/sim/job_model.hpp"
#include "dra/sim/profile.hpp"
#include "dra/sim/result.hpp"
#include "dra/sim/scheduling.hpp"
#include "dra/sim/training.hpp"
#include "dra/sim/workload.hpp"

namespace dra::sim {

class simulator {
 public:
  simulator(const profile_library& profiles, std::vector<job_spec> jobs, sim_config config)
      : profiles_(&profiles), state_(profiles, std::move(jobs), std::move(config)) {}

  const sim_config& config() const noexcept { return state_.config(); }
  int capacity() const noexcept { return state_.capacity(); }

  /// Runs to completion (or max_time_s after the first arrival). `progress(now, done, total)` is called once per tick
  /// when given; returning false stops the run early.
  sim_result run(const std::function<bool(double, std::size_t, std::size_t)>& progress = nullptr) {
    const auto wall_start = std::chrono::steady_clock::now();
    const sim_config& config = state_.config();
    const int capacity = state_.capacity();
    std::vector<detail::job_state>& jobs = state_.jobs();
    sim_result out;
    out.policy = config.policy;
    out.capacity = capacity;
    out.reallocation_cost_s = config.reallocation_cost_s;
    double now = 0.0;
    std::size_t done = 0;
    double last_compute = 0.0, last_busy = 0.0;
    double first = jobs.empty() ? 0.0 : jobs.front().spec.submit_s;
    for (const auto& j : jobs) first = std::min(first, j.spec.submit_s);
    const double horizon = first + config.max_time_s;
    while (done < jobs.size() && now < horizon) {
      now = skip_idle(now, horizon);
      // Advance every job by one interval, then decide at the new time (as the reference does).
      if (!(now + config.interval_s > now))  // a time so large that the interval is below its precision
        dra::detail::throw_invalid(
            "interval_s", std::to_string(config.interval_s) +
                              " s is below the precision of the "
                              "simulated time " +
                              std::to_string(now) + " s; give times from a nearer origin (subtract the first arrival)");
      for (auto& j : jobs) detail::advance(j, now, config.interval_s, config);
      now += config.interval_s;
      done = 0;
      for (auto& j : jobs)
        if (j.done) {
          ++done;
          if (j.devices > 0) state_.release(j);
        }
      schedule(now);
      state_.check_conservation();
      if (config.record_timeline) {
        timeline_point p;
        p.time_s = now;
        double compute = 0.0, busy = 0.0;
        for (const auto& j : jobs) {
          compute += j.compute_s;
          busy += j.busy_s;
          if (j.devices > 0)
            ++p.running, p.allocated += j.devices;
          else if (!j.done && j.spec.submit_s <= now)
            ++p.waiting;
        }
        p.compute_fraction = (compute - last_compute) / (config.interval_s * capacity);
        p.busy_fraction = (busy - last_busy) / (config.interval_s * capacity);
        last_compute = compute;
        last_busy = busy;
        out.timeline.push_back(p);
      }
      if (progress && !progress(now, done, jobs.size())) break;
    }
    out.first_submit_s = first;
    out.end_s = now;
    for (const auto& j : jobs) {
      job_result r;
      r.name = j.spec.name;
      r.application = j.spec.application;
      r.submit_s = j.spec.submit_s;
      r.start_s = j.start_s;
      r.completion_s = j.done ? j.completion_s : std::numeric_limits<double>::quiet_NaN();
      r.jct_s = j.done ? j.completion_s - j.spec.submit_s : std::numeric_limits<double>::quiet_NaN();
      r.gpu_seconds = j.gpu_s;
      r.compute_gpu_seconds = j.compute_s;
      r.busy_gpu_seconds = j.busy_s;
      r.progress = j.progress;
      r.epochs = j.epoch;
      r.requested_replicas = j.spec.replicas;
      r.requested_batch = j.spec.batch;
      r.final_batch = j.last_batch;
      r.final_metric = j.epoch > 0 ? j.best_metric : std::numeric_limits<double>::quiet_NaN();
      r.reached_target = j.reached_target;
      r.reallocations = std::max(0, j.restarts);
      r.max_devices = j.max_held;
      r.device_time_weighted_devices = j.held_s > 0.0 ? j.gpu_s / j.held_s : 0.0;
      r.declared_epochs = j.spec.declared_epochs;
      r.stopped_early = j.stopped_early;
      r.estimate_checks = j.estimate_checks;
      if (j.done)
        out.makespan_s = std::max(out.makespan_s, j.completion_s);
      else
        out.all_completed = false;
      out.jobs.push_back(std::move(r));
    }
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    return out;
  }

  /// The time to go on from: `now`, or a later tick when no job has arrived unfinished (none runs,
  /// none waits), since every tick before the next arrival then changes nothing. The jump keeps the
  /// ticks on the grid (multiples of the interval from 0) and leaves the last idle tick to run (its
  /// timeline point shows the idle cluster), so a workload whose times start far from 0 (Unix
  /// timestamps) or that is idle for days costs what the same workload at 0 costs, with the same
  /// results when shifted by a multiple of the interval.
  double skip_idle(double now, double horizon) const {
    double next = horizon;
    for (const auto& j : state_.jobs()) {
      if (j.done) continue;
      if (j.spec.submit_s <= now) return now;
      next = std::min(next, j.spec.submit_s);
    }
    // The first tick that sees the arrival is now + ticks x interval.
    const double ticks = std::ceil((next - now) / state_.config().interval_s);
    return ticks >= 3.0 ? now + (ticks - 2.0) * state_.config().interval_s : now;
  }

 private:
  void schedule(double now) {
    const policy::sim_scheduler s = state_.entry().simulator;
    if (s == policy::sim_scheduler::first_come)
      detail::schedule_static(state_, now);
    else if (s == policy::sim_scheduler::tiresias)
      detail::schedule_tiresias(state_, now);
    else if (state_.cluster())
      detail::schedule_cluster(state_, now);
    else
      detail::schedule_per_job(state_, now);
  }

  const profile_library* profiles_;
  detail::cluster_state state_;
};

/// Convenience: simulate a workload under one policy.
inline sim_result simulate(const profile_library& profiles, const std::vector<job_spec>& jobs, const sim_config& config,
                           const std::function<bool(double, std::size_t, std::size_t)>& progress = nullptr) {
  simulator s(profiles, jobs, config);
  return s.run(progress);
}

}  // namespace dra::sim
