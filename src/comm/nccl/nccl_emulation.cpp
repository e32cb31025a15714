// The emulated NCCL library (include/dra/torch/comm/nccl.hpp, make_emulated_nccl_api): the same API
// table as the real one, over host memory shared between the processes of one machine. It exists to
// prove the elastic protocol against NCCL's API on machines without GPUs (CI); it proves nothing
// about NCCL itself. Its shared-memory layout and how each call is emulated: docs/design/nccl.md,
// "The emulated NCCL library".
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"
#include "nccl_emulation_shm.hpp"

namespace dra::comm {
namespace {

using namespace emulation;

thread_local int t_group_depth = 0;
thread_local std::vector<p2p_op> t_group_ops;

class emulated_nccl final : public nccl_api {
 public:
  explicit emulated_nccl(nccl_emulation_options o) : options_(std::move(o)) {
    features_.runtime_version = options_.version;
    features_.shrink_symbol = features_.grow_symbols = features_.revoke_symbol = true;
  }
  ~emulated_nccl() override {
    // Aborted communicators are kept (a racing call on a stale handle must find the flag, never
    // freed memory); their segments were already unmapped.
    for (auto* c : graveyard_) delete c;
  }

  nccl_features features() const override { return features_; }
  bool host_memory() const override { return true; }
  std::string label() const override { return "emulated"; }

  nccl_result get_unique_id(nccl_unique_id* id) override {
    write_id(id, fresh_key());
    return nccl_result::success;
  }

