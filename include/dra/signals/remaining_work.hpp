#pragma once
// How much work a job has left, from what a scheduler can know: the budget it declared (possibly
// wrong, possibly absent), its progress, its learning curve, and the jobs of its class that already
// finished. One estimator for the simulator, the live engine and the device pool (model and
// sources: docs/guide/policy.md, "Remaining work").
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"

namespace dra::signals {

namespace detail {

inline double normal_cdf(double z) {
  return 0.5 * std::erfc(-z / std::sqrt(2.0));
}

/// Inverse of the standard normal CDF (Acklam's rational approximation, refined by one Halley
/// step: about 1e-15 relative error). p is clamped to (1e-300, 1 - 1e-16).
inline double normal_quantile(double p) {
  p = std::clamp(p, 1e-300, 1.0 - 1e-16);
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    const double q = std::sqrt(-2.0 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  } else if (p <= 1.0 - 0.02425) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  } else {
    const double q = std::sqrt(-2.0 * std::log(1.0 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  }
  const double e = normal_cdf(x) - p;
  const double u = e * 2.5066282746310002 * std::exp(x * x / 2.0);  // sqrt(2 pi): M_PI is not standard C++
  return x - u / (1.0 + x * u / 2.0);
}

/// Running mean and variance (Welford), with a prior worth `count` observations.
struct running_moments {
  double n = 0.0, mean = 0.0, m2 = 0.0;
  void add(double x) {
    n += 1.0;
    const double d = x - mean;
    mean += d / n;
    m2 += d * (x - mean);
  }
  /// (mean, standard deviation) shrunk towards (prior_mean, prior_sd) with `prior_count` weight.
  std::pair<double, double> shrunk(double prior_mean, double prior_sd, double prior_count) const {
    const double w = n + prior_count;
    const double mu = (n * mean + prior_count * prior_mean) / w;
    const double ss =
        m2 + prior_count * prior_sd * prior_sd + n * prior_count / w * (mean - prior_mean) * (mean - prior_mean);
    return {mu, std::sqrt(ss / w)};
  }
};

}  // namespace detail

/// Epoch (or step) at which a falling loss-like curve stops improving, Optimus-style: fits
/// loss(e) = 1 / (a e + b) + c (c on a grid below the lowest value, a and b by least squares on
/// 1 / (loss - c)) and returns the first e from which a further 10 % of training improves the fit by
/// less than 1 %. NaN when the points do not support a descending fit (fewer than 3, or rising), or
/// when the fit keeps improving past 100 x the last point (a loss with no floor in sight).
inline double curve_convergence_point(const std::vector<std::pair<double, double>>& curve) {
  if (curve.size() < 3) return std::numeric_limits<double>::quiet_NaN();
  double lowest = INFINITY;
  for (const auto& h : curve) lowest = std::min(lowest, h.second);
  if (!(lowest > 0.0) || !std::isfinite(lowest)) return std::numeric_limits<double>::quiet_NaN();
  double best_err = INFINITY, best_a = 0.0, best_b = 0.0, best_c = 0.0;
  const double n = static_cast<double>(curve.size());
  for (int g = 0; g < 20; ++g) {
    const double c = lowest * 0.05 * g;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [e, l] : curve) {
      const double y = 1.0 / std::max(l - c, 1e-12);
      sx += e, sy += y, sxx += e * e, sxy += e * y;
    }
    const double den = n * sxx - sx * sx;
    if (!(std::abs(den) > 0.0)) continue;
    const double a = (n * sxy - sx * sy) / den, b = (sy - a * sx) / n;
    if (!(a > 0.0)) continue;
    double err = 0.0;
    for (const auto& [e, l] : curve) {
      const double pred = 1.0 / std::max(a * e + b, 1e-12) + c;
      err += (pred - l) * (pred - l);
    }
    if (err < best_err) best_err = err, best_a = a, best_b = b, best_c = c;
  }
  if (!std::isfinite(best_err)) return std::numeric_limits<double>::quiet_NaN();
  auto loss = [&](double e) { return 1.0 / std::max(best_a * e + best_b, 1e-12) + best_c; };
  const double first = std::max(curve.back().first, 1.0);
  for (double e = first; e < 100.0 * first; e *= 1.02)
    if (loss(e) - loss(1.1 * e) < 0.01 * loss(e)) return e;
  return std::numeric_limits<double>::quiet_NaN();
}

struct remaining_work_config {
  /// Log-scale error assumed for a declaration before finished jobs calibrate it (0.5: a budget
  /// off by a factor of 1.6 is one standard deviation).
  double declared_sigma = 0.5;
  /// Log-scale error assumed for a learning-curve extrapolation before finished jobs calibrate it.
  double curve_sigma = 1.0;
  /// With no declaration, no curve and no history: total ~ twice the work done (the median of a
  /// scale-free prior), with this log-scale spread. New jobs then look short: least attained
  /// service first, the classic answer when sizes are unknown.
  double uninformed_sigma = 1.5;
  /// Pseudo-observations of the priors above when history calibrates a source.
  double prior_count = 2.0;
  /// Finished jobs of a class before the class's own history is used (else all classes pooled).
  int min_class_jobs = 3;
  /// Points of the learning curve before it is fitted.
  int min_curve_points = 4;
  /// Smallest log-scale spread of any estimate (a perfectly repeatable class still gets some).
  double min_sigma = 0.02;
  /// Quantile reported as the tail (p90 by default).
  double tail_quantile = 0.9;

