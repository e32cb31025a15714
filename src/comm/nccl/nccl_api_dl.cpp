// The real nccl_api: NCCL loaded with dlopen and resolved with dlsym. Compiled against nccl.h
// only for ncclConfig_t and the enums; every entry point is a pointer looked up at run time, so
// newer functions (ncclCommShrink, ncclCommGrow, ...) are simply absent on older libraries, and
// libnccl is never a link-time dependency of dra.
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 21400
#error "dra's NCCL backend needs nccl.h >= 2.14 (ncclConfig_t, non-blocking init); pass -DDRA_WITH_NCCL=OFF"
#endif

// Flag values of newer headers, fixed by NCCL's API; defined here when the header predates them.
#ifndef NCCL_SHRINK_DEFAULT
#define NCCL_SHRINK_DEFAULT 0x00
#endif
#ifndef NCCL_SHRINK_ABORT
#define NCCL_SHRINK_ABORT 0x01
#endif

namespace dra::comm {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(nccl_unique_id::bytes), "ncclUniqueId must be 128 bytes");
static_assert(static_cast<int>(ncclInProgress) == static_cast<int>(nccl_result::in_progress),
              "ncclResult_t values changed");

// Entry points, declared here (not taken from the header) so a header older than the library
// still compiles, and a library older than the header still loads.
using get_version_fn = ncclResult_t (*)(int*);
using get_unique_id_fn = ncclResult_t (*)(ncclUniqueId*);
using init_rank_config_fn = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
using get_async_error_fn = ncclResult_t (*)(ncclComm_t, ncclResult_t*);
using comm_fn = ncclResult_t (*)(ncclComm_t);
using revoke_fn = ncclResult_t (*)(ncclComm_t, int);
using shrink_fn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
using comm_get_unique_id_fn = ncclResult_t (*)(ncclComm_t, ncclUniqueId*);
using grow_fn = ncclResult_t (*)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);
using all_reduce_fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                       cudaStream_t);
using broadcast_fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using group_fn = ncclResult_t (*)();
using send_fn = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using recv_fn = ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using error_string_fn = const char* (*)(ncclResult_t);
using last_error_fn = const char* (*)(ncclComm_t);

ncclDataType_t to_nccl(nccl_dtype t) {
  switch (t) {
    case nccl_dtype::int8:
      return ncclInt8;
    case nccl_dtype::uint8:
      return ncclUint8;
    case nccl_dtype::int32:
      return ncclInt32;
    case nccl_dtype::uint32:
      return ncclUint32;
    case nccl_dtype::int64:
      return ncclInt64;
    case nccl_dtype::uint64:
      return ncclUint64;
    case nccl_dtype::float16:
      return ncclFloat16;
    case nccl_dtype::float32:
      return ncclFloat32;
    case nccl_dtype::float64:
      return ncclFloat64;
    case nccl_dtype::bfloat16:
#if NCCL_VERSION_CODE >= 21000
      return ncclBfloat16;
#else
      break;
#endif
  }
  throw std::invalid_argument("nccl dtype: not supported by this NCCL");
}

ncclConfig_t to_nccl(const nccl_config& c) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = c.blocking ? 1 : 0;
  return config;
}

nccl_result from_nccl(ncclResult_t r) {
  return static_cast<nccl_result>(static_cast<int>(r));
}

