#pragma once
// Cluster-level arbiter: divides identical devices among jobs by their speedup curves, maximising
// the power mean of speedups (Pollux's objective at p = -1) with a penalty on moving a job, by a
// greedy search over increments then single-device moves (deterministic; ties to the job listed
// first). It knows nothing about where jobs run, so the simulator and the live pool share it; how
// remaining work weights it (completion_weights, completion_config) is below. The objective, the
// search and its exhaustive check: docs/design/policies.md.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "dra/error.hpp"

namespace dra::policy {

struct arbiter_job {
  /// speedup[k] for k = 0..max devices; speedup[0] is taken as 0. Must be finite and >= 0.
  std::vector<double> speedup;
  int current = 0;              ///< devices it holds now
  double change_penalty = 1.0;  ///< multiplier on its speedup at any allocation other than `current`
  int min_devices = 0;          ///< devices it must keep when it has them (0: may be preempted)
  /// Value of holding any device at all, added to speedup[k] for every k >= 1 and never scaled by
  /// the change penalty (completion_config::admission: starting a waiting job beats growing one).
  double presence = 0.0;
};

struct arbiter_config {
  double p = -1.0;        ///< power-mean exponent; 1 = utilitarian sum, -1 = Pollux, very negative = max-min
  double epsilon = 1e-3;  ///< added to each speedup so a zero does not make the mean undefined (Pollux: 1e-3)
  int max_moves = 256;    ///< bound on single-device moves in the local search

  void validate() const {
    if (!std::isfinite(p) || p == 0.0)
      dra::detail::throw_invalid(
          "p", "must be finite and non-zero (use a small |p| for near-geometric mean), got " + std::to_string(p));
    if (!(epsilon > 0.0) || !std::isfinite(epsilon))
      dra::detail::throw_invalid("epsilon", "must be a finite number > 0, got " + std::to_string(epsilon));
    if (max_moves < 0) dra::detail::throw_invalid("max_moves", "must be >= 0");
  }
};

/// Weights that make the arbiter's weighted sum (p = 1) allocate as heSRPT (Berg et al., 2020: the
/// allocation that minimises mean completion time for jobs of known size with speedup k^a): rank
/// jobs from the largest remaining size (rank 1) to the smallest (rank m); rank i gets
/// (i^c - (i-1)^c)^(1/c) with c = 1 / (1 - a). Only the order of the sizes matters, so a size known
/// to within a factor still ranks right; equal sizes get equal weights. c = 1 is equal weights;
/// large c tends to shortest first. A size that is not a number (a job whose remaining work is
/// unknown) counts as infinite: the largest, so it gets the smallest weight.
inline std::vector<double> completion_weights(const std::vector<double>& sizes, double c) {
  if (!(c >= 1.0) || !std::isfinite(c))
    dra::detail::throw_invalid("c", "must be a finite number >= 1, got " + std::to_string(c));
  // A NaN would break the sort's order and the grouping of equal sizes below (it equals nothing,
  // not even itself: the grouping never advanced and the call never returned).
  std::vector<double> size(sizes);
  for (double& s : size)
    if (std::isnan(s)) s = std::numeric_limits<double>::infinity();
  std::vector<std::size_t> order(size.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return size[a] > size[b]; });
  auto rank_weight = [&](std::size_t r) {
    const double i = static_cast<double>(r + 1);
    return std::pow(std::pow(i, c) - std::pow(i - 1.0, c), 1.0 / c);
  };
  // Largest first; equal sizes share the mean weight of their ranks.
  std::vector<double> w(size.size(), 1.0);
  for (std::size_t r = 0; r < order.size();) {
    std::size_t end = r;
    double sum = 0.0;
    while (end < order.size() && size[order[end]] == size[order[r]]) sum += rank_weight(end++);
    for (std::size_t k = r; k < end; ++k) w[order[k]] = sum / static_cast<double>(end - r);
    r = end;
  }
  return w;
}

/// How jobs' remaining work tilts an arbitration (dra's convergence_aware cluster policy; the
/// simulator and the device pool use it alike): each job's completion weight (completion_weights of
/// its remaining size) raised to `tilt` scales its speedup curve, multiplying it under a
/// utilitarian objective (power > 0), dividing it under a fair one (power < 0: a job closer to done
/// needs more speedup to count as well served).
struct completion_config {
  double exponent = 2.0;  ///< c of completion_weights (heSRPT's 1 / (1 - a) for speedup k^a)
  double tilt = 1.0;      ///< exponent of the weight (1: heSRPT's; 0: remaining work is ignored)
  double power = 1.0;     ///< the arbiter's power-mean exponent (1: heSRPT's weighted sum)
  /// Under a utilitarian objective (power > 0), the value of holding any device, times the job's
  /// weight, in the caller's speedup unit (the simulator: a job at its fair share; the pool: one
  /// worker), never discounted by the restart penalty (arbiter_job::presence). A device then starts
  /// a waiting job before it grows a running one, as the fair objective (power < 0) does by itself:
  /// without it a new short job waits while the restart penalty of the job it would take a device
  /// from outweighs its speedup (ncf's 1-device jobs waited 17 % longer than under Pollux). 0: off.
  double admission = 0.3;

