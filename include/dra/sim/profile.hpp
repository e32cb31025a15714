#pragma once
// Measured training profiles of one application (Pollux OSDI'21 artifact format,
// data/pollux/README.md): step time over placement and per-device batch, per-epoch gradient
// statistics and validation metric at several batch sizes. Interpolation and clamping follow the
// reference except where docs/guide/simulator.md ("Deviations") says otherwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dra/sim/csv.hpp"

namespace dra::sim {

/// Seconds per optimizer step and the part of it spent synchronising gradients.
struct step_times {
  double step_s = 0.0;
  double sync_s = 0.0;
};

/// Per-application settings the reference simulator hard-codes (README of the data).
struct application_options {
  int max_epochs = 0;                 ///< 0: the shortest validation file
  double max_local_batch = 0.0;       ///< 0: the largest measured local batch
  int max_replicas = 0;               ///< 0: no application limit
  double adaptive_fixed_batch = 0.0;  ///< batch an adaptive scheduler must keep (reference: ncf 32768)
};

/// The reference simulator's settings for the six profiled models; other names get defaults.
inline application_options reference_options(const std::string& name) {
  application_options o;
  if (name == "bert") o.max_epochs = 2;
  if (name == "cifar10") o.max_epochs = 100;
  if (name == "ncf") o.max_epochs = 10, o.max_replicas = 1, o.adaptive_fixed_batch = 32768;
  if (name == "imagenet") o.max_epochs = 90;
  if (name == "deepspeech2") o.max_epochs = 80;
  if (name == "yolov3") o.max_epochs = 50, o.max_local_batch = 8;
  return o;
}

namespace detail {

struct bsz_point {
  double bsz, step, sync;
};

/// A measured step: a batch > 0, a step time > 0 and the sync inside it (0 <= sync <= step; a
/// larger sync gave negative compute and a utilisation below 0).
inline void check_step_row(const csv_table& t, std::size_t r, std::size_t c_b, std::size_t c_st, std::size_t c_sy,
                           const bsz_point& pt) {
  if (!(pt.bsz > 0.0)) t.fail(r, c_b, "local batch must be > 0");
  if (!(pt.step > 0.0)) t.fail(r, c_st, "step_time " + t.text(r, c_st) + " must be > 0 seconds");
  if (!(pt.sync >= 0.0 && pt.sync <= pt.step))
    t.fail(r, c_sy,
           "sync_time " + t.text(r, c_sy) + " must lie in [0, step_time " + t.text(r, c_st) +
               "]: the sync is part of the step");
}

/// Linear interpolation in local batch over points sorted by bsz, clamped at both ends.
inline step_times interpolate_bsz(const std::vector<bsz_point>& pts, double bsz) {
  if (pts.empty()) throw std::logic_error("interpolate_bsz: no points");
  if (bsz <= pts.front().bsz) return {pts.front().step, pts.front().sync};
  if (bsz >= pts.back().bsz) return {pts.back().step, pts.back().sync};
  auto hi = std::lower_bound(pts.begin(), pts.end(), bsz, [](const bsz_point& p, double v) { return p.bsz < v; });
  auto lo = hi - 1;
  const double w = (bsz - lo->bsz) / (hi->bsz - lo->bsz);
  return {lo->step + w * (hi->step - lo->step), lo->sync + w * (hi->sync - lo->sync)};
}

inline step_times lerp(const step_times& a, const step_times& b, double w) {
  return {a.step_s + w * (b.step_s - a.step_s), a.sync_s + w * (b.sync_s - a.sync_s)};
}

/// Bracketing pair in a sorted container of keys: (lo, hi, weight of hi), clamped.
template <class Keys>
std::tuple<typename Keys::value_type, typename Keys::value_type, double> bracket(const Keys& keys, double x) {
  auto first = *keys.begin();
  auto last = *keys.rbegin();
  if (x <= static_cast<double>(first)) return {first, first, 0.0};
  if (x >= static_cast<double>(last)) return {last, last, 0.0};
  auto hi = std::lower_bound(keys.begin(), keys.end(), x, [](auto k, double v) { return static_cast<double>(k) < v; });
  auto lo = std::prev(hi);
  if (static_cast<double>(*hi) == x) return {*hi, *hi, 0.0};
  return {*lo, *hi, (x - static_cast<double>(*lo)) / static_cast<double>(*hi - *lo)};
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double pstdev(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  double mean = 0.0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double ss = 0.0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / static_cast<double>(v.size()));
}

}  // namespace detail

/// The placement key the reference uses: zeros dropped, rotated to the lexicographically smallest
/// order, digits concatenated ("2,1" -> "12").
inline std::string placement_key(const std::vector<int>& placement) {
  std::vector<int> p;
  for (int c : placement)
    if (c > 0) p.push_back(c);
  if (p.empty()) return {};
  std::vector<int> best = p;
  for (std::size_t i = 1; i < p.size(); ++i) {
    std::vector<int> rot(p.begin() + static_cast<std::ptrdiff_t>(i), p.end());
    rot.insert(rot.end(), p.begin(), p.begin() + static_cast<std::ptrdiff_t>(i));
    if (rot < best) best = rot;
  }
  std::string key;
  for (int c : best) key += std::to_string(c);
  return key;
}

/// Devices packed onto as few nodes as possible: 10 devices on 4-device nodes -> {4, 4, 2}.
inline std::vector<int> packed_placement(int devices, int per_node) {
  std::vector<int> p;
  for (int left = devices; left > 0; left -= per_node) p.push_back(std::min(left, per_node));
  return p;
}

class application_profile {
 public:
  struct epoch_row {
    double progress, iteration, metric, grad_sqr, grad_var;
  };

