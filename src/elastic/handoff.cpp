#include "handoff.hpp"

#include <ATen/Functions.h>

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

std::uint64_t send_state(comm::communicator& comm, comm::tensor_transfer& transfer, const std::vector<int>& dsts,
                         state_provider& state, const handoff_header& header) {
  auto snap = state.collect();
  const std::string own =
      json{{"step_index", header.step_index},
           {"sampler", {header.sampler.epoch, header.sampler.cursor, header.sampler.global_batch, header.sampler.seed}},
           {"num_epochs", header.num_epochs},
           {"resizes", header.resizes},
           {"energy", {header.energy_j, header.energy_known, header.energy_measured}}}
          .dump();
  const auto n = static_cast<std::int64_t>(snap.tensors.size());
  at::Tensor head = at::empty({kFixed + n}, at::kLong);
  auto* h = head.data_ptr<std::int64_t>();
  h[0] = static_cast<std::int64_t>(own.size());
  h[1] = static_cast<std::int64_t>(snap.manifest.size());
  h[2] = static_cast<std::int64_t>(header.hook_state.size());
  h[3] = n;
  std::uint64_t tensor_bytes = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    h[kFixed + i] = byte_size(snap.tensors[static_cast<std::size_t>(i)]);
    tensor_bytes += static_cast<std::uint64_t>(h[kFixed + i]);
  }
  at::Tensor length = at::full({1}, kFixed + n, at::kLong);
  comm.send(length, dsts, kTagHeader);
  comm.send(head, dsts, kTagHeader);
  at::Tensor meta = at::empty({h[0] + h[1] + h[2]}, at::kByte);
  auto* out = static_cast<char*>(meta.data_ptr());
  std::memcpy(out, own.data(), own.size());
  if (!snap.manifest.empty()) std::memcpy(out + own.size(), snap.manifest.data(), snap.manifest.size());
  if (!header.hook_state.empty())
    std::memcpy(out + own.size() + snap.manifest.size(), header.hook_state.data(), header.hook_state.size());
  transfer.send(comm, {meta}, dsts);
  transfer.send(comm, snap.tensors, dsts);
  return tensor_bytes;
}

std::uint64_t recv_state(comm::communicator& comm, comm::tensor_transfer& transfer, int src, state_provider& state,
                         handoff_header& header) {
  at::Tensor length = at::zeros({1}, at::kLong);
  comm.recv(length, src, kTagHeader);
  at::Tensor head = at::empty({length.item<std::int64_t>()}, at::kLong);
  comm.recv(head, src, kTagHeader);
  const auto* h = head.data_ptr<std::int64_t>();
  const std::int64_t own_len = h[0], manifest_len = h[1], hook_len = h[2], n = h[3];
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
  std::uint64_t tensor_bytes = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto mine = byte_size(targets[static_cast<std::size_t>(i)]);
    if (mine != h[kFixed + i])
      throw dra::state_mismatch_error("dra: state tensor " + std::to_string(i) + " has " +
                                      std::to_string(h[kFixed + i]) + " bytes in the world, " + std::to_string(mine) +
                                      " here; its model or optimizer differs");
    tensor_bytes += static_cast<std::uint64_t>(mine);
  }
  transfer.recv(comm, targets, src);
  state.load(manifest, targets);
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
  return tensor_bytes;
}

}  // namespace detail
}  // namespace dra::elastic
