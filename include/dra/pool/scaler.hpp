#pragma once
// Scaling: how many workers each running job should have now. Inference replicas follow their load
// (replica_autoscaler, with hysteresis) and are served first; training jobs divide the rest with the
// cluster arbiter the simulator evaluates; rigid jobs keep what they hold. docs/design/pool.md.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"
#include "dra/policy/cluster_arbiter.hpp"
#include "dra/pool/request.hpp"

namespace dra::pool {

struct autoscaler_config {
  double replica_rps = 1.0;         ///< requests per second one replica serves at full load
  double up_utilisation = 0.75;     ///< scale up when load / (replicas x replica_rps) exceeds this
  double target_utilisation = 0.6;  ///< the size a change aims at
  double down_utilisation = 0.35;   ///< scale down only below this ...
  double down_delay_s = 10.0;       ///< ... held for this long
  /// ... and only while no load in this long (across changes) would have sent one replica fewer
  /// back up: the anti-flap rule (Kubernetes' HPA holds the highest recommendation for 300 s).
  double peak_window_s = 60.0;
  double queue_per_replica = 4.0;  ///< queued requests one more replica is added for
  int min_replicas = 1;
  int max_replicas = 1;

  void validate() const {
    using dra::detail::throw_invalid;
    // Every setting is a finite number: an infinite down_delay_s kept every load sample for good,
    // an infinite replica_rps or up_utilisation never scaled up.
    for (const auto& [name, v] : {std::pair<const char*, double>{"replica_rps", replica_rps},
                                  {"up_utilisation", up_utilisation},
                                  {"target_utilisation", target_utilisation},
                                  {"down_utilisation", down_utilisation},
                                  {"down_delay_s", down_delay_s},
                                  {"peak_window_s", peak_window_s},
                                  {"queue_per_replica", queue_per_replica}})
      if (!std::isfinite(v)) throw_invalid(name, "must be a finite number, got " + request::shown(v));
    if (!(replica_rps > 0.0)) throw_invalid("replica_rps", "must be > 0, got " + request::shown(replica_rps));
    if (!(down_utilisation > 0.0 && down_utilisation < target_utilisation && target_utilisation <= up_utilisation))
      throw_invalid("down_utilisation",
                    "need 0 < down_utilisation < target_utilisation <= up_utilisation (hysteresis band), got " +
                        request::shown(down_utilisation) + " < " + request::shown(target_utilisation) +
                        " <= " + request::shown(up_utilisation) + "; reorder them");
    if (!(down_delay_s >= 0.0)) throw_invalid("down_delay_s", "must be >= 0");
    if (!(peak_window_s >= 0.0))
      throw_invalid("peak_window_s", "must be >= 0 (0: no anti-flap hold), got " + request::shown(peak_window_s));
    if (!(queue_per_replica > 0.0)) throw_invalid("queue_per_replica", "must be > 0");
    if (min_replicas < 0 || max_replicas < min_replicas)
      throw_invalid("max_replicas", "need 0 <= min_replicas <= max_replicas, got " + std::to_string(min_replicas) +
                                        " and " + std::to_string(max_replicas));
  }
};

class replica_autoscaler {
 public:
  explicit replica_autoscaler(autoscaler_config config) : config_((config.validate(), config)) {}
  const autoscaler_config& config() const noexcept { return config_; }