  void validate() const {
    auto positive = [](const char* f, double v) {
      if (!(v > 0.0) || !std::isfinite(v))
        dra::detail::throw_invalid(f, "must be a finite number > 0, got " + std::to_string(v));
    };
    positive("declared_sigma", declared_sigma);
    positive("curve_sigma", curve_sigma);
    positive("uninformed_sigma", uninformed_sigma);
    positive("min_sigma", min_sigma);
    if (!(prior_count >= 0.0) || !std::isfinite(prior_count))
      dra::detail::throw_invalid("prior_count", "must be >= 0, got " + std::to_string(prior_count));
    if (min_class_jobs < 1)
      dra::detail::throw_invalid("min_class_jobs", "must be >= 1, got " + std::to_string(min_class_jobs));
    if (min_curve_points < 3)
      dra::detail::throw_invalid("min_curve_points",
                                 "must be >= 3 (a fit needs 3 points), got " + std::to_string(min_curve_points));
    if (!(tail_quantile > 0.5 && tail_quantile < 1.0))
      dra::detail::throw_invalid("tail_quantile", "must lie in (0.5, 1), got " + std::to_string(tail_quantile));
  }
};

/// What a job reports about its own progress: only quantities a running job knows.
struct work_observation {
  std::string job_class;  ///< jobs of one class share history (e.g. the model being trained)
  /// Total work the job declared (epochs or steps, the unit of `done`); NaN: declared nothing.
  double declared = std::numeric_limits<double>::quiet_NaN();
  double done = 0.0;  ///< work done so far (fractional epochs or steps)
  /// (work done, loss-like value that falls as the model learns), oldest first; may be empty.
  std::vector<std::pair<double, double>> curve;
};

/// Remaining work (the unit of `done`) as a distribution: log-normal total work conditioned on
/// the work already done.
struct work_estimate {
  double median = 0.0;                               ///< remaining work, median
  double mean = 0.0;                                 ///< remaining work, mean
  double tail = 0.0;                                 ///< remaining work at the configured tail quantile (p90)
  double total_log_mu = 0.0, total_log_sigma = 0.0;  ///< log-normal of the total, before conditioning
  int sources = 0;                                   ///< bit set: 1 declaration, 2 class history, 4 learning curve
  /// The cap: log of the largest total a finished job of the class reached, or of the job's own
  /// declaration (bias-corrected) where it lies beyond that by more than twice the declarations'
  /// measured error (+inf: no class history). The total lies beyond it with probability at
  /// most `beyond_cap`, 1 / (k + 1) for k finished jobs of the class that ran longer than this job
  /// has so far (exchangeability: one more job of the class is the longest with that chance); the
  /// rest of the belief's mass beyond the cap sits on the cap (detail::total_law).
  double cap_log = std::numeric_limits<double>::infinity();
  double beyond_cap = 1.0;
};

namespace detail {

/// The law of a job's total work T given T > done: the log-normal N(mu, sigma) in log T
/// conditioned on T > done, censored at the cap. Where that belief puts more than `beyond` beyond the
/// cap, the excess sits on the cap itself (jobs of a class stop at its budget), and `beyond` keeps
/// the belief's shape past it; otherwise, and without a cap (none, at or below done), the belief is
/// left as it is.
class total_law {
 public:
  total_law(double mu, double sigma, double done, double cap_log, double beyond)
      : mu_(mu), s_(std::max(sigma, 1e-9)), done_(done) {
    const double f0 = cdf(done);
    if (!(1.0 - f0 > 1e-12)) return;  // done lies past the belief's far tail
    f0_ = f0;
    lo_ = 1.0 / (1.0 - f0);
    if (!(std::isfinite(cap_log) && std::exp(cap_log) > done)) return;
    const double cap = std::exp(cap_log), fc = cdf(cap);
    const double past = (1.0 - fc) * lo_;  // the belief's mass beyond the cap
    beyond = std::clamp(beyond, 0.0, 1.0);
    if (!(past > beyond)) return;
    cap_ = cap;
    fc_ = fc;
    atom_ = past - beyond;
    hi_ = 1.0 - fc > 1e-12 ? beyond / (1.0 - fc) : 0.0;
  }

