#pragma once
// The per-step gradient reduction of an elastic world (internal to dra::dra), bucketed as DDP's:
// the parameters are laid out in reverse order into float32 buckets (the first one small, so that
// communication starts early in backward, then ~25 MiB each); backward reports each gradient as it
// is ready (ready()), and a bucket is all-reduced as soon as all of its gradients are in and every
// earlier bucket was launched, so every rank launches the same buckets in the same order. On CUDA
// the all-reduces run on a stream of their own, ordered after the gradients and overlapping the
// rest of backward; finish() makes the caller's stream wait for them. A synchronous communicator
// (Gloo) would block backward for each bucket, so there every gradient goes into one bucket (one
// all-reduce per step). The last bucket carries a
// short tail that rides along so that steps need no other collective: the previous step's loss
// (sum and sample count), its energy, the leader's "a decision is published" flag, a member's stop
// request, and the exactly-once check of this step's batches (each rank's batches skipped and batches in flight).
// A bucket_hook (gradient codecs) may transform buckets around their all-reduce.
#include <ATen/Tensor.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dra/torch/comm/communicator.hpp"
#include "dra/torch/elastic/bucket_hook.hpp"

namespace dra::elastic::detail {

/// What rides with the gradients, read on the host: summed over the world by the all-reduce.
struct reduction_tail {
  double loss_sum = 0.0;
  double count = 0.0;
  bool decision_flag = false;
  double energy_j = 0.0;    ///< the previous step's energy, summed over the world's processes
  double not_measured = 0;  ///< processes whose energy figure is an estimate
  bool stop = false;        ///< a member asked the job to stop (controller::request_stop)
  // This step's batches: a rank that did not train one (it skipped it) is caught here.
  double skipped = 0;       ///< batches the ranks skipped since their previous reduced one
  double skip_mask = 0;     ///< sum of 2^rank over the ranks < 24 that skipped
  double depth_ranks = 0;   ///< ranks that know how many batches they hold in flight
  double depth_sum = 0;     ///< and the sum of those counts
  double depth_sq_sum = 0;  ///< and of their squares (unequal counts: a rank skipped a batch)
  double micro_sum = 0;     ///< loader batches the ranks' gradients carry (accumulation), summed
  double micro_sq_sum = 0;  ///< and their squares (unequal: the ranks accumulated different batches)
  double missed = 0;        ///< ranks that did not call step() after their previous reduction
  double stale = 0;         ///< of them, those whose batch was taken before that step was committed
};

/// This rank's contribution to the tail: the loss as a 0-d tensor (any device: a device loss is
/// never read on the host here) or, when undefined, `loss_value`; the step's energy on this process.
struct tail_input {
  at::Tensor loss;
  double loss_value = 0.0;
  double count = 0.0;
  bool decision_flag = false;
  double energy_j = 0.0;
  bool energy_measured = false;
  bool stop = false;  ///< this process asks the job to stop
  int rank = 0;
  int skipped = 0;      ///< batches this rank skipped since its previous reduced one
  int in_flight = -1;   ///< batches handed to this rank's loop and not yet stepped (-1: unknown)
  int micro = 1;        ///< loader batches this rank's gradient carries (gradient accumulation)
  bool missed = false;  ///< this rank did not call step() after its previous reduction
  bool stale = false;   ///< and its batch was taken before it caught up (this step repeats the missed one's)
};

/// The tail as floats [loss sum, count, flag, energy J, not-measured count, stop requests,
/// skipped, skip mask, depth ranks, depth sum, depth square sum, micro sum, micro square sum,
/// missed, stale] in a tensor, read on the host.
reduction_tail read_tail(const at::Tensor& tail);
/// Writes `in` into `dst` (kTail floats, on any device) without reading a device loss on the host.
void write_tail(at::Tensor& dst, const tail_input& in);

class gradient_reducer {
 public:
  static constexpr std::int64_t kTail = 15;
  explicit gradient_reducer(std::size_t bucket_bytes = std::size_t{25} << 20,
                            std::size_t first_bucket_bytes = std::size_t{1} << 20);

  /// Starts a step: every parameter of `params` will be reported once, by ready() or finish().
  /// `weight`: this rank's share of the step's samples. Lays the buckets out again only when the
  /// parameter list changed.
  /// `unused_to_none` (DDP's find_unused_parameters): which parameters had a gradient rides along
  /// (one float each after the tail), and a parameter no rank had one for keeps no gradient (None),
  /// as in one process; otherwise it receives a zero gradient. Every rank passes the same value.
  void begin(comm::communicator& comm, const std::vector<at::Tensor>& params, double weight, const tail_input& tail,
             bool unused_to_none = false);
  /// params[index]'s gradient is ready: copied (weighted) into its bucket; every bucket now
  /// complete is launched, in order. Never throws a dra::error (a failed bucket fails the step at
  /// finish(); the remaining buckets are not launched).
  void ready(std::size_t index);
  /// End of backward: the parameters never reported count as zero; the remaining buckets are
  /// launched; the averaged gradients are written back (a parameter without a gradient receives
  /// one, unless unused_to_none and no rank had one for it). Returns the world's tail as kTail floats on the
  /// communicator's device (a view valid until the next begin()). Throws dra::error when a bucket failed (a peer died
  /// or hung).
  at::Tensor finish();
  /// Abandons the step (the gradients are left as they are).
  void cancel() noexcept;
  bool active() const noexcept { return comm_ != nullptr; }
  std::size_t buckets() const noexcept { return buckets_.size(); }
  void set_hook(std::shared_ptr<bucket_hook> hook) { hook_ = std::move(hook); }

 private:
  struct bucket {
    std::vector<std::size_t> params;  // indices into params_, in layout order
    std::vector<std::int64_t> offsets;
    std::int64_t numel = 0;            // gradient elements (the tail comes after them)
    at::ScalarType type = at::kFloat;  // float64 (and complex128) gradients travel in float64 buckets
    bucket_layout shapes;              // offsets and shapes, for a hook
    at::Tensor flat;
    std::size_t waiting = 0;
  };
  void layout(const std::vector<at::Tensor>& params, const at::Device& device, bool single, bool flags);
  at::Tensor flags_slot();  // the last bucket's per-parameter "had a gradient" counts (unused_to_none)
  void launch_ready();
  void launch(std::size_t b);

  std::vector<at::ScalarType> types_;  // each parameter's type when the buckets were laid out
  std::size_t bucket_bytes_;
  std::size_t first_bucket_bytes_;
  bool single_ = false;  // one bucket for all gradients (synchronous communicators)
  bool flags_ = false;   // unused_to_none: the last bucket carries one "had a gradient" float per parameter
  comm::communicator* comm_ = nullptr;
  std::vector<at::Tensor> params_;
  std::vector<bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<char> reported_;
  std::vector<float> used_;  // this rank had a gradient for the parameter (weighted in)
  double weight_ = 1.0;
  std::size_t next_launch_ = 0;
  std::string failure_;
  std::optional<c10::Stream> stream_;  // CUDA: the reductions' own stream
  std::shared_ptr<bucket_hook> hook_;
};

}  // namespace dra::elastic::detail