  /// Loads traces/<name>/ (placements.csv, scalability.csv, validation-<B>.csv).
  static application_profile load(const std::string& dir, const std::string& name, application_options options) {
    namespace fs = std::filesystem;
    application_profile p;
    p.name_ = name;
    const fs::path root(dir);
    if (!fs::is_directory(root))
      throw std::invalid_argument(
          dir + ": not a directory; expected a trace folder with placements.csv and validation-*.csv");

    const csv_table placements = csv_table::read((root / "placements.csv").string());
    {
      const auto c_pl = placements.column("placement"), c_b = placements.column("local_bsz"),
                 c_st = placements.column("step_time"), c_sy = placements.column("sync_time");
      std::map<std::tuple<int, int, double>, std::vector<detail::bsz_point>> groups;
      for (std::size_t r = 0; r < placements.rows(); ++r) {
        const std::string& text = placements.text(r, c_pl);
        std::vector<int> counts;
        for (char ch : text) {
          if (ch < '1' || ch > '9')
            placements.fail(r, c_pl, "'" + text + "' is not a placement (digits 1-9, one per node)");
          counts.push_back(ch - '0');
        }
        if (counts.empty()) placements.fail(r, c_pl, "empty placement");
        const detail::bsz_point pt{placements.number(r, c_b), placements.number(r, c_st), placements.number(r, c_sy)};
        detail::check_step_row(placements, r, c_b, c_st, c_sy, pt);
        p.placements_[placement_key(counts)].push_back(pt);
        int replicas = 0;
        for (int c : counts) replicas += c;
        groups[{static_cast<int>(counts.size()), replicas, pt.bsz}].push_back(pt);
        p.min_local_ = p.min_local_ == 0.0 ? pt.bsz : std::min(p.min_local_, pt.bsz);
        p.max_local_measured_ = std::max(p.max_local_measured_, pt.bsz);
      }
      // Averaged rows per (nodes, replicas, bsz), as the reference's groupby().mean().
      std::vector<double> spreads;
      for (const auto& [key, pts] : groups) {
        detail::bsz_point mean{std::get<2>(key), 0.0, 0.0};
        std::vector<double> logs;
        for (const auto& q : pts) mean.step += q.step, mean.sync += q.sync, logs.push_back(std::log(q.step));
        mean.step /= static_cast<double>(pts.size());
        mean.sync /= static_cast<double>(pts.size());
        p.grid_[{std::get<0>(key), std::get<1>(key)}].push_back(mean);
        if (pts.size() >= 2) spreads.push_back(detail::pstdev(logs));
      }
      p.placement_noise_ = detail::median(spreads);
    }
    {
      const csv_table scal = csv_table::read((root / "scalability.csv").string());
      const auto c_n = scal.column("num_nodes"), c_r = scal.column("num_replicas"), c_b = scal.column("local_bsz"),
                 c_st = scal.column("step_time"), c_sy = scal.column("sync_time");
      for (std::size_t r = 0; r < scal.rows(); ++r) {
        const long long n = scal.integer(r, c_n), k = scal.integer(r, c_r);
        if (n < 1 || k < n) scal.fail(r, c_r, "need 1 <= num_nodes <= num_replicas");
        const detail::bsz_point pt{scal.number(r, c_b), scal.number(r, c_st), scal.number(r, c_sy)};
        detail::check_step_row(scal, r, c_b, c_st, c_sy, pt);
        p.grid_[{static_cast<int>(n), static_cast<int>(k)}].push_back(pt);
      }
    }
    for (auto& [key, pts] : p.placements_)
      std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.bsz < b.bsz; });
    for (auto& [key, pts] : p.grid_) {
      std::sort(pts.begin(), pts.end(), [](const auto& a, const auto& b) { return a.bsz < b.bsz; });
      p.grid_nodes_.insert(key.first);
      p.grid_replicas_[key.first].insert(key.second);
    }
    if (p.placements_.empty()) throw std::invalid_argument((root / "placements.csv").string() + ": no rows");

