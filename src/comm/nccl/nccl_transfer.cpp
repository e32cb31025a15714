// The state handoff's transfer over NCCL (include/dra/torch/comm/nccl.hpp, make_nccl_transfer):
// the chunked transfer (src/comm/chunked_transfer.cpp) with its staging chunk on the device, run on
// a stream of its own. Large pieces of device tensors travel straight from and into their storage;
// small pieces and CPU tensors (optimizer step counters, the manifest) are packed into the device
// chunk. Chunks follow each other on the stream without waiting for the host (one staging chunk,
// reused in stream order); the stream first waits for the work the caller's stream enqueued, and
// the caller's stream afterwards waits for the transfer. Under the emulated library (host
// memory) every call completes in this thread and the staging chunk is on the CPU.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>

#include "../chunked_transfer.hpp"
#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"

namespace dra::comm {

namespace {

class nccl_transfer final : public tensor_transfer {
 public:
  explicit nccl_transfer(std::size_t chunk_bytes) : chunk_(chunk_bytes) {}

  void send(communicator& comm, const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts) override {
    run(comm, [&](tensor_transfer& t) { t.send(comm, tensors, dsts); });
  }
  void recv(communicator& comm, const std::vector<at::Tensor>& tensors, int src) override {
    run(comm, [&](tensor_transfer& t) { t.recv(comm, tensors, src); });
  }

 private:
  template <class Move>
  void run(communicator& comm, Move&& move) {
    auto* nc = dynamic_cast<nccl_communicator*>(&comm);
    if (!nc) dra::detail::throw_invalid("comm", "the NCCL transfer moves state over NCCL communicators only");
    const auto dev = nc->device();
    if (!inner_ || !device_ || *device_ != dev) {
      inner_ = make_chunked_transfer_on(chunk_, dev);
      device_ = dev;
    }
    if (dev.is_cpu()) {  // the emulated library: every call completes before it returns
      move(*inner_);
      return;
    }
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream current = impl->getStream(dev);
    const c10::Stream own = impl->getStreamFromGlobalPool(dev, /*isHighPriority=*/false);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(current);
    ready.block(own);  // the state as the caller's stream leaves it
    {
      c10::StreamGuard guard(own);
      move(*inner_);
    }
    nc->synchronize();  // bounded: a peer gone mid-transfer ends in the watchdog's fault
    c10::Event done(c10::DeviceType::CUDA);
    done.record(own);
    done.block(current);
  }

  std::size_t chunk_;
  std::optional<at::Device> device_;
  std::unique_ptr<tensor_transfer> inner_;
};

}  // namespace

std::unique_ptr<tensor_transfer> make_nccl_transfer(std::size_t chunk_bytes) {
  if (chunk_bytes < 1024)
    dra::detail::throw_invalid("chunk_bytes", "must be >= 1024 (1 KiB), got " + std::to_string(chunk_bytes));
  return std::make_unique<nccl_transfer>(chunk_bytes);
}

}  // namespace dra::comm