  nccl_result comm_init_rank(nccl_handle* comm, int nranks, const nccl_unique_id& id, int rank,
                             const nccl_config& config) override {
    *comm = nullptr;
    std::uint64_t key = 0;
    if (!read_id(id, &key) || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
      return nccl_result::invalid_argument;
    return attach(comm, key, nranks, rank, config);
  }

  nccl_result comm_get_async_error(nccl_handle h, nccl_result* state) override {
    auto* c = as_comm(h);
    if (!c) return nccl_result::invalid_argument;
    const int err = c->async_error.load();
    if (err != 0) {
      *state = static_cast<nccl_result>(err);
    } else if (c->header == nullptr || c->header->joined.load() < c->nranks || c->busy.load() > 0) {
      *state = nccl_result::in_progress;  // init not complete, or (revoked) work still leaving
    } else {
      *state = nccl_result::success;
    }
    if (*state == nccl_result::in_progress && c->header && c->header->joined.load() >= c->nranks) unlink_once(*c);
    return nccl_result::success;
  }

  nccl_result comm_finalize(nccl_handle h) override {
    return as_comm(h) ? nccl_result::success : nccl_result::invalid_argument;
  }

  nccl_result comm_destroy(nccl_handle h) override {
    auto* c = as_comm(h);
    if (!c) return nccl_result::invalid_argument;
    unmap_segment(*c);
    delete c;
    return nccl_result::success;
  }

  nccl_result comm_abort(nccl_handle h) override {
    auto* c = as_comm(h);
    if (!c) return nccl_result::invalid_argument;
    c->aborted.store(true);
    // Calls in flight see the flag within one backoff pause and leave.
    while (c->busy.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    unmap_segment(*c);
    std::lock_guard<std::mutex> lock(mutex_);
    graveyard_.push_back(c);
    return nccl_result::success;
  }

  nccl_result comm_revoke(nccl_handle h) override {
    auto* c = as_comm(h);
    if (!c) return nccl_result::invalid_argument;
    c->revoked.store(true);
    return nccl_result::success;
  }

  nccl_result comm_shrink(nccl_handle h, const std::vector<int>& exclude, nccl_handle* new_comm,
                          const nccl_config& config, bool abort_in_flight) override {
    *new_comm = nullptr;
    auto* c = as_comm(h);
    if (!c || c->aborted.load()) return nccl_result::invalid_usage;
    if (abort_in_flight) c->revoked.store(true);  // NCCL_SHRINK_ABORT: in-flight work on the parent stops
    int below = 0;
    for (int r : exclude) {
      if (r < 0 || r >= c->nranks) return nccl_result::invalid_argument;
      if (r == c->rank) return nccl_result::invalid_argument;  // an excluded rank does not call shrink
      if (r < c->rank) ++below;
    }
    const int n = c->nranks - static_cast<int>(exclude.size());
    return attach(new_comm, mix(mix(c->key, ++c->derived), 's'), n, c->rank - below, config);
  }

  nccl_result comm_get_grow_id(nccl_handle h, nccl_unique_id* id) override {
    auto* c = as_comm(h);
    if (!c || c->dead()) return nccl_result::invalid_usage;
    write_id(id, mix(mix(c->key, c->derived + 1), 'g'));
    return nccl_result::success;
  }

  nccl_result comm_grow(nccl_handle h, int nranks, const nccl_unique_id* id, int rank, nccl_handle* new_comm,
                        const nccl_config& config) override {
    *new_comm = nullptr;
    if (nranks < 1 || nranks > kMaxRanks) return nccl_result::invalid_argument;
    if (h) {
      auto* c = as_comm(h);
      if (!c || c->dead() || rank != -1 || nranks <= c->nranks) return nccl_result::invalid_usage;
      const std::uint64_t key = mix(mix(c->key, ++c->derived), 'g');
      std::uint64_t given = 0;
      if (id && (!read_id(*id, &given) || given != key)) return nccl_result::invalid_argument;
      return attach(new_comm, key, nranks, c->rank, config);
    }
    std::uint64_t key = 0;
    if (!id || !read_id(*id, &key) || rank < 0 || rank >= nranks) return nccl_result::invalid_argument;
    return attach(new_comm, key, nranks, rank, config);
  }

  nccl_result all_reduce_sum(const void* send, void* recv, std::size_t count, nccl_dtype dtype, nccl_handle h,
                             void*) override {
    return collective(send, recv, count, dtype, -1, h);
  }

  nccl_result broadcast(const void* send, void* recv, std::size_t count, nccl_dtype dtype, int root, nccl_handle h,
                        void*) override {
    auto* c = as_comm(h);
    if (c && (root < 0 || root >= c->nranks)) return nccl_result::invalid_argument;
    return collective(send, recv, count, dtype, root, h);
  }

  nccl_result group_start() override {
    ++t_group_depth;
    return nccl_result::success;
  }

  nccl_result group_end() override {
    if (t_group_depth == 0) return nccl_result::invalid_usage;
    if (--t_group_depth > 0) return nccl_result::success;
    std::vector<p2p_op> ops;
    ops.swap(t_group_ops);
    return run(ops);
  }

  nccl_result send(const void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle h, void*) override {
    return post(const_cast<void*>(buf), count, dtype, peer, h, true);
  }
  nccl_result recv(void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle h, void*) override {
    return post(buf, count, dtype, peer, h, false);
  }

  std::string error_string(nccl_result r) const override {
    switch (r) {
      case nccl_result::success:
        return "no error (emulated NCCL)";
      case nccl_result::invalid_usage:
        return "invalid usage: the communicator was revoked or aborted (emulated NCCL)";
      case nccl_result::invalid_argument:
        return "invalid argument (emulated NCCL)";
      case nccl_result::remote_error:
        return "remote process exited or there was a network error (emulated NCCL)";
      case nccl_result::system_error:
        return "system error (emulated NCCL)";
      default:
        return "emulated NCCL error " + std::to_string(static_cast<int>(r));
    }
  }
  std::string last_error(nccl_handle h) const override {
    auto* c = static_cast<emu_comm*>(h);
    return c ? c->last_error : "";
  }

 private:
  static emu_comm* as_comm(nccl_handle h) { return static_cast<emu_comm*>(h); }

  std::uint64_t fresh_key() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!seeded_) {
      std::random_device rd;
      rng_.seed((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid()) ^
                static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
      seeded_ = true;
    }
    return rng_();
  }

  nccl_result attach(nccl_handle* out, std::uint64_t key, int nranks, int rank, const nccl_config& config) {
    auto c = std::make_unique<emu_comm>();
    c->key = key;
    c->nranks = nranks;
    c->rank = rank;
    c->blocking = config.blocking;
    if (const auto r = map_segment(*c, options_.directory); r != nccl_result::success) return r;
    emu_comm* raw = c.release();
    *out = raw;
    if (!config.blocking) return nccl_result::in_progress;
    // A blocking init waits for every rank (forever, like NCCL's): only abort ends it.
    backoff b;
    while (raw->header->joined.load() < nranks) {
      if (raw->dead()) return nccl_result::invalid_usage;
      b.pause();
    }
    unlink_once(*raw);
    return nccl_result::success;
  }

  /// Waits until `ready()`; an error once the communicator is revoked or aborted, or when
  /// (peer_death_error) a peer in `peers` has no process any more.
  template <class Ready>
  nccl_result wait(emu_comm& c, Ready&& ready, const std::vector<int>& peers) {
    backoff b;
    auto last_check = std::chrono::steady_clock::now();
    while (!ready()) {
      if (c.dead()) return nccl_result::invalid_usage;
      if (options_.peer_death_error && std::chrono::steady_clock::now() - last_check > std::chrono::milliseconds(50)) {
        last_check = std::chrono::steady_clock::now();
        for (int r : peers) {
          const int pid = c.ranks[r].pid.load();
          if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
            c.last_error = "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") is gone";
            c.async_error.store(static_cast<int>(nccl_result::remote_error));
            return nccl_result::remote_error;
          }
        }
      }
      b.pause();
    }
    return nccl_result::success;
  }

