#pragma once
// Communicator interface of the compiled part (dra::dra; needs LibTorch). Backends (Gloo, NCCL)
// implement it, register by name (make_backend), and are passed to the elastic world, so
// membership and rebuild logic can be tested on the CPU with any backend. The elastic protocol
// never asks which backend it holds: everything it needs is on these interfaces.
#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
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
  /// Bound of the rendezvous (joiners may be slower to arrive than a step).
  std::chrono::milliseconds timeout{30000};
  /// Bound of every collective and transfer afterwards (a dead or hung peer is detected within
  /// it); 0: the rendezvous timeout.
  std::chrono::milliseconds collective_timeout{0};
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
  /// After a failure: stops in-flight work but keeps what an abortive rebuild can still use
  /// (NCCL >= 2.28: ncclCommRevoke, so the survivors shrink it); never blocks. Default: abort().
  virtual void revoke() noexcept { abort(); }
  /// Where collective buffers live for this communicator (CPU: Gloo and the emulated NCCL; the
  /// CUDA device: NCCL). A CPU tensor given to a device communicator travels through a copy.
  virtual at::Device device() const { return at::Device(at::kCPU); }
  /// Whether collectives may complete after they return (NCCL: ordered on the device's stream).
  /// The elastic controller then reads what rides with the gradient reduction (the loss, the
  /// decision flag) only at decision steps, so that other steps never wait for the device.
  virtual bool asynchronous() const { return false; }
  /// False once a failure was detected in the background (NCCL: its watchdog revoked or aborted
  /// it); the next call would throw.
  virtual bool healthy() const noexcept { return true; }
  /// The c10d backend behind it, when there is one (lets Python DDP use the same world).
  virtual c10::intrusive_ptr<c10d::Backend> c10d_backend() const { return {}; }
};

/// Moves the bytes of a list of tensors from one rank to others over a communicator's
/// point-to-point, in bounded chunks (the state handoff to joiners). Sender and receivers pass
/// tensors of the same byte sizes in the same order. Each backend supplies the one that suits its
/// memory (CPU staging for Gloo; a CUDA stream for NCCL).
class tensor_transfer {
 public:
  virtual ~tensor_transfer() = default;
  virtual void send(communicator& comm, const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts) = 0;
  virtual void recv(communicator& comm, const std::vector<at::Tensor>& tensors, int src) = 0;
};

/// Chunked point-to-point transfer of CPU tensors: pieces of at least 256 KiB go straight from
/// and into tensor storage, smaller ones are packed into one staging buffer; all pieces of a
/// chunk are in flight at once (send_batch/recv_batch). Memory beyond the tensors: one chunk.
/// Throws std::invalid_argument for chunk_bytes < 1024.
std::unique_ptr<tensor_transfer> make_chunked_transfer(std::size_t chunk_bytes);

class backend {
 public:
  virtual ~backend() = default;
  virtual std::string name() const = 0;
  /// Builds the communicator for the new epoch. `current` is the communicator of the old world
  /// (null on first init or for a joiner); the backend owns its teardown. Returns null when
  /// `self` is not in `new_members` (a leaver). Throws dra::comm_error / dra::timeout_error.
  virtual std::unique_ptr<communicator> rebuild(std::unique_ptr<communicator> current, const rebuild_request& request,
                                                const c10::intrusive_ptr<c10d::Store>& store) = 0;
  /// Whether its communicators use a device (NCCL on a GPU): a process released from such a world
  /// exits by default, so that it does not keep the device from another job.
  virtual bool uses_device() const { return false; }
  /// The transfer the state handoff uses on this backend's communicators, or null when the
  /// backend cannot hand state over yet (then an elastic world refuses it at start).
  virtual std::unique_ptr<tensor_transfer> make_transfer(std::size_t chunk_bytes) const {
    return make_chunked_transfer(chunk_bytes);
  }
};

/// How an elastic job picks its backend: by name, with the few settings every backend reads.
struct backend_config {
  /// Address the backend binds to and announces to peers (e.g. "127.0.0.1" on one host); empty:
  /// the backend's default (Gloo: GLOO_SOCKET_IFNAME, else the hostname).
  std::string address;
  /// Store keys of an epoch's rendezvous live under <key_prefix>/<epoch>/.
  std::string key_prefix = "pg";
};

using backend_factory = std::function<std::shared_ptr<backend>(const backend_config&)>;

/// Registers a backend under `name`, replacing one of that name: the latest registration wins,
/// over a built-in ("gloo", and "nccl" when compiled in) too, whether or not anything looked a
/// backend up before. A name is letters, digits, '_', '-' and '.', starting with a letter or digit.
/// Registrations belong to this program's copy of dra (an installed Python dra has its own).
/// Throws std::invalid_argument for an empty or odd name and for an empty factory.
void register_backend(const std::string& name, backend_factory factory);
/// A new backend from the factory registered as `name` (the controller makes one per controller,
/// with its backend_address). Throws std::invalid_argument listing the known names for an unknown
/// one, or naming the factory when it returns null; what the factory throws comes out as the same
/// kind of error (anything else as dra::comm_error), naming the backend.
std::shared_ptr<backend> make_backend(const std::string& name, const backend_config& config = {});
/// Names of the registered backends, sorted.
std::vector<std::string> backend_names();

inline void communicator::send(const at::Tensor&, const std::vector<int>&, int) {
  throw dra::comm_error(
      "this backend has no point-to-point send; the state handoff needs one: override communicator::send and "
      "recv, or return null from backend::make_transfer, so that an elastic world refuses the backend at start");
}
inline void communicator::recv(at::Tensor&, int, int) {
  throw dra::comm_error(
      "this backend has no point-to-point recv; the state handoff needs one: override communicator::send and "
      "recv, or return null from backend::make_transfer, so that an elastic world refuses the backend at start");
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
