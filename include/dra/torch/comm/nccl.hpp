#pragma once
// NCCL backend of the communicator interface (docs/design/nccl.md). Available when dra::dra was
// built with DRA_WITH_NCCL. NCCL itself is loaded at run time (dlopen), never linked: a build
// with the backend still imports and runs on machines without libnccl or a GPU, and every
// version gate reads the version of the library actually loaded.
//
// The NCCL entry points are reached through `nccl_api`, an interface that is passed in: the
// real one wraps the loaded library; tests pass a recording double to check call sequences.
// This header needs neither nccl.h nor the CUDA headers: the few NCCL types appear here as
// dra's own equivalents, translated in src/comm/nccl/.
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

// communicator.hpp returns intrusive_ptr<c10d::Backend> from an inline virtual, which needs the
// complete type in every translation unit that defines a derived class.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dra/comm/nccl_plan.hpp"
#include "dra/torch/comm/communicator.hpp"
#include "dra/torch/comm/nccl_runtime.hpp"

namespace dra::comm {

/// ncclResult_t values (stable across NCCL 2.x).
enum class nccl_result : int {
  success = 0,
  unhandled_cuda_error = 1,
  system_error = 2,
  internal_error = 3,
  invalid_argument = 4,
  invalid_usage = 5,
  remote_error = 6,
  in_progress = 7,
};

/// The NCCL data types dra uses; translated to ncclDataType_t in src/comm/nccl/.
enum class nccl_dtype { int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, bfloat16 };

/// ncclUniqueId: 128 opaque bytes.
struct nccl_unique_id {
  std::array<char, 128> bytes{};
};

/// An ncclComm_t, opaque.
using nccl_handle = void*;

/// The subset of ncclConfig_t dra sets; everything else keeps NCCL's defaults.
struct nccl_config {
  bool blocking = false;  ///< dra always inits non-blocking, so every wait can time out
};

/// NCCL entry points used by dra. Functions absent from the loaded library return
/// nccl_result::invalid_usage; `features()` says which are present.
class nccl_api {
 public:
  virtual ~nccl_api() = default;
  /// Version of the loaded library and the fast paths it resolves.
  virtual nccl_features features() const = 0;
  virtual nccl_result get_unique_id(nccl_unique_id* id) = 0;
  virtual nccl_result comm_init_rank(nccl_handle* comm, int nranks, const nccl_unique_id& id, int rank,
                                     const nccl_config& config) = 0;
  virtual nccl_result comm_get_async_error(nccl_handle comm, nccl_result* state) = 0;
  virtual nccl_result comm_finalize(nccl_handle comm) = 0;
  virtual nccl_result comm_destroy(nccl_handle comm) = 0;
  virtual nccl_result comm_abort(nccl_handle comm) = 0;
  /// ncclCommRevoke (>= 2.28): stops in-flight work but keeps the communicator shrinkable.
  virtual nccl_result comm_revoke(nccl_handle comm) = 0;
  /// ncclCommShrink (>= 2.27); `abort_in_flight` selects NCCL_SHRINK_ABORT.
  virtual nccl_result comm_shrink(nccl_handle comm, const std::vector<int>& exclude_ranks, nccl_handle* new_comm,
                                  const nccl_config& config, bool abort_in_flight) = 0;
  /// ncclCommGetUniqueId (>= 2.29): the single-use id of a grow, created by the root.
  virtual nccl_result comm_get_grow_id(nccl_handle comm, nccl_unique_id* id) = 0;
  /// ncclCommGrow (>= 2.29). Existing ranks: comm set, rank -1, id only on the root.
  /// Joiners: comm null, id set, rank = assigned new rank.
  virtual nccl_result comm_grow(nccl_handle comm, int nranks, const nccl_unique_id* id, int rank, nccl_handle* new_comm,
                                const nccl_config& config) = 0;
  virtual nccl_result all_reduce_sum(const void* send, void* recv, std::size_t count, nccl_dtype dtype,
                                     nccl_handle comm, void* stream) = 0;
  virtual nccl_result broadcast(const void* send, void* recv, std::size_t count, nccl_dtype dtype, int root,
                                nccl_handle comm, void* stream) = 0;
  /// ncclGroupStart / ncclGroupEnd: the point-to-point calls between them progress together (a
  /// rank may send to and receive from the same peer in one group without deadlock).
  virtual nccl_result group_start() = 0;
  virtual nccl_result group_end() = 0;
  /// ncclSend / ncclRecv (NCCL >= 2.7): matched in call order per pair of ranks (no tags), the
  /// counts of a matching pair must be equal.
  virtual nccl_result send(const void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle comm,
                           void* stream) = 0;
  virtual nccl_result recv(void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle comm,
                           void* stream) = 0;
  virtual std::string error_string(nccl_result result) const = 0;
  virtual std::string last_error(nccl_handle comm) const = 0;
  /// Where this library's buffers live: device memory (NCCL) or host memory (the emulation, whose
  /// operations complete in the calling thread and take CPU tensors).
  virtual bool host_memory() const { return false; }
  /// A label for logs and build information ("" for the real library).
  virtual std::string label() const { return ""; }
};

/// Loads NCCL with dlopen: `DRA_NCCL_LIBRARY` if set, else libnccl.so.2 from the loader's search
/// path (the copy torch already loaded, if any), else the library found at build time. Throws
/// dra::comm_error saying what was tried when none loads. Loaded once per process.
/// With `DRA_NCCL_EMULATION` set ("1", or a version such as "2.27.0") it returns the emulated
/// library instead (make_emulated_nccl_api): a proof of the protocol on CPUs, never of NCCL.
std::shared_ptr<nccl_api> load_nccl_api();

/// Settings of the emulated NCCL library.
struct nccl_emulation_options {
  int version = nccl_version_code(2, 29, 0);  ///< what ncclGetVersion answers (drives the gates)
  std::string directory = "/dev/shm";         ///< where communicators' shared segments are created
  /// A peer process that is gone: false (default) hangs like NCCL over shared memory or NVLink
  /// until the communicator is revoked or aborted; true reports ncclRemoteError asynchronously, like
  /// NCCL over sockets when the peer's connection closes.
  bool peer_death_error = false;
  /// From DRA_NCCL_EMULATION ("1" or a version "2.27.0"), DRA_NCCL_EMULATION_DIR and
  /// DRA_NCCL_EMULATION_PEER_DEATH ("hang" or "error"). Throws std::invalid_argument for bad values.
  static nccl_emulation_options from_env();
};

/// An emulated NCCL library behind the same API table: communicators of processes on one host over
/// shared memory (a segment per communicator in `directory`), host buffers (CPU tensors), and the
/// semantics the elastic protocol relies on: init from a unique id (non-blocking, polled), grouped
/// send/recv matched in order, all-reduce and broadcast (bit-identical results on every rank),
/// shrink with renumbering (and NCCL_SHRINK_ABORT), grow with a single-use id, revoke and abort
/// from another thread, asynchronous errors, and an operation that hangs while a peer is gone.
/// Operations run in the calling thread (there is no device); see docs/design/nccl.md.
std::shared_ptr<nccl_api> make_emulated_nccl_api(nccl_emulation_options options = {});

/// One line of the decision log: a JSON object, no trailing newline.
using nccl_log_sink = std::function<void(const std::string& json_line)>;

struct nccl_backend_options {
  int device = -1;                      ///< CUDA device index set before every NCCL call; -1: leave the current device
  std::string key_prefix = "dra/nccl";  ///< store keys: <prefix>/<epoch>/...
  nccl_log_sink log;                    ///< decision log; empty: one JSON line per rebuild on stderr
  std::chrono::milliseconds poll_interval{1};  ///< first sleep between ncclCommGetAsyncError polls (doubles to 16x)
};

class nccl_backend;
namespace detail {
class rendezvous_keys;
}
namespace nccl_detail {
class nccl_watchdog;
}

/// A communicator of one epoch. Collectives and point-to-point calls run on the tensor's current
/// CUDA stream and return once enqueued (like torch.distributed); with the emulated library they
/// take CPU tensors and complete in the calling thread. Every operation is bounded by a watchdog:
/// past the timeout, or on an asynchronous error, the communicator is revoked (NCCL >= 2.28) or
/// aborted, and the next call throws. A CPU tensor given to a device communicator travels
/// through a device copy (synchronously): the state handoff's small CPU pieces, never the steps.
class nccl_communicator final : public communicator {
 public:
  nccl_communicator(std::shared_ptr<nccl_api> api, nccl_handle handle, int rank, int size, std::uint64_t epoch,
                    int device, std::chrono::milliseconds timeout, std::chrono::milliseconds poll_interval);
  ~nccl_communicator() override;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t epoch() const override { return epoch_; }
  void all_reduce_sum(at::Tensor& tensor) override;
  void broadcast(at::Tensor& tensor, int root) override;
  /// All-reduces one element and waits (bounded by the timeout) for it to complete.
  void barrier() override;
  /// Point-to-point: ncclSend/ncclRecv in one group per call (all destinations, or all tensors
  /// of a batch, in flight at once). NCCL matches calls in order: tags are not sent.
  void send(const at::Tensor& tensor, const std::vector<int>& dsts, int tag) override;
  void recv(at::Tensor& tensor, int src, int tag) override;
  void send_batch(const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts, int first_tag) override;
  void recv_batch(const std::vector<at::Tensor>& tensors, int src, int first_tag) override;
  void abort() noexcept override;
  /// Revokes (NCCL >= 2.28: in-flight work stops, the communicator stays shrinkable) or aborts.
  void revoke() noexcept override;
  at::Device device() const override;
  bool asynchronous() const override { return true; }
  bool healthy() const noexcept override { return handle_.load() && !revoked_.load(); }
  /// Waits until all work enqueued on this communicator completed, bounded by the timeout
  /// (dra::timeout_error; the communicator is then revoked or aborted).
  void synchronize();

