// Chunked point-to-point transfer (include/dra/torch/comm/communicator.hpp): CPU tensors with a
// CPU staging chunk (Gloo), or any tensors with a device staging chunk (NCCL, chunked_transfer.hpp).
#include "chunked_transfer.hpp"

#include <ATen/Functions.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/comm/communicator.hpp"

namespace dra::comm {

namespace {

// Pieces of at least this size travel straight from / into their tensor; smaller ones are packed
// into the chunk's staging buffer. A chunk's transfers are all in flight at once.
constexpr std::int64_t kDirectPiece = 256 << 10;
constexpr int kTagPiece = 1000;

// Chunks as (tensor index, byte offset, byte count) lists; identical on the sending and the
// receiving side because both derive it from the same byte sizes.
struct piece {
  std::size_t tensor;
  std::int64_t offset;
  std::int64_t count;
};

std::vector<std::vector<piece>> plan_chunks(const std::vector<at::Tensor>& views, std::int64_t chunk) {
  std::vector<std::vector<piece>> chunks;
  std::vector<piece> current;
  std::int64_t room = chunk;
  for (std::size_t i = 0; i < views.size(); ++i) {
    const std::int64_t size = views[i].numel();
    for (std::int64_t off = 0; off < size;) {
      const std::int64_t take = std::min(size - off, room);
      current.push_back({i, off, take});
      off += take;
      room -= take;
      if (room == 0) {
        chunks.push_back(std::move(current));
        current.clear();
        room = chunk;
      }
    }
  }
  if (!current.empty()) chunks.push_back(std::move(current));
  return chunks;
}

// The classification depends on byte sizes only, so sender and receiver agree on every message
// even when their tensors live on different devices (the communicator stages what it must).
bool direct(const piece& p, const std::vector<piece>& chunk) {
  return p.count >= kDirectPiece || chunk.size() == 1;
}

at::Tensor byte_view(const at::Tensor& t, const at::Device& staging) {
  if (!t.defined() || !t.is_contiguous() || (!t.device().is_cpu() && t.device() != staging))
    dra::detail::throw_invalid("tensors",
                               "the chunked transfer takes contiguous tensors on the CPU or on " + staging.str());
  if (t.numel() == 0) return at::empty({0}, t.options().dtype(at::kByte));
  return t.reshape({-1}).view(at::kByte);
}

class chunked_transfer final : public tensor_transfer {
 public:
  chunked_transfer(std::int64_t chunk_bytes, at::Device staging) : chunk_(chunk_bytes), device_(staging) {}

  void send(communicator& comm, const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts) override {
    const auto views = byte_views(tensors);
    for (const auto& chunk : plan_chunks(views, chunk_)) {
      std::vector<at::Tensor> batch;
      std::int64_t packed = 0;
      for (const auto& p : chunk) {
        const auto bytes = views[p.tensor].narrow(0, p.offset, p.count);
        if (direct(p, chunk)) {
          batch.push_back(bytes);
        } else {
          staging().narrow(0, packed, p.count).copy_(bytes);
          packed += p.count;
        }
      }
      if (packed > 0) batch.push_back(staging().narrow(0, 0, packed));
      comm.send_batch(batch, dsts, kTagPiece);
    }
  }

  void recv(communicator& comm, const std::vector<at::Tensor>& tensors, int src) override {
    const auto views = byte_views(tensors);
    for (const auto& chunk : plan_chunks(views, chunk_)) {
      // The same classification as the sender's, from the same plan.
      std::vector<at::Tensor> batch;
      std::vector<const piece*> small;
      std::int64_t packed = 0;
      for (const auto& p : chunk) {
        if (direct(p, chunk)) {
          batch.push_back(views[p.tensor].narrow(0, p.offset, p.count));
        } else {
          small.push_back(&p);
          packed += p.count;
        }
      }
      if (packed > 0) batch.push_back(staging().narrow(0, 0, packed));
      comm.recv_batch(batch, src, kTagPiece);
      std::int64_t pos = 0;
      for (const piece* p : small) {
        views[p->tensor].narrow(0, p->offset, p->count).copy_(staging().narrow(0, pos, p->count));
        pos += p->count;
      }
    }
  }

 private:
  std::vector<at::Tensor> byte_views(const std::vector<at::Tensor>& tensors) const {
    std::vector<at::Tensor> views;
    views.reserve(tensors.size());
    for (const auto& t : tensors) views.push_back(byte_view(t, device_));
    return views;
  }

  at::Tensor& staging() {
    if (!staging_.defined()) staging_ = at::empty({chunk_}, at::TensorOptions().dtype(at::kByte).device(device_));
    return staging_;
  }

  std::int64_t chunk_;
  at::Device device_;
  at::Tensor staging_;
};

}  // namespace

std::unique_ptr<tensor_transfer> make_chunked_transfer_on(std::size_t chunk_bytes, at::Device staging) {
  if (chunk_bytes < 1024)
    dra::detail::throw_invalid("chunk_bytes", "must be >= 1024 (1 KiB), got " + std::to_string(chunk_bytes));
  return std::make_unique<chunked_transfer>(static_cast<std::int64_t>(chunk_bytes), staging);
}

std::unique_ptr<tensor_transfer> make_chunked_transfer(std::size_t chunk_bytes) {
  return make_chunked_transfer_on(chunk_bytes, at::Device(at::kCPU));
}

}  // namespace dra::comm
