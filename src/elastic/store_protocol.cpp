#include "store_protocol.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"

namespace dra::elastic::detail {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

json signature_json(const std::vector<tensor_spec>& sig) {
  json out = json::array();
  for (const auto& s : sig) out.push_back({s.name, s.shape, s.dtype});
  return out;
}

std::vector<tensor_spec> signature_from_json(const json& j) {
  std::vector<tensor_spec> out;
  for (const auto& e : j)
    out.push_back({e.at(0).get<std::string>(), e.at(1).get<std::vector<std::int64_t>>(), e.at(2).get<std::string>()});
  return out;
}

std::string key(const char* base, std::int64_t id) {
  return std::string(base) + std::to_string(id);
}

}  // namespace

json to_json(const policy::decision& d) {
  return {{"action", policy::to_string(d.kind)},
          {"target", d.target_size},
          {"members", d.members},
          {"joined", d.join},
          {"left", d.leave},
          {"batch_scale", d.batch_scale},
          {"lr_scale", d.lr_scale},
          {"reason", d.reason},
          {"policy", d.policy}};
}

policy::decision decision_from_json(const json& j) {
  policy::decision d;
  const auto action = j.at("action").get<std::string>();
  d.kind = action == "grow" ? policy::action::grow : action == "shrink" ? policy::action::shrink : policy::action::hold;
  d.target_size = j.at("target").get<int>();
  d.members = j.at("members").get<std::vector<int>>();
  d.join = j.at("joined").get<std::vector<int>>();
  d.leave = j.at("left").get<std::vector<int>>();
  d.batch_scale = j.at("batch_scale").get<double>();
  d.lr_scale = j.at("lr_scale").get<double>();
  d.reason = j.at("reason").get<std::string>();
  d.policy = j.at("policy").get<std::string>();
  return d;
}

// A thread that raises beat/<uid> on a connection of its own until stopped (or the store fails:
// a process whose store is gone has nothing to tell the others).
class store_protocol::heartbeat {
 public:
  heartbeat(std::unique_ptr<store_client> client, std::string key, std::chrono::milliseconds interval)
      : client_(std::move(client)), key_(std::move(key)), interval_(interval), thread_([this] { run(); }) {}
  ~heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      try {
        client_->add(key_, 1);
      } catch (const std::exception&) {
        return;
      }
      lock.lock();
      wake_.wait_for(lock, interval_, [this] { return stop_; });
    }
  }

  std::unique_ptr<store_client> client_;
  std::string key_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

store_protocol::store_protocol(const launch_info& launch, std::chrono::milliseconds timeout)
    : host_(launch.store_host),
      prefix_(launch.job_prefix),
      timeout_(timeout),
      client_(std::make_unique<store_client>(launch.store_host, launch.store_port, launch.host_store, launch.job_prefix,
                                             timeout)) {}

store_protocol::~store_protocol() = default;

void store_protocol::start_heartbeat(int uid, std::chrono::milliseconds interval, std::chrono::milliseconds stale,
                                     std::chrono::milliseconds late_grace) {
  if (heartbeat_) return;
  const std::string& address = client_->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  auto own = std::make_unique<store_client>(host_, port, false, prefix_, timeout_);
  beat_stale_ = stale;
  late_grace_ = late_grace;
  heartbeat_ = std::make_unique<heartbeat>(std::move(own), key("beat/", uid), interval);
}

std::string store_protocol::address() const {
  return client_->address();
}
const c10::intrusive_ptr<c10d::Store>& store_protocol::store() const {
  return client_->store();
}

int store_protocol::claim_late_uid() {
  return kLateUidBase + static_cast<int>(client_->add("late_uid", 1)) - 1;
}
void store_protocol::set_universe(int size) {
  client_->set("universe", size);
}
int store_protocol::universe() {
  return client_->get("universe").get<int>();
}

void store_protocol::check_consistency(int uid, const json& config, const std::vector<tensor_spec>& signature,
                                       const std::vector<int>& others, bool compare_signatures) {
  client_->set(key("cfg/", uid), config);
  client_->set(key("sig/", uid), signature_json(signature));
  for (int other : others) {
    if (other == uid) continue;
    const json theirs = client_->get(key("cfg/", other));
    if (theirs != config) {
      std::string diff;
      for (const auto& [k, v] : config.items())
        if (!theirs.contains(k) || theirs.at(k) != v) diff += (diff.empty() ? "'" : ", '") + k + "'";
      throw std::invalid_argument("dra: inconsistent configuration: process " + std::to_string(uid) + " and process " +
                                  std::to_string(other) + " differ in [" + diff +
                                  "]; every process of a job must pass the same options");
    }
    if (!compare_signatures) continue;
    const std::string problem = signature_mismatch(signature_from_json(client_->get(key("sig/", other))), signature);
    if (!problem.empty())
      throw dra::state_mismatch_error("dra: process " + std::to_string(uid) + "'s model differs from process " +
                                      std::to_string(other) + "'s: " + problem);
  }
}

