#pragma once
// Job specifications: read from a workload CSV (name,time,application,num_replicas,batch_size and,
// when present, declared_epochs; any other declared_* column is refused), or generated (study.hpp). A spec holds the
// truth (how the job really trains) beside what the user declares; policies see only the declaration (job_view).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/error.hpp"
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
  /// The epochs the user declares to the scheduler (possibly wrong); NaN: declares nothing.
  double declared_epochs = std::numeric_limits<double>::quiet_NaN();
  bool declared_from_file = false;  ///< the workload file had a declared_epochs column for it
  /// Truth: stop early once the validation metric has not improved by `stop_min_delta` (relative)
  /// for this many epochs (0: train the whole budget).
  int stop_patience = 0;
  double stop_min_delta = 1e-3;
  /// Truth: log-normal spread of the job's own gradient-noise-scale estimate, per epoch (0: exact).
  double gns_estimate_sigma = 0.0;
  /// With a target: judge it by the work done at each batch (true) or by the metric of the
  /// epoch-weighted geometric-mean batch (false, the earlier rule).
  bool target_by_work = true;
};

namespace detail {
/// splitmix64: a tiny, portable, well-mixed 64-bit generator (the standard library's
/// distributions differ between implementations; this does not).
class portable_rng {
 public:
  explicit portable_rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  /// Standard normal (Box-Muller; the second value is discarded for simplicity).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  std::uint64_t state_;
};
}  // namespace detail

/// How the jobs of a workload declare their budgets (issue 21's realistic declarations).
struct declaration_config {
  /// Log-normal error of a declared budget: declared = budget x exp(sigma z), rounded to whole
  /// epochs (0: the budget exactly, as a training script that states its epochs).
  double sigma = 0.0;
  /// Share of jobs that declare nothing.
  double none_share = 0.0;
  /// Share of jobs that stop early on a plateau (their declaration is still their full budget).
  double early_stop_share = 0.0;
  /// Early stopping: patience drawn from these (epochs), minimum relative improvement.
  std::vector<int> patience{5, 10, 20};
  double min_delta = 1e-3;
  std::uint64_t seed = 1;
  /// Keep a declaration read from the workload file (its declared_epochs column) as is.
  bool keep_file_declarations = true;

  void validate() const {
    // Past 5, exp(sigma z) spans 10^-11..10^11 within 2.3 sigmas: every budget declared as 1 epoch
    // or as billions (1000 was accepted).
    if (!(sigma >= 0.0 && sigma <= 5.0))
      dra::detail::throw_invalid("sigma", "must lie in [0, 5] (0.5 and 1 are realistic), got " + std::to_string(sigma));
    if (!(none_share >= 0.0 && none_share <= 1.0))
      dra::detail::throw_invalid("none_share", "must lie in [0, 1], got " + std::to_string(none_share));
    if (!(early_stop_share >= 0.0 && early_stop_share <= 1.0))
      dra::detail::throw_invalid("early_stop_share", "must lie in [0, 1], got " + std::to_string(early_stop_share));
    if (patience.empty()) dra::detail::throw_invalid("patience", "needs at least one value");
    for (int p : patience)
      if (p < 1) dra::detail::throw_invalid("patience", "every value must be >= 1 epoch, got " + std::to_string(p));
    if (!(min_delta >= 0.0)) dra::detail::throw_invalid("min_delta", "must be >= 0");
  }
};

/// Gives every job a declaration derived from its true budget (the application's epochs), with
/// log-normal error, a share that declares nothing and a share that stops early. Job i's draws
/// depend only on (seed, i), so a job declares the same whatever the other jobs do.
inline void declare_budgets(std::vector<job_spec>& jobs, const profile_library& profiles,
                            const declaration_config& config) {
  config.validate();
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    job_spec& j = jobs[i];
    detail::portable_rng rng(config.seed * 0x2545F4914F6CDD1DULL +
                             static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ULL + 7);
    rng.next();
    const double u_none = rng.uniform(), u_stop = rng.uniform(), z = rng.normal();
    const auto patience = config.patience[rng.below(config.patience.size())];
    if (u_stop < config.early_stop_share) j.stop_patience = patience, j.stop_min_delta = config.min_delta;
    if (config.keep_file_declarations && j.declared_from_file) continue;
    const double budget = profiles.at(j.application).max_epochs();
    j.declared_epochs = u_none < config.none_share ? std::numeric_limits<double>::quiet_NaN()
                                                   : std::max(1.0, std::round(budget * std::exp(config.sigma * z)));
  }
}

