// The shared memory of the emulated NCCL library (nccl_emulation_shm.hpp).
#include "nccl_emulation_shm.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace dra::comm::emulation {

std::size_t segment_bytes(int n) {
  const auto un = static_cast<std::size_t>(n);
  return sizeof(seg_header) + un * sizeof(rank_ctl) + un * un * sizeof(channel_ctl) + un * kSlotBytes +
         un * un * kChannelBytes;
}

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void write_id(nccl_unique_id* id, std::uint64_t key) {
  id->bytes.fill(0);
  std::memcpy(id->bytes.data(), kMagic, sizeof kMagic);
  std::memcpy(id->bytes.data() + 8, &key, sizeof key);
}

bool read_id(const nccl_unique_id& id, std::uint64_t* key) {
  if (std::memcmp(id.bytes.data(), kMagic, sizeof kMagic) != 0) return false;
  std::memcpy(key, id.bytes.data() + 8, sizeof *key);
  return true;
}

std::size_t element_size(nccl_dtype t) {
  switch (t) {
    case nccl_dtype::int8:
    case nccl_dtype::uint8:
      return 1;
    case nccl_dtype::float16:
    case nccl_dtype::bfloat16:
      return 2;
    case nccl_dtype::int32:
    case nccl_dtype::uint32:
    case nccl_dtype::float32:
      return 4;
    case nccl_dtype::int64:
    case nccl_dtype::uint64:
    case nccl_dtype::float64:
      return 8;
  }
  return 0;
}

template <class T, class Acc = T>
void sum_slots(void* out, const char* const* slots, int n, std::size_t count) {
  auto* dst = static_cast<T*>(out);
  for (std::size_t i = 0; i < count; ++i) {
    Acc acc = static_cast<Acc>(reinterpret_cast<const T*>(slots[0])[i]);
    for (int r = 1; r < n; ++r) acc = static_cast<Acc>(acc + static_cast<Acc>(reinterpret_cast<const T*>(slots[r])[i]));
    dst[i] = static_cast<T>(acc);
  }
}

void sum_slots(nccl_dtype t, void* out, const char* const* slots, int n, std::size_t count) {
  switch (t) {
    case nccl_dtype::int8:
      return sum_slots<std::int8_t>(out, slots, n, count);
    case nccl_dtype::uint8:
      return sum_slots<std::uint8_t>(out, slots, n, count);
    case nccl_dtype::int32:
      return sum_slots<std::int32_t>(out, slots, n, count);
    case nccl_dtype::uint32:
      return sum_slots<std::uint32_t>(out, slots, n, count);
    case nccl_dtype::int64:
      return sum_slots<std::int64_t>(out, slots, n, count);
    case nccl_dtype::uint64:
      return sum_slots<std::uint64_t>(out, slots, n, count);
    case nccl_dtype::float16:
      return sum_slots<c10::Half, float>(out, slots, n, count);
    case nccl_dtype::bfloat16:
      return sum_slots<c10::BFloat16, float>(out, slots, n, count);
    case nccl_dtype::float32:
      return sum_slots<float>(out, slots, n, count);
    case nccl_dtype::float64:
      return sum_slots<double>(out, slots, n, count);
  }
}

void backoff::pause() {
  if (spins_ < 32) {
    ++spins_;
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
}

void backoff::reset() {
  spins_ = 0;
  sleep_ = std::chrono::microseconds(20);
}

nccl_result map_segment(emu_comm& c, const std::string& directory) {
  char name[48];
  std::snprintf(name, sizeof name, "/dra-nccl-emu-%016llx", static_cast<unsigned long long>(c.key));
  c.path = directory + name;
  c.bytes = segment_bytes(c.nranks);
  const int fd = ::open(c.path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) {
    c.last_error = "open " + c.path + ": " + std::strerror(errno);
    return nccl_result::system_error;
  }
  struct stat st{};
  bool ok = ::fstat(fd, &st) == 0;
  if (ok && static_cast<std::size_t>(st.st_size) < c.bytes) ok = ::ftruncate(fd, static_cast<off_t>(c.bytes)) == 0;
  void* base = ok ? ::mmap(nullptr, c.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    c.last_error = "map " + c.path + ": " + std::strerror(err);
    return nccl_result::system_error;
  }
  c.base = base;
  auto* p = static_cast<char*>(base);
  c.header = reinterpret_cast<seg_header*>(p);
  p += sizeof(seg_header);
  c.ranks = reinterpret_cast<rank_ctl*>(p);
  p += static_cast<std::size_t>(c.nranks) * sizeof(rank_ctl);
  c.channels = reinterpret_cast<channel_ctl*>(p);
  p += static_cast<std::size_t>(c.nranks * c.nranks) * sizeof(channel_ctl);
  c.slots = p;
  c.rings = p + static_cast<std::size_t>(c.nranks) * kSlotBytes;
  c.ranks[c.rank].pid.store(static_cast<std::int32_t>(::getpid()));
  c.header->joined.fetch_add(1);
  return nccl_result::success;
}

void unlink_once(emu_comm& c) {
  if (c.unlinked) return;
  c.unlinked = true;
  ::unlink(c.path.c_str());  // every rank tries; ENOENT is fine
}

void unmap_segment(emu_comm& c) {
  if (!c.base) return;
  unlink_once(c);
  ::munmap(c.base, c.bytes);
  c.base = nullptr;
  c.header = nullptr;
}
bool progress(p2p_op& op) {
  emu_comm& c = *op.comm;
  const int src = op.is_send ? c.rank : op.peer;
  const int dst = op.is_send ? op.peer : c.rank;
  channel_ctl& ch = c.channel(src, dst);
  char* ring = c.ring(src, dst);
  const std::uint64_t head =
      op.is_send ? ch.head.load(std::memory_order_relaxed) : ch.head.load(std::memory_order_acquire);
  const std::uint64_t tail =
      op.is_send ? ch.tail.load(std::memory_order_acquire) : ch.tail.load(std::memory_order_relaxed);
  const std::size_t ready =
      op.is_send ? kChannelBytes - static_cast<std::size_t>(head - tail) : static_cast<std::size_t>(head - tail);
  const std::size_t n = std::min(ready, op.total - op.done);
  if (n == 0) return false;
  const std::uint64_t pos = op.is_send ? head : tail;
  const std::size_t at = static_cast<std::size_t>(pos % kChannelBytes);
  const std::size_t first = std::min(n, kChannelBytes - at);
  if (op.is_send) {
    std::memcpy(ring + at, op.buf + op.done, first);
    std::memcpy(ring, op.buf + op.done + first, n - first);
    ch.head.store(head + n, std::memory_order_release);
  } else {
    std::memcpy(op.buf + op.done, ring + at, first);
    std::memcpy(op.buf + op.done + first, ring, n - first);
    ch.tail.store(tail + n, std::memory_order_release);
  }
  op.done += n;
  return true;
}

bool nudged(std::vector<p2p_op>& ops) {
  for (auto& op : ops) {
    if (op.done == op.total) continue;
    emu_comm& c = *op.comm;
    const int src = op.is_send ? c.rank : op.peer;
    const int dst = op.is_send ? op.peer : c.rank;
    channel_ctl& ch = c.channel(src, dst);
    const std::uint64_t used = ch.head.load(std::memory_order_acquire) - ch.tail.load(std::memory_order_acquire);
    if (op.is_send ? used < kChannelBytes : used > 0) return true;
  }
  return false;
}

}  // namespace dra::comm::emulation