void store_protocol::register_candidate(int uid, const std::vector<tensor_spec>& signature) {
  client_->set(key("waiting/", uid), {{"sig", signature_json(signature)}});
  client_->append_list("cands", uid);
}

void store_protocol::withdraw(int uid) noexcept {
  try {
    client_->erase(key("waiting/", uid));
  } catch (const std::exception&) {
    // The store is already gone: the job is over anyway.
  }
}

void store_protocol::dismiss(int uid, const std::string& why) {
  client_->erase(key("waiting/", uid));
  client_->set(key("admit/", uid), {{"dismissed", why}});
}

std::vector<int> store_protocol::registered_candidates() {
  auto ids = client_->read_list("cands");
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

std::vector<int> store_protocol::admissible_candidates(const std::vector<int>& members,
                                                       const std::vector<tensor_spec>& signature,
                                                       const std::function<void(int, const std::string&)>& rejected) {
  std::vector<int> out;
  for (int uid : registered_candidates()) {
    if (rank_of(members, uid) >= 0) continue;
    const auto info = client_->try_get(key("waiting/", uid));
    if (!info) continue;
    const std::string problem = signature_mismatch(signature, signature_from_json(info->at("sig")));
    if (!problem.empty()) {
      client_->erase(key("waiting/", uid));
      client_->set(key("admit/", uid), {{"rejected", "model mismatch: " + problem}});
      rejected(uid, problem);
      continue;
    }
    out.push_back(uid);
  }
  return out;
}

bool store_protocol::any_waiting() {
  for (int uid : registered_candidates())
    if (client_->exists(key("waiting/", uid))) return true;
  return false;
}

void store_protocol::admit(const std::vector<int>& joined, const admission& a) {
  for (int uid : joined) {
    client_->erase(key("waiting/", uid));
    client_->set(key("admit/", uid), {{"epoch", a.epoch}, {"members", a.members}, {"joined", a.joined}});
  }
}

admission_result store_protocol::wait_for_admission(int uid) {
  // Polled (not a blocking wait) so that the job's end is noticed too; 5 ms keeps the admission
  // latency small next to a rebuild.
  for (std::int64_t polls = 1;; ++polls) {
    if (auto r = poll_admission(uid, polls % 20 == 0)) return *r;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<admission_result> store_protocol::poll_admission(int uid, bool check_done) {
  const std::string admit_key = key("admit/", uid);
  if (!client_->exists(admit_key)) {
    if (check_done && client_->exists("done")) {
      withdraw(uid);  // the leader waits for this before it leaves (it may host the store)
      return admission_result{};
    }
    return std::nullopt;
  }
  const json msg = client_->get(admit_key);
  client_->erase(admit_key);
  admission_result r;
  if (msg.contains("rejected") || msg.contains("dismissed")) {
    const bool rejected = msg.contains("rejected");
    r.what = rejected ? admission_result::outcome::rejected : admission_result::outcome::dismissed;
    r.why = msg.at(rejected ? "rejected" : "dismissed").get<std::string>();
    return r;
  }
  r.what = admission_result::outcome::admitted;
  r.admitted = {msg.at("epoch").get<std::int64_t>(), msg.at("members").get<std::vector<int>>(),
                msg.at("joined").get<std::vector<int>>(), msg.value("recovery", false)};
  return r;
}

std::int64_t store_protocol::next_epoch() {
  return client_->add("epoch_seq", 1);
}

void store_protocol::publish_decision(std::int64_t current_epoch, const published_decision& d) {
  client_->set(key("dec/", current_epoch),
               {{"decision", to_json(d.decision)}, {"epoch", d.epoch}, {"decided_step", d.decided_step}});
}

published_decision store_protocol::read_decision(std::int64_t current_epoch, std::chrono::milliseconds timeout) {
  const json j = client_->get(key("dec/", current_epoch), timeout);
  return {decision_from_json(j.at("decision")), j.at("epoch").get<std::int64_t>(),
          j.at("decided_step").get<std::int64_t>()};
}

void store_protocol::publish_boundary(std::int64_t epoch, std::int64_t step, bool decided) {
  const std::string base = key("word/", epoch) + "/";
  client_->set(base + std::to_string(step), decided ? 1 : 0);
  client_->erase(base + std::to_string(step - 1));
}

bool store_protocol::read_boundary(std::int64_t epoch, std::int64_t step, std::chrono::milliseconds timeout) {
  return client_->get(key("word/", epoch) + "/" + std::to_string(step), timeout).get<int>() != 0;
}

std::optional<published_decision> store_protocol::try_read_decision(std::int64_t epoch) {
  const auto j = client_->try_get(key("dec/", epoch));
  if (!j) return std::nullopt;
  return published_decision{decision_from_json(j->at("decision")), j->at("epoch").get<std::int64_t>(),
                            j->at("decided_step").get<std::int64_t>()};
}

store_protocol::decided_world store_protocol::latest_decided_world(std::int64_t epoch, std::vector<int> members) {
  decided_world w{epoch, std::move(members), {}};
  while (auto next = try_read_decision(w.epoch)) {
    w.epoch = next->epoch;
    w.members = next->decision.members;
    w.joiners = next->decision.join;
  }
  return w;
}

agreement store_protocol::agree_on_survivors(std::int64_t failed_epoch, const std::vector<int>& old_members, int uid,
                                             bool holds_state, std::chrono::milliseconds window,
                                             const std::vector<int>& admit_if_waiting) {
  const std::string base = key("fault/", failed_epoch);
  client_->set(base + "/alive/" + std::to_string(uid), holds_state ? 1 : 0);
  const auto start = clock_type::now();
  const auto deadline = start + window;
  const auto late_deadline = deadline + late_grace_;
  // Each missing member's last heartbeat value and when this process saw it change.
  std::map<int, std::pair<std::int64_t, clock_type::time_point>> beats;
  std::vector<int> alive;
  bool decided = false;
  for (;;) {
    if (client_->exists(base + "/result")) {
      decided = true;
      break;
    }
    const auto now = clock_type::now();
    alive.clear();
    bool waiting = false;  // for a member that may still check in
    for (int u : old_members) {
      if (client_->exists(base + "/alive/" + std::to_string(u))) {
        alive.push_back(u);
        continue;
      }
      const auto beat = beat_stale_.count() > 0 ? client_->try_get(key("beat/", u)) : std::nullopt;
      if (!beat || !beat->is_number_integer()) {  // no heartbeat: the window decides
        waiting = waiting || now < deadline;
        continue;
      }
      const auto value = beat->get<std::int64_t>();
      auto seen = beats.find(u);
      if (seen == beats.end() || seen->second.first != value)
        seen = beats.insert_or_assign(u, std::make_pair(value, now)).first;
      const bool beating = now - seen->second.second < beat_stale_;
      waiting = waiting || (beating && now < late_deadline);
    }
    if (alive.size() == old_members.size() || !waiting) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!decided) {
    // The processes that hold the training state come first: rank 0 of the agreed world sends
    // it to the others (a joiner whose handoff was cut off holds none).
    std::vector<int> holders, others;
    for (int u : survivors(old_members, alive))
      (client_->get(base + "/alive/" + std::to_string(u)).get<int>() == 1 ? holders : others).push_back(u);
    std::vector<int> kept;  // joiners that never got their admission and still wait
    for (int u : admit_if_waiting) {
      if (std::find(alive.begin(), alive.end(), u) != alive.end()) continue;
      if (client_->exists(key("admit/", u))) {
        withdraw(u);  // an admission it never took: it died waiting
        continue;
      }
      if (client_->exists(key("waiting/", u))) kept.push_back(u);
    }
    const std::int64_t epoch = next_epoch();
    json proposal = {{"epoch", epoch}, {"members", json::array()}};
    if (!holders.empty()) {
      holders.insert(holders.end(), others.begin(), others.end());
      holders.insert(holders.end(), kept.begin(), kept.end());
      proposal["members"] = holders;
    }
    if (client_->claim(base + "/result", proposal.dump()) && !holders.empty() && !kept.empty()) {
      admission a{epoch, holders, kept, true};
      for (int u : kept) {
        client_->erase(key("waiting/", u));
        client_->set(key("admit/", u),
                     {{"epoch", a.epoch}, {"members", a.members}, {"joined", a.joined}, {"recovery", true}});
      }
    }
  }
  const json result = client_->get(base + "/result", 2 * window + late_grace_ + std::chrono::seconds(5));
  agreement a{result.at("epoch").get<std::int64_t>(), result.at("members").get<std::vector<int>>()};
  if (a.members.empty())
    throw dra::membership_error("dra: the training state is lost: every process that held it failed (world epoch " +
                                std::to_string(failed_epoch) + ")");
  return a;
}

void store_protocol::mark_done() {
  client_->set("done", 1);
}
bool store_protocol::done() {
  return client_->exists("done");
}

std::optional<size_limit> store_protocol::limit() {
  const auto j = client_->try_get("capacity");
  if (!j) return std::nullopt;
  size_limit l;
  l.max_size = j->value("max_size", 0);
  l.min_size = j->value("min_size", 0);
  if (j->contains("leave")) l.leave = j->at("leave").get<std::vector<int>>();
  return l;
}

void store_protocol::publish_report(const json& report) {
  client_->set("report", report);
}

}  // namespace dra::elastic::detail
