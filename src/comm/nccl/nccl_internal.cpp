// Helpers shared by the NCCL backend's parts (nccl_internal.hpp).
#include "nccl_internal.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "dra/error.hpp"

namespace dra::comm::nccl_detail {

wait_outcome wait_ready(nccl_api& api, nccl_handle comm, clock_type::time_point deadline,
                        std::chrono::milliseconds poll, nccl_result* error) {
  auto sleep = std::max(poll, std::chrono::milliseconds(1));
  const auto max_sleep = sleep * 16;
  for (;;) {
    nccl_result state = nccl_result::success;
    const auto r = api.comm_get_async_error(comm, &state);
    if (r != nccl_result::success) state = r;
    if (state == nccl_result::success) return wait_outcome::ready;
    if (state != nccl_result::in_progress) {
      if (error) *error = state;
      return wait_outcome::failed;
    }
    const auto now = clock_type::now();
    if (now >= deadline) return wait_outcome::timed_out;
    std::this_thread::sleep_for(std::min<clock_type::duration>(sleep, deadline - now));
    sleep = std::min(sleep * 2, max_sleep);
  }
}

std::string describe(const nccl_api& api, nccl_handle comm, nccl_result r) {
  std::string s = api.error_string(r);
  if (comm) {
    const auto last = api.last_error(comm);
    if (!last.empty()) s += " (" + last + ")";
  }
  return s;
}

void finish_or_abort(nccl_api& api, nccl_handle comm, clock_type::time_point deadline, std::chrono::milliseconds poll,
                     std::chrono::milliseconds timeout, const std::string& what) {
  nccl_result error = nccl_result::success;
  const auto outcome = wait_ready(api, comm, deadline, poll, &error);
  if (outcome == wait_outcome::ready) return;
  const auto message = outcome == wait_outcome::failed ? describe(api, comm, error) : std::string();
  api.comm_abort(comm);
  if (outcome == wait_outcome::timed_out)
    throw timeout_error(what + " did not complete within " + std::to_string(timeout.count()) +
                        " ms; the communicator was aborted");
  throw comm_error(what + " failed: " + message + "; the communicator was aborted");
}

void release_handle(nccl_api& api, nccl_handle comm, bool with_abort, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds poll) noexcept {
  if (!comm) return;
  try {
    if (!with_abort) {
      const auto r = api.comm_finalize(comm);
      if ((r == nccl_result::success || r == nccl_result::in_progress) &&
          wait_ready(api, comm, clock_type::now() + timeout, poll, nullptr) == wait_outcome::ready) {
        dra::detail::log_check(api.comm_destroy(comm) == nccl_result::success, "ncclCommDestroy");
        return;
      }
    }
    api.comm_abort(comm);
  } catch (...) {
    dra::detail::log_check(false, "NCCL communicator teardown threw");
  }
}

nccl_dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return nccl_dtype::float32;
    case at::kDouble:
      return nccl_dtype::float64;
    case at::kHalf:
      return nccl_dtype::float16;
    case at::kBFloat16:
      return nccl_dtype::bfloat16;
    case at::kInt:
      return nccl_dtype::int32;
    case at::kLong:
      return nccl_dtype::int64;
    case at::kChar:
      return nccl_dtype::int8;
    case at::kByte:
      return nccl_dtype::uint8;
    default:
      break;
  }
  throw std::invalid_argument(std::string("tensor dtype: ") + c10::toString(t.scalar_type()) +
                              " is not supported by the NCCL backend; use a float, half, bfloat16 or integer tensor");
}

void* current_stream(const at::Tensor& t) {
  if (!t.is_cuda()) return nullptr;
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStream(t.device()).native_handle();
}

}  // namespace dra::comm::nccl_detail
