#pragma once
// Job specifications: read from a workload CSV (name,time,application,num_replicas,batch_size),
// or generated (study.hpp).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dra/sim/csv.hpp"
#include "dra/sim/profile.hpp"

namespace dra::sim {

struct job_spec {
  std::string name;
  double submit_s = 0.0;    ///< arrival, seconds from the start
  std::string application;  ///< a profile folder name
  int replicas = 1;         ///< devices the user requested (static allocation)
  double batch = 0.0;       ///< total batch the user requested
  // Perturbations used by the generated study (1 / NaN: the measured profile as is).
  double throughput_scale = 1.0;  ///< multiplies step and sync time
  double gns_scale = 1.0;         ///< multiplies tr(Sigma), i.e. the gradient noise scale
  double target_metric = std::numeric_limits<double>::quiet_NaN();  ///< stop once the best metric reaches it
};

/// Reads a workload CSV; every malformed cell is reported with file, line and column. When a
/// profile library is given, applications and batch sizes are checked against it too.
inline std::vector<job_spec> read_workload(const std::string& path, const profile_library* profiles = nullptr) {
  const csv_table t = csv_table::read(path);
  const auto c_name = t.column("name"), c_time = t.column("time"), c_app = t.column("application"),
             c_rep = t.column("num_replicas"), c_bsz = t.column("batch_size");
  std::vector<job_spec> jobs;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    job_spec j;
    j.name = t.text(r, c_name);
    if (j.name.empty()) t.fail(r, c_name, "empty job name");
    j.submit_s = t.number(r, c_time);
    if (j.submit_s < 0.0) t.fail(r, c_time, "arrival time must be >= 0 seconds");
    j.application = t.text(r, c_app);
    if (profiles && !profiles->contains(j.application)) {
      std::string have;
      for (const auto& n : profiles->names()) have += (have.empty() ? "" : ", ") + n;
      t.fail(r, c_app, "no profile for application '" + j.application + "' (have: " + have + ")");
    }
    const long long k = t.integer(r, c_rep);
    if (k < 1 || k > 1 << 20) t.fail(r, c_rep, "num_replicas must be >= 1");
    j.replicas = static_cast<int>(k);
    j.batch = t.number(r, c_bsz);
    if (!(j.batch > 0.0)) t.fail(r, c_bsz, "batch_size must be > 0");
    if (profiles) {
      const auto& app = profiles->at(j.application);
      if (j.batch < app.init_batch() || j.batch > app.max_batch())
        t.fail(r, c_bsz,
               "batch_size " + t.text(r, c_bsz) + " is outside the validated range [" +
                   std::to_string(static_cast<long long>(app.init_batch())) + ", " +
                   std::to_string(static_cast<long long>(app.max_batch())) + "] of '" + j.application + "'");
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

}  // namespace dra::sim