  /// Whether T > done has any mass under the belief (else done lies past its far tail).
  bool alive() const { return lo_ > 0.0; }

  /// P(T <= t | T > done).
  double cdf_given(double t) const {
    if (!alive()) return t > done_ * (1.0 + s_) ? 1.0 : 0.0;
    if (t <= done_) return 0.0;
    if (t < cap_) return (cdf(t) - f0_) * lo_;
    return std::min(1.0, (fc_ - f0_) * lo_ + atom_ + (cdf(t) - fc_) * hi_);
  }

  /// The total at quantile q in [0, 1) of T given T > done.
  double quantile(double q) const {
    if (!alive()) return done_ * (1.0 + s_);  // past the far tail: a little more than done
    const double below = (fc_ - f0_) * lo_;   // mass under the cap (all of it without one)
    if (!std::isfinite(cap_) || q < below) {
      const double p = f0_ + q / lo_;
      if (!(p < 1.0 - 1e-12)) return done_ * (1.0 + s_);
      return std::clamp(std::exp(mu_ + s_ * normal_quantile(p)), done_, cap_);
    }
    if (q < below + atom_ || !(hi_ > 0.0)) return cap_;
    const double p = fc_ + (q - below - atom_) / hi_;
    if (!(p < 1.0 - 1e-12)) return cap_ * (1.0 + s_);
    return std::max(std::exp(mu_ + s_ * normal_quantile(p)), cap_);
  }

  /// E[T; a < T <= b | T > done].
  double partial(double a, double b) const {
    if (!alive()) return 0.0;
    double out = lo_ * raw_partial(std::max(a, done_), std::min(b, cap_));
    if (std::isfinite(cap_)) {
      if (a < cap_ && cap_ <= b) out += atom_ * cap_;
      out += hi_ * raw_partial(std::max(a, cap_), b);
    }
    return out;
  }

  /// E[T | T > done]; past the far tail, a little more than done.
  double mean() const { return alive() ? partial(done_, INFINITY) : done_ * (1.0 + s_); }

 private:
  double cdf(double t) const { return t > 0.0 ? normal_cdf((std::log(t) - mu_) / s_) : 0.0; }
  // E[T; a < T <= b] for the log-normal itself.
  double raw_partial(double a, double b) const {
    if (!(b > a)) return 0.0;
    const double za = a > 0.0 ? (std::log(a) - mu_ - s_ * s_) / s_ : -INFINITY;
    const double zb = std::isfinite(b) ? (std::log(b) - mu_ - s_ * s_) / s_ : INFINITY;
    return std::exp(mu_ + s_ * s_ / 2.0) * (normal_cdf(zb) - normal_cdf(za));
  }