/// The latest arrival a workload may give, in seconds (a Unix timestamp in seconds is 1.7e9).
inline constexpr double kMaxArrivalS = 1e13;

/// Reads a workload CSV; every malformed cell is reported with file, line and column. When a
/// profile library is given, applications and batch sizes are checked against it too.
inline std::vector<job_spec> read_workload(const std::string& path, const profile_library* profiles = nullptr) {
  const csv_table t = csv_table::read(path);
  const auto c_name = t.column("name"), c_time = t.column("time"), c_app = t.column("application"),
             c_rep = t.column("num_replicas"), c_bsz = t.column("batch_size");
  // Optional: what each job declares (an empty cell declares nothing). Any other declared_*
  // column is refused: ignored, it would leave its jobs declaring their exact budget (the default).
  const auto& header = t.header();
  for (const auto& h : header) {
    std::string key;  // lower case, letters and digits only: declared_steps, "Declared Epochs", declaredEpochs
    for (const unsigned char c : h)
      if (std::isalnum(c)) key += static_cast<char>(std::tolower(c));
    if (key.rfind("declared", 0) == 0 && h != "declared_epochs")
      throw std::invalid_argument(t.source() + ":1: column '" + h +
                                  "': not a declaration the simulator reads (it accepts only declared_epochs, "
                                  "each job's budget in epochs, an empty cell declaring nothing); convert it to "
                                  "declared_epochs or drop the column");
  }
  const bool has_declared = std::find(header.begin(), header.end(), "declared_epochs") != header.end();
  const std::size_t c_decl = has_declared ? t.column("declared_epochs") : 0;
  std::vector<job_spec> jobs;
  std::set<std::string> named;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    job_spec j;
    j.name = t.text(r, c_name);
    if (j.name.empty()) t.fail(r, c_name, "empty job name");
    // A name repeated (a trace naming jobs by their kind) is made unique with its line, "name@LINE":
    // records, plots and messages name each job apart.
    if (!named.insert(j.name).second) j.name += "@" + std::to_string(t.line_of(r));
    j.submit_s = t.number(r, c_time);
    if (j.submit_s < 0.0) t.fail(r, c_time, "arrival time must be >= 0 seconds");
    // Far past 1e13 s a double's step (2e-3 s there, 256 s at 1.7e18) swallows the simulator's interval.
    if (j.submit_s > kMaxArrivalS)
      t.fail(r, c_time,
             "arrival time " + t.text(r, c_time) +
                 " s is past 1e13 s (317,000 years): times are seconds (a Unix timestamp in microseconds or "
                 "nanoseconds is 1e6 to 1e9 times too large); give seconds, or subtract the first arrival");
    j.application = t.text(r, c_app);
    if (profiles && !profiles->contains(j.application)) {
      std::string have;
      for (const auto& n : profiles->names()) have += (have.empty() ? "" : ", ") + n;
      t.fail(r, c_app, "no profile for application '" + j.application + "' (have: " + have + ")");
    }
    const long long k = t.integer(r, c_rep);
    if (k < 1 || k > 1 << 20) t.fail(r, c_rep, "num_replicas " + t.text(r, c_rep) + " is outside [1, 1048576]");
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
    j.declared_from_file = has_declared;
    if (has_declared && !t.text(r, c_decl).empty()) {
      j.declared_epochs = t.number(r, c_decl);
      if (!(j.declared_epochs > 0.0))
        t.fail(r, c_decl, "declared_epochs must be > 0 (leave the cell empty to declare nothing)");
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

}  // namespace dra::sim
