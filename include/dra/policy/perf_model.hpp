#pragma once
// Pollux's step-time model, fitted online from what a job has measured, and the goodput search
// over batch sizes that Pollux (and dra's convergence-aware policies) run on top of it.
//
// Model (Pollux, OSDI'21), with a per-replica atomic batch b and `accum` extra micro-batches:
//   T_accum(b)   = alpha_c + beta_c * b                                 (one forward/backward)
//   T_net(n, r)  = alpha_n + beta_n * max(r - 2, 0)   when the job spans more than one node
//                = alpha_r + beta_r * max(r - 2, 0)   when it has several replicas on one node
//                = ~0                                  for one replica
//   T_optim      = (T_accum^gamma + T_net^gamma)^(1/gamma)              (overlap of compute and sync)
//   T_step       = accum * T_accum + T_optim
// Before the first measurement there is no model: callers use a linear-speedup prior (speedup =
// replicas), as Pollux does. Each new (nodes, replicas, atomic batch) measurement refits the seven
// parameters by minimising Pollux's objective, RMS log error of the accumulation-step and the
// optimizer-step time plus two small regularisers, under the same bounds and the same rules for
// fixing parameters the data cannot identify. The minimiser is L-BFGS (LBFGSpp) with an analytic
// gradient, on parameters transformed so that the bounds always hold (p = 1e-8 + e^u for the six
// times, gamma = 1 + 9 sigmoid(v)); Pollux runs scipy's L-BFGS-B on the raw parameters. The
// objective is the same, so is its minimiser; the best point evaluated is kept, because the RMS
// terms have a kink at a perfect fit where line searches stop early.
//
// Efficiency: with |G|^2 = sqr and tr(Sigma) = var measured at the initial batch M0, a global batch
// M = scale * M0 makes (var + sqr) / (var/scale + sqr) steps' worth of progress per step (AdaScale);
// goodput = throughput * that gain / scale.
#if !__has_include(<LBFGS.h>)
#error "dra/policy/perf_model.hpp needs the header-only LBFGSpp library (Debian/Ubuntu: apt-get install liblbfgspp-dev)"
#endif
#include <LBFGS.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dra/error.hpp"

namespace dra::policy {

/// alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma.
struct perf_params {
  double alpha_c = 0.1, beta_c = 0.01, alpha_n = 0.1, beta_n = 0.01, alpha_r = 0.1, beta_r = 0.01, gamma = 1.001;

  double accum_time(double atomic_bsz) const { return alpha_c + beta_c * atomic_bsz; }
  double network_time(int nodes, int replicas) const {
    const double extra = std::max(static_cast<double>(replicas) - 2.0, 1e-8);
    if (nodes > 1) return alpha_n + beta_n * extra;
    if (replicas > 1) return alpha_r + beta_r * extra;
    return 1e-8 + 1e-8 * extra;
  }
  double optim_time(double accum, double network) const {
    return std::exp(std::log(std::pow(accum, gamma) + std::pow(network, gamma)) / gamma);
  }
  /// Seconds per optimizer step.
  double step_time(int nodes, int replicas, double atomic_bsz, int accum_steps) const {
    const double a = accum_time(atomic_bsz);
    return accum_steps * a + optim_time(a, network_time(nodes, replicas));
  }
};

/// Statistical efficiency terms of one job at its current point of training.
struct grad_stats {
  double sqr = 0.0;  ///< |G|^2
  double var = 0.0;  ///< tr(Sigma) at the initial batch
};

/// AdaScale gain of a global batch `scale` times the initial one: progress per step, in steps at M0.
inline double adascale_progress_gain(const grad_stats& g, double scale) {
  const double denom = g.var / scale + g.sqr;
  return denom > 0.0 ? (g.var + g.sqr) / denom : 1.0;
}

/// Limits of the batch search (Pollux's GoodputFunction.optimize with accumulation).
struct batch_limits {
  double init_batch = 1.0;  ///< M0: the batch at which grad_stats are expressed
  double max_batch = 1.0;   ///< largest total batch (Pollux: the largest validated one)
  double min_atomic = 1.0;  ///< smallest per-replica micro-batch
  double max_atomic = 1.0;  ///< largest per-replica micro-batch (above: gradient accumulation)
  int candidates = 50;      ///< total batches tried, geometric between the bounds

