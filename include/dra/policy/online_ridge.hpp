#pragma once
// Online ridge regression with forgetting, pulled towards a prior: the fitting engine behind the
// throughput model (step time vs per-rank batch, sync time vs world size) and the generation
// model of the stage-balance policy (decode iteration time vs concurrency and context).
//
// Minimises  sum_i w_i (y_i - c . f_i)^2 + w0 |c - c0|^2,  where each new observation multiplies
// the weight of the past by `forgetting`. O(Dim^3) per observation with fixed-size Eigen types:
// no allocation. A model that has seen nothing predicts from its prior, and the prior fades as
// measurements arrive.
#include <Eigen/Dense>

namespace dra::policy::detail {

template <int Dim>
struct online_ridge {
  using vector = Eigen::Matrix<double, Dim, 1>;
  using matrix = Eigen::Matrix<double, Dim, Dim>;

  matrix gram = matrix::Zero();
  vector moment = vector::Zero();
  vector prior = vector::Zero();
  double prior_weight = 1.0;
  vector coef = vector::Zero();

  void reset(const vector& prior_coef, double weight) {
    prior = prior_coef;
    prior_weight = weight;
    gram.setZero();
    moment.setZero();
    coef = prior;
  }

  /// One observation y at features f, counted `weight` times.
  void add(const vector& f, double y, double forgetting, double weight = 1.0) {
    gram *= forgetting;
    moment *= forgetting;
    gram.noalias() += weight * f * f.transpose();
    moment.noalias() += weight * f * y;
    const matrix a = gram + prior_weight * matrix::Identity();
    const vector b = moment + prior_weight * prior;
    const vector solved = a.ldlt().solve(b);
    if (solved.allFinite()) coef = solved;
  }

  double predict(const vector& f) const { return coef.dot(f); }
};

}  // namespace dra::policy::detail
