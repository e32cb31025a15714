#pragma once
// The scheduling rules that do not arbitrate over goodput curves: first come first served
// (static), Tiresias's two-queue least-attained-service, and each job's own constrained policy
// (the live-job code) against the devices it could get.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/policy/constraints.hpp"
#include "dra/sim/cluster.hpp"
#include "dra/sim/cluster_policy.hpp"
#include "dra/sim/job_model.hpp"
#include "dra/sim/observation.hpp"

namespace dra::sim::detail {

// First come, first served with backfilling: a job starts with exactly what it requested as soon
// as that many devices are free; a job that does not fit does not block smaller ones behind it.
inline void schedule_static(cluster_state& state, double now) {
  for (job_state* j : state.active(now))
    if (j->devices == 0 && j->spec.replicas <= state.free_devices()) state.reallocate(*j, j->spec.replicas, now);
}

// Tiresias-style two-queue least-attained-service, preemptive, no resizing (as the reference's
// baseline): a job is demoted after `threshold` GPU-seconds of service; queue 0 before queue 1,
// arrival (or demotion) order within a queue; jobs that do not fit are preempted. Placement: the
// node with the most free devices first, as the reference.
inline void schedule_tiresias(cluster_state& state, double now) {
  std::vector<job_state*> act = state.active(now);
  for (job_state* j : act) {
    if (j->devices > 0) j->executed_s += state.config().interval_s;
    if (j->queue == 0 && j->executed_s * j->spec.replicas >= state.config().tiresias_threshold_gpu_s)
      j->queue = 1, j->demoted_at = now;
  }
  std::stable_sort(act.begin(), act.end(), [](const job_state* a, const job_state* b) {
    if (a->queue != b->queue) return a->queue < b->queue;
    if (a->queue == 1 && a->demoted_at != b->demoted_at) return a->demoted_at < b->demoted_at;
    return a->spec.submit_s < b->spec.submit_s;
  });
  int budget = state.capacity();
  std::vector<job_state*> run;
  for (job_state* j : act) {
    if (j->spec.replicas <= budget) {
      budget -= j->spec.replicas;
      run.push_back(j);
    } else if (j->devices > 0) {
      state.reallocate(*j, 0, now);  // preempted
    }
  }
  for (job_state* j : run)
    if (j->devices == 0) state.reallocate(*j, j->spec.replicas, now);
}

/// Device price the cluster quotes to per-job policies: 0 while nothing waits, rising to 1 as the
/// devices waiting jobs ask for approach the whole cluster.
inline double contention_price(const cluster_state& state, int waiting_demand) {
  return std::clamp(static_cast<double>(waiting_demand) / static_cast<double>(state.capacity()), 0.0, 1.0);
}

// Each job runs its own constrained policy (the live-job code) against the devices it could get
// now: its own plus the spare ones, up to its fair share. Waiting jobs are admitted first, in
// arrival order, with what they requested when it is free (as static, with backfilling); then
// running jobs decide in arrival order. Size and batch decisions are both applied.
/// A per-job policy's decision for `j` at `now`, with an exception from it naming the job and the
/// simulated time before the policy's own message (std::invalid_argument stays one, anything else
/// becomes std::runtime_error), as a cluster policy's does.
template <class Decide>
policy::decision decide_named(const job_state& j, double now, Decide&& decide) {
  const auto named = [&](const char* what) {
    return "job '" + j.spec.name + "' at t = " + std::to_string(static_cast<long long>(now)) + " s: " + what;
  };
  try {
    return decide();
  } catch (const cluster_policy_interrupted&) {
    throw;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(named(e.what()));
  } catch (const std::exception& e) {
    throw std::runtime_error(named(e.what()));
  } catch (...) {
    throw std::runtime_error(named("its policy threw something that is not a std::exception; throw one"));
  }
}

inline void schedule_per_job(cluster_state& state, double now) {
  std::vector<job_state*> act = state.active(now);
  for (job_state* j : act) {
    if (j->devices > 0) continue;
    const int k = std::min(j->spec.replicas, j->max_devices);
    if (k <= state.free_devices()) state.reallocate(*j, k, now);
  }
  int waiting_demand = 0;
  for (job_state* j : act)
    if (j->devices == 0) waiting_demand += std::min(j->spec.replicas, j->max_devices);
  observe_jobs(state, now);
  const bool oracle = state.config().policy.rfind("oracle_", 0) == 0;
  for (job_state* j : act) {
    if (j->devices == 0 || j->rescale_left > 0.0) continue;
    signals::convergence_signals sig = j->est->signals();
    const double batch = j->last_batch > 0.0 ? j->last_batch : j->fixed_batch;
    // The job's own estimate of its gradient statistics (its view), not the trace's truth.
    const double sqr = j->view.grad.sqr, var = j->view.grad.var;
    sig.grad_sqr = sqr;
    sig.grad_var = var;
    sig.gns_valid = sqr > 0.0 && var >= 0.0;
    sig.gns = sig.gns_valid ? var / sqr * j->app->init_batch() : 0.0;
    policy::world_state world;
    world.size = j->devices;
    world.step = static_cast<std::int64_t>(j->steps);
    world.steps_since_resize = static_cast<std::int64_t>(j->steps - j->steps_at_resize);
    world.global_batch = batch;
    world.base_batch = j->app->init_batch();
    const double step_s = j->predictor->step_time_s(j->devices, batch / j->devices);
    const double gain = detail::adascale_gain_from_stats(sqr, var, batch / j->app->init_batch());
    // Steps left from the remaining-work estimate (its median; oracle_: the truth).
    const double epochs_left =
        oracle ? std::max(true_total_epochs(*j) - j->view.epochs_done, 0.0) : j->view.remaining.median;
    const double remaining_progress = epochs_left * j->view.work_per_epoch;
    world.remaining_steps = static_cast<std::int64_t>(std::max(0.0, remaining_progress / std::max(gain, 1e-12)));
    // The pool lends spare devices (none while jobs wait) up to the job's fair share of the
    // cluster, so one job's policy cannot starve the jobs arriving after it.
    const int fair =
        std::max(j->spec.replicas,
                 static_cast<int>(std::ceil(static_cast<double>(state.capacity()) / static_cast<double>(act.size()))));
    const int spare = std::max(0, state.free_devices() - waiting_demand);
    policy::capacity cap;
    cap.available = std::max(j->devices, std::min(j->devices + spare, fair));
    cap.device_price = contention_price(state, waiting_demand);
    policy::cost_model costs{state.config().reallocation_cost_s,
                             std::max(1.0, state.config().horizon_s / std::max(step_s > 0.0 ? step_s : 1.0, 1e-9))};
    const policy::decision d =
        decide_named(*j, now, [&] { return j->policy->decide(sig, world, cap, costs, *j->predictor); });
    if (d.kind != policy::action::hold && d.target_size != j->devices) {
      const double new_batch = batch * d.batch_scale;
      state.reallocate(*j, d.target_size, now);
      if (j->devices > 0 && d.batch_scale != 1.0) set_batch(*j, new_batch);
    } else if (d.batch_scale != 1.0) {
      set_batch(*j, batch * d.batch_scale);
    }
  }
}

}  // namespace dra::sim::detail