class dl_nccl_api final : public nccl_api {
 public:
  explicit dl_nccl_api(void* lib) {
    auto sym = [lib](const char* name) { return dlsym(lib, name); };
    get_version_ = reinterpret_cast<get_version_fn>(sym("ncclGetVersion"));
    get_unique_id_ = reinterpret_cast<get_unique_id_fn>(sym("ncclGetUniqueId"));
    init_rank_config_ = reinterpret_cast<init_rank_config_fn>(sym("ncclCommInitRankConfig"));
    get_async_error_ = reinterpret_cast<get_async_error_fn>(sym("ncclCommGetAsyncError"));
    finalize_ = reinterpret_cast<comm_fn>(sym("ncclCommFinalize"));
    destroy_ = reinterpret_cast<comm_fn>(sym("ncclCommDestroy"));
    abort_ = reinterpret_cast<comm_fn>(sym("ncclCommAbort"));
    revoke_ = reinterpret_cast<revoke_fn>(sym("ncclCommRevoke"));
    shrink_ = reinterpret_cast<shrink_fn>(sym("ncclCommShrink"));
    comm_get_unique_id_ = reinterpret_cast<comm_get_unique_id_fn>(sym("ncclCommGetUniqueId"));
    grow_ = reinterpret_cast<grow_fn>(sym("ncclCommGrow"));
    all_reduce_ = reinterpret_cast<all_reduce_fn>(sym("ncclAllReduce"));
    broadcast_ = reinterpret_cast<broadcast_fn>(sym("ncclBroadcast"));
    group_start_ = reinterpret_cast<group_fn>(sym("ncclGroupStart"));
    group_end_ = reinterpret_cast<group_fn>(sym("ncclGroupEnd"));
    send_ = reinterpret_cast<send_fn>(sym("ncclSend"));
    recv_ = reinterpret_cast<recv_fn>(sym("ncclRecv"));
    error_string_ = reinterpret_cast<error_string_fn>(sym("ncclGetErrorString"));
    last_error_ = reinterpret_cast<last_error_fn>(sym("ncclGetLastError"));
    const char* missing = nullptr;
    if (!get_version_)
      missing = "ncclGetVersion";
    else if (!get_unique_id_)
      missing = "ncclGetUniqueId";
    else if (!init_rank_config_)
      missing = "ncclCommInitRankConfig";
    else if (!get_async_error_)
      missing = "ncclCommGetAsyncError";
    else if (!finalize_)
      missing = "ncclCommFinalize";
    else if (!destroy_)
      missing = "ncclCommDestroy";
    else if (!abort_)
      missing = "ncclCommAbort";
    else if (!all_reduce_)
      missing = "ncclAllReduce";
    else if (!broadcast_)
      missing = "ncclBroadcast";
    else if (!group_start_ || !group_end_)
      missing = "ncclGroupStart/ncclGroupEnd";
    else if (!send_ || !recv_)
      missing = "ncclSend/ncclRecv";
    if (missing) throw comm_error(std::string("NCCL library lacks ") + missing + " (dra needs NCCL >= 2.14)");
    int v = 0;
    if (get_version_(&v) != ncclSuccess) throw comm_error("ncclGetVersion failed");
    features_.runtime_version = v;
    features_.shrink_symbol = shrink_ != nullptr;
    features_.grow_symbols = grow_ != nullptr && comm_get_unique_id_ != nullptr;
    features_.revoke_symbol = revoke_ != nullptr;
    if (!features_.nonblocking())
      throw comm_error("loaded NCCL " + nccl_version_string(v) + " is older than 2.14 (no non-blocking init)");
  }

  nccl_features features() const override { return features_; }

