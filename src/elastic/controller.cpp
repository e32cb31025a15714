// The elastic controller: the protocol of include/dra/elastic/controller.hpp.
#include "dra/elastic/controller.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include <ATen/Functions.h>
#include <nlohmann/json.hpp>

#include "dra/comm/gloo.hpp"
#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"
#include "store_client.hpp"

namespace dra::elastic {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr int kLateUidBase = 10000;
constexpr int kTagHeader = 71;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback) {
  const std::string v = env_or(name, "");
  if (v.empty()) return fallback;
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    dra::detail::throw_invalid(name, "must be an integer, got '" + v + "'");
  }
}

// Chunks of the state handoff as (tensor index, byte offset, byte count) lists; identical on the
// sending and the receiving side because both derive it from the same byte sizes.
struct piece {
  std::size_t tensor;
  std::int64_t offset;
  std::int64_t count;
};
std::vector<std::vector<piece>> plan_chunks(const std::vector<std::int64_t>& sizes, std::int64_t chunk) {
  std::vector<std::vector<piece>> chunks;
  std::vector<piece> current;
  std::int64_t room = chunk;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::int64_t off = 0;
    while (off < sizes[i]) {
      const std::int64_t take = std::min(sizes[i] - off, room);
      current.push_back({i, off, take});
      off += take;
      room -= take;
      if (room == 0) {
        chunks.push_back(std::move(current));
        current.clear();
        room = chunk;
      }
    }
  }
  if (!current.empty()) chunks.push_back(std::move(current));
  return chunks;
}

at::Tensor byte_view(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous())
    dra::detail::throw_invalid("state tensors", "the state handoff takes contiguous CPU tensors");
  if (t.numel() == 0) return at::empty({0}, at::kByte);
  return t.reshape({-1}).view(at::kByte);
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

json signature_json(const std::vector<tensor_spec>& sig) {
  json out = json::array();
  for (const auto& s : sig) out.push_back({s.name, s.shape, s.dtype});
  return out;
}

std::vector<tensor_spec> signature_from_json(const json& j) {
  std::vector<tensor_spec> out;
  for (const auto& e : j) out.push_back({e.at(0).get<std::string>(), e.at(1).get<std::vector<std::int64_t>>(), e.at(2).get<std::string>()});
  return out;
}

}  // namespace

const char* to_string(role r) noexcept {
  switch (r) {
    case role::candidate: return "candidate";
    case role::member: return "member";
    case role::released: return "released";
    case role::finished: return "finished";
    case role::rejected: return "rejected";
  }
  return "?";
}

launch_info launch_info::from_env() {
  launch_info l;
  l.join = env_or("DRA_JOIN", "0") == "1";
  const std::string dedicated = env_or("DRA_STORE", "");
  const std::string host = env_or("MASTER_ADDR", ""), port = env_or("MASTER_PORT", "");
  if (!dedicated.empty()) {
    // A store that outlives every training process (python -m dra.elastic store): the job then
    // survives the loss of any rank, rank 0 and torchrun's node 0 included.
    const auto colon = dedicated.rfind(':');
    if (colon == std::string::npos || colon == 0)
      dra::detail::throw_invalid("DRA_STORE", "must be host:port, got '" + dedicated + "'");
    l.store_host = dedicated.substr(0, colon);
    try {
      l.store_port = std::stoi(dedicated.substr(colon + 1));
    } catch (const std::exception&) {
      dra::detail::throw_invalid("DRA_STORE", "port must be an integer, got '" + dedicated + "'");
    }
  } else if (!host.empty() && !port.empty()) {
    l.store_host = host;
    l.store_port = env_int("MASTER_PORT", 0);
  }
  l.uid = env_int("RANK", 0);
  l.universe_size = env_int("WORLD_SIZE", 1);
  if (l.store_host.empty()) {
    // Alone, without torchrun: a private store on a free port, a world of one.
    l.store_host = "127.0.0.1";
    l.host_store = true;
  } else if (!l.join && l.uid == 0 && dedicated.empty()) {
    // Under torchrun the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True), or rank 0 when
    // the agent does not share its store. Processes started by hand use a dedicated store, or
    // rank 0 hosts it when it sets DRA_HOST_STORE=1.
    const bool torchrun = !env_or("TORCHELASTIC_RUN_ID", "").empty();
    const bool agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
    l.host_store = env_or("DRA_HOST_STORE", torchrun && !agent_store ? "1" : "0") == "1";
  }
  const std::string run = env_or("DRA_JOB_ID", env_or("TORCHELASTIC_RUN_ID", "job"));
  l.job_prefix = "dra/" + run + "/" + env_or("TORCHELASTIC_RESTART_COUNT", "0") + "/";
  return l;
}

void controller_options::validate() const {
  engine.validate();
  if (decide_every < 1) dra::detail::throw_invalid("decide_every", "must be >= 1, got " + std::to_string(decide_every));
  if (fault_timeout.count() <= 0) dra::detail::throw_invalid("fault_timeout", "must be > 0");
  if (store_timeout.count() <= 0) dra::detail::throw_invalid("store_timeout", "must be > 0");
  if (chunk_bytes < 1024) dra::detail::throw_invalid("chunk_bytes", "must be >= 1024, got " + std::to_string(chunk_bytes));
  if (max_resize_retries < 0) dra::detail::throw_invalid("max_resize_retries", "must be >= 0");
  if (status_every < 0) dra::detail::throw_invalid("status_every", "must be >= 0 (0 = no status line)");
  for (const auto& [step, size] : schedule) {
    if (step < 1) dra::detail::throw_invalid("schedule", "steps must be >= 1, got " + std::to_string(step));
    if (size < 1) dra::detail::throw_invalid("schedule", "sizes must be >= 1, got " + std::to_string(size));
  }
}