    for (const auto& entry : fs::directory_iterator(root)) {
      const std::string file = entry.path().filename().string();
      if (file.rfind("validation-", 0) != 0 || entry.path().extension() != ".csv") continue;
      const std::string stem = entry.path().stem().string().substr(11);
      char* end = nullptr;
      const double batch = std::strtod(stem.c_str(), &end);
      if (stem.empty() || *end != '\0' || !(batch > 0.0))
        throw std::invalid_argument(entry.path().string() + ": file name must be validation-<total batch>.csv");
      const csv_table v = csv_table::read(entry.path().string());
      const auto c_p = v.column("progress"), c_i = v.column("iteration"), c_m = v.column("metric"),
                 c_s = v.column("grad_sqr"), c_v = v.column("grad_var");
      std::vector<epoch_row> rows;
      for (std::size_t r = 0; r < v.rows(); ++r) {
        rows.push_back({v.number(r, c_p), v.number(r, c_i), v.number(r, c_m), v.number(r, c_s), v.number(r, c_v)});
        const epoch_row& e = rows.back();
        // Statistical progress is cumulative: each epoch adds some. A row that adds none made the
        // epochs after it free (a whole run done at once).
        if (!(e.progress > 0.0) || (r > 0 && !(e.progress > rows[r - 1].progress)))
          v.fail(r, c_p, "progress " + v.text(r, c_p) + " must be > 0 and grow every epoch (it is cumulative)");
        if (e.grad_sqr < 0.0 || e.grad_var < 0.0 || (e.grad_sqr == 0.0 && e.grad_var == 0.0))
          v.fail(r, e.grad_sqr < 0.0 ? c_s : c_v,
                 "grad_sqr and grad_var are a squared norm and a variance: each >= 0, "
                 "not both 0");
      }
      if (rows.empty()) throw std::invalid_argument(entry.path().string() + ": no epochs");
      p.validation_[batch] = std::move(rows);
    }
    if (p.validation_.empty()) throw std::invalid_argument(dir + ": no validation-<B>.csv files");
    for (const auto& [b, rows] : p.validation_) p.validated_.push_back(b);

