#pragma once
// How one gradient bucket travels in an elastic world's per-step reduction (part of dra::dra): the
// hook point for gradient codecs (codec_hook.hpp runs the torch-free codecs of include/dra/compress/:
// PowerSGD, masked, top-k, fp16/bf16). Without a hook a bucket is all-reduced as is.
#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dra/signals/convergence_estimator.hpp"
#include "dra/torch/comm/communicator.hpp"

namespace dra::elastic {

/// Where each parameter's gradient lies in a bucket's flat tensor: in layout order (the reverse of
/// the parameter order), `offsets[i]` elements in, of shape `shapes[i]`; `params[i]` is the
/// parameter itself (its values, for a hook that reads them: the `masked` codec's RigL masks).
struct bucket_layout {
  std::vector<std::int64_t> offsets;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<at::Tensor> params;
};

/// What a hook's own state does when the world changes (docs/guide/sage.md, "Rule on a world change").
enum class hook_transition {
  survived,   ///< this process was in the world before a voluntary grow or shrink: keeps its state
  joined,     ///< this process entered the world (grow, admission): received the shared state
  recovered,  ///< the world was re-formed after a failure: every member received the leader's shared state
};

/// Bytes a hook handed to its communicator since the world started, and what an uncompressed
/// fp32 all-reduce of the same gradients would have handed over (per rank, payload before the
/// transport's framing).
struct hook_bytes {
  std::uint64_t sent = 0;
  std::uint64_t dense = 0;
};

/// Transforms a bucket around its all-reduce. Buckets hold this rank's gradients already weighted
/// by its share of the step's samples (float32, in reverse parameter order, ~25 MiB each) and are
/// launched in bucket order while backward goes on. A codec encodes `grads`, reduces the encoded
/// form over `comm` (collectives only: every rank calls the hook for the same buckets in the same
/// order) and decodes the world's sum back into `grads`. `exact` (non-empty in the last bucket
/// only: the previous step's loss and energy, the sample count and the leader's decision flag,
/// which ride with the reduction) must arrive bit-exact: reduce it along, uncompressed. `index` is
/// stable while the model's parameters are (per-bucket state, e.g. error feedback). On CUDA the
/// hook runs on the reduction's own stream, ordered after the bucket's gradients; it should not
/// synchronise the device. A dra::error it throws fails the step like a dead peer does (the world
/// recovers).
class bucket_hook {
 public:
  virtual ~bucket_hook() = default;
  virtual void reduce(comm::communicator& comm, std::size_t index, const bucket_layout& layout, at::Tensor& grads,
                      at::Tensor& exact) = 0;
  /// The part of the hook's state every member holds identically (e.g. PowerSGD's warm start and
  /// step counter): handed over with the training state on a world change. Empty: none.
  virtual std::vector<std::uint8_t> shared_state() const { return {}; }
  /// Loads what shared_state() returned on the sender. Throws dra::state_mismatch_error when it
  /// does not fit (another hook or configuration).
  virtual void load_shared_state(const std::vector<std::uint8_t>& /*bytes*/) {}
  /// Called on every member once a world change is complete (after the state handoff).
  virtual void world_changed(hook_transition /*how*/) {}
  /// Called on every member at each committed step's boundary, after the optimizer step, with the
  /// controller's signals (a sparsity hook zeroes the pruned weights here and follows the phase).
  virtual void step_committed(const signals::convergence_signals& /*signals*/) {}
  virtual hook_bytes bytes() const { return {}; }
};

}  // namespace dra::elastic
