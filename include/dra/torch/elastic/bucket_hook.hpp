#pragma once
// How one gradient bucket travels in an elastic world's per-step reduction (part of dra::dra): the
// hook point for gradient codecs (the torch-free codecs of include/dra/compress/: PowerSGD, masked,
// top-k, fp16). Without a hook a bucket is all-reduced as is.
#include <ATen/Tensor.h>

#include <cstddef>

#include "dra/torch/comm/communicator.hpp"

namespace dra::elastic {

/// Transforms a bucket around its all-reduce. Buckets hold this rank's gradients already weighted
/// by its share of the step's samples (float32, in reverse parameter order, ~25 MiB each) and are
/// launched in bucket order while backward goes on. A codec encodes `grads`, reduces the encoded
/// form over `comm` (collectives only: every rank calls the hook for the same buckets in the same
/// order) and decodes the world's sum back into `grads`. `exact` (non-empty in the last bucket
/// only: the previous step's loss, the sample count and the leader's decision flag, which ride with
/// the reduction) must arrive bit-exact: reduce it along, uncompressed. `index` is stable while the
/// model's parameters are (per-bucket state, e.g. error feedback). On CUDA the hook runs on the
/// reduction's own stream, ordered after the bucket's gradients; it must not synchronise the device.
/// A dra::error it throws fails the step like a dead peer does (the world recovers).
class bucket_hook {
 public:
  virtual ~bucket_hook() = default;
  virtual void reduce(comm::communicator& comm, std::size_t index, at::Tensor& grads, at::Tensor& exact) = 0;
};

}  // namespace dra::elastic
