#pragma once
// The per-step gradient all-reduce of an elastic world (internal to dra::dra). One flat buffer:
// every parameter's gradient weighted by this rank's share of the step's samples, then a short
// tail that rides along so that steps need no other collective: the previous step's loss (sum and
// sample count) and the leader's "a decision is published" flag.
#include <vector>

#include <ATen/Tensor.h>

#include "dra/torch/comm/communicator.hpp"

namespace dra::elastic::detail {

/// What rides with the gradients: summed over the world by the all-reduce.
struct reduction_tail {
  double loss_sum = 0.0;
  double count = 0.0;
  bool decision_flag = false;
};

class gradient_reducer {
 public:
  using tail = reduction_tail;
  /// Averages the gradients of `params` over the world in place (a parameter without a gradient
  /// counts as zero and receives one), weighting this rank's by `weight`. Returns the world's
  /// tail. Throws dra::error when the communicator fails (a peer died or hung).
  tail reduce(comm::communicator& comm, const std::vector<at::Tensor>& params, double weight, const tail& mine);

 private:
  at::Tensor flat_;
};

}  // namespace dra::elastic::detail