    std::size_t shortest = SIZE_MAX;
    for (const auto& [b, rows] : p.validation_) shortest = std::min(shortest, rows.size());
    p.max_epochs_ = options.max_epochs > 0 ? std::min<int>(options.max_epochs, static_cast<int>(shortest))
                                           : static_cast<int>(shortest);
    p.max_local_ = options.max_local_batch > 0.0 ? options.max_local_batch : p.max_local_measured_;
    p.max_replicas_ = options.max_replicas;
    p.adaptive_fixed_batch_ = options.adaptive_fixed_batch;
    const auto& first = p.validation_.begin()->second;
    p.metric_increases_ = first.front().metric < first.back().metric;

    // Spread of the gradient noise scale across the batch-size runs at the same epoch.
    std::vector<double> spreads;
    for (int e = 0; e < p.max_epochs_; ++e) {
      std::vector<double> logs;
      for (const auto& [b, rows] : p.validation_)
        if (rows[e].grad_sqr > 0.0 && rows[e].grad_var > 0.0)
          logs.push_back(std::log(rows[e].grad_var / rows[e].grad_sqr));
      if (logs.size() >= 2) spreads.push_back(detail::pstdev(logs));
    }
    p.gns_noise_ = detail::median(spreads);
    return p;
  }

  const std::string& name() const noexcept { return name_; }
  double init_batch() const noexcept { return validated_.front(); }  ///< M0: smallest validated batch
  double max_batch() const noexcept { return validated_.back(); }
  const std::vector<double>& validated_batches() const noexcept { return validated_; }
  double min_local_batch() const noexcept { return min_local_; }
  double max_local_batch() const noexcept { return max_local_; }
  int max_epochs() const noexcept { return max_epochs_; }
  int max_replicas() const noexcept { return max_replicas_; }
  double adaptive_fixed_batch() const noexcept { return adaptive_fixed_batch_; }
  bool metric_increases() const noexcept { return metric_increases_; }
  /// Median spread (std of log step time) between placements with the same nodes, replicas, batch.
  double placement_noise() const noexcept { return placement_noise_; }
  /// Median spread (std of log grad_var/grad_sqr) across the batch-size runs at the same epoch.
  double gns_noise() const noexcept { return gns_noise_; }
  bool has_placement(const std::vector<int>& placement) const {
    return placements_.count(placement_key(placement)) > 0;
  }

  /// Step and sync time of one optimizer step (no accumulation) at a placement and local batch.
  step_times throughput(const std::vector<int>& placement, double local_bsz) const {
    const std::string key = placement_key(placement);
    if (key.empty()) throw std::invalid_argument("placement: needs at least one device");
    auto it = placements_.find(key);
    if (it != placements_.end()) return detail::interpolate_bsz(it->second, local_bsz);
    int nodes = 0, replicas = 0;
    for (int c : placement)
      if (c > 0) ++nodes, replicas += c;
    return grid(std::min(nodes, 16), replicas, local_bsz);
  }

  /// |G|^2 and tr(Sigma) (at the initial batch) during `epoch` (0-based) for total batch `batch`,
  /// interpolated linearly between the validated batches around it.
  std::pair<double, double> grad_stats(double batch, int epoch) const {
    const auto [lo, hi, w] = detail::bracket(validated_, batch);
    const auto& a = row(lo, epoch);
    const auto& b = row(hi, epoch);
    return {a.grad_sqr + w * (b.grad_sqr - a.grad_sqr), a.grad_var + w * (b.grad_var - a.grad_var)};
  }

  /// Validation metric measured at the end of `epoch` (0-based) for total batch `batch`.
  double metric(double batch, int epoch) const {
    const auto [lo, hi, w] = detail::bracket(validated_, batch);
    return row(lo, epoch).metric + w * (row(hi, epoch).metric - row(lo, epoch).metric);
  }

  /// Best validation metric over the first `epochs` epochs (the reference's get_best_metric).
  double best_metric(double batch, int epochs) const {
    const auto [lo, hi, w] = detail::bracket(validated_, batch);
    const double a = best_of(lo, epochs), b = best_of(hi, epochs);
    return a + w * (b - a);
  }

  /// Statistical progress (in steps at the initial batch) at which `epoch` epochs are complete:
  /// the smallest value across the validation runs, as the reference does.
  double progress_at(int epoch) const {
    if (epoch <= 0) return 0.0;
    double best = INFINITY;
    for (const auto& [b, rows] : validation_)
      best = std::min(best, rows.at(std::min<std::size_t>(epoch, rows.size()) - 1).progress);
    return best;
  }

  /// Step time with gradient accumulation, as the reference charges it: one synchronised step
  /// plus `accum_steps` extra forward/backward passes without synchronisation.
  step_times accumulated(const std::vector<int>& placement, double atomic_bsz, int accum_steps) const {
    const step_times t = throughput(placement, atomic_bsz);
    return {t.step_s + (t.step_s - t.sync_s) * accum_steps, t.sync_s};
  }

 private:
  const epoch_row& row(double batch, int epoch) const {
    const auto& rows = validation_.at(batch);
    return rows.at(static_cast<std::size_t>(std::clamp(epoch, 0, static_cast<int>(rows.size()) - 1)));
  }
  double best_of(double batch, int epochs) const {
    const auto& rows = validation_.at(batch);
    const int n = std::clamp(epochs, 1, static_cast<int>(rows.size()));
    double best = rows[0].metric;
    for (int e = 1; e < n; ++e)
      best = metric_increases_ ? std::max(best, rows[e].metric) : std::min(best, rows[e].metric);
    return best;
  }

  step_times grid(int nodes, int replicas, double bsz) const {
    const auto [n0, n1, wn] = detail::bracket(grid_nodes_, nodes);
    auto at_nodes = [&](int n) {
      const auto& reps = grid_replicas_.at(n);
      const auto [r0, r1, wr] = detail::bracket(reps, replicas);
      const step_times a = detail::interpolate_bsz(grid_.at({n, r0}), bsz);
      if (r0 == r1) return a;
      return detail::lerp(a, detail::interpolate_bsz(grid_.at({n, r1}), bsz), wr);
    };
    const step_times a = at_nodes(n0);
    if (n0 == n1) return a;
    return detail::lerp(a, at_nodes(n1), wn);
  }

  std::string name_;
  std::map<std::string, std::vector<detail::bsz_point>> placements_;
  std::map<std::pair<int, int>, std::vector<detail::bsz_point>> grid_;
  std::set<int> grid_nodes_;
  std::map<int, std::set<int>> grid_replicas_;
  std::map<double, std::vector<epoch_row>> validation_;
  std::vector<double> validated_;
  double min_local_ = 0.0, max_local_ = 0.0, max_local_measured_ = 0.0;
  int max_epochs_ = 0, max_replicas_ = 0;
  double adaptive_fixed_batch_ = 0.0;
  bool metric_increases_ = true;
  double placement_noise_ = 0.0, gns_noise_ = 0.0;
};