  std::vector<int> everyone(const emu_comm& c) const {
    std::vector<int> all;
    for (int r = 0; r < c.nranks; ++r)
      if (r != c.rank) all.push_back(r);
    return all;
  }

  nccl_result collective(const void* send, void* recv, std::size_t count, nccl_dtype dtype, int root, nccl_handle h) {
    auto* c = as_comm(h);
    if (!c) return nccl_result::invalid_argument;
    op_scope scope(c);
    if (!scope.ok()) return nccl_result::invalid_usage;
    if (c->header->joined.load() < c->nranks) return nccl_result::invalid_usage;  // init not complete
    const std::size_t esize = element_size(dtype);
    const std::size_t per_piece = kSlotBytes / esize;
    const auto peers = everyone(*c);
    std::vector<const char*> slots(static_cast<std::size_t>(c->nranks));
    for (int r = 0; r < c->nranks; ++r) slots[static_cast<std::size_t>(r)] = c->slot(r);
    for (std::size_t off = 0; off < count || (count == 0 && off == 0); off += per_piece) {
      const std::size_t n = std::min(per_piece, count - off);
      const std::uint64_t piece = ++c->pieces;
      auto all_at = [c](std::atomic<std::uint64_t> rank_ctl::* field, std::uint64_t target) {
        for (int r = 0; r < c->nranks; ++r)
          if ((c->ranks[r].*field).load(std::memory_order_acquire) < target) return false;
        return true;
      };
      // My slot is free once every rank is done with the previous piece.
      if (auto r = wait(*c, [&] { return all_at(&rank_ctl::leave, piece - 1); }, peers); r != nccl_result::success)
        return r;
      if (root < 0 || root == c->rank)
        std::memcpy(c->slot(c->rank), static_cast<const char*>(send) + off * esize, n * esize);
      c->ranks[c->rank].arrive.store(piece, std::memory_order_release);
      if (auto r = wait(*c, [&] { return all_at(&rank_ctl::arrive, piece); }, peers); r != nccl_result::success)
        return r;
      char* out = static_cast<char*>(recv) + off * esize;
      if (root < 0) {
        sum_slots(dtype, out, slots.data(), c->nranks, n);
      } else {
        std::memcpy(out, c->slot(root), n * esize);
      }
      c->ranks[c->rank].leave.store(piece, std::memory_order_release);
      if (count == 0) break;
    }
    return nccl_result::success;
  }