  nccl_result get_unique_id(nccl_unique_id* id) override {
    ncclUniqueId raw{};
    const auto r = get_unique_id_(&raw);
    std::memcpy(id->bytes.data(), &raw, sizeof raw);
    return from_nccl(r);
  }
  nccl_result comm_init_rank(nccl_handle* comm, int nranks, const nccl_unique_id& id, int rank,
                             const nccl_config& config) override {
    ncclUniqueId raw{};
    std::memcpy(&raw, id.bytes.data(), sizeof raw);
    ncclConfig_t c = to_nccl(config);
    ncclComm_t out = nullptr;
    const auto r = init_rank_config_(&out, nranks, raw, rank, &c);
    *comm = out;
    return from_nccl(r);
  }
  nccl_result comm_get_async_error(nccl_handle comm, nccl_result* state) override {
    ncclResult_t s = ncclSuccess;
    const auto r = get_async_error_(static_cast<ncclComm_t>(comm), &s);
    *state = from_nccl(s);
    return from_nccl(r);
  }
  nccl_result comm_finalize(nccl_handle comm) override { return from_nccl(finalize_(static_cast<ncclComm_t>(comm))); }
  nccl_result comm_destroy(nccl_handle comm) override { return from_nccl(destroy_(static_cast<ncclComm_t>(comm))); }
  nccl_result comm_abort(nccl_handle comm) override { return from_nccl(abort_(static_cast<ncclComm_t>(comm))); }
  nccl_result comm_revoke(nccl_handle comm) override {
    if (!revoke_) return nccl_result::invalid_usage;
    return from_nccl(revoke_(static_cast<ncclComm_t>(comm), 0));
  }
  nccl_result comm_shrink(nccl_handle comm, const std::vector<int>& exclude_ranks, nccl_handle* new_comm,
                          const nccl_config& config, bool abort_in_flight) override {
    if (!shrink_) return nccl_result::invalid_usage;
    std::vector<int> excluded = exclude_ranks;  // NCCL takes a non-const pointer
    ncclConfig_t c = to_nccl(config);
    ncclComm_t out = nullptr;
    const auto r = shrink_(static_cast<ncclComm_t>(comm), excluded.data(), static_cast<int>(excluded.size()), &out, &c,
                           abort_in_flight ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
    *new_comm = out;
    return from_nccl(r);
  }
  nccl_result comm_get_grow_id(nccl_handle comm, nccl_unique_id* id) override {
    if (!comm_get_unique_id_) return nccl_result::invalid_usage;
    ncclUniqueId raw{};
    const auto r = comm_get_unique_id_(static_cast<ncclComm_t>(comm), &raw);
    std::memcpy(id->bytes.data(), &raw, sizeof raw);
    return from_nccl(r);
  }
  nccl_result comm_grow(nccl_handle comm, int nranks, const nccl_unique_id* id, int rank, nccl_handle* new_comm,
                        const nccl_config& config) override {
    if (!grow_) return nccl_result::invalid_usage;
    ncclUniqueId raw{};
    if (id) std::memcpy(&raw, id->bytes.data(), sizeof raw);
    ncclConfig_t c = to_nccl(config);
    ncclComm_t out = nullptr;
    const auto r = grow_(static_cast<ncclComm_t>(comm), nranks, id ? &raw : nullptr, rank, &out, &c);
    *new_comm = out;
    return from_nccl(r);
  }
  nccl_result all_reduce_sum(const void* send, void* recv, std::size_t count, nccl_dtype dtype, nccl_handle comm,
                             void* stream) override {
    return from_nccl(all_reduce_(send, recv, count, to_nccl(dtype), ncclSum, static_cast<ncclComm_t>(comm),
                                 static_cast<cudaStream_t>(stream)));
  }
  nccl_result broadcast(const void* send, void* recv, std::size_t count, nccl_dtype dtype, int root, nccl_handle comm,
                        void* stream) override {
    return from_nccl(broadcast_(send, recv, count, to_nccl(dtype), root, static_cast<ncclComm_t>(comm),
                                static_cast<cudaStream_t>(stream)));
  }
  nccl_result group_start() override { return from_nccl(group_start_()); }
  nccl_result group_end() override { return from_nccl(group_end_()); }
  nccl_result send(const void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle comm,
                   void* stream) override {
    return from_nccl(
        send_(buf, count, to_nccl(dtype), peer, static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)));
  }
  nccl_result recv(void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle comm, void* stream) override {
    return from_nccl(
        recv_(buf, count, to_nccl(dtype), peer, static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)));
  }
  std::string error_string(nccl_result result) const override {
    const char* s = error_string_ ? error_string_(static_cast<ncclResult_t>(static_cast<int>(result))) : nullptr;
    return s ? s : "NCCL error " + std::to_string(static_cast<int>(result));
  }
  std::string last_error(nccl_handle comm) const override {
    const char* s = last_error_ ? last_error_(static_cast<ncclComm_t>(comm)) : nullptr;
    return s ? s : "";
  }

 private:
  nccl_features features_;
  get_version_fn get_version_ = nullptr;
  get_unique_id_fn get_unique_id_ = nullptr;
  init_rank_config_fn init_rank_config_ = nullptr;
  get_async_error_fn get_async_error_ = nullptr;
  comm_fn finalize_ = nullptr;
  comm_fn destroy_ = nullptr;
  comm_fn abort_ = nullptr;
  revoke_fn revoke_ = nullptr;
  shrink_fn shrink_ = nullptr;
  comm_get_unique_id_fn comm_get_unique_id_ = nullptr;
  grow_fn grow_ = nullptr;
  all_reduce_fn all_reduce_ = nullptr;
  broadcast_fn broadcast_ = nullptr;
  group_fn group_start_ = nullptr;
  group_fn group_end_ = nullptr;
  send_fn send_ = nullptr;
  recv_fn recv_ = nullptr;
  error_string_fn error_string_ = nullptr;
  last_error_fn last_error_ = nullptr;
};

