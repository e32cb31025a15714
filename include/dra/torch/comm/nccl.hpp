#pragma once
// NCCL backend of the communicator interface (DESIGN.md §3.3). Available when dra::dra was
// built with DRA_WITH_NCCL. NCCL itself is loaded at run time (dlopen), never linked: a build
// with the backend still imports and runs on machines without libnccl or a GPU, and every
// version gate reads the version of the library actually loaded.
//
// The NCCL entry points are reached through `nccl_api`, an interface that is passed in: the
// real one wraps the loaded library; tests pass a recording double to check call sequences.
// This header needs neither nccl.h nor the CUDA headers: the few NCCL types appear here as
// dra's own equivalents, translated in src/nccl/.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

// communicator.hpp returns intrusive_ptr<c10d::Backend> from an inline virtual, which needs the
// complete type in every translation unit that defines a derived class.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dra/torch/comm/communicator.hpp"
#include "dra/comm/nccl_plan.hpp"
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

/// The NCCL data types dra uses; translated to ncclDataType_t in src/nccl/.
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
  virtual std::string error_string(nccl_result result) const = 0;
  virtual std::string last_error(nccl_handle comm) const = 0;
};

/// Loads NCCL with dlopen: `DRA_NCCL_LIBRARY` if set, else libnccl.so.2 from the loader's search
/// path (the copy torch already loaded, if any), else the library found at build time. Throws
/// dra::comm_error saying what was tried when none loads. Loaded once per process.
std::shared_ptr<nccl_api> load_nccl_api();

/// One line of the decision log: a JSON object, no trailing newline.
using nccl_log_sink = std::function<void(const std::string& json_line)>;

struct nccl_backend_options {
  int device = -1;                      ///< CUDA device index set before every NCCL call; -1: leave the current device
  std::string key_prefix = "dra/nccl";  ///< store keys: <prefix>/<epoch>/...
  nccl_log_sink log;                    ///< decision log; empty: one JSON line per rebuild on stderr
  std::chrono::milliseconds poll_interval{1};  ///< first sleep between ncclCommGetAsyncError polls (doubles to 16x)
};

class nccl_backend;

/// A communicator of one epoch. Collectives run on the tensor's current CUDA stream and return
/// once enqueued (like torch.distributed); a fault aborts (or, NCCL >= 2.28, revokes) it.
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
  void abort() noexcept override;

  /// The ncclComm_t, null once aborted or released.
  nccl_handle handle() const { return handle_; }
  /// After a fault on NCCL >= 2.28 the communicator is revoked: no more collectives, but it can
  /// still be shrunk (abortively).
  bool revoked() const { return revoked_; }
  int device() const { return device_; }

 private:
  friend class nccl_backend;
  void check_enqueued(nccl_result result, const char* what);
  void fault() noexcept;
  nccl_handle release() noexcept;  ///< gives up ownership of the handle

  std::shared_ptr<nccl_api> api_;
  nccl_handle handle_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  std::uint64_t epoch_ = 0;
  int device_ = -1;
  bool revoked_ = false;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds poll_interval_;
};

/// The NCCL backend: the rebuild routine (see src/nccl/nccl_backend.cpp for every case).
/// Store keys live under <key_prefix>/<epoch>/: every rebuild call, retries included, needs an
/// epoch not used before with the same prefix and store.
class nccl_backend final : public backend {
 public:
  explicit nccl_backend(std::shared_ptr<nccl_api> api, nccl_backend_options options = {});
  std::string name() const override { return "nccl"; }
  std::unique_ptr<communicator> rebuild(std::unique_ptr<communicator> current, const rebuild_request& request,
                                        const c10::intrusive_ptr<c10d::Store>& store) override;
  /// No point-to-point on NCCL communicators yet: an elastic world cannot hand state over on
  /// this backend, and refuses it at start.
  std::unique_ptr<tensor_transfer> make_transfer(std::size_t) const override { return nullptr; }
  /// The plan of the last rebuild on this rank, and the path it finally took (after votes and
  /// fallbacks).
  const nccl_plan& last_plan() const { return last_plan_; }
  nccl_path last_path() const { return last_path_; }
  const nccl_api& api() const { return *api_; }

 private:
  std::shared_ptr<nccl_api> api_;
  nccl_backend_options options_;
  nccl_plan last_plan_;
  nccl_path last_path_ = nccl_path::fresh_init;
};

}  // namespace dra::comm