/// A leader's decision, as published under dec/<epoch>.
struct controller::decision {
  std::string action;
  std::string reason;
  std::vector<int> members, joined, left;
  std::int64_t epoch = 0;
  double batch_scale = 1.0, lr_scale = 1.0;
  std::int64_t decided_step = 0;

  json to_json() const {
    return {{"action", action}, {"reason", reason}, {"members", members}, {"joined", joined}, {"left", left},
            {"epoch", epoch}, {"batch_scale", batch_scale}, {"lr_scale", lr_scale}, {"decided_step", decided_step}};
  }
  static decision from_json(const json& j) {
    decision d;
    d.action = j.at("action").get<std::string>();
    d.reason = j.at("reason").get<std::string>();
    d.members = j.at("members").get<std::vector<int>>();
    d.joined = j.at("joined").get<std::vector<int>>();
    d.left = j.at("left").get<std::vector<int>>();
    d.epoch = j.at("epoch").get<std::int64_t>();
    d.batch_scale = j.at("batch_scale").get<double>();
    d.lr_scale = j.at("lr_scale").get<double>();
    d.decided_step = j.at("decided_step").get<std::int64_t>();
    return d;
  }
};

// ---------------------------------------------------------------------------------------------
// construction, start, admission
// ---------------------------------------------------------------------------------------------
controller::controller(controller_options options, launch_info launch, std::shared_ptr<state_provider> state,
                       std::shared_ptr<elastic_sampler> sampler, std::shared_ptr<comm::backend> backend)
    : options_((options.validate(), std::move(options))),
      state_(std::move(state)),
      sampler_(std::move(sampler)),
      backend_(std::move(backend)),
      engine_([&] {
        auto c = options_.engine;
        // The controller decides at its own decision steps; the engine only accumulates signals.
        c.decide_every = std::numeric_limits<std::int64_t>::max() / 4;
        if (options_.batch == batch_mode::adascale && c.policy == "goodput") c.goodput.adapt_batch = true;
        return c;
      }()),
      last_loss_(std::numeric_limits<double>::quiet_NaN()) {
  if (!state_) dra::detail::throw_invalid("state", "a state_provider is required (module_state for LibTorch models)");
  if (!sampler_) dra::detail::throw_invalid("sampler", "an elastic_sampler is required");
  if (launch.universe_size < 1)
    dra::detail::throw_invalid("universe_size", "WORLD_SIZE must be >= 1, got " + std::to_string(launch.universe_size));
  if (!launch.join && (launch.uid < 0 || launch.uid >= launch.universe_size))
    dra::detail::throw_invalid("uid", "RANK must lie in [0, WORLD_SIZE=" + std::to_string(launch.universe_size) +
                                          "), got " + std::to_string(launch.uid));
  if (!backend_) {
    comm::gloo_backend_options o;
    o.hostname = options_.gloo_hostname;
    o.key_prefix = "pg";
    backend_ = std::make_shared<comm::gloo_backend>(o);
  }
  store_ = std::make_unique<store_client>(launch.store_host, launch.store_port, launch.host_store, launch.job_prefix,
                                          options_.store_timeout);
  joined_late_ = launch.join;
  if (launch.join) {
    // Late joiners number themselves from 10000 up, so they never collide with the ranks
    // torchrun handed out, whenever they arrive.
    uid_ = kLateUidBase + static_cast<int>(store_->add("late_uid", 1)) - 1;
    universe_size_ = store_->get("universe").get<int>();
  } else {
    uid_ = launch.uid;
    universe_size_ = launch.universe_size;
    if (uid_ == 0) store_->set("universe", universe_size_);
  }
  start_size_ = options_.start_size < 0 ? universe_size_ : options_.start_size;
  if (start_size_ < 1 || start_size_ > universe_size_)
    dra::detail::throw_invalid("start_size", "must lie in [1, " + std::to_string(universe_size_) +
                                                 "] (the processes launched), got " + std::to_string(start_size_));
  signature_ = state_->signature();
  check_consistency();
  if (!launch.join && uid_ < start_size_) {
    std::vector<int> first;
    for (int u = 0; u < start_size_; ++u) first.push_back(u);
    enter_world(0, first, "start", {}, {}, "start", 0, 0.0, {}, -1);
  } else {
    wait_for_admission();
  }
}

controller::~controller() {
  if (comm_) comm_.reset();
}