  void validate() const {
    if (!(exponent >= 1.0) || !std::isfinite(exponent))
      dra::detail::throw_invalid("exponent", "must be a finite number >= 1, got " + std::to_string(exponent));
    if (!(tilt >= 0.0) || !std::isfinite(tilt))
      dra::detail::throw_invalid("tilt", "must be a finite number >= 0, got " + std::to_string(tilt));
    if (!std::isfinite(power) || power == 0.0)
      dra::detail::throw_invalid("power", "must be finite and non-zero, got " + std::to_string(power));
    if (!(admission >= 0.0) || !std::isfinite(admission))
      dra::detail::throw_invalid("admission",
                                 "must be a finite number >= 0 (0: off), got " + std::to_string(admission));
  }
  /// The factor a job's speedup curve is multiplied by.
  double factor(double weight) const { return std::pow(weight, power > 0.0 ? tilt : -tilt); }
  /// A job's arbiter_job::presence for its weight, `unit` being its speedup at its fair share.
  double presence(double weight, double unit) const { return power > 0.0 ? admission * factor(weight) * unit : 0.0; }
};

class cluster_arbiter {
 public:
  explicit cluster_arbiter(arbiter_config config = {}) : config_((config.validate(), config)) {}
  const arbiter_config& config() const noexcept { return config_; }

  /// Speedup of a job at k devices, with the change penalty applied.
  static double effective(const arbiter_job& job, int k) {
    if (k <= 0 || job.speedup.empty()) return 0.0;
    const double s = job.speedup[static_cast<std::size_t>(std::min<int>(k, static_cast<int>(job.speedup.size()) - 1))];
    return (k == job.current ? s : s * job.change_penalty) + job.presence;
  }

  /// Power mean of effective speedups for an allocation.
  double objective(const std::vector<arbiter_job>& jobs, const std::vector<int>& alloc) const {
    if (alloc.size() != jobs.size())
      dra::detail::throw_invalid("alloc", "needs one allocation per job (" + std::to_string(jobs.size()) + "), got " +
                                              std::to_string(alloc.size()));
    if (jobs.empty()) return 0.0;
    double sum = 0.0;
    for (std::size_t j = 0; j < jobs.size(); ++j) sum += term(effective(jobs[j], alloc[j]));
    return std::pow(sum / static_cast<double>(jobs.size()), 1.0 / config_.p);
  }