  double mu_, s_, done_;
  double f0_ = 0.0, fc_ = 1.0, cap_ = INFINITY;
  double lo_ = 0.0, hi_ = 0.0, atom_ = 0.0;  // density scales under and beyond the cap; the mass on it
};

}  // namespace detail

/// The size a job counts as when jobs are ranked shortest-first under uncertainty: 1 / its Gittins
/// index, the least "expected work spent" per "chance of finishing" over quanta ending at the
/// remaining-work quantiles 5 %, 10 %, ..., 95 %, 99 % (the Gittins rule minimises mean completion
/// time on one server when sizes are known only as distributions). A sure size counts as itself;
/// an uncertain one between its median and its mean: a job that may well be nearly done (a heavy
/// left tail) gains, a job whose spread is mostly upwards counts as longer than its median.
inline double gittins_size(const work_estimate& e, double done) {
  const detail::total_law law(e.total_log_mu, e.total_log_sigma, done, e.cap_log, e.beyond_cap);
  if (!law.alive()) return std::max(e.median, 1e-12);
  double best = INFINITY;
  for (double q : {0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
                   0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99}) {
    const double u = law.quantile(q);          // total at this quantile
    const double finished = law.cdf_given(u);  // q, or more where u is the cap and its mass
    if (!(u > done) || !(finished > 0.0)) continue;
    // E[min(T, u) - done | T > done]: the work spent on a quantum that ends at total u.
    const double spent = law.partial(done, u) + u * (1.0 - finished) - done;
    best = std::min(best, spent / finished);
  }
  return std::isfinite(best) ? std::max(best, 1e-12) : std::max(e.median, 1e-12);
}

inline std::string describe_sources(int sources) {
  if (sources == 0) return "none (least attained service)";
  std::string s;
  if (sources & 1) s += "declared";
  if (sources & 2) s += std::string(s.empty() ? "" : "+") + "history";
  if (sources & 4) s += std::string(s.empty() ? "" : "+") + "curve";
  return s;
}

/// Estimates remaining work and learns, from finished jobs, how good each source is.
///
/// Each source gives a log-normal belief about the job's total work T:
///  - history of its class (finished jobs' totals): the prior;
///  - its declaration D: log T = log D + bias, the bias and spread measured on finished jobs that
///    declared (their class, else all classes), shrunk towards (0, declared_sigma);
///  - its learning curve: the Optimus-style convergence point, calibrated the same way on the
///    curves of finished jobs.
/// Beliefs are combined by precision (a Gaussian product in log T), then conditioned on T > done;
/// the remaining work T - done is reported as median, mean and tail quantile. Deterministic.
class remaining_work_estimator {
 public:
  explicit remaining_work_estimator(remaining_work_config config = {}) : config_((config.validate(), config)) {}
  const remaining_work_config& config() const noexcept { return config_; }

  /// A job finished after `total` work (same unit as its observations). Its final observation
  /// (class, declaration, curve) calibrates the sources for later jobs.
  void record_completion(const work_observation& last, double total) {
    if (!(total > 0.0) || !std::isfinite(total)) return;
    const double lt = std::log(total);
    auto& c = classes_[last.job_class];
    c.totals.add(lt);
    c.recent.push_back(lt);
    if (c.recent.size() > recent_totals) c.recent.pop_front();
    if (last.declared > 0.0 && std::isfinite(last.declared)) {
      c.declared.add(lt - std::log(last.declared));
      pooled_declared_.add(lt - std::log(last.declared));
    }
    // The curve as it looked at a quarter, half and three quarters of the job's life.
    for (double f : {0.25, 0.5, 0.75}) {
      std::vector<std::pair<double, double>> head;
      for (const auto& p : last.curve)
        if (p.first <= f * total) head.push_back(p);
      if (static_cast<int>(head.size()) < config_.min_curve_points) continue;
      const double tc = curve_convergence_point(head);
      if (!(tc > 0.0) || !std::isfinite(tc)) continue;
      const double r = lt - std::log(std::max(tc, head.back().first));
      c.curve.add(r);
      pooled_curve_.add(r);
    }
    ++completed_;
  }

  /// Finished jobs recorded so far (all classes).
  int completed() const noexcept { return completed_; }
  /// Finished jobs of one class.
  int completed(const std::string& job_class) const {
    const auto it = classes_.find(job_class);
    return it == classes_.end() ? 0 : static_cast<int>(it->second.totals.n);
  }

