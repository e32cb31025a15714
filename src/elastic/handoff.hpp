#pragma once
// The state handoff to joiners (internal to dra::dra): what a world change sends, over the
// backend's tensor_transfer. Wire format, from one sender to each of its receivers: the header
// length, a header [controller part bytes, manifest bytes, hook state bytes, tensor count, each
// tensor's bytes], the meta stream (the controller's own part as JSON, the provider's manifest,
// the bucket hook's shared state), then every state tensor's bytes. Memory beyond the state itself: one chunk.
#include <cstdint>
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

/// Sends the provider's state and `header` to the ranks in `dsts`; returns the tensor bytes sent.
std::uint64_t send_state(comm::communicator& comm, comm::tensor_transfer& transfer, const std::vector<int>& dsts,
                         state_provider& state, const handoff_header& header);
/// Receives from `src` into the provider and `header`; returns the tensor bytes received. Throws
/// dra::state_mismatch_error when the sender's state does not fit this process's model.
std::uint64_t recv_state(comm::communicator& comm, comm::tensor_transfer& transfer, int src, state_provider& state,
                         handoff_header& header);

}  // namespace dra::elastic::detail