  /// Throws std::invalid_argument naming the field: every batch a finite number >= 1 (a micro-batch
  /// is whole samples), min_atomic <= max_atomic, init_batch <= max_batch, and at most 2^30
  /// micro-batches in the largest batch (more overflowed the accumulation count, an int).
  void validate() const {
    for (const auto& [name, v] : {std::pair<const char*, double>{"init_batch", init_batch},
                                  {"max_batch", max_batch},
                                  {"min_atomic", min_atomic},
                                  {"max_atomic", max_atomic}})
      if (!(std::isfinite(v) && v >= 1.0))
        dra::detail::throw_invalid(name, "must be a finite number of samples >= 1, got " + std::to_string(v));
    if (min_atomic > max_atomic)
      dra::detail::throw_invalid("min_atomic", "must be <= max_atomic (" + std::to_string(max_atomic) + "), got " +
                                                   std::to_string(min_atomic));
    if (init_batch > max_batch)
      dra::detail::throw_invalid(
          "init_batch", "must be <= max_batch (" + std::to_string(max_batch) + "), got " + std::to_string(init_batch));
    if (max_batch / min_atomic > 1073741824.0)
      dra::detail::throw_invalid("max_batch",
                                 "holds more than 2^30 micro-batches of min_atomic; raise min_atomic or "
                                 "lower max_batch");
    if (candidates < 1) dra::detail::throw_invalid("candidates", "must be >= 1, got " + std::to_string(candidates));
  }
};

/// One configuration and its goodput (progress per second, in steps at M0).
struct batch_choice {
  double goodput = 0.0;
  double atomic = 0.0;
  int accum = 0;
};

/// Splits a total batch over `replicas` like Pollux does: ceil to whole micro-batches, accumulation
/// above max_atomic, at least one accumulation step for a single replica above M0, and the
/// micro-batch capped so that the total never exceeds max_batch (Pollux's batch cap).
struct batch_split {
  double atomic = 0.0;
  int accum = 0;
};
inline batch_split split_total_batch(double batch, int replicas, const batch_limits& lim, bool cap = true) {
  const double eps = 1e-8;
  const double local = std::ceil(batch / replicas - eps);
  int accum = static_cast<int>(std::ceil(local / lim.max_atomic - eps)) - 1;
  if (replicas == 1 && local > lim.init_batch + eps) accum = std::max(accum, 1);
  accum = std::max(accum, 0);
  double atomic = std::ceil(local / (accum + 1) - eps);
  if (cap) atomic = std::min(atomic, std::floor(lim.max_batch / (static_cast<double>(replicas) * (accum + 1)) + eps));
  return {std::max(atomic, 1.0), accum};
}

/// The batch with the best goodput at `replicas` devices: `step_time(atomic, accum)` predicts seconds
/// per step. Candidates whose micro-batch leaves [min_atomic, max_atomic] are skipped; the chosen
/// micro-batch is then capped so that the total batch stays within max_batch.
template <class StepTime>
batch_choice best_batch(const StepTime& step_time, const grad_stats& g, int replicas, const batch_limits& lim) {
  lim.validate();
  batch_choice best;
  if (replicas < 1) return best;
  const double eps = 1e-8;
  const double lo = std::max(lim.init_batch, lim.min_atomic * replicas);
  const double hi = lim.max_batch;
  if (lo > hi + eps) return best;
  const int n = std::max(1, lim.candidates);
  for (int i = 0; i < n; ++i) {
    const double batch = n == 1 || hi <= lo ? lo : lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1));
    const batch_split s = split_total_batch(batch, replicas, lim, false);
    if (s.atomic < lim.min_atomic - eps || s.atomic > lim.max_atomic + eps) continue;
    const double total = static_cast<double>(replicas) * s.atomic * (s.accum + 1);
    const double t = step_time(s.atomic, s.accum);
    if (!(t > 0.0)) continue;
    const double scale = total / lim.init_batch;
    const double goodput = adascale_progress_gain(g, scale) / t;
    if (goodput > best.goodput) best = {goodput, s.atomic, s.accum};
  }
  if (best.goodput > 0.0) {
    const double count = static_cast<double>(replicas) * (best.accum + 1);
    best.atomic = std::max(1.0, std::min(best.atomic, std::floor(lim.max_batch / count + eps)));
  }
  return best;
}