  nccl_result post(void* buf, std::size_t count, nccl_dtype dtype, int peer, nccl_handle h, bool is_send) {
    auto* c = as_comm(h);
    if (!c) return nccl_result::invalid_argument;
    if (peer < 0 || peer >= c->nranks) return nccl_result::invalid_argument;
    if (c->dead()) return nccl_result::invalid_usage;
    p2p_op op{c, is_send, static_cast<char*>(buf), count * element_size(dtype), 0, peer};
    if (t_group_depth > 0) {
      t_group_ops.push_back(op);
      return nccl_result::success;
    }
    std::vector<p2p_op> ops{op};
    return run(ops);
  }

  nccl_result run(std::vector<p2p_op>& ops) {
    std::vector<std::unique_ptr<op_scope>> scopes;
    std::vector<int> peers;
    for (auto& op : ops) {
      scopes.push_back(std::make_unique<op_scope>(op.comm));
      if (!scopes.back()->ok()) return nccl_result::invalid_usage;
      peers.push_back(op.peer);
    }
    if (ops.empty()) return nccl_result::success;
    emu_comm& c = *ops.front().comm;
    for (;;) {
      bool all = true;
      bool any = false;
      for (auto& op : ops) {
        while (op.done < op.total && progress(op)) any = true;
        all = all && op.done == op.total;
      }
      if (all) return nccl_result::success;
      if (any) continue;
      // Nothing moved: the same checks as a collective's wait, once.
      if (auto r = wait(c, [&] { return nudged(ops); }, peers); r != nccl_result::success) return r;
    }
  }

  nccl_emulation_options options_;
  nccl_features features_;
  std::mutex mutex_;
  std::mt19937_64 rng_;
  bool seeded_ = false;
  std::vector<emu_comm*> graveyard_;
};

}  // namespace

nccl_emulation_options nccl_emulation_options::from_env() {
  nccl_emulation_options o;
  if (const char* v = std::getenv("DRA_NCCL_EMULATION"); v && *v && std::string(v) != "1") {
    int major = 0, minor = 0, patch = 0;
    if (std::sscanf(v, "%d.%d.%d", &major, &minor, &patch) != 3 || major != 2 || minor < 14)
      dra::detail::throw_invalid("DRA_NCCL_EMULATION",
                                 std::string("expected 1 or a version >= 2.14.0 such as 2.27.0, got '") + v + "'");
    o.version = nccl_version_code(major, minor, patch);
  }
  if (const char* d = std::getenv("DRA_NCCL_EMULATION_DIR"); d && *d) o.directory = d;
  if (const char* p = std::getenv("DRA_NCCL_EMULATION_PEER_DEATH"); p && *p) {
    const std::string s = p;
    if (s != "hang" && s != "error")
      dra::detail::throw_invalid("DRA_NCCL_EMULATION_PEER_DEATH", "expected 'hang' or 'error', got '" + s + "'");
    o.peer_death_error = s == "error";
  }
  return o;
}

std::shared_ptr<nccl_api> make_emulated_nccl_api(nccl_emulation_options options) {
  if (options.version < nccl_nonblocking_min)
    dra::detail::throw_invalid("version", "the emulation starts at NCCL 2.14 (non-blocking init), got " +
                                              nccl_version_string(options.version));
  struct stat st{};
  if (::stat(options.directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    dra::detail::throw_invalid("directory", "'" + options.directory + "' is not a directory");
  return std::make_shared<emulated_nccl>(std::move(options));
}

}  // namespace dra::comm