#pragma once
// The shared memory of the emulated NCCL library (internal to dra::dra): one segment per
// communicator, its layout, the unique ids, the reduction of the ranks' slots, and the byte rings
// of point-to-point calls. nccl_emulation.cpp describes the semantics built on it.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dra/torch/comm/nccl.hpp"

namespace dra::comm::emulation {

constexpr std::size_t kSlotBytes = std::size_t{1} << 20;     // all-reduce piece per rank
constexpr std::size_t kChannelBytes = std::size_t{1} << 19;  // ring of one ordered pair
constexpr int kMaxRanks = 64;
constexpr char kMagic[8] = {'d', 'r', 'a', 'e', 'm', 'u', '0', '1'};

struct alignas(64) seg_header {
  std::atomic<std::int32_t> joined;
};
struct alignas(64) rank_ctl {
  std::atomic<std::uint64_t> arrive;
  std::atomic<std::uint64_t> leave;
  std::atomic<std::int32_t> pid;
};
struct alignas(64) channel_ctl {
  std::atomic<std::uint64_t> head;  // bytes written by the sender
  std::atomic<std::uint64_t> tail;  // bytes consumed by the receiver
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

/// Bytes of the segment of a communicator of `n` ranks.
std::size_t segment_bytes(int n);
/// A key derived from `a` and `b` (shrink/grow: the same on every rank).
std::uint64_t mix(std::uint64_t a, std::uint64_t b);
/// A unique id carrying `key`, and back (false: not an id of the emulation).
void write_id(nccl_unique_id* id, std::uint64_t key);
bool read_id(const nccl_unique_id& id, std::uint64_t* key);
std::size_t element_size(nccl_dtype t);
/// out[i] = sum over ranks r (in rank order: bit-identical on every rank) of slots[r][i].
void sum_slots(nccl_dtype t, void* out, const char* const* slots, int n, std::size_t count);

/// Sleeps a little longer each time nothing moved: yields first, then 20 us doubling to 1 ms.
class backoff {
 public:
  void pause();
  void reset();

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{20};
};

/// One rank's handle on a communicator's shared segment.
struct emu_comm {
  std::string path;
  std::uint64_t key = 0;
  int nranks = 0;
  int rank = 0;
  void* base = nullptr;
  std::size_t bytes = 0;
  seg_header* header = nullptr;
  rank_ctl* ranks = nullptr;
  channel_ctl* channels = nullptr;
  char* slots = nullptr;
  char* rings = nullptr;
  bool blocking = false;
  bool unlinked = false;
  std::uint64_t pieces = 0;   // collective pieces done: the same count on every rank
  std::uint64_t derived = 0;  // communicators derived by shrink/grow: the same on every rank
  std::atomic<bool> aborted{false};
  std::atomic<bool> revoked{false};
  std::atomic<int> busy{0};
  std::atomic<int> async_error{0};
  std::string last_error;

  char* slot(int r) const { return slots + static_cast<std::size_t>(r) * kSlotBytes; }
  channel_ctl& channel(int src, int dst) const { return channels[src * nranks + dst]; }
  char* ring(int src, int dst) const {
    return rings + (static_cast<std::size_t>(src) * static_cast<std::size_t>(nranks) + static_cast<std::size_t>(dst)) *
                       kChannelBytes;
  }
  bool dead() const { return aborted.load() || revoked.load(); }
};

/// Marks an operation in flight on a communicator (abort waits for it to leave); false when the
/// communicator was revoked or aborted.
class op_scope {
 public:
  explicit op_scope(emu_comm* c) : c_(c) {
    c_->busy.fetch_add(1);
    ok_ = !c_->dead();
  }
  ~op_scope() { c_->busy.fetch_sub(1); }
  op_scope(const op_scope&) = delete;
  op_scope& operator=(const op_scope&) = delete;
  bool ok() const { return ok_; }

 private:
  emu_comm* c_;
  bool ok_ = false;
};

// A point-to-point call waiting to progress (in a group, or alone).
struct p2p_op {
  emu_comm* comm;
  bool is_send;
  char* buf;
  std::size_t total;
  std::size_t done;
  int peer;
};

/// Creates (or opens) the segment of `c.key` in `directory` and maps it (c.path, c.base and the
/// pointers into it); registers this rank's pid and counts it in. system_error: c.last_error says why.
nccl_result map_segment(emu_comm& c, const std::string& directory);
/// Unlinks the segment's file once (every rank tries; ENOENT is fine).
void unlink_once(emu_comm& c);
/// Unlinks and unmaps the segment.
void unmap_segment(emu_comm& c);

/// Moves what the ring of `op`'s pair allows now; false when nothing moved.
bool progress(p2p_op& op);
/// True as soon as any pending call could move a byte.
bool nudged(std::vector<p2p_op>& ops);

}  // namespace dra::comm::emulation