/// Pollux's throughput model of one job, refitted on every new measured configuration.
class perf_model {
 public:
  bool fitted() const noexcept { return fitted_; }
  const perf_params& params() const noexcept { return params_; }
  std::size_t configurations() const noexcept { return profile_.size(); }
  /// Most replicas the job has been measured on (Pollux's exploration limit is twice this).
  int max_profiled_replicas() const noexcept { return max_replicas_; }

  /// One measured step. Refits only when the configuration is new (as Pollux does). Returns true
  /// when it refitted.
  bool observe(int nodes, int replicas, double atomic_bsz, double step_time_s, double sync_time_s) {
    if (nodes < 1 || replicas < nodes || !(atomic_bsz > 0.0) || !(step_time_s > sync_time_s) || sync_time_s < 0.0 ||
        !std::isfinite(step_time_s))
      return false;
    const auto key = std::make_tuple(nodes, replicas, atomic_bsz);
    if (profile_.count(key)) return false;
    profile_.emplace(key, std::make_pair(step_time_s, sync_time_s));
    max_replicas_ = std::max(max_replicas_, replicas);
    refit();
    return true;
  }

  /// Predicted seconds per step (requires fitted()).
  double step_time(int nodes, int replicas, double atomic_bsz, int accum_steps) const {
    return params_.step_time(nodes, replicas, atomic_bsz, accum_steps);
  }

 private:
  struct objective {
    std::vector<int> nodes, replicas;
    std::vector<double> bsz, log_accum, log_optim;
    std::array<int, 7> free{};  ///< index into the full parameter vector of each free variable
    int n_free = 0;
    perf_params fixed;

    perf_params unpack(const Eigen::VectorXd& x) const {
      std::array<double, 7> p{fixed.alpha_c, fixed.beta_c, fixed.alpha_n, fixed.beta_n,
                              fixed.alpha_r, fixed.beta_r, fixed.gamma};
      for (int i = 0; i < n_free; ++i) p[static_cast<std::size_t>(free[static_cast<std::size_t>(i)])] = x[i];
      return {p[0], p[1], p[2], p[3], p[4], p[5], p[6]};
    }