  /// Devices per job (same order as `jobs`), summing to at most `capacity`.
  std::vector<int> allocate(const std::vector<arbiter_job>& jobs, int capacity) const {
    if (capacity < 0) dra::detail::throw_invalid("capacity", "must be >= 0, got " + std::to_string(capacity));
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      for (double s : jobs[j].speedup)
        if (!(s >= 0.0) || !std::isfinite(s))
          dra::detail::throw_invalid("speedup", "job " + std::to_string(j) + " has a negative or non-finite speedup");
      if (!(jobs[j].presence >= 0.0) || !std::isfinite(jobs[j].presence))
        dra::detail::throw_invalid(
            "presence", "job " + std::to_string(j) + " has a negative or non-finite presence (use 0 for none)");
      if (!(jobs[j].change_penalty >= 0.0 && jobs[j].change_penalty <= 1.0))
        dra::detail::throw_invalid("change_penalty", "must lie in [0, 1] (job " + std::to_string(j) + ")");
    }
    const std::size_t n = jobs.size();
    // terms[j][k]: the job's contribution to the sum at k devices (penalty included), every job's
    // curve in one contiguous array.
    std::vector<std::size_t> offset(n + 1, 0);
    for (std::size_t j = 0; j < n; ++j) offset[j + 1] = offset[j] + static_cast<std::size_t>(max_devices(jobs[j])) + 1;
    std::vector<double> flat(offset[n]);
    struct curve {
      const double* t;
      std::size_t len;
      std::size_t size() const { return len; }
      double operator[](std::size_t k) const { return t[k]; }
    };
    auto terms = [&](std::size_t j) { return curve{flat.data() + offset[j], offset[j + 1] - offset[j]}; };
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t k = 0; k < offset[j + 1] - offset[j]; ++k)
        flat[offset[j] + k] = term(effective(jobs[j], static_cast<int>(k)));
    std::vector<int> alloc(n, 0);
    int free = capacity;
    // Jobs that must keep what they hold (non-preemptible) keep it first.
    for (std::size_t j = 0; j < n; ++j) {
      const int keep = std::min({jobs[j].min_devices, jobs[j].current, max_devices(jobs[j])});
      if (keep > 0 && keep <= free) alloc[j] = keep, free -= keep;
    }
    // Greedy: best objective gain per device over every (job, increment) pair.
    // Minimising the sum of terms when p < 0 is maximising the mean; the sign flips for p > 0.
    // Each job's best increment sits in a max-heap (rate, then lower index first). `free` only
    // shrinks, so a stored rate is an upper bound of the job's rate now: the top is recomputed
    // and taken only when it is still exact (O((devices + jobs) log jobs x curve length) rather
    // than devices x jobs x curve length; a decision over 6,000 devices and 1,000 jobs is
    // milliseconds).
    const double sign = config_.p < 0.0 ? -1.0 : 1.0;
    struct candidate {
      double rate;
      std::size_t job;
      int k;
    };
    auto best_increment = [&](std::size_t j) {
      const curve t = terms(j);
      const double now = t[static_cast<std::size_t>(alloc[j])];
      const int most = std::min(static_cast<int>(t.size()) - 1, alloc[j] + free);
      candidate c{0.0, j, 0};
      for (int k = alloc[j] + 1; k <= most; ++k) {
        const double rate = sign * (t[static_cast<std::size_t>(k)] - now) / (k - alloc[j]);
        if (rate > c.rate * (1.0 + 1e-12) && rate > 0.0) c.rate = rate, c.k = k;
      }
      return c;
    };
    auto lower = [](const candidate& a, const candidate& b) {  // heap order: max rate, then min job
      if (a.rate != b.rate) return a.rate < b.rate;
      return a.job > b.job;
    };
    std::vector<candidate> heap;
    heap.reserve(n);
    for (std::size_t j = 0; j < n && free > 0; ++j) {
      const candidate c = best_increment(j);
      if (c.k > 0) heap.push_back(c);
    }
    std::make_heap(heap.begin(), heap.end(), lower);
    // The top is read in place and replaced by its job's next increment (one sift down), not
    // popped and pushed again. Candidates never tie (the job index breaks ties), so the order of
    // tops is the same whatever the heap's inner layout.
    auto sift_down = [&](std::size_t i) {
      const candidate v = heap[i];
      for (;;) {
        std::size_t c = 2 * i + 1;
        if (c >= heap.size()) break;
        if (c + 1 < heap.size() && lower(heap[c], heap[c + 1])) ++c;
        if (!lower(v, heap[c])) break;
        heap[i] = heap[c];
        i = c;
      }
      heap[i] = v;
    };
    while (free > 0 && !heap.empty()) {
      candidate& top = heap.front();
      // Within reach, the stored increment is still the job's best (the range it was the best of
      // has only lost its far end) and is granted; out of reach, it is recomputed and put back.
      if (top.k - alloc[top.job] <= free) {
        free -= top.k - alloc[top.job];
        alloc[top.job] = top.k;
      }
      const candidate next = best_increment(top.job);
      if (free > 0 && next.k > 0) {
        top = next;
        sift_down(0);
      } else {
        std::pop_heap(heap.begin(), heap.end(), lower);
        heap.pop_back();
      }
    }
    // Local search: move one device from a job to another while it helps. The best receiver is
    // the same for every giver but itself, so each move costs O(jobs): the two best receivers.
    std::vector<double> gain(n);
    for (int move = 0; move < config_.max_moves; ++move) {
      std::size_t b1 = n, b2 = n;
      for (std::size_t b = 0; b < n; ++b) {
        const auto kb = static_cast<std::size_t>(alloc[b]);
        const curve tb = terms(b);
        if (kb + 1 >= tb.size()) continue;
        gain[b] = sign * (tb[kb + 1] - tb[kb]);
        if (b1 == n || gain[b] > gain[b1] + 1e-12)
          b2 = b1, b1 = b;
        else if (b2 == n || gain[b] > gain[b2] + 1e-12)
          b2 = b;
      }
      double best = 0.0;
      std::size_t from = n, to = n;
      for (std::size_t a = 0; a < n && b1 != n; ++a) {
        if (alloc[a] == 0 || alloc[a] <= std::min(jobs[a].min_devices, jobs[a].current)) continue;
        const std::size_t b = a != b1 ? b1 : b2;
        if (b == n) continue;
        const auto ka = static_cast<std::size_t>(alloc[a]);
        const double delta = sign * (terms(a)[ka - 1] - terms(a)[ka]) + gain[b];
        if (delta > best + 1e-12) best = delta, from = a, to = b;
      }
      if (from == n) break;
      --alloc[from];
      ++alloc[to];
    }
    return alloc;
  }

 private:
  static int max_devices(const arbiter_job& job) { return std::max(0, static_cast<int>(job.speedup.size()) - 1); }
  // Pollux's p = -1 is a division, several times cheaper than pow (a decision over 100,000 devices
  // computes hundreds of thousands of terms).
  double term(double s) const {
    return config_.p == -1.0 ? 1.0 / (s + config_.epsilon) : std::pow(s + config_.epsilon, config_.p);
  }

  arbiter_config config_;
};

}  // namespace dra::policy