  /// Every figure of the result is finite and >= 0 whatever the observation: a `done` that is negative
  /// or not a finite number counts as 0 (nothing known to be done; the device pool passes what a job
  /// reported, unchecked), and a total beyond the largest double is reported as the largest double.
  work_estimate estimate(const work_observation& obs) const {
    const double done = std::isfinite(obs.done) ? std::max(obs.done, 0.0) : 0.0;
    const auto it = classes_.find(obs.job_class);
    const class_history* hist = it == classes_.end() ? nullptr : &it->second;
    double precision = 0.0, weighted = 0.0;
    int sources = 0;
    auto add = [&](double mu, double sigma) {
      const double s = std::max(sigma, config_.min_sigma);
      precision += 1.0 / (s * s);
      weighted += mu / (s * s);
    };
    const bool own = hist && hist->totals.n >= config_.min_class_jobs;
    if (own) {
      // Predictive spread of one more job of the class.
      const double n = hist->totals.n;
      const double sd = std::sqrt(hist->totals.m2 / std::max(n - 1.0, 1.0) * (1.0 + 1.0 / n));
      add(hist->totals.mean, sd);
      sources |= 2;
    }
    double declared_log = -INFINITY, declared_sd = INFINITY;  // the declaration, corrected, and its error
    if (obs.declared > 0.0 && std::isfinite(obs.declared)) {
      const auto& m = own && hist->declared.n >= config_.min_class_jobs ? hist->declared : pooled_declared_;
      const auto [bias, sd] = m.shrunk(0.0, config_.declared_sigma, config_.prior_count);
      declared_log = std::log(obs.declared) + bias;
      declared_sd = sd;
      add(declared_log, sd);
      sources |= 1;
    }
    if (static_cast<int>(obs.curve.size()) >= config_.min_curve_points) {
      const double tc = curve_convergence_point(obs.curve);
      if (tc > 0.0 && std::isfinite(tc)) {
        const auto& m = own && hist->curve.n >= config_.min_class_jobs ? hist->curve : pooled_curve_;
        const auto [bias, sd] = m.shrunk(0.0, config_.curve_sigma, config_.prior_count);
        add(std::log(std::max(tc, obs.curve.back().first)) + bias, sd);
        sources |= 4;
      }
    }
    if (sources == 0) return uninformed(done);
    const double mu = weighted / precision, sigma = std::sqrt(1.0 / precision);
    if (!own) return conditioned(mu, sigma, done, sources);
    // The cap: no finished job of the class ran past its longest, but with probability 1 / (k + 1)
    // this one will (k: those that ran longer than this one has so far). Without it a job near its
    // end kept a remainder in proportion to the belief's spread times the work done: 3.6x the truth
    // at 90 % of a job's life. A declaration beyond the longest raises the cap to it when it lies
    // beyond by more than twice the declarations' measured error (a longer run declared on
    // purpose), not when it is within their noise.
    double cap = *std::max_element(hist->recent.begin(), hist->recent.end());
    if (declared_log - 2.0 * declared_sd > cap) cap = declared_log;
    const double log_done = done > 0.0 ? std::log(done) : -INFINITY;
    const auto longer = std::count_if(hist->recent.begin(), hist->recent.end(), [&](double l) { return l > log_done; });
    return conditioned(mu, sigma, done, sources, cap, 1.0 / (static_cast<double>(longer) + 1.0));
  }

  /// Nothing known: a log-normal total of spread uninformed_sigma placed so that, given the work
  /// done, the median remaining work equals it (a scale-free prior: a job that ran longer is
  /// expected to run longer still). New jobs then look shortest.
  work_estimate uninformed(double done) const {
    const double s = config_.uninformed_sigma, d = std::max(done, 1e-9);
    double lo = std::log(d) - 10.0 * s, hi = std::log(d) + 5.0 * s;
    for (int i = 0; i < 100; ++i) {
      const double mid = 0.5 * (lo + hi);
      (conditioned(mid, s, d, 0).median < d ? lo : hi) = mid;
    }
    return conditioned(0.5 * (lo + hi), s, d, 0);
  }

  /// The log-normal total N(mu, sigma) conditioned on total > done, as remaining work; with a cap
  /// (cap_log, beyond_cap: see work_estimate), the total lies beyond it with at most that probability.
  work_estimate conditioned(double mu, double sigma, double done, int sources,
                            double cap_log = std::numeric_limits<double>::infinity(), double beyond_cap = 1.0) const {
    work_estimate out;
    out.total_log_mu = mu;
    out.total_log_sigma = sigma;
    out.sources = sources;
    out.cap_log = cap_log;
    out.beyond_cap = beyond_cap;
    const detail::total_law law(mu, sigma, done, cap_log, beyond_cap);
    out.median = std::max(law.quantile(0.5) - done, 0.0);
    out.tail = std::max(law.quantile(config_.tail_quantile) - done, 0.0);
    out.mean = std::max(law.mean() - done, out.median);
    // A total beyond the largest double (a declaration or a done near it) is reported as that.
    for (double* v : {&out.median, &out.mean, &out.tail})
      if (!(*v <= std::numeric_limits<double>::max())) *v = std::numeric_limits<double>::max();
    return out;
  }

 private:
  /// Finished totals kept per class for the cap (the most recent ones: a class's budget may drift).
  static constexpr std::size_t recent_totals = 512;

  struct class_history {
    detail::running_moments totals;    ///< log total work of finished jobs
    std::deque<double> recent;         ///< log totals of the latest finished jobs, oldest first
    detail::running_moments declared;  ///< log(total / declared) of those that declared
    detail::running_moments curve;     ///< log(total / curve convergence point)
  };

  remaining_work_config config_;
  std::map<std::string, class_history> classes_;
  detail::running_moments pooled_declared_, pooled_curve_;
  int completed_ = 0;
};

}  // namespace dra::signals