int controller::rank() const noexcept { return comm_ ? comm_->rank() : -1; }
int controller::world_size() const noexcept { return comm_ ? comm_->size() : 0; }
std::string controller::store_address() const { return store_->address(); }
std::vector<int> controller::registered_candidates() {
  auto ids = store_->read_list("cands");
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void controller::check_consistency() {
  const auto& e = options_.engine;
  json schedule = json::array();
  for (const auto& [s, n] : options_.schedule) schedule.push_back({s, n});
  const json fingerprint = {
      {"global_batch", sampler_->global_batch()},
      {"dataset_size", sampler_->dataset_size()},
      {"seed", sampler_->seed()},
      {"drop_last", sampler_->drop_last()},
      {"policy", e.policy},
      {"min_size", e.limits.min_size},
      {"max_size", e.limits.max_size},
      {"start_size", start_size_},
      {"release", options_.release == release_mode::exit ? "exit" : "standby"},
      {"batch_mode", options_.batch == batch_mode::adascale ? "adascale" : "fixed"},
      {"decide_every", options_.decide_every},
      {"schedule", schedule},
      {"verify", options_.verify},
      {"fault_timeout_ms", options_.fault_timeout.count()},
      {"extra", options_.config_fingerprint},
  };
  store_->set("cfg/" + std::to_string(uid_), fingerprint);
  store_->set("sig/" + std::to_string(uid_), signature_json(signature_));
  std::vector<int> others;
  if (joined_late_)
    others.push_back(0);
  else
    for (int u = 0; u < universe_size_; ++u) others.push_back(u);
  for (int other : others) {
    if (other == uid_) continue;
    const json theirs = store_->get("cfg/" + std::to_string(other));
    if (theirs != fingerprint) {
      std::string diff;
      for (const auto& [k, v] : fingerprint.items())
        if (!theirs.contains(k) || theirs.at(k) != v) diff += (diff.empty() ? "'" : ", '") + k + "'";
      throw std::invalid_argument("dra: inconsistent configuration: process " + std::to_string(uid_) +
                                  " and process " + std::to_string(other) + " differ in [" + diff +
                                  "]; every process of a job must pass the same options");
    }
    if (!joined_late_) {
      const std::string problem =
          signature_mismatch(signature_from_json(store_->get("sig/" + std::to_string(other))), signature_);
      if (!problem.empty())
        throw dra::state_mismatch_error("dra: process " + std::to_string(uid_) + "'s model differs from process " +
                                        std::to_string(other) + "'s: " + problem);
    }
  }
}

void controller::wait_for_admission() {
  role_ = role::candidate;
  store_->set("waiting/" + std::to_string(uid_), {{"sig", signature_json(signature_)}});
  store_->append_list("cands", uid_);
  const std::string key = "admit/" + std::to_string(uid_);
  for (std::int64_t polls = 1;; ++polls) {
    // Polled (not a blocking wait) so that the job's end is noticed too; 5 ms keeps the
    // admission latency small next to a rebuild.
    if (!store_->exists(key)) {
      if (polls % 20 == 0 && store_->exists("done")) {
        role_ = role::finished;
        sampler_->finish();
        // Withdraw: the leader waits for this before it leaves (it may host the store).
        try {
          store_->erase("waiting/" + std::to_string(uid_));
        } catch (const dra::error&) {
          // The store is already gone: the job is over anyway.
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    const json msg = store_->get(key);
    store_->erase(key);
    if (msg.contains("rejected")) {
      role_ = role::rejected;
      throw dra::state_mismatch_error("dra: admission refused by the world: " + msg.at("rejected").get<std::string>());
    }
    const auto epoch = msg.at("epoch").get<std::int64_t>();
    try {
      enter_world(epoch, msg.at("members").get<std::vector<int>>(), "admit", {}, {}, "", 0, 0.0,
                  msg.at("joined").get<std::vector<int>>(), -1);
    } catch (const dra::error& e) {
      // A peer died while this process joined: it is a member of that epoch now, so it takes
      // part in the recovery like everyone else.
      role_ = role::member;
      recover(std::string("joining epoch ") + std::to_string(epoch) + " failed: " + e.what());
    }
    return;
  }
}

// ---------------------------------------------------------------------------------------------
// the world of an epoch: rebuild, state handoff, reshard, first all-reduce
// ---------------------------------------------------------------------------------------------
void controller::hook(const char* phase) {
  if (options_.phase_hook) options_.phase_hook(phase, *this);
}

void controller::enter_world(std::int64_t epoch, const std::vector<int>& members, const std::string& source,
                             const std::vector<int>& joined, const std::vector<int>& left, const std::string& reason,
                             int before, double t_agree, const std::vector<int>& receivers, std::int64_t decided_step) {
  const auto t0 = clock_type::now();
  const std::vector<int> old_members = members_;
  // Members and epoch first: when the build fails, the recovery runs for this new epoch.
  members_ = members;
  epoch_ = epoch;
  hook("rebuild");
  comm::rebuild_request request;
  request.epoch = static_cast<std::uint64_t>(epoch);
  request.new_members = members;
  request.self = uid_;
  request.abortive = source == "fault";
  request.timeout = 2 * options_.fault_timeout;
  if (comm_) request.old_members = old_members;  // a communicator is passed with its members
  comm_ = backend_->rebuild(std::move(comm_), request, store_->store());
  if (!comm_) throw dra::membership_error("dra: process " + std::to_string(uid_) + " is not in epoch " + std::to_string(epoch));
  if (auto* gloo = dynamic_cast<comm::gloo_communicator*>(comm_.get())) gloo->set_timeout(options_.fault_timeout);
  const double t_rebuild = seconds_since(t0);

  const auto t1 = clock_type::now();
  hook("state_transfer");
  std::uint64_t nbytes = 0;
  const int my_rank = comm_->rank();
  if (source == "start" || source == "fault") {
    // Survivors may disagree on whether the interrupted step was applied: the leader's state wins.
    std::vector<int> dst_ranks;
    for (int r = 1; r < comm_->size(); ++r) dst_ranks.push_back(r);
    if (my_rank == 0 && !dst_ranks.empty())
      send_state(dst_ranks, nbytes);
    else if (my_rank != 0)
      recv_state(0, nbytes);
  } else if (!receivers.empty()) {
    // A grow: the members that stay share the sending (round-robin over the joiners), each
    // joiner receives from one of them. Joiners learn the same list from their admission.
    const auto sources = handoff_sources(members, receivers);
    const auto mine = std::find(receivers.begin(), receivers.end(), uid_);
    if (mine != receivers.end()) {
      recv_state(sources[static_cast<std::size_t>(mine - receivers.begin())], nbytes);
    } else {
      std::vector<int> dst_ranks;
      for (std::size_t i = 0; i < receivers.size(); ++i)
        if (sources[i] == my_rank) dst_ranks.push_back(rank_of(members, receivers[i]));
      if (!dst_ranks.empty()) send_state(dst_ranks, nbytes);
    }
  }
  const double t_transfer = seconds_since(t1);

  const auto t2 = clock_type::now();
  hook("reshard");
  sampler_->set_world(comm_->size(), my_rank);
  pending_.reset();
  decision_flag_ = false;
  pending_loss_sum_ = pending_count_ = 0.0;
  last_loss_ = std::numeric_limits<double>::quiet_NaN();
  comm_->barrier();  // the first collective of the new world
  json identical = nullptr;
  if (options_.verify) {
    const std::uint64_t mine = state_digest();
    last_digest_ = mine;
    at::Tensor leader = at::full({1}, static_cast<std::int64_t>(mine), at::kLong);
    comm_->broadcast(leader, 0);
    at::Tensor differs = at::full({1}, leader.item<std::int64_t>() == static_cast<std::int64_t>(mine) ? 0.0 : 1.0);
    comm_->all_reduce_sum(differs);
    identical = differs.item<double>() == 0.0;
  }
  const double t_reshard = seconds_since(t2);
  role_ = role::member;
  failure_.clear();
  // The status line's samples/s window starts with the world (it was started lazily at the first
  // committed step, so a first window of one step divided by ~0 s).
  status_t_ = std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
  status_samples_ = 0;
  engine_.resized(comm_->size(), static_cast<double>(sampler_->global_batch()));
  engine_.world().active = members;
  if (source != "admit" && my_rank == 0) {
    const json cost = {{"agree", t_agree}, {"rebuild", t_rebuild}, {"state_transfer", t_transfer}, {"reshard", t_reshard}};
    json ev = {
        {"event", source == "fault" ? "fault" : (source == "start" ? "start" : "resize")},
        {"step", step_index_},
        {"epoch", epoch_},
        {"data_epoch", sampler_->epoch()},
        {"before", before},
        {"after", comm_->size()},
        {"members", members},
        {"left", left},
        {"joined", joined},
        {"reason", reason},
        {"decided_step", decided_step >= 0 ? json(decided_step) : json(nullptr)},
        {"cost_s", cost},
        {"total_s", t_agree + t_rebuild + t_transfer + t_reshard},
        {"state_bytes", nbytes},
        {"state_gbps", nbytes > 0 && t_transfer > 0 ? json(static_cast<double>(nbytes) / t_transfer / 1e9) : json(nullptr)},
        {"global_batch", sampler_->global_batch()},
        {"batch_mode", options_.batch == batch_mode::adascale ? "adascale" : "fixed"},
        {"params_identical", identical},
        {"backend", backend_->name()},
    };
    if (source == "start") ev["release"] = options_.release == release_mode::exit ? "exit" : "standby";
    emit(ev.dump());
  }
  if (source != "start") ++resizes_;
}

void controller::emit(const std::string& event_json) {
  json ev = json::parse(event_json);
  ev["time"] = wall_time();
  const std::string line = ev.dump();
  last_event_ = line;
  events_.push_back(line);
  if (!options_.events_path.empty()) {
    std::ofstream f(options_.events_path, std::ios::app);
    if (!f) throw std::runtime_error("dra: cannot append to events_path '" + options_.events_path + "'");
    f << line << '\n';
  }
  std::fprintf(stderr, "[dra] %s\n", line.c_str());
  std::fflush(stderr);
}

std::uint64_t controller::state_digest() {
  const auto snap = state_->collect();
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const auto& t : snap.tensors) {
    const auto b = byte_view(t.contiguous());
    h = mix_bytes(h, static_cast<const unsigned char*>(b.data_ptr()), static_cast<std::size_t>(b.numel()));
  }
  return h >> 2;  // 62 bits: a non-negative int64 and a Python int that round-trips JSON
}

// Wire format of a handoff (rank 0 to each receiver): a header [own bytes, manifest bytes, tensor
// count], the byte size of every tensor, the meta stream (the controller's own JSON, then the
// provider's manifest) in chunks, then the tensors' bytes in chunks. A chunk that is one piece of
// one tensor goes straight from / into that tensor's storage; smaller tensors share a staging
// buffer. Memory beyond the state itself: one chunk.
namespace {
// Pieces of at least this size travel straight from / into their tensor; smaller ones are packed
// into the chunk's staging buffer. A chunk's transfers are all in flight at once.
constexpr std::int64_t kDirectPiece = 256 << 10;
constexpr int kTagPiece = 1000;

void stream_out(comm::communicator& c, const std::vector<at::Tensor>& views, const std::vector<int>& dsts,
                std::int64_t chunk_bytes) {
  std::vector<std::int64_t> sizes;
  for (const auto& v : views) sizes.push_back(v.numel());
  at::Tensor staging;
  for (const auto& chunk : plan_chunks(sizes, chunk_bytes)) {
    std::vector<at::Tensor> batch;
    std::int64_t packed = 0;
    for (const auto& p : chunk) {
      if (p.count >= kDirectPiece || chunk.size() == 1) {
        batch.push_back(views[p.tensor].narrow(0, p.offset, p.count));
      } else {
        if (!staging.defined()) staging = at::empty({chunk_bytes}, at::kByte);
        staging.narrow(0, packed, p.count).copy_(views[p.tensor].narrow(0, p.offset, p.count));
        packed += p.count;
      }
    }
    if (packed > 0) batch.push_back(staging.narrow(0, 0, packed));
    c.send_batch(batch, dsts, kTagPiece);
  }
}

void stream_in(comm::communicator& c, const std::vector<at::Tensor>& views, int src, std::int64_t chunk_bytes) {
  std::vector<std::int64_t> sizes;
  for (const auto& v : views) sizes.push_back(v.numel());
  at::Tensor staging;
  for (const auto& chunk : plan_chunks(sizes, chunk_bytes)) {
    // The same classification as the sender's, from the same plan.
    std::vector<at::Tensor> batch;
    std::vector<const piece*> small;
    std::int64_t packed = 0;
    for (const auto& p : chunk) {
      if (p.count >= kDirectPiece || chunk.size() == 1) {
        batch.push_back(views[p.tensor].narrow(0, p.offset, p.count));
      } else {
        small.push_back(&p);
        packed += p.count;
      }
    }
    if (packed > 0) {
      if (!staging.defined()) staging = at::empty({chunk_bytes}, at::kByte);
      batch.push_back(staging.narrow(0, 0, packed));
    }
    c.recv_batch(batch, src, kTagPiece);
    std::int64_t pos = 0;
    for (const piece* p : small) {
      views[p->tensor].narrow(0, p->offset, p->count).copy_(staging.narrow(0, pos, p->count));
      pos += p->count;
    }
  }
}
}  // namespace

void controller::send_state(const std::vector<int>& dst_ranks, std::uint64_t& nbytes) {
  auto snap = state_->collect();
  const auto pos = sampler_->position();
  const std::string own = json{{"step_index", step_index_},
                               {"sampler", {pos.epoch, pos.cursor, pos.global_batch, pos.seed}},
                               {"num_epochs", num_epochs_},
                               {"resizes", resizes_}}
                              .dump();
  const auto n = static_cast<std::int64_t>(snap.tensors.size());
  at::Tensor header = at::empty({3 + n}, at::kLong);
  auto* h = header.data_ptr<std::int64_t>();
  h[0] = static_cast<std::int64_t>(own.size());
  h[1] = static_cast<std::int64_t>(snap.manifest.size());
  h[2] = n;
  std::vector<at::Tensor> views;
  std::int64_t tensor_bytes = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    views.push_back(byte_view(snap.tensors[static_cast<std::size_t>(i)]));
    h[3 + i] = views.back().numel();
    tensor_bytes += h[3 + i];
  }
  at::Tensor count = at::full({1}, 3 + n, at::kLong);
  comm_->send(count, dst_ranks, kTagHeader);
  comm_->send(header, dst_ranks, kTagHeader);
  at::Tensor meta = at::empty({h[0] + h[1]}, at::kByte);
  std::memcpy(meta.data_ptr(), own.data(), own.size());
  if (!snap.manifest.empty())
    std::memcpy(static_cast<char*>(meta.data_ptr()) + own.size(), snap.manifest.data(), snap.manifest.size());
  const auto chunk = static_cast<std::int64_t>(options_.chunk_bytes);
  stream_out(*comm_, {meta}, dst_ranks, chunk);
  stream_out(*comm_, views, dst_ranks, chunk);
  nbytes = static_cast<std::uint64_t>(tensor_bytes);
}

void controller::recv_state(int src, std::uint64_t& nbytes) {
  at::Tensor count = at::zeros({1}, at::kLong);
  comm_->recv(count, src, kTagHeader);
  at::Tensor header = at::empty({count.item<std::int64_t>()}, at::kLong);
  comm_->recv(header, src, kTagHeader);
  const auto* h = header.data_ptr<std::int64_t>();
  const std::int64_t own_len = h[0], manifest_len = h[1], n = h[2];
  at::Tensor meta = at::empty({own_len + manifest_len}, at::kByte);
  const auto chunk = static_cast<std::int64_t>(options_.chunk_bytes);
  stream_in(*comm_, {meta}, src, chunk);
  const char* base = static_cast<const char*>(meta.data_ptr());
  const json own = json::parse(std::string(base, base + own_len));
  const std::string manifest(base + own_len, base + own_len + manifest_len);
  auto targets = state_->prepare(manifest);
  if (static_cast<std::int64_t>(targets.size()) != n)
    throw dra::state_mismatch_error("dra: the world hands over " + std::to_string(n) + " state tensors, this process has " +
                                    std::to_string(targets.size()) + "; its model or optimizer differs");
  std::vector<at::Tensor> views;
  std::int64_t tensor_bytes = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    views.push_back(byte_view(targets[static_cast<std::size_t>(i)]));
    if (views.back().numel() != h[3 + i])
      throw dra::state_mismatch_error("dra: state tensor " + std::to_string(i) + " has " + std::to_string(h[3 + i]) +
                                      " bytes in the world, " + std::to_string(views.back().numel()) +
                                      " here; its model or optimizer differs");
    tensor_bytes += h[3 + i];
  }
  stream_in(*comm_, views, src, chunk);
  state_->load(manifest, targets);
  const auto s = own.at("sampler");
  sampler_->set_position({s.at(0).get<std::int64_t>(), s.at(1).get<std::int64_t>(), s.at(2).get<std::int64_t>(),
                          s.at(3).get<std::uint64_t>()});
  step_index_ = own.at("step_index").get<std::int64_t>();
  if (own.at("num_epochs").get<std::int64_t>() >= 0) num_epochs_ = own.at("num_epochs").get<std::int64_t>();
  resizes_ = own.at("resizes").get<std::int64_t>();
  nbytes = static_cast<std::uint64_t>(tensor_bytes);
}

// ---------------------------------------------------------------------------------------------
// steps
// ---------------------------------------------------------------------------------------------
bool controller::reduce_gradients(const std::vector<at::Tensor>& params) {
  reduced_ = true;
  if (role_ != role::member || !comm_ || !failure_.empty()) return failure_.empty() && role_ == role::member;
  const int size = comm_->size();
  if (size == 1) {
    // Alone: the gradient already is the global batch's mean; nothing to reduce.
    last_loss_ = pending_count_ > 0 ? pending_loss_sum_ / pending_count_ : std::numeric_limits<double>::quiet_NaN();
    decision_flag_ = false;
    return true;
  }
  std::int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  if (!flat_.defined() || flat_.numel() != total + 3) flat_ = at::empty({total + 3}, at::kFloat);
  const double weight = sampler_->share_weight();
  std::int64_t off = 0;
  for (const auto& p : params) {
    const auto n = p.numel();
    at::Tensor dst = flat_.narrow(0, off, n);
    const at::Tensor& g = p.grad();
    if (!g.defined() || weight == 0.0)
      dst.zero_();
    else
      at::mul_out(dst, g.reshape({-1}), weight);
    off += n;
  }
  float* tail = flat_.data_ptr<float>() + total;
  tail[0] = static_cast<float>(pending_loss_sum_);
  tail[1] = static_cast<float>(pending_count_);
  // The leader's "a decision is published" flag rides on the gradient all-reduce, so that steps
  // without a resize never touch the store.
  tail[2] = pending_ && comm_->rank() == 0 ? 1.0f : 0.0f;
  try {
    comm_->all_reduce_sum(flat_);
  } catch (const dra::error& e) {
    failure_ = e.what();
    comm_->abort();
    return false;
  }
  tail = flat_.data_ptr<float>() + total;
  decision_flag_ = tail[2] > 0.5f;
  const double count = tail[1];
  last_loss_ = count > 0 ? static_cast<double>(tail[0]) / count : std::numeric_limits<double>::quiet_NaN();
  off = 0;
  for (const auto& p : params) {
    const auto n = p.numel();
    at::Tensor src = flat_.narrow(0, off, n).view(p.sizes());
    if (!p.grad().defined()) {
      auto& mutable_grad = const_cast<at::Tensor&>(p).mutable_grad();
      mutable_grad = src.to(p.dtype()).clone();
    } else {
      p.grad().copy_(src);
    }
    off += n;
  }
  return true;
}

step_result controller::step(double loss) {
  step_result r;
  if (role_ != role::member) return r;
  if (!reduced_ && failure_.empty())
    throw std::logic_error(
        "dra: step() without a gradient reduction this step; call reduce_gradients() after backward (Python: call "
        "backward() on the output of controller.model, the ElasticDataParallel wrapper)");
  reduced_ = false;
  const std::size_t events_before = events_.size();
  if (!failure_.empty()) {
    std::string reason = failure_;
    failure_.clear();
    recover(reason);
    if (events_.size() > events_before) r.event = events_.back();
    r.exit_requested = exit_requested_;
    return r;
  }
  const auto share = sampler_->share_range().size();
  pending_loss_sum_ = share > 0 ? loss * static_cast<double>(share) : 0.0;
  pending_count_ = static_cast<double>(share);
  const auto samples = sampler_->step_range().size();
  sampler_->commit();
  const std::int64_t committed = step_index_++;
  if (!std::isnan(last_loss_)) engine_.step(committed, last_loss_);
  r.committed = true;
  r.step = committed;
  r.loss = last_loss_;
  if (comm_ && comm_->rank() == 0 && options_.status_every > 0) {
    status_samples_ += samples;
    const double now = std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
    if (status_t_ == 0.0) status_t_ = now;
    if (step_index_ % options_.status_every == 0) {
      std::printf("[dra] step %lld loss %.4f world %d samples/s %.0f\n", static_cast<long long>(step_index_), last_loss_,
                  comm_->size(), static_cast<double>(status_samples_) / std::max(now - status_t_, 1e-9));
      std::fflush(stdout);
      status_t_ = now;
      status_samples_ = 0;
    }
  }
  if (decision_flag_) {
    // The leader flagged a decision in this step's all-reduce: everyone applies it now.
    decision_flag_ = false;
    apply_decision();
  } else if (comm_ && comm_->rank() == 0 && !pending_ &&
             (step_index_ % options_.decide_every == 0 || options_.schedule.count(step_index_))) {
    leader_decides();
  }
  if (events_.size() > events_before) r.event = events_.back();
  r.exit_requested = exit_requested_;
  return r;
}

bool controller::next_epoch(std::int64_t num_epochs) {
  num_epochs_ = num_epochs;
  if (role_ == role::member && sampler_->exhausted() && sampler_->epoch() < num_epochs) sampler_->next_epoch();
  if (role_ == role::member && sampler_->epoch() < num_epochs) return true;
  finish();
  return false;
}

void controller::finish() {
  if (role_ != role::member || !comm_) return;
  try {
    comm_->barrier();
  } catch (const dra::error&) {
    // A peer already gone at the very end changes nothing: training is over.
  }
  if (comm_->rank() == 0) {
    store_->set("done", 1);
    // Standbys learn the end from the store. When this process hosts it (rank 0 outside the
    // torchrun agent), leaving at once would take the store away before they read "done", and
    // they would fail on a broken store: wait (bounded) until every waiting candidate withdrew.
    try {
      const auto deadline = clock_type::now() + options_.fault_timeout + std::chrono::seconds(1);
      for (;;) {
        bool waiting = false;
        for (int uid : registered_candidates())
          if (store_->exists("waiting/" + std::to_string(uid))) waiting = true;
        if (!waiting || clock_type::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const dra::error&) {
      // A store failure at the very end changes nothing: training is over.
    }
  }
  comm_.reset();
  role_ = role::finished;
}

// ---------------------------------------------------------------------------------------------
// decisions (the leader publishes, every member reads)
// ---------------------------------------------------------------------------------------------
std::vector<int> controller::candidates() {
  std::vector<int> out;
  for (int uid : registered_candidates()) {
    if (rank_of(members_, uid) >= 0) continue;
    const auto info = store_->try_get("waiting/" + std::to_string(uid));
    if (!info) continue;
    const std::string problem = signature_mismatch(signature_, signature_from_json(info->at("sig")));
    if (!problem.empty()) {
      store_->erase("waiting/" + std::to_string(uid));
      store_->set("admit/" + std::to_string(uid), {{"rejected", "model mismatch: " + problem}});
      emit(json{{"event", "rejected"}, {"step", step_index_}, {"epoch", epoch_}, {"uid", uid}, {"reason", problem}}.dump());
      continue;
    }
    out.push_back(uid);
  }
  return out;
}

void controller::leader_decides() {
  const auto t0 = clock_type::now();
  decision d;
  try {
    // The candidate list is a store round trip (~1 ms on a loaded host): read at most once a
    // second for the policy's view of capacity, and fresh only when the world grows (below), so a
    // decision step that holds costs no store access most of the time.
    const auto now = clock_type::now();
    bool fresh = false;
    if (now - candidates_read_ >= std::chrono::seconds(1) || options_.schedule.count(step_index_)) {
      candidates_cache_ = candidates();
      candidates_read_ = now;
      fresh = true;
    }
    std::vector<int> cands = candidates_cache_;
    auto& w = engine_.world();
    w.size = static_cast<int>(members_.size());
    w.active = members_;
    w.candidates = cands;
    w.global_batch = static_cast<double>(sampler_->global_batch());
    engine_.capacity().available = static_cast<int>(members_.size() + cands.size());
    int target;
    if (const auto it = options_.schedule.find(step_index_); it != options_.schedule.end()) {
      target = it->second;
      d.reason = "schedule: size " + std::to_string(target) + " at step " + std::to_string(step_index_);
    } else {
      const auto& dec = engine_.decide();
      target = dec.target_size;
      d.reason = dec.reason;
      if (options_.batch == batch_mode::adascale) {
        d.batch_scale = dec.batch_scale;
        d.lr_scale = dec.lr_scale;
      }
    }
    const int current = static_cast<int>(members_.size());
    if (target > current) {
      if (!fresh) {
        cands = candidates_cache_ = candidates();
        candidates_read_ = now;
      }
      d.joined = pick_joiners(members_, cands, target);
    }
    if (target < current) d.left = pick_leavers(members_, std::max(target, 1));
    if (d.joined.empty() && d.left.empty() && d.batch_scale == 1.0) return;  // hold: costs nothing more
    d.members = next_members(members_, d.left, d.joined);
    d.epoch = store_->add("epoch_seq", 1);
    d.action = !d.joined.empty() ? "grow" : (!d.left.empty() ? "shrink" : "rebatch");
    d.decided_step = step_index_;
    store_->set("dec/" + std::to_string(epoch_), d.to_json());
  } catch (const dra::error& e) {
    // The store failed: no decision this time (the world keeps training; a store that is gone
    // for good shows up at the next store operation that needs an answer).
    std::fprintf(stderr, "[dra] decision at step %lld skipped: %s\n", static_cast<long long>(step_index_), e.what());
    return;
  }
  pending_ = std::make_unique<decision>(std::move(d));
  decide_s_ = seconds_since(t0);
  if (comm_ && comm_->size() == 1) apply_decision();  // no peers to tell: apply at this boundary
}

void controller::apply_decision() {
  const auto t0 = clock_type::now();
  decision d;
  try {
    if (comm_ && comm_->rank() == 0 && pending_) {
      d = *pending_;
      for (int uid : d.joined) {
        store_->erase("waiting/" + std::to_string(uid));
        store_->set("admit/" + std::to_string(uid), {{"epoch", d.epoch}, {"members", d.members}, {"joined", d.joined}});
      }
    } else {
      d = decision::from_json(store_->get("dec/" + std::to_string(epoch_), options_.fault_timeout + std::chrono::seconds(1)));
    }
  } catch (const dra::error& e) {
    if (comm_) comm_->abort();
    recover("decision of epoch " + std::to_string(epoch_) + " not received: " + e.what());
    return;
  }
  pending_.reset();
  decision_flag_ = false;
  const bool leader = comm_ && comm_->rank() == 0;
  const double t_agree = seconds_since(t0) + (leader ? decide_s_ : 0.0);
  if (d.batch_scale != 1.0) {
    sampler_->set_global_batch(std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::llround(static_cast<double>(sampler_->global_batch()) * d.batch_scale))));
    state_->scale_learning_rate(d.lr_scale);
  }
  const int before = static_cast<int>(members_.size());
  if (std::find(d.left.begin(), d.left.end(), uid_) != d.left.end()) {
    leave(options_.release == release_mode::exit);
    return;
  }
  try {
    enter_world(d.epoch, d.members, "resize", d.joined, d.left, d.reason, before, t_agree, d.joined, d.decided_step);
  } catch (const dra::error& e) {
    recover("resize to epoch " + std::to_string(d.epoch) + " failed: " + e.what());
  }
}

void controller::leave(bool exit) {
  comm_.reset();  // a voluntary change: the old world is idle at this step boundary
  role_ = role::released;
  members_.clear();
  if (exit) {
    std::printf("[dra] process %d released at step %lld: exiting to give the device back\n", uid_,
                static_cast<long long>(step_index_));
    std::fflush(stdout);
    exit_requested_ = true;
    sampler_->finish();
    return;
  }
  wait_for_admission();
}

// ---------------------------------------------------------------------------------------------
// faults
// ---------------------------------------------------------------------------------------------
void controller::recover(std::string reason) {
  // The event reports the change against the world that was running when the failure hit, even
  // when a member dies again during the recovery and it takes several attempts.
  const std::vector<int> world_before = members_;
  const std::string first_reason = reason;
  for (int attempt = 0; attempt <= options_.max_resize_retries; ++attempt) {
    const auto t0 = clock_type::now();
    const std::int64_t failed_epoch = epoch_;
    const std::vector<int> old_members = members_;
    // Close this rank's connections now: peers still blocked on it fail at once.
    if (comm_) comm_->abort();
    const std::string base = "fault/" + std::to_string(failed_epoch);
    store_->set(base + "/alive/" + std::to_string(uid_), 1);
    // Every survivor waits until every old member checked in (or the window closed), then
    // proposes the survivors; the first proposal stored wins and everyone adopts it. No single
    // decider: a survivor that dies during the recovery cannot leave the others without a result.
    const auto deadline = clock_type::now() + options_.fault_timeout + std::chrono::seconds(1);
    std::vector<int> alive;
    bool decided = false;
    for (;;) {
      if (store_->exists(base + "/result")) {
        decided = true;
        break;
      }
      alive.clear();
      for (int u : old_members)
        if (store_->exists(base + "/alive/" + std::to_string(u))) alive.push_back(u);
      if (alive.size() == old_members.size() || clock_type::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!decided) {
      const json proposal = {{"epoch", store_->add("epoch_seq", 1)}, {"members", survivors(old_members, alive)}};
      store_->claim(base + "/result", proposal.dump());
    }
    const json result = store_->get(base + "/result", 2 * options_.fault_timeout + std::chrono::seconds(5));
    const double t_agree = seconds_since(t0);
    const auto members = result.at("members").get<std::vector<int>>();
    const auto epoch = result.at("epoch").get<std::int64_t>();
    if (rank_of(members, uid_) < 0) {
      std::printf("[dra] process %d was left out of epoch %lld (arrived late); %s\n", uid_, static_cast<long long>(epoch),
                  options_.release == release_mode::exit ? "exiting" : "standing by");
      std::fflush(stdout);
      if (comm_) comm_.reset();
      leave(options_.release == release_mode::exit);
      return;
    }
    std::vector<int> dead;
    for (int u : world_before)
      if (rank_of(members, u) < 0) dead.push_back(u);
    try {
      enter_world(epoch, members, "fault", {}, dead, "peer failure: " + first_reason,
                  static_cast<int>(world_before.size()), t_agree, {}, -1);
      return;
    } catch (const dra::error& e) {
      reason = std::string("rebuild after fault failed: ") + e.what();
    }
  }
  throw dra::membership_error("dra: could not re-form the world after " + std::to_string(options_.max_resize_retries + 1) +
                              " attempts: " + reason);
}

}  // namespace dra::elastic