struct loaded_state {
  std::once_flag once;
  std::shared_ptr<nccl_api> api;
  std::string error;
};

loaded_state& state() {
  static loaded_state s;
  return s;
}

// Tries each candidate in order; the library stays loaded for the life of the process (no
// dlclose: communicators may outlive any owner we could tie it to).
void load_once(loaded_state& s) {
  if (const char* emulate = std::getenv("DRA_NCCL_EMULATION"); emulate && *emulate && std::string(emulate) != "0") {
    // The emulated library (a proof of the protocol on CPUs, not of NCCL): explicit, never a fallback.
    try {
      s.api = make_emulated_nccl_api(nccl_emulation_options::from_env());
    } catch (const std::exception& e) {
      s.error = std::string("cannot start the emulated NCCL (DRA_NCCL_EMULATION): ") + e.what();
    }
    return;
  }
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DRA_NCCL_LIBRARY"); env && *env) candidates.emplace_back(env);
  candidates.emplace_back("libnccl.so.2");
  candidates.emplace_back("libnccl.so");
  // A pip wheel's NCCL in the running interpreter's site-packages (set by `import dra`): a wheel of
  // dra built on another machine has no other way to it.
  if (const char* pip = std::getenv("DRA_NCCL_PIP_LIBRARY"); pip && *pip) candidates.emplace_back(pip);
#ifdef DRA_NCCL_LIBRARY_HINT
  candidates.emplace_back(DRA_NCCL_LIBRARY_HINT);
#endif
  std::string tried;
  for (const auto& name : candidates) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      tried += "\n  " + name + ": " + (why ? why : "not found");
      continue;
    }
    try {
      s.api = std::make_shared<dl_nccl_api>(lib);
      return;
    } catch (const std::exception& e) {
      tried += "\n  " + name + ": " + e.what();
    }
  }
  s.error = "cannot load NCCL (set DRA_NCCL_LIBRARY to libnccl.so.2, or pip install nvidia-nccl-cu13); tried:" + tried;
}

}  // namespace

std::shared_ptr<nccl_api> load_nccl_api() {
  auto& s = state();
  std::call_once(s.once, [&s] { load_once(s); });
  if (!s.api) throw comm_error(s.error);
  return s.api;
}

int nccl_runtime_version() noexcept {
  try {
    return load_nccl_api()->features().runtime_version;
  } catch (...) {
    return 0;
  }
}

std::string nccl_load_error() {
  auto& s = state();
  std::call_once(s.once, [&s] { load_once(s); });
  return s.error;
}

}  // namespace dra::comm