  /// Replicas wanted now, given the arrival rate (requests/s), the queue length and the replicas
  /// running; `replica_rps` > 0 is a measured capacity per replica that replaces the configured
  /// one; `serving` (< 0: all of them) is how many of the `current` replicas serve already (their
  /// worker started): each one still starting takes queue_per_replica of the queue.
  /// Deterministic in its inputs and the load it saw since the last change.
  int update(double now, double rate_rps, double queue, int current, double replica_rps = 0.0, int serving = -1) {
    const auto& c = config_;
    const double per = replica_rps > 0.0 && std::isfinite(replica_rps) ? replica_rps : c.replica_rps;
    const double load = std::max(0.0, rate_rps) / per;  // replicas' worth of work
    // In doubles, clamped before any int: a burst of 3e9 requests/s (or a queue of 1e10) overflowed
    // the int and the service asked for no replica at all.
    double backlog = std::floor(std::max(0.0, queue) / c.queue_per_replica);
    // A replica granted but not serving yet (starting) will take queue_per_replica of the queue: the
    // requests that arrive while replicas start wait for them, not for more. Counted as saturation,
    // a new service's cold start (3-5 s) asked for max_size at 1.5 requests/s and its peak held them
    // for peak_window_s; a queue past what the starting ones take still asks at once.
    if (serving >= 0 && serving < current) backlog = std::max(0.0, backlog - (current - serving));
    const bool queued = backlog >= 1.0;
    const double aim = std::ceil(load / c.target_utilisation - 1e-9) + backlog;
    if (current != seen_current_) {  // a change (ours or anyone's) starts a new window
      seen_current_ = current;
      window_.clear();
      step_down_ = -1;
      if (step_up_ <= current) step_up_ = -1;  // carried out
    }
    window_.push_back({now, load});
    while (window_.size() > 1 && window_[1].first <= now - c.down_delay_s) window_.pop_front();
    // The replicas this sample needed not to ask for more: its load at up_utilisation each, and one
    // more than were running if a queue built (they were saturated).
    note_peak(now, std::max(load / c.up_utilisation, queued ? current + 1.0 : 0.0));
    double want = current;
    const auto lo = static_cast<double>(c.min_replicas), hi = static_cast<double>(c.max_replicas);
    if (current < c.min_replicas || load > c.up_utilisation * current || queued) {
      want = std::max({static_cast<double>(current), aim, current + backlog});  // a backlog: replicas saturated
      step_up_ = std::clamp(want, lo, hi), up_at_ = now;
      step_down_ = -1;
    } else if (step_up_ > current && now - up_at_ < c.down_delay_s) {
      // A step up holds until it is carried out too: its device is freed by a preemption, a second
      // or more, and the burst's queue had drained by then: the answer fell back to the replicas
      // running and the freed device went to a training job (seen twice in one run: SLO 97.5 %
      // against static's 99.9 %). It lapses after down_delay_s without a new surge.
      want = step_up_;
    } else if (step_down_ >= 0) {
      // A step down decided and not carried out yet holds until it is: the pool re-plans every few
      // seconds while this is asked every tick, and an answer that lasted one tick was carried out
      // only when a re-plan fell on it (a second replica serving 2 % of a core held 79 s).
      want = step_down_;
    } else if (now - window_.front().first >= c.down_delay_s - 1e-9) {
      const double mean = mean_load(now);
      // One replica fewer only if it would have held every load of the last peak_window_s: on the
      // bursty code trace the mean over 15 s fell under the band between bursts, the service went
      // 2 -> 1 four times in 100 s, and a burst of 45 requests in 0.25 s met one replica while the
      // second waited for a training job's preemption (SLO 98.7 % against static's 100 %).
      // The size it aims at can be the current one (2 replicas at a mean of 0.65 aim at
      // ceil(0.65 / 0.6) = 2): no step then. Held as a step down, that answer stayed until the
      // replicas changed, which they never did: a service with a short peak_window_s kept its
      // peak's replicas for good (an outside review: 2 replicas at 0.2 requests/s for over 60 s).
      const double down = std::max(std::ceil(mean / c.target_utilisation - 1e-9), current - 1.0);
      if (mean < c.down_utilisation * current && peak_needed() <= current - 1.0 + 1e-9 && down < current) {
        want = down;
        step_down_ = want;
        window_.clear();  // the next step down waits another window
      }
    }
    return static_cast<int>(std::clamp(want, lo, hi));
  }

  /// Time-weighted mean of the load over the window (each sample holds until the next; the
  /// oldest one stands for the part of the window before it).
  double mean_load(double now) const {
    if (window_.empty()) return 0.0;
    const double start = now - config_.down_delay_s;
    double area = 0.0, span = 0.0;
    for (std::size_t i = 0; i < window_.size(); ++i) {
      const double from = std::max(i == 0 ? start : window_[i].first, start);
      const double to = i + 1 < window_.size() ? window_[i + 1].first : now;
      if (to > from) area += window_[i].second * (to - from), span += to - from;
    }
    return span > 0.0 ? area / span : window_.back().second;
  }

  /// The most replicas any load of the last peak_window_s needed not to ask for more (0: none seen).
  double peak_needed() const { return peaks_.empty() ? 0.0 : peaks_.front().second; }

  /// Drops the peaks seen: the service stopped reporting, and its last peak no longer holds replicas.
  void forget_peaks() { peaks_.clear(); }

 private:
  void note_peak(double now, double needed) {
    // A sliding maximum: each entry is larger than every later one, so the front is the window's.
    while (!peaks_.empty() && peaks_.back().second <= needed) peaks_.pop_back();
    peaks_.push_back({now, needed});
    while (peaks_.front().first < now - config_.peak_window_s) peaks_.pop_front();
  }

