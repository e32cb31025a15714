#include "handoff.hpp"

#include <ATen/Functions.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"
#include "world_change.hpp"

namespace dra::elastic {

namespace {

constexpr int kTagHeader = 71;
constexpr std::int64_t kFixed = 4;  // head: own, manifest, hook state lengths, tensor count
// What a receiver accepts in a header (a sender's own values are far below): entries (2^25
// tensors, deferred) and bytes of each meta part (the controller's, the manifest, the hook state).
constexpr std::int64_t kMaxHeader = kFixed + 1 + (std::int64_t{2} << 25);
constexpr std::int64_t kMaxPartBytes = std::int64_t{1} << 40;

std::int64_t byte_size(const at::Tensor& t) {
  return static_cast<std::int64_t>(t.numel() * t.element_size());
}

std::uint64_t mix_bytes(std::uint64_t h, const unsigned char* p, std::size_t n) {
  // A 64-bit multiply-xorshift over 8-byte words: fast enough for a post-resize check of
  // hundreds of MB, and any differing bit changes the result with overwhelming probability.
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

}  // namespace

std::uint64_t state_digest(state_provider& state) {
  const auto snap = state.collect();
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const auto& tensor : snap.tensors) {
    const auto t = tensor.contiguous().cpu();
    h = mix_bytes(h, static_cast<const unsigned char*>(t.data_ptr()), static_cast<std::size_t>(byte_size(t)));
  }
  return h >> 2;  // 62 bits: a non-negative int64 and a Python int that round-trips JSON
}

namespace detail {

using json = nlohmann::json;

handoff_route route_handoff(const world_change& change, int rank, int size, int uid) {
  handoff_route route;
  if (change.cause == change_cause::start || change.cause == change_cause::fault) {
    if (rank != 0) {
      route.receive_from = 0;
    } else {
      for (int r = 1; r < size; ++r) route.send_to.push_back(r);
    }
    return route;
  }
  if (change.joined.empty()) return route;
  const auto sources = handoff_sources(change.members, change.joined);
  for (std::size_t i = 0; i < change.joined.size(); ++i) {
    if (change.joined[i] == uid) route.receive_from = sources[i];
    if (sources[i] == rank) route.send_to.push_back(rank_of(change.members, change.joined[i]));
  }
  if (route.receive_from >= 0) route.send_to.clear();  // a joiner holds no state to send
  return route;
}

namespace {

constexpr int kTagNeed = 72;  // receiver -> sender: the tensors it lacks; sender -> receivers: the union

std::uint64_t tensor_digest(const at::Tensor& tensor) {
  const auto t = tensor.contiguous().cpu();
  return mix_bytes(0xCBF29CE484222325ull, static_cast<const unsigned char*>(t.data_ptr()),
                   static_cast<std::size_t>(byte_size(t))) >>
         2;
}

template <class T>
std::vector<T> pick(const std::vector<T>& all, std::size_t from, std::size_t to, const std::uint8_t* need) {
  std::vector<T> out;
  for (std::size_t i = from; i < to; ++i)
    if (need == nullptr || need[i]) out.push_back(all[i]);
  return out;
}

}  // namespace

deferred_transfer::deferred_transfer(comm::communicator& comm, comm::tensor_transfer& transfer,
                                     std::vector<at::Tensor> tensors, std::vector<int> dsts)
    : receiver_(false), tensors_(std::move(tensors)) {
  for (const auto& t : tensors_) bytes_ += static_cast<std::uint64_t>(byte_size(t));
  start([this, &comm, &transfer, dsts = std::move(dsts)] { transfer.send(comm, tensors_, dsts); });
}

deferred_transfer::deferred_transfer(comm::communicator& comm, comm::tensor_transfer& transfer,
                                     std::vector<at::Tensor> tensors, int src, std::string manifest,
                                     std::vector<at::Tensor> targets)
    : receiver_(true), tensors_(std::move(tensors)), targets_(std::move(targets)), manifest_(std::move(manifest)) {
  for (const auto& t : tensors_) bytes_ += static_cast<std::uint64_t>(byte_size(t));
  start([this, &comm, &transfer, src] { transfer.recv(comm, tensors_, src); });
}

void deferred_transfer::start(std::function<void()> body) {
  thread_ = std::thread([this, body = std::move(body)] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      body();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    duration_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
}

std::string deferred_transfer::wait() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

deferred_transfer::~deferred_transfer() {
  if (thread_.joinable()) thread_.join();  // the communicator was revoked or the transfer ended
}

handoff_result send_state(comm::communicator& comm, comm::tensor_transfer& transfer, const std::vector<int>& dsts,
                          state_provider& state, const handoff_header& header, bool deferred) {
  auto snap = state.collect();
  const std::string own =
      json{{"step_index", header.step_index},
           {"sampler", {header.sampler.epoch, header.sampler.cursor, header.sampler.global_batch, header.sampler.seed}},
           {"num_epochs", header.num_epochs},
           {"resizes", header.resizes},
           {"energy", {header.energy_j, header.energy_known, header.energy_measured}}}
          .dump();
  const auto n = static_cast<std::int64_t>(snap.tensors.size());
  const auto split = deferred ? std::min<std::size_t>(snap.deferrable_from, snap.tensors.size()) : snap.tensors.size();
  // Deferred: [fixed, sizes, first deferrable, a digest of each tensor before it].
  const std::int64_t extra = deferred ? 1 + n : 0;
  at::Tensor head = at::zeros({kFixed + n + extra}, at::kLong);
  auto* h = head.data_ptr<std::int64_t>();
  h[0] = static_cast<std::int64_t>(own.size());
  h[1] = static_cast<std::int64_t>(snap.manifest.size());
  h[2] = static_cast<std::int64_t>(header.hook_state.size());
  h[3] = n;
  for (std::int64_t i = 0; i < n; ++i) h[kFixed + i] = byte_size(snap.tensors[static_cast<std::size_t>(i)]);
  if (deferred) {
    h[kFixed + n] = static_cast<std::int64_t>(split);
    for (std::size_t i = 0; i < split; ++i)
      h[kFixed + n + 1 + static_cast<std::int64_t>(i)] = static_cast<std::int64_t>(tensor_digest(snap.tensors[i]));
  }
  at::Tensor length = at::full({1}, kFixed + n + extra, at::kLong);
  comm.send(length, dsts, kTagHeader);
  comm.send(head, dsts, kTagHeader);
  at::Tensor meta = at::empty({h[0] + h[1] + h[2]}, at::kByte);
  auto* out = static_cast<char*>(meta.data_ptr());
  std::memcpy(out, own.data(), own.size());
  if (!snap.manifest.empty()) std::memcpy(out + own.size(), snap.manifest.data(), snap.manifest.size());
  if (!header.hook_state.empty())
    std::memcpy(out + own.size() + snap.manifest.size(), header.hook_state.data(), header.hook_state.size());
  transfer.send(comm, {meta}, dsts);
  handoff_result result;
  if (!deferred) {
    transfer.send(comm, snap.tensors, dsts);
    for (const auto& t : snap.tensors) result.bytes += static_cast<std::uint64_t>(byte_size(t));
    return result;
  }
  // What the receivers lack: the union of their answers, sent back so that all expect the same.
  at::Tensor need = at::zeros({std::max<std::int64_t>(n, 1)}, at::kByte);
  for (int d : dsts) {
    at::Tensor theirs = at::zeros({std::max<std::int64_t>(n, 1)}, at::kByte);
    comm.recv(theirs, d, kTagNeed);
    need.bitwise_or_(theirs);
  }
  comm.send(need, dsts, kTagNeed);
  const auto* lacks = need.data_ptr<std::uint8_t>();
  const auto now = pick(snap.tensors, 0, split, lacks);
  transfer.send(comm, now, dsts);
  for (std::size_t i = 0; i < split; ++i)
    (lacks[i] ? result.bytes : result.skipped_bytes) += static_cast<std::uint64_t>(byte_size(snap.tensors[i]));
  auto later = pick(snap.tensors, split, snap.tensors.size(), nullptr);
  if (!later.empty()) result.deferred = std::make_unique<deferred_transfer>(comm, transfer, std::move(later), dsts);
  return result;
}

handoff_result recv_state(comm::communicator& comm, comm::tensor_transfer& transfer, int src, state_provider& state,
                          handoff_header& header, bool deferred) {
  // The header comes from another process: its length, sizes and counts are checked before
  // anything is sized from them or read at an index they give.
  const auto malformed = [src](const std::string& what) {
    return dra::state_mismatch_error("dra: the state handoff from rank " + std::to_string(src) +
                                     " has a malformed header (" + what + "); not loaded");
  };
  at::Tensor length = at::zeros({1}, at::kLong);
  comm.recv(length, src, kTagHeader);
  const std::int64_t head_len = length.item<std::int64_t>();
  if (head_len < kFixed || head_len > kMaxHeader)
    throw malformed("length " + std::to_string(head_len) + ", expected " + std::to_string(kFixed) + " to " +
                    std::to_string(kMaxHeader));
  at::Tensor head = at::empty({head_len}, at::kLong);
  comm.recv(head, src, kTagHeader);
  const auto* h = head.data_ptr<std::int64_t>();
  const std::int64_t own_len = h[0], manifest_len = h[1], hook_len = h[2], n = h[3];
  for (const std::int64_t part : {own_len, manifest_len, hook_len})
    if (part < 0 || part > kMaxPartBytes)
      throw malformed("a part of " + std::to_string(part) + " bytes, expected 0 to " + std::to_string(kMaxPartBytes));
  if (n < 0 || head_len != kFixed + n + (deferred ? 1 + n : 0))
    throw malformed(std::to_string(n) + " tensors in a header of " + std::to_string(head_len) + " entries" +
                    (deferred ? " (deferred)" : ""));
  if (deferred && (h[kFixed + n] < 0 || h[kFixed + n] > n))
    throw malformed("first deferrable tensor " + std::to_string(h[kFixed + n]) + " of " + std::to_string(n));
  at::Tensor meta = at::empty({own_len + manifest_len + hook_len}, at::kByte);
  transfer.recv(comm, {meta}, src);
  const char* base = static_cast<const char*>(meta.data_ptr());
  const json own = json::parse(std::string(base, base + own_len));
  const std::string manifest(base + own_len, base + own_len + manifest_len);
  const auto* hook = reinterpret_cast<const std::uint8_t*>(base + own_len + manifest_len);
  header.hook_state.assign(hook, hook + hook_len);
  auto targets = state.prepare(manifest);
  if (static_cast<std::int64_t>(targets.size()) != n)
    throw dra::state_mismatch_error("dra: the world hands over " + std::to_string(n) +
                                    " state tensors, this process has " + std::to_string(targets.size()) +
                                    "; its model or optimizer differs");
  for (std::int64_t i = 0; i < n; ++i) {
    const auto mine = byte_size(targets[static_cast<std::size_t>(i)]);
    if (mine != h[kFixed + i])
      throw dra::state_mismatch_error("dra: state tensor " + std::to_string(i) + " has " +
                                      std::to_string(h[kFixed + i]) + " bytes in the world, " + std::to_string(mine) +
                                      " here; its model or optimizer differs");
  }
  handoff_result result;
  std::size_t split = targets.size();
  if (!deferred) {
    transfer.recv(comm, targets, src);
    for (const auto& t : targets) result.bytes += static_cast<std::uint64_t>(byte_size(t));
  } else {
    split = static_cast<std::size_t>(h[kFixed + n]);
    // Which of the tensors before the deferrable ones this process lacks: those whose digest
    // differs from the sender's (prepare() gave the model's own storage, so it holds our values).
    at::Tensor need = at::ones({std::max<std::int64_t>(n, 1)}, at::kByte);
    auto* lacks = need.data_ptr<std::uint8_t>();
    for (std::size_t i = 0; i < split; ++i)
      lacks[i] =
          tensor_digest(targets[i]) == static_cast<std::uint64_t>(h[kFixed + n + 1 + static_cast<std::int64_t>(i)]) ? 0
                                                                                                                    : 1;
    comm.send(need, {src}, kTagNeed);
    comm.recv(need, src, kTagNeed);  // the union over every receiver: what the sender sends
    transfer.recv(comm, pick(targets, 0, split, lacks), src);
    for (std::size_t i = 0; i < split; ++i)
      (lacks[i] ? result.bytes : result.skipped_bytes) += static_cast<std::uint64_t>(byte_size(targets[i]));
  }
  const auto s = own.at("sampler");
  header.sampler = {s.at(0).get<std::int64_t>(), s.at(1).get<std::int64_t>(), s.at(2).get<std::int64_t>(),
                    s.at(3).get<std::uint64_t>()};
  header.step_index = own.at("step_index").get<std::int64_t>();
  header.num_epochs = own.at("num_epochs").get<std::int64_t>();
  header.resizes = own.at("resizes").get<std::int64_t>();
  const auto e = own.at("energy");
  header.energy_j = e.at(0).get<double>();
  header.energy_known = e.at(1).get<bool>();
  header.energy_measured = e.at(2).get<bool>();
  if (split >= targets.size()) {
    state.load(manifest, targets);
    return result;
  }
  auto later = pick(targets, split, targets.size(), nullptr);
  result.deferred =
      std::make_unique<deferred_transfer>(comm, transfer, std::move(later), src, manifest, std::move(targets));
  return result;
}

}  // namespace detail
}  // namespace dra::elastic
