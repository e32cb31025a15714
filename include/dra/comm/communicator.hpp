#pragma once
// Communicator interface of the compiled part (dra::dra; needs LibTorch). Backends (Gloo, NCCL)
// implement it and are passed in to the elastic world, so membership and rebuild logic can be
// tested on the CPU with any backend.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>
// c10d_backend() below is an inline virtual returning intrusive_ptr<c10d::Backend>: every
// translation unit that emits the vtable needs the complete type.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dra/error.hpp"

namespace c10d {
class Store;
}  // namespace c10d

namespace dra::comm {

/// What a rebuild must produce: the communicator of `new_members` for `epoch`.
struct rebuild_request {
  std::uint64_t epoch = 0;
  std::vector<int> old_members;  ///< universe ids of the old world, in rank order (empty: first init)
  std::vector<int> new_members;  ///< universe ids of the new world, in rank order
  int self = -1;                 ///< this process's universe id
  bool abortive = false;         ///< a member died or hung: in-flight work must be aborted
  std::chrono::milliseconds timeout{30000};
};

class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::uint64_t epoch() const = 0;
  /// In-place sum over the world, on the tensor's current stream (CUDA) or synchronously (CPU).
  virtual void all_reduce_sum(at::Tensor& tensor) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  /// Point-to-point (the state handoff to joiners uses it, so existing members receive
  /// nothing). Sends `tensor` to every rank in `dsts` (all transfers in flight at once) and
  /// returns when all finished; `tag` matches it with the receiver's recv. Backends without
  /// point-to-point throw dra::comm_error.
  virtual void send(const at::Tensor& tensor, const std::vector<int>& dsts, int tag);
  virtual void recv(at::Tensor& tensor, int src, int tag);
  /// Several transfers in flight at once (the state handoff pipelines the pieces of a chunk):
  /// tensor i travels with tag `first_tag + i`. Returns when all finished. Default: one by one.
  virtual void send_batch(const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts, int first_tag);
  virtual void recv_batch(const std::vector<at::Tensor>& tensors, int src, int first_tag);
  /// Abandons in-flight work; never blocks. The communicator is unusable afterwards.
  virtual void abort() noexcept = 0;
  /// The c10d backend behind it, when there is one (lets Python DDP use the same world).
  virtual c10::intrusive_ptr<c10d::Backend> c10d_backend() const { return {}; }
};

class backend {
 public:
  virtual ~backend() = default;
  virtual std::string name() const = 0;
  /// Builds the communicator for the new epoch. `current` is the communicator of the old world
  /// (null on first init or for a joiner); the backend owns its teardown. Returns null when
  /// `self` is not in `new_members` (a leaver). Throws dra::comm_error / dra::timeout_error.
  virtual std::unique_ptr<communicator> rebuild(std::unique_ptr<communicator> current, const rebuild_request& request,
                                                const c10::intrusive_ptr<c10d::Store>& store) = 0;
};

inline void communicator::send(const at::Tensor&, const std::vector<int>&, int) {
  throw dra::comm_error("this backend has no point-to-point send; the state handoff needs one");
}
inline void communicator::recv(at::Tensor&, int, int) {
  throw dra::comm_error("this backend has no point-to-point recv; the state handoff needs one");
}
inline void communicator::send_batch(const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts,
                                      int first_tag) {
  for (std::size_t i = 0; i < tensors.size(); ++i) send(tensors[i], dsts, first_tag + static_cast<int>(i));
}
inline void communicator::recv_batch(const std::vector<at::Tensor>& tensors, int src, int first_tag) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor t = tensors[i];
    recv(t, src, first_tag + static_cast<int>(i));
  }
}

}  // namespace dra::comm