    // Pollux's objective: RMSLE(accum) + RMSLE(optim) + 1e-3 (gamma - 1)^2
    //                     + 1e-2 ((beta_n / alpha_n)^2 + (beta_r / alpha_r)^2), with its gradient.
    double operator()(const Eigen::VectorXd& x, Eigen::VectorXd& grad) const {
      const perf_params p = unpack(x);
      const std::size_t m = bsz.size();
      std::array<double, 7> g{};
      double s1 = 0.0, s2 = 0.0;
      std::vector<double> e1(m), e2(m);
      for (std::size_t i = 0; i < m; ++i) {
        const double a = p.accum_time(bsz[i]);
        const double net = p.network_time(nodes[i], replicas[i]);
        const double lo = std::log(std::pow(a, p.gamma) + std::pow(net, p.gamma)) / p.gamma;
        e1[i] = std::log(a) - log_accum[i];
        e2[i] = lo - log_optim[i];
        s1 += e1[i] * e1[i];
        s2 += e2[i] * e2[i];
      }
      const double md = static_cast<double>(m);
      // sqrt(mse + 1e-12) instead of sqrt(mse): the same minimiser to within 1e-6 in log error,
      // without the kink at a perfect fit that stops line searches.
      const double err1 = std::sqrt(s1 / md + 1e-12), err2 = std::sqrt(s2 / md + 1e-12);
      const double k1 = 1.0 / (err1 * md);
      const double k2 = 1.0 / (err2 * md);
      for (std::size_t i = 0; i < m; ++i) {
        const double a = p.accum_time(bsz[i]);
        const double net = p.network_time(nodes[i], replicas[i]);
        const double ag = std::pow(a, p.gamma), ng = std::pow(net, p.gamma);
        const double s = ag + ng;
        // d err1: e1 = log a - y
        g[0] += k1 * e1[i] / a;
        g[1] += k1 * e1[i] * bsz[i] / a;
        // d err2 through a, net and gamma.
        const double d_a = (ag / a) / s;    // d lo / d a = a^(g-1) / s
        const double d_n = (ng / net) / s;  // d lo / d net
        const double d_g = ((ag * std::log(a) + ng * std::log(net)) / s) / p.gamma - std::log(s) / (p.gamma * p.gamma);
        g[0] += k2 * e2[i] * d_a;
        g[1] += k2 * e2[i] * d_a * bsz[i];
        const double extra = std::max(static_cast<double>(replicas[i]) - 2.0, 1e-8);
        if (nodes[i] > 1) {
          g[2] += k2 * e2[i] * d_n;
          g[3] += k2 * e2[i] * d_n * extra;
        } else if (replicas[i] > 1) {
          g[4] += k2 * e2[i] * d_n;
          g[5] += k2 * e2[i] * d_n * extra;
        }
        g[6] += k2 * e2[i] * d_g;
      }
      const double rn = p.beta_n / p.alpha_n, rr = p.beta_r / p.alpha_r;
      g[6] += 2e-3 * (p.gamma - 1.0);
      g[2] += 1e-2 * 2.0 * rn * (-p.beta_n / (p.alpha_n * p.alpha_n));
      g[3] += 1e-2 * 2.0 * rn / p.alpha_n;
      g[4] += 1e-2 * 2.0 * rr * (-p.beta_r / (p.alpha_r * p.alpha_r));
      g[5] += 1e-2 * 2.0 * rr / p.alpha_r;
      grad.resize(n_free);
      for (int i = 0; i < n_free; ++i) grad[i] = g[static_cast<std::size_t>(free[static_cast<std::size_t>(i)])];
      return err1 + err2 + 1e-3 * (p.gamma - 1.0) * (p.gamma - 1.0) + 1e-2 * (rn * rn + rr * rr);
    }
  };

  // Pollux's objective in transformed coordinates, remembering the best point it was evaluated at.
  struct transformed {
    explicit transformed(const objective* o) : obj(o) {}
    const objective* obj;
    mutable double best_f = INFINITY;
    mutable Eigen::VectorXd best_x;
    static double to_param(int index, double z) {
      return index == 6 ? 1.0 + 9.0 / (1.0 + std::exp(-z)) : 1e-8 + std::exp(z);
    }
    static double from_param(int index, double p) {
      if (index == 6) {
        const double s = std::clamp((p - 1.0) / 9.0, 1e-12, 1.0 - 1e-12);
        return std::log(s / (1.0 - s));
      }
      return std::log(std::max(p - 1e-8, 1e-300));
    }
    double operator()(const Eigen::VectorXd& z, Eigen::VectorXd& grad) const {
      Eigen::VectorXd x(z.size());
      for (int i = 0; i < z.size(); ++i) x[i] = to_param(obj->free[static_cast<std::size_t>(i)], z[i]);
      Eigen::VectorXd g;
      const double f = (*obj)(x, g);
      grad.resize(z.size());
      for (int i = 0; i < z.size(); ++i) {
        const int k = obj->free[static_cast<std::size_t>(i)];
        double d;
        if (k == 6) {
          const double s = 1.0 / (1.0 + std::exp(-z[i]));
          d = 9.0 * s * (1.0 - s);
        } else {
          d = x[i] - 1e-8;
        }
        grad[i] = g[i] * d;
      }
      if (std::isfinite(f) && f < best_f) best_f = f, best_x = x;
      return f;
    }
  };