/// All application profiles under a traces/ directory, by folder name.
class profile_library {
 public:
  static profile_library load(const std::string& traces_dir) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(traces_dir))
      throw std::invalid_argument(
          traces_dir + ": traces directory not found; pass --traces DIR (folders <model>/placements.csv ...)");
    profile_library lib;
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(traces_dir))
      if (e.is_directory() && fs::exists(e.path() / "placements.csv")) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    for (const auto& d : dirs) {
      const std::string name = d.filename().string();
      lib.apps_.emplace(name, application_profile::load(d.string(), name, reference_options(name)));
    }
    if (lib.apps_.empty()) throw std::invalid_argument(traces_dir + ": no <model>/placements.csv found");
    return lib;
  }
  const application_profile& at(const std::string& name) const {
    auto it = apps_.find(name);
    if (it == apps_.end()) {
      std::string have;
      for (const auto& [n, a] : apps_) have += (have.empty() ? "" : ", ") + n;
      throw std::invalid_argument("application: no profile named '" + name + "' (have: " + have + ")");
    }
    return it->second;
  }
  bool contains(const std::string& name) const { return apps_.count(name) > 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, a] : apps_) out.push_back(n);
    return out;
  }

 private:
  std::map<std::string, application_profile> apps_;
};

}  // namespace dra::sim
