#pragma once
// What a simulation reports: per job, the cluster timeline, and the run's totals.
#include <array>
#include <limits>
#include <string>
#include <vector>

namespace dra::sim {

struct job_result {
  std::string name, application;
  double submit_s = 0.0;
  double start_s = std::numeric_limits<double>::quiet_NaN();       ///< first allocation
  double completion_s = std::numeric_limits<double>::quiet_NaN();  ///< NaN: did not finish
  double jct_s = std::numeric_limits<double>::quiet_NaN();         ///< completion - submit
  double gpu_seconds = 0.0;          ///< device time allocated (held, including resize time)
  double compute_gpu_seconds = 0.0;  ///< device time spent computing gradients (not sync, not resizing)
  double busy_gpu_seconds = 0.0;     ///< device time spent running steps (compute and sync; not resizing)
  double progress = 0.0;             ///< statistical progress (steps at the initial batch)
  int epochs = 0;
  int requested_replicas = 0;
  double requested_batch = 0.0;
  double final_batch = 0.0;
  double final_metric = std::numeric_limits<double>::quiet_NaN();
  bool reached_target = false;
  int reallocations = 0;  ///< allocation changes after the first start
  int max_devices = 0;
  double device_time_weighted_devices = 0.0;                          ///< mean devices while allocated
  double declared_epochs = std::numeric_limits<double>::quiet_NaN();  ///< what it declared (NaN: nothing)
  bool stopped_early = false;                                         ///< its early-stopping rule ended it
  /// Its remaining-work estimates at 10, 50 and 90 % of its life: (life fraction, epochs done, true
  /// remaining epochs, estimated median, estimated tail).
  std::vector<std::array<double, 5>> estimate_checks;
};

struct timeline_point {
  double time_s = 0.0;
  int allocated = 0;              ///< devices held by jobs
  double busy_fraction = 0.0;     ///< busy device-time / capacity over the last interval
  int running = 0;                ///< jobs holding devices
  int waiting = 0;                ///< submitted jobs with no devices
  double compute_fraction = 0.0;  ///< computing device-time / capacity over the last interval
};

struct sim_result {
  std::string policy;
  int capacity = 0;
  double reallocation_cost_s = 0.0;
  double makespan_s = 0.0;  ///< last completion (from t = 0)
  double first_submit_s = 0.0;
  double end_s = 0.0;  ///< when the simulation stopped (every job done, or the horizon reached)
  std::vector<job_result> jobs;
  std::vector<timeline_point> timeline;
  double wall_s = 0.0;  ///< simulator run time
  bool all_completed = true;
};

}  // namespace dra::sim