  autoscaler_config config_;
  std::deque<std::pair<double, double>> peaks_;   ///< (time, replicas needed), decreasing, peak_window_s at most
  std::deque<std::pair<double, double>> window_;  ///< (time, load) since the last change, down_delay_s at most
  int seen_current_ = -1;
  double step_down_ = -1.0;  ///< a step down decided for seen_current_, held until the replicas change
  double step_up_ = -1.0;    ///< a step up decided, held until the replicas reach it (or it lapses)
  double up_at_ = 0.0;       ///< when the load last asked for a step up
};

/// A running job as the scaler sees it.
struct scale_job {
  std::string job;
  std::string kind = "training";
  std::string priority = "normal";
  bool elastic = true;
  int min_size = 1, max_size = 1;
  int current = 0;              ///< workers it holds now
  std::vector<double> speedup;  ///< speedup[k], k = 0..max_size (training; empty: linear)
  double change_penalty = 1.0;  ///< arbiter's penalty for moving it (resize cost over its age)
  int replicas_wanted = -1;     ///< inference: the autoscaler's answer (-1: keep current)
  /// Training: its remaining work in seconds on one worker, from the remaining-work estimator
  /// (signals/remaining_work.hpp); < 0: unknown (counts as the shortest, as a new job).
  double remaining_size_s = -1.0;
};

/// Priority weight on a job's speedup in the arbiter's objective: 0.5, 1, 2, 4 for low..critical.
inline double priority_weight(const std::string& priority) {
  return std::pow(2.0, static_cast<double>(priority_level(priority)) - 1.0);
}

/// Throws std::invalid_argument naming the job and field of a scale_job the planner cannot take.
inline void check_scale_jobs(const std::vector<scale_job>& jobs) {
  std::set<std::string> seen;
  for (const auto& j : jobs) {
    const auto bad = [&](const char* field, const std::string& what) {
      dra::detail::throw_invalid(std::string("jobs['") + j.job + "']." + field, what);
    };
    if (j.job.empty()) dra::detail::throw_invalid("jobs[].job", "is empty; name every job");
    if (!seen.insert(j.job).second) bad("job", "is listed twice; list each job once");
    if (j.kind != "training" && j.kind != "inference")
      bad("kind", "must be 'training' or 'inference', got '" + j.kind + "'");
    if (j.min_size < 0) bad("min_size", "must be >= 0, got " + std::to_string(j.min_size));
    if (j.max_size < std::max(j.min_size, 1))
      bad("max_size", "must be >= 1 and >= min_size (" + std::to_string(j.min_size) + "), got " +
                          std::to_string(j.max_size) + "; raise max_size or lower min_size");
    if (j.current < 0) bad("current", "must be >= 0 (the workers it holds), got " + std::to_string(j.current));
    priority_level(j.priority);  // throws, naming the priority, on an unknown one
  }
}

/// Wanted sizes per job for `capacity` workers' worth of devices (identical devices). A plan sums
/// to at most `capacity`, except where what running jobs hold up to their minimums (a rigid job's
/// workers, min(min_size, current) of the others) exceeds it (the pool shrank under them): those
/// are kept, and the caller shrinks or stops jobs to fit. With a
/// `completion` config, training jobs' remaining sizes tilt the arbitration as the simulator's
/// convergence_aware policy does (the arbiter then runs at completion->power).
inline std::map<std::string, int> plan_sizes(const std::vector<scale_job>& jobs, int capacity,
                                             const policy::cluster_arbiter& arbiter,
                                             const policy::completion_config* completion = nullptr) {
  if (capacity < 0) dra::detail::throw_invalid("capacity", "must be >= 0, got " + std::to_string(capacity));
  check_scale_jobs(jobs);
  std::map<std::string, int> out;
  int left = capacity;
  // Rigid jobs keep what they hold; inference replicas come next (highest priority first).
  for (const auto& j : jobs)
    if (!j.elastic) out[j.job] = j.current, left -= j.current;
  std::vector<const scale_job*> inference, training;
  for (const auto& j : jobs)
    if (j.elastic) (j.kind == "inference" ? inference : training).push_back(&j);
  std::stable_sort(inference.begin(), inference.end(), [](const scale_job* a, const scale_job* b) {
    return priority_level(a->priority) > priority_level(b->priority);
  });
  int training_min = 0;
  for (const auto* j : training) training_min += std::min(j->min_size, j->current);
  // Services of one class divide what is left for them: first their minimums, then a replica at a
  // time to the one holding the least of its want (the admission's inference first does the same;
  // in arrival order, the first took every device and a second, as loaded, kept one replica).
  for (std::size_t first = 0; first < inference.size();) {
    std::size_t end = first + 1;
    while (end < inference.size() &&
           priority_level(inference[end]->priority) == priority_level(inference[first]->priority))
      ++end;
    // Past its minimum a service takes devices from training of its own class or lower only (as the
    // scheduler's inference-first does): a low-priority service's burst left a critical training
    // job at its minimum at the next re-plan.
    int above = 0;
    for (const auto* t : training)
      if (priority_level(t->priority) > priority_level(inference[first]->priority))
        above += t->current - std::min(t->min_size, t->current);
    std::vector<int> want, got;
    for (std::size_t i = first; i < end; ++i) {
      const scale_job* j = inference[i];
      want.push_back(std::clamp(j->replicas_wanted < 0 ? j->current : j->replicas_wanted, j->min_size, j->max_size));
      // Its minimum comes out of what rigid jobs and training's minimums leave (a new service on a
      // pool full of training at its minimums was planned past the capacity); the replicas it holds
      // up to its minimum are kept.
      const int floor = std::min(j->min_size, std::max(left - training_min, std::min(j->current, j->min_size)));
      got.push_back(std::max(floor, 0));
      left -= got.back();
    }
    for (int spare = left - training_min - above; spare > 0; --spare, --left) {
      std::size_t best = want.size();
      for (std::size_t i = 0; i < want.size(); ++i)
        if (got[i] < want[i] && (best == want.size() ||
                                 static_cast<double>(got[i]) / want[i] < static_cast<double>(got[best]) / want[best]))
          best = i;
      if (best == want.size()) break;
      ++got[best];
    }
    for (std::size_t i = first; i < end; ++i) out[inference[i]->job] = got[i - first];
    first = end;
  }
  left = std::max(left, 0);
  std::stable_sort(training.begin(), training.end(), [](const scale_job* a, const scale_job* b) {
    return priority_level(a->priority) > priority_level(b->priority);
  });
  std::vector<double> completion_weight(training.size(), 1.0);
  if (completion) {
    completion->validate();
    std::vector<double> size;
    for (const auto* j : training) size.push_back(std::max(j->remaining_size_s, 0.0));
    completion_weight = policy::completion_weights(size, completion->exponent);
  }
  policy::arbiter_config ac = arbiter.config();
  if (completion) ac.p = completion->power;
  std::vector<policy::arbiter_job> in;
  for (std::size_t t = 0; t < training.size(); ++t) {
    const scale_job* j = training[t];
    policy::arbiter_job a;
    // The priority weight w enters the power mean as (sum w s^p)^(1/p), i.e. the speedup scaled by
    // w^(1/p): at Pollux's p = -1 a speedup scaled by w itself made a higher class worth less per
    // device (a critical job got 1 device of 5, a low one 4).
    const double w = std::pow(priority_weight(j->priority), 1.0 / ac.p) *
                     (completion ? completion->factor(completion_weight[t]) : 1.0);
    // No job gets more than the devices there are: its curve stops there (a max_size of 2e9 sized
    // it by max_size, 16 GB).
    const int top = std::min(j->max_size, std::max({left, j->current, j->min_size}));  // the arbiter reads min_size
    a.speedup.assign(static_cast<std::size_t>(top) + 1, 0.0);
    for (int k = 1; k <= top; ++k) {
      const auto ku = static_cast<std::size_t>(k);
      const double s = j->speedup.size() > ku ? j->speedup[ku] : static_cast<double>(k);
      a.speedup[ku] = w * std::max(0.0, std::isfinite(s) ? s : 0.0);
    }
    // Starting a waiting job beats growing a running one (completion_config::admission; one
    // worker is the unit of a pool's speedups).
    if (completion) a.presence = priority_weight(j->priority) * completion->presence(completion_weight[t], 1.0);
    a.current = j->current;
    a.change_penalty = std::clamp(j->change_penalty, 0.0, 1.0);
    a.min_devices = j->min_size;
    in.push_back(std::move(a));
  }
  const std::vector<int> alloc = policy::cluster_arbiter(ac).allocate(in, left);
  for (std::size_t i = 0; i < training.size(); ++i)
    out[training[i]->job] = std::max(alloc[i], std::min(training[i]->min_size, training[i]->current));
  return out;
}

}  // namespace dra::pool