  /// The ncclComm_t, null once aborted or released.
  nccl_handle handle() const { return handle_.load(); }
  /// After a fault on NCCL >= 2.28 the communicator is revoked: no more collectives, but it can
  /// still be shrunk (abortively).
  bool revoked() const { return revoked_.load(); }
  /// The watchdog faulted it (a peer gone or hung, or an asynchronous error).
  bool faulted() const;
  int device_index() const { return device_; }
  bool host_memory() const { return host_memory_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  friend class nccl_backend;
  template <class Call>
  void run(const char* what, const at::Tensor* sample, Call&& call);
  void check_usable(const char* what) const;
  void fault() noexcept;
  void set_timeout(std::chrono::milliseconds timeout);
  nccl_handle release() noexcept;  ///< gives up ownership of the handle

  std::shared_ptr<nccl_api> api_;
  std::atomic<nccl_handle> handle_{nullptr};
  mutable std::mutex handle_mutex_;  ///< the owner's teardown against the watchdog's probe and fault
  int rank_ = 0;
  int size_ = 0;
  std::uint64_t epoch_ = 0;
  int device_ = -1;
  bool host_memory_ = false;
  std::atomic<bool> revoked_{false};
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds poll_interval_;
  std::unique_ptr<nccl_detail::nccl_watchdog> watchdog_;
};

/// The transfer of the state handoff over NCCL communicators: chunked and pipelined on a stream of
/// its own, straight from and into device tensors (large pieces), small pieces and CPU tensors
/// packed into a device staging chunk; host memory under the emulated library. Waits (bounded) for
/// the transfer to finish before returning. Throws std::invalid_argument for chunk_bytes < 1024.
std::unique_ptr<tensor_transfer> make_nccl_transfer(std::size_t chunk_bytes);

/// The NCCL backend: the rebuild routine (see src/comm/nccl/nccl_backend.cpp for every case).
/// Store keys live under <key_prefix>/<epoch>/: every rebuild call, retries included, needs an
/// epoch not used before with the same prefix and store.
class nccl_backend final : public backend {
 public:
  explicit nccl_backend(std::shared_ptr<nccl_api> api, nccl_backend_options options = {});
  std::string name() const override { return "nccl"; }
  std::unique_ptr<communicator> rebuild(std::unique_ptr<communicator> current, const rebuild_request& request,
                                        const c10::intrusive_ptr<c10d::Store>& store) override;
  /// The NCCL transfer (make_nccl_transfer).
  std::unique_ptr<tensor_transfer> make_transfer(std::size_t chunk_bytes) const override {
    return make_nccl_transfer(chunk_bytes);
  }
  /// The plan of the last rebuild on this rank, and the path it finally took (after votes and
  /// fallbacks).
  const nccl_plan& last_plan() const { return last_plan_; }
  nccl_path last_path() const { return last_path_; }
  const nccl_api& api() const { return *api_; }
  bool uses_device() const override { return !api_->host_memory(); }

 private:
  std::shared_ptr<nccl_api> api_;
  nccl_backend_options options_;
  nccl_plan last_plan_;
  nccl_path last_path_ = nccl_path::fresh_init;
  std::shared_ptr<detail::rendezvous_keys> keys_;  // a world's keys, erased by its rank 0 two worlds later
};

}  // namespace dra::comm
