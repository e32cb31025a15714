// Values read on the host only where needed (deferred_reads.hpp).
#include "deferred_reads.hpp"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <thread>

#include "dra/error.hpp"

namespace dra::elastic::detail {

void deferred_reads::reset() {
  host_rows_.clear();
  device_steps_.clear();
  prefetched_ = 0;
  copied_.reset();
}

void deferred_reads::push(std::int64_t step, const at::Tensor& values) {
  const auto flat = values.reshape({-1});
  const auto n = std::min<std::int64_t>(flat.numel(), kWidth);
  if (flat.device().is_cpu()) {
    row r;
    r.step = step;
    const auto v = flat.to(at::kDouble);
    const double* p = v.data_ptr<double>();
    for (std::int64_t i = 0; i < n; ++i) r.values[static_cast<std::size_t>(i)] = p[i];
    host_rows_.push_back(r);
    return;
  }
  const auto used = static_cast<std::int64_t>(device_steps_.size());
  if (!ring_.defined() || ring_.device() != flat.device() || used == ring_.size(0)) {
    at::Tensor grown = at::zeros({std::max<std::int64_t>(16, 2 * used), kWidth},
                                 at::TensorOptions().dtype(at::kFloat).device(flat.device()));
    if (used > 0 && ring_.defined() && ring_.device() == flat.device())
      grown.narrow(0, 0, used).copy_(ring_.narrow(0, 0, used));
    ring_ = grown;
  }
  ring_.select(0, used).narrow(0, 0, n).copy_(flat.narrow(0, 0, n));  // device to device: no wait
  device_steps_.push_back(step);
}

void deferred_reads::prefetch() {
  const auto n = static_cast<std::int64_t>(device_steps_.size());
  if (n == 0 || static_cast<std::size_t>(n) == prefetched_) return;
  if (!pinned_.defined() || pinned_.size(0) < n)
    pinned_ = at::empty({ring_.size(0), kWidth}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  pinned_.narrow(0, 0, n).copy_(ring_.narrow(0, 0, n), /*non_blocking=*/true);
  const auto* impl = c10::impl::getDeviceGuardImpl(ring_.device().type());
  copied_.emplace(ring_.device().type());
  copied_->record(impl->getStream(ring_.device()));
  prefetched_ = static_cast<std::size_t>(n);
}

std::vector<deferred_reads::row> deferred_reads::take(std::int64_t before, std::chrono::milliseconds timeout,
                                                      const std::function<void()>& check) {
  std::vector<row> out;
  auto split = std::find_if(host_rows_.begin(), host_rows_.end(), [before](const row& r) { return r.step >= before; });
  out.assign(host_rows_.begin(), split);
  host_rows_.erase(host_rows_.begin(), split);
  const auto wanted = static_cast<std::size_t>(
      std::find_if(device_steps_.begin(), device_steps_.end(), [before](std::int64_t s) { return s >= before; }) -
      device_steps_.begin());
  if (wanted == 0) return out;
  ++reads_;
  if (prefetched_ < wanted) {
    ++blocking_waits_;  // not prefetched a step ahead: this read waits for the device
    prefetch();
  } else if (!copied_->query()) {
    ++blocking_waits_;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::microseconds(20);
  while (!copied_->query()) {
    if (check) check();
    if (std::chrono::steady_clock::now() >= deadline)
      throw dra::timeout_error("the step's reduction did not complete within " + std::to_string(timeout.count()) +
                               " ms (a peer is gone or hung)");
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
  const float* p = pinned_.data_ptr<float>();
  for (std::size_t i = 0; i < wanted; ++i) {
    row r;
    r.step = device_steps_[i];
    for (std::int64_t k = 0; k < kWidth; ++k)
      r.values[static_cast<std::size_t>(k)] = p[i * kWidth + static_cast<std::size_t>(k)];
    out.push_back(r);
  }
  // The rows not taken (the newest steps) move to the front of the ring, in stream order.
  const auto left = static_cast<std::int64_t>(device_steps_.size() - wanted);
  if (left > 0) ring_.narrow(0, 0, left).copy_(ring_.narrow(0, static_cast<std::int64_t>(wanted), left).clone());
  device_steps_.erase(device_steps_.begin(), device_steps_.begin() + static_cast<std::ptrdiff_t>(wanted));
  prefetched_ = prefetched_ > wanted ? prefetched_ - wanted : 0;
  if (prefetched_ > 0) {
    // The remaining prefetched rows shift as well (host side, already copied).
    float* q = pinned_.data_ptr<float>();
    std::copy(q + wanted * kWidth, q + (wanted + prefetched_) * kWidth, q);
  }
  return out;
}

}  // namespace dra::elastic::detail
