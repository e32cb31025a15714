#pragma once
// Values a step produces on the device that the host needs only at some steps (internal to
// dra::dra): the world's tail of each gradient reduction (loss sum, sample count, decision flag, energy)
// and, for a controller alone, the loss of a device tensor. Reading such a value at every step
// would synchronise the host with the device at every step and stall the pipeline that
// asynchronous CUDA execution keeps full. So the values stay in a ring on their device (one small
// device-to-device copy per step); one step before the host needs them, prefetch() copies every
// unread row to pinned memory (non-blocking) and records an event; take() waits on that event,
// which by then has normally completed (the device is at most one step behind). Values on the CPU
// (Gloo, the emulated NCCL) are read at once and only queued.
#include <ATen/Tensor.h>
#include <c10/core/Event.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace dra::elastic::detail {

class deferred_reads {
 public:
  static constexpr std::int64_t kWidth = 15;  ///< gradient_reducer::kTail
  struct row {
    std::int64_t step = 0;
    std::array<double, kWidth> values{};
  };
  /// Forgets every row (a world change).
  void reset();
  /// The values of `step` (kWidth floats, or fewer: the rest read as 0), on any device.
  void push(std::int64_t step, const at::Tensor& values);
  /// Device rows: starts their copy to pinned memory (non-blocking) for the next take().
  void prefetch();
  /// The rows of steps < `before`, oldest first. Device rows: waits for their copy (started here
  /// when prefetch() was not called: a forced wait), polling `check` (which throws to give up,
  /// e.g. when the communicator's watchdog fired) and bounded by `timeout` (dra::timeout_error).
  std::vector<row> take(std::int64_t before, std::chrono::milliseconds timeout,
                        const std::function<void()>& check = {});
  std::size_t size() const noexcept { return host_rows_.size() + device_steps_.size(); }
  bool empty() const noexcept { return host_rows_.empty() && device_steps_.empty(); }
  /// Device reads that had to wait for the device (the event was not complete when taken).
  std::uint64_t blocking_waits() const noexcept { return blocking_waits_; }
  std::uint64_t reads() const noexcept { return reads_; }

 private:
  std::vector<row> host_rows_;              // CPU values, read at push
  std::vector<std::int64_t> device_steps_;  // steps of ring_[0 .. n)
  at::Tensor ring_;                         // [capacity, kWidth] float32 on the device
  at::Tensor pinned_;                       // host copy of the prefetched rows
  std::optional<c10::Event> copied_;
  std::size_t prefetched_ = 0;  // rows of ring_ covered by pinned_
  std::uint64_t blocking_waits_ = 0;
  std::uint64_t reads_ = 0;
};

}  // namespace dra::elastic::detail
