#pragma once
// The state handoff to joiners (internal to dra::dra): what a world change sends, over the
// backend's tensor_transfer. Wire format, from one sender to each of its receivers: the header
// length, a header [controller part bytes, manifest bytes, hook state bytes, tensor count, each
// tensor's bytes], the meta stream (the controller's own part as JSON, the provider's manifest,
// the bucket hook's shared state), then every state tensor's bytes. Memory beyond the state itself:
// one chunk. A deferred handoff adds to the header the first deferrable tensor and a digest of each
// tensor before it; each receiver answers which of those it lacks, the sender sends the union of
// the answers, then the lacking tensors, and the deferrable ones later, on a thread.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dra/elastic/sampler.hpp"
#include "dra/torch/comm/communicator.hpp"
#include "dra/torch/elastic/state.hpp"

namespace dra::elastic::detail {

/// The controller's own part of the state: where the job stands.
struct handoff_header {
  std::int64_t step_index = 0;
  sampler_position sampler;
  std::int64_t num_epochs = -1;
  std::int64_t resizes = 0;
  double energy_j = 0.0;  ///< the world's energy so far (the job's running total)
  bool energy_known = false;
  bool energy_measured = true;
  std::vector<std::uint8_t> hook_state;  ///< the bucket hook's shared_state() (codec warm start, steps)
};

/// The part of a deferred handoff still in flight after the world change: the provider's
/// deferrable tensors (the optimizer's), sent or received on a thread of its own while the joiner
/// computes its first forward and backward. wait() joins it; a receiver then loads the state.
class deferred_transfer {
 public:
  /// Sender: `tensors` to every rank in `dsts`.
  deferred_transfer(comm::communicator& comm, comm::tensor_transfer& transfer, std::vector<at::Tensor> tensors,
                    std::vector<int> dsts);
  /// Receiver: into `tensors` (the tail of `targets`) from `src`; `manifest` and `targets` are
  /// what state_provider::load takes once they arrived.
  deferred_transfer(comm::communicator& comm, comm::tensor_transfer& transfer, std::vector<at::Tensor> tensors, int src,
                    std::string manifest, std::vector<at::Tensor> targets);
  ~deferred_transfer();
  deferred_transfer(const deferred_transfer&) = delete;
  deferred_transfer& operator=(const deferred_transfer&) = delete;
  /// Joins the transfer: "" when it completed, else what failed.
  std::string wait();
  bool receiver() const noexcept { return receiver_; }
  const std::string& manifest() const noexcept { return manifest_; }
  const std::vector<at::Tensor>& targets() const noexcept { return targets_; }
  double duration_s() const noexcept { return duration_s_; }
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  void start(std::function<void()> body);
  bool receiver_;
  std::vector<at::Tensor> tensors_, targets_;
  std::string manifest_;
  std::uint64_t bytes_ = 0;
  double duration_s_ = 0.0;
  std::string error_;
  std::thread thread_;
};

/// What a handoff moved; `deferred` holds the part still in flight (deferred handoff only).
struct handoff_result {
  std::uint64_t bytes = 0;          ///< tensor bytes sent now (sender: to each receiver) or received now
  std::uint64_t skipped_bytes = 0;  ///< not sent: the joiner's own tensors have the same digest
  std::unique_ptr<deferred_transfer> deferred;
};

/// Sends the provider's state and `header` to the ranks in `dsts`. With `deferred`: tensors every
/// receiver already holds (same digest) are skipped, and the deferrable ones go on a thread.
handoff_result send_state(comm::communicator& comm, comm::tensor_transfer& transfer, const std::vector<int>& dsts,
                          state_provider& state, const handoff_header& header, bool deferred);
/// Receives from `src` into the provider and `header` (both sides pass the same `deferred`).
/// Throws dra::state_mismatch_error when the sender's state does not fit this process's model.
handoff_result recv_state(comm::communicator& comm, comm::tensor_transfer& transfer, int src, state_provider& state,
                          handoff_header& header, bool deferred);

}  // namespace dra::elastic::detail
