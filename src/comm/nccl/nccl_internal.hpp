#pragma once
// Helpers shared by the NCCL backend's parts (internal to dra::dra): bounded waits on a
// communicator, the teardown order, error text, the device and stream of a call, dtypes.
#include <ATen/Tensor.h>
#include <c10/core/DeviceGuard.h>

#include <chrono>
#include <optional>
#include <string>

#include "dra/torch/comm/nccl.hpp"

namespace dra::comm::nccl_detail {

using clock_type = std::chrono::steady_clock;

enum class wait_outcome { ready, failed, timed_out };

/// Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress, or the deadline.
wait_outcome wait_ready(nccl_api& api, nccl_handle comm, clock_type::time_point deadline,
                        std::chrono::milliseconds poll, nccl_result* error);

/// The error string of `r`, with the communicator's last error when there is one.
std::string describe(const nccl_api& api, nccl_handle comm, nccl_result r);

/// Waits for a communicator being built; on failure aborts it and throws.
void finish_or_abort(nccl_api& api, nccl_handle comm, clock_type::time_point deadline, std::chrono::milliseconds poll,
                     std::chrono::milliseconds timeout, const std::string& what);

/// Fixed teardown order: finalize (bounded) -> destroy; failure or timeout -> abort. With
/// `with_abort` (after a fault or an abortive shrink) only abort.
void release_handle(nccl_api& api, nccl_handle comm, bool with_abort, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds poll) noexcept;

/// Sets the CUDA device for the NCCL calls of a scope (NCCL binds a communicator to the current
/// device at creation), through torch's device guard so dra needs no CUDA runtime of its own.
class device_scope {
 public:
  explicit device_scope(int device) {
    if (device >= 0) guard_.emplace(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

/// The NCCL type of a tensor; std::invalid_argument naming the dtype for others.
nccl_dtype dtype_of(const at::Tensor& t);

/// The native handle of the tensor's current CUDA stream; null for a CPU tensor.
void* current_stream(const at::Tensor& t);

}  // namespace dra::comm::nccl_detail