  void refit() {
    objective obj;
    bool multi_node = false, single_node_multi = false, beyond_two = false;
    std::vector<double> atomics;
    double accum_sum = 0.0;
    for (const auto& [key, val] : profile_) {
      const auto [n, r, b] = key;
      obj.nodes.push_back(n);
      obj.replicas.push_back(r);
      obj.bsz.push_back(b);
      obj.log_accum.push_back(std::log(val.first - val.second));
      obj.log_optim.push_back(std::log(val.first));
      accum_sum += val.first - val.second;
      multi_node |= n > 1;
      single_node_multi |= n == 1 && r > 1;
      beyond_two |= r > 2;
      if (std::find(atomics.begin(), atomics.end(), b) == atomics.end()) atomics.push_back(b);
    }
    // Start and bounds as Pollux: 0.1, 0.01 for each pair, gamma 1.001 in [1, 10], others >= 1e-8.
    std::array<double, 7> start{1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3};
    const std::array<double, 7> lower{1e-8, 1e-8, 1e-8, 1e-8, 1e-8, 1e-8, 1.0};
    std::array<bool, 7> fix{};
    // Parameters the data cannot identify are fixed, as Pollux fixes them.
    if (atomics.size() == 1) start[0] = accum_sum / static_cast<double>(profile_.size()) / 2.0, fix[0] = true;
    if (!multi_node) start[2] = lower[2], start[3] = lower[3], fix[2] = fix[3] = true;
    if (!single_node_multi) start[4] = lower[4], start[5] = lower[5], fix[4] = fix[5] = true;
    if (!beyond_two) start[3] = lower[3], start[5] = lower[5], fix[3] = fix[5] = true;
    obj.fixed = {start[0], start[1], start[2], start[3], start[4], start[5], start[6]};
    for (int i = 0; i < 7; ++i)
      if (!fix[static_cast<std::size_t>(i)]) obj.free[static_cast<std::size_t>(obj.n_free++)] = i;
    Eigen::VectorXd x(obj.n_free), z(obj.n_free);
    for (int i = 0; i < obj.n_free; ++i) {
      const int k = obj.free[static_cast<std::size_t>(i)];
      x[i] = start[static_cast<std::size_t>(k)];
      z[i] = transformed::from_param(k, x[i]);
    }
    if (obj.n_free > 0) {
      LBFGSpp::LBFGSParam<double> param;
      param.max_iterations = 300;
      param.epsilon = 1e-8;
      param.max_linesearch = 60;
      LBFGSpp::LBFGSSolver<double> solver(param);
      transformed fn(&obj);
      // A line search that cannot progress (curvature near a perfect fit makes the quasi-Newton
      // direction unreliable) ends a round; the next round restarts from the best point with fresh
      // curvature memory, until a round no longer improves.
      for (int round = 0; round < 20; ++round) {
        const double before = fn.best_f;
        double fx = 0.0;
        try {
          solver.minimize(fn, z, fx);
        } catch (const std::exception&) {
        }
        if (fn.best_x.size() != x.size()) break;
        for (int i = 0; i < z.size(); ++i)
          z[i] = transformed::from_param(obj.free[static_cast<std::size_t>(i)], fn.best_x[i]);
        if (!(fn.best_f < before - 1e-10)) break;
      }
      if (fn.best_x.size() == x.size()) x = fn.best_x;
    }
    perf_params p = obj.unpack(x);
    if (!multi_node) {  // Pollux's prior: inter-node is at least as slow as intra-node.
      p.alpha_n = std::max(p.alpha_n, p.alpha_r * 1.1);
      p.beta_n = std::max(p.beta_n, p.beta_r * 1.1);
    }
    params_ = p;
    fitted_ = true;
  }

  std::map<std::tuple<int, int, double>, std::pair<double, double>> profile_;
  perf_params params_;
  bool fitted_ = false;
  int max_replicas_ = 0;
};

}  // namespace dra::policy
