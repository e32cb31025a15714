#include "store_protocol.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"
#include "dra/torch/elastic/job_control.hpp"

namespace dra::elastic::detail {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

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

std::optional<policy::decision> decision_from_json(const json& j) {
  if (!j.is_object()) return std::nullopt;
  policy::decision d;
  const auto action = string_field(j, "action");
  if (!action || (*action != "grow" && *action != "shrink" && *action != "hold")) return std::nullopt;
  d.kind = *action == "grow"     ? policy::action::grow
           : *action == "shrink" ? policy::action::shrink
                                 : policy::action::hold;
  const auto target = int_field(j, "target", 0, kMaxUid);
  auto members = j.contains("members") ? uid_array(j.at("members")) : std::nullopt;
  auto join = j.contains("joined") ? uid_array(j.at("joined")) : std::nullopt;
  auto leave = j.contains("left") ? uid_array(j.at("left")) : std::nullopt;
  const auto number = [&](const char* name) -> std::optional<double> {
    const auto it = j.find(name);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    const double v = it->get<double>();
    return std::isfinite(v) && v > 0.0 ? std::optional<double>(v) : std::nullopt;
  };
  const auto batch_scale = number("batch_scale"), lr_scale = number("lr_scale");
  const auto reason = string_field(j, "reason"), policy_name = string_field(j, "policy");
  if (!target || !members || members->empty() || !join || !leave || !batch_scale || !lr_scale || !reason ||
      !policy_name)
    return std::nullopt;
  d.target_size = static_cast<int>(*target);
  d.members = std::move(*members);
  d.join = std::move(*join);
  d.leave = std::move(*leave);
  d.batch_scale = *batch_scale;
  d.lr_scale = *lr_scale;
  d.reason = *reason;
  d.policy = *policy_name;
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
    std::int64_t beats = 0;
    while (!stop_) {
      lock.unlock();
      try {
        try {
          client_->add(key_, 1);
        } catch (const bad_counter&) {
          // Another client wrote over the counter: any new value is a beat to the readers.
          client_->set_text(key_, std::to_string(++beats));
        }
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
                                             timeout)),
      values_(launch.job_prefix) {}

store_protocol::store_protocol(std::unique_ptr<store_client> client, const std::string& job_prefix)
    : host_(client->host()),
      prefix_(job_prefix),
      timeout_(client->timeout()),
      client_(std::move(client)),
      values_(job_prefix) {}

store_protocol::~store_protocol() = default;

void store_protocol::start_heartbeat(int uid, std::chrono::milliseconds interval, std::chrono::milliseconds stale,
                                     std::chrono::milliseconds late_grace) {
  if (heartbeat_) return;
  auto own = std::make_unique<store_client>(host_, client_->port(), false, prefix_, timeout_);
  beat_stale_ = stale;
  late_grace_ = late_grace;
  heartbeat_ = std::make_unique<heartbeat>(std::move(own), key("beat/", uid), interval);
}

void store_protocol::mark_gone(int uid) noexcept {
  heartbeat_.reset();  // stops beating first: a recovery that looks now sees it still
  try {
    client_->set("gone/" + std::to_string(uid), 1);
  } catch (const std::exception&) {
    // The store is gone too: its stopped heartbeat tells the survivors.
  }
}

void store_protocol::rebuilding(int uid, std::int64_t epoch) noexcept {
  try {
    client_->set(key("rebuild/", uid), epoch);
  } catch (const std::exception&) {
    // The rebuild goes through the store too: it reports the failure.
  }
}

void store_protocol::rebuilt(int uid) noexcept {
  try {
    client_->erase(key("rebuild/", uid));
  } catch (const std::exception&) {
    // As above; a mark left behind only makes a recovery wait longer for a member that beats.
  }
}

std::string store_protocol::address() const {
  return client_->address();
}

void store_protocol::bound_reconnects(std::chrono::milliseconds bound) noexcept {
  client_->set_reconnect_within(bound);
}

bool store_protocol::gone() const noexcept {
  return client_->gone();
}
const c10::intrusive_ptr<c10d::Store>& store_protocol::store() const {
  return client_->store();
}

int store_protocol::claim_late_uid() {
  // Late joiners number themselves from the counter; registered uids tell how far it had got
  // when something overwrote it.
  std::int64_t floor = 0;
  for (int uid : registered_candidates()) floor = std::max<std::int64_t>(floor, uid - kLateUidBase + 1);
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::int64_t n = 0;
    try {
      n = client_->add("late_uid", 1);
    } catch (const bad_counter& b) {
      repair_counter("late_uid", b.value(), floor);
      continue;
    }
    if (n > floor && n <= kMaxUid - kLateUidBase) return kLateUidBase + static_cast<int>(n) - 1;
    repair_counter("late_uid", std::to_string(n), floor);
  }
  throw dra::membership_error("dra: 'late_uid' on the store keeps being overwritten; no late joiner uid claimed");
}
void store_protocol::set_universe(int size) {
  client_->set("universe", size);
}
int store_protocol::universe(int launched) {
  const std::string raw = client_->get("universe");
  const auto n = values_.int_of("universe", raw, 1, 1 << 20);
  return n ? static_cast<int>(*n) : launched;
}

std::int64_t store_protocol::repair_counter(const std::string& key, const std::string& seen, std::int64_t floor) {
  // Far past anything handed out before the overwrite (a counter moves by one per world change):
  // compare-and-set, so that two repairs at once agree.
  const std::int64_t to = std::min(kMaxEpoch, floor + (std::int64_t{1} << 20));
  values_.warn(key, seen, "a counter that cannot count from it; set to " + std::to_string(to));
  client_->compare_set(key, seen, std::to_string(to));
  return to;
}

std::int64_t store_protocol::next_epoch(std::int64_t known) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::int64_t e = 0;
    try {
      e = client_->add("epoch_seq", 1);
    } catch (const bad_counter& b) {
      repair_counter("epoch_seq", b.value(), known);
      continue;
    }
    // An epoch at or below one this process already knows was handed out before: the counter
    // was set back by another client.
    if (e > known && e <= kMaxEpoch) return e;
    repair_counter("epoch_seq", std::to_string(e), known);
  }
  throw dra::membership_error("dra: 'epoch_seq' on the store keeps being overwritten; no new world epoch");
}

store_protocol::claim store_protocol::claim_key(const std::string& k, std::int64_t parent, std::int64_t child) {
  const std::string mine = json{{"parent", parent}, {"child", child}}.dump();
  std::string expected;  // absent
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string now = client_->compare_set(k, expected, mine);
    if (now == mine) return claim::mine;
    const auto j = values_.object_of(k, now);
    const auto held = j ? int_field(*j, "child", 0, kMaxEpoch) : std::nullopt;
    if (held && int_field(*j, "parent", 0, kMaxEpoch) == parent) return *held == child ? claim::mine : claim::other;
    if (j) values_.warn(k, now, "not a claim of the world after epoch " + std::to_string(parent));
    expected = now;  // a value that is no claim: replace exactly it (another client may write again)
  }
  return claim::unknown;
}

bool store_protocol::claim_child(std::int64_t parent, std::int64_t child) {
  // Two keys: another client that writes over one of them after the first world claimed it (and
  // a second group then claims what it wrote) still finds the first world's claim in the other.
  // A value that is no claim is replaced; only another world's claim stops this one.
  const std::string k = key("child/", parent);
  const claim first = claim_key(k, parent, child);
  const claim second = claim_key(k + "/again", parent, child);
  return first != claim::other && second != claim::other;
}

void store_protocol::publish_decision(std::int64_t current_epoch, const published_decision& d) {
  client_->set(key("dec/", current_epoch),
               {{"decision", to_json(d.decision)}, {"epoch", d.epoch}, {"decided_step", d.decided_step}});
}

std::optional<published_decision> store_protocol::decision_of(const std::string& k, const std::string& raw) {
  const auto j = values_.object_of(k, raw);
  if (!j) return std::nullopt;
  auto d = j->contains("decision") ? decision_from_json(j->at("decision")) : std::nullopt;
  const auto epoch = int_field(*j, "epoch", 1, kMaxEpoch);
  const auto step = int_field(*j, "decided_step", 0, std::numeric_limits<std::int64_t>::max());
  if (!d || !epoch || !step) {
    values_.warn(k, raw, "not a published decision");
    return std::nullopt;
  }
  return published_decision{std::move(*d), *epoch, *step};
}

published_decision store_protocol::read_decision(std::int64_t current_epoch, std::chrono::milliseconds timeout) {
  const std::string k = key("dec/", current_epoch);
  const std::string raw = client_->get(k, timeout);
  if (auto d = decision_of(k, raw)) return *d;
  throw dra::membership_error("dra: the decision of world epoch " + std::to_string(current_epoch) +
                              " on the store does not parse (another client wrote over it)");
}

void store_protocol::publish_boundary(std::int64_t epoch, std::int64_t step, bool decided) {
  const std::string base = key("word/", epoch) + "/";
  client_->set(base + std::to_string(step), decided ? 1 : 0);
  client_->erase(base + std::to_string(step - 1));
}

bool store_protocol::read_boundary(std::int64_t epoch, std::int64_t step, std::chrono::milliseconds timeout) {
  const std::string k = key("word/", epoch) + "/" + std::to_string(step);
  const auto word = values_.int_of(k, client_->get(k, timeout), 0, 1);
  if (!word)
    throw dra::membership_error("dra: the leader's word at step " + std::to_string(step) +
                                " on the store does not parse (another client wrote over it)");
  return *word != 0;
}

std::optional<published_decision> store_protocol::try_read_decision(std::int64_t epoch) {
  const std::string k = key("dec/", epoch);
  const auto raw = client_->try_get(k);
  return raw ? decision_of(k, *raw) : std::nullopt;
}

store_protocol::decided_world store_protocol::latest_decided_world(std::int64_t epoch, std::vector<int> members) {
  decided_world w{epoch, std::move(members), {}};
  // Epochs only grow along the chain: a decision that points back (written over by another
  // client) ends it rather than looping.
  while (auto next = try_read_decision(w.epoch)) {
    if (next->epoch <= w.epoch) break;
    w.epoch = next->epoch;
    w.members = next->decision.members;
    w.joiners = next->decision.join;
  }
  return w;
}

agreement store_protocol::agree_on_survivors(std::int64_t failed_epoch, const std::vector<int>& old_members, int uid,
                                             bool holds_state, std::int64_t committed, std::chrono::milliseconds window,
                                             const std::vector<int>& admit_if_waiting) {
  // Room 0 is fault/<epoch>; a result that does not parse (another client wrote over it) sends
  // every survivor that read it to the next room, where they check in and agree again.
  constexpr int kRooms = 4;
  for (int room = 0; room < kRooms; ++room) {
    const std::string base = key("fault/", failed_epoch) + (room == 0 ? "" : "/r" + std::to_string(room));
    if (auto a =
            agree_in_room(base, failed_epoch, old_members, uid, holds_state, committed, window, admit_if_waiting)) {
      if (a->members.empty() && a->elsewhere.empty())
        throw dra::membership_error("dra: the training state is lost: every process that held it failed (world epoch " +
                                    std::to_string(failed_epoch) + ")");
      return *a;
    }
  }
  throw dra::membership_error("dra: the survivors' agreement after world epoch " + std::to_string(failed_epoch) +
                              " was written over " + std::to_string(kRooms) + " times on the store");
}

std::optional<agreement> store_protocol::agree_in_room(const std::string& base, std::int64_t failed_epoch,
                                                       const std::vector<int>& old_members, int uid, bool holds_state,
                                                       std::int64_t committed, std::chrono::milliseconds window,
                                                       const std::vector<int>& admit_if_waiting) {
  // 0: no state; n > 0: a state that has applied n - 1 steps.
  client_->set(base + "/alive/" + std::to_string(uid),
               holds_state ? std::clamp<std::int64_t>(committed, 0, kMaxEpoch) + 1 : 0);
  const auto start = clock_type::now();
  const auto deadline = start + window;
  const auto late_deadline = deadline + late_grace_;
  // A member that beats and is still inside the rebuild of a world (rebuild/<uid>) is on its way
  // here: its backend bounds the rebuild, but not always by the timeout it was given (2 x
  // fault_timeout_s, the late grace). Gloo retries a connection that a peer gone mid-rendezvous
  // refuses for 5 x that timeout: trial 8:kill_in_resize:py, the leader killed once it had
  // finished its side of the shrink's rendezvous, left member 2 connecting for 20 s while the
  // survivors waited 7 s. Such a member is waited for up to 4 more late graces past the late
  // deadline, and at least the store timeout.
  const auto rebuild_deadline = late_deadline + std::max(timeout_, 4 * late_grace_);
  // Each missing member's last heartbeat value, when this process saw it change, and whether it
  // saw it change at all (a member it saw beat is alive: on a loaded host, or with a store shared
  // by many jobs, its beats can come further apart than beat_stale_, and it is then given the late
  // grace between two beats before it is taken for dead; a killed member, whose value never moves
  // here, is still taken for dead after beat_stale_).
  struct seen_beat {
    std::string value;
    clock_type::time_point at;
    bool moved = false;
  };
  std::map<int, seen_beat> beats;
  std::vector<int> alive, beating;  // beating: old members not here whose heartbeat still moves
  bool decided = false;
  for (;;) {
    if (client_->exists(base + "/result")) {
      decided = true;
      break;
    }
    const auto now = clock_type::now();
    alive.clear();
    beating.clear();
    bool waiting = false;  // for a member that may still check in
    for (int u : old_members) {
      if (client_->exists(base + "/alive/" + std::to_string(u))) {
        alive.push_back(u);
        continue;
      }
      if (const auto gone = client_->try_get(key("gone/", u)); gone && values_.int_of(key("gone/", u), *gone, 1, 1))
        continue;  // it left the job: dead now
      const auto beat = beat_stale_.count() > 0 ? client_->try_get(key("beat/", u)) : std::nullopt;
      if (!beat) {  // no heartbeat: the window decides
        waiting = waiting || now < deadline;
        continue;
      }
      auto seen = beats.find(u);
      if (seen == beats.end())
        seen = beats.emplace(u, seen_beat{*beat, now, false}).first;
      else if (seen->second.value != *beat)
        seen->second = seen_beat{*beat, now, true};
      const auto stale = seen->second.moved ? std::max(beat_stale_, late_grace_) : beat_stale_;
      const bool beats = now - seen->second.at < stale;
      if (beats) beating.push_back(u);
      const bool late = beats && now >= late_deadline;
      waiting = waiting || (beats && now < late_deadline) ||
                (late && now < rebuild_deadline && client_->exists(key("rebuild/", u)));
    }
    if (alive.size() == old_members.size() || !waiting) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!decided) {
    // The processes that hold the training state come first, the one furthest on ahead of the
    // others: rank 0 of the agreed world sends its state to the rest (a joiner whose handoff was
    // cut off holds none). States differ by one step when a reduction finished on some members
    // and timed out on another: the world committed that step (every member's gradient was in
    // the sum the finished ones applied), and the member that timed out takes it from them.
    std::vector<std::pair<std::int64_t, int>> held_by;  // (committed steps + 1, uid)
    std::vector<int> holders, others;
    for (int u : survivors(old_members, alive)) {
      const std::string k = base + "/alive/" + std::to_string(u);
      const auto held = values_.int_of(k, client_->get(k), 0, kMaxEpoch + 1);  // unreadable: not a holder
      if (held && *held > 0)
        held_by.emplace_back(*held, u);
      else
        others.push_back(u);
    }
    std::stable_sort(held_by.begin(), held_by.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [steps, u] : held_by) holders.push_back(u);
    std::vector<int> kept;  // joiners that never got their admission and still wait
    for (int u : admit_if_waiting) {
      if (std::find(alive.begin(), alive.end(), u) != alive.end()) continue;
      if (client_->exists(key("admit/", u))) {
        withdraw(u);  // an admission it never took: it died waiting
        continue;
      }
      if (client_->exists(key("waiting/", u))) kept.push_back(u);
    }
    const std::int64_t epoch = next_epoch(failed_epoch);
    json proposal = {{"epoch", epoch}, {"members", json::array()}};
    // Nobody here holds the state, and members of the world are alive (beating) but never came:
    // they are training elsewhere (this room came from a decision another client wrote), so the
    // state is not lost: the ones here step out.
    if (holders.empty() && !beating.empty()) proposal["elsewhere"] = beating;
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
  const std::string k = base + "/result";
  const std::string raw = client_->get(k, 2 * window + late_grace_ + std::chrono::seconds(5));
  const auto j = values_.object_of(k, raw);
  const auto epoch = j ? int_field(*j, "epoch", failed_epoch + 1, kMaxEpoch) : std::nullopt;
  const auto members = j && j->contains("members") ? uid_array(j->at("members")) : std::nullopt;
  if (!epoch || !members) {
    if (j) values_.warn(k, raw, "not a survivors' agreement");
    return std::nullopt;
  }
  agreement a{*epoch, *members, {}};
  if (members->empty() && j->contains("elsewhere"))
    a.elsewhere = uid_array(j->at("elsewhere")).value_or(std::vector<int>{});
  return a;
}

void store_protocol::mark_done(const std::vector<int>& members, std::optional<std::int64_t> stopped_at) {
  // The finishing world first: an outside actor that reads "done" finds it (job_control::final_members),
  // and whether a stop request ended the training (job_control::stopped_at).
  json world{{"members", members}};
  if (stopped_at) world["stopped_at"] = *stopped_at;
  client_->set(job_keys::final_world, world);
  client_->set("done", 1);
}
bool store_protocol::done() {
  // A flag the leader sets to 1; anything else another client wrote there is not the job's end.
  const auto raw = client_->try_get("done");
  return raw && values_.int_of("done", *raw, 1, 1).has_value();
}

void store_protocol::mark_loop_ended(std::int64_t epoch, int uid, std::int64_t step) noexcept {
  try {
    client_->set(key("ended/", epoch), json{{"uid", uid}, {"step", step}});
  } catch (const std::exception&) {
    // The store is gone: the end's barrier says so.
  }
}

std::optional<store_protocol::loop_end> store_protocol::loop_ended(std::int64_t epoch) {
  const std::string k = key("ended/", epoch);
  const auto raw = client_->try_get(k);
  if (!raw) return std::nullopt;
  const auto j = values_.object_of(k, *raw);
  const auto uid = j ? int_field(*j, "uid", 0, kMaxUid) : std::nullopt;
  const auto step = j ? int_field(*j, "step", 0, std::numeric_limits<std::int64_t>::max()) : std::nullopt;
  if (!uid || !step) {
    if (j) values_.warn(k, *raw, "not a member's end of the training loop");
    return std::nullopt;
  }
  return loop_end{static_cast<int>(*uid), *step};
}

std::optional<size_limit> store_protocol::limit() {
  const auto raw = client_->try_get("capacity");
  if (!raw) {
    last_limit_.reset();
    return std::nullopt;
  }
  const auto j = values_.object_of("capacity", *raw);
  if (!j) return last_limit_;
  size_limit l;
  // Each field absent or a non-negative integer; "leave" a list of uids.
  const auto field = [&](const char* name, int& out) {
    if (!j->contains(name)) return true;
    const auto v = int_field(*j, name, 0, kMaxUid);
    if (v) out = static_cast<int>(*v);
    return v.has_value();
  };
  bool ok = field("max_size", l.max_size) && field("min_size", l.min_size);
  if (ok && j->contains("leave")) {
    auto leave = uid_array(j->at("leave"));
    ok = leave.has_value();
    if (leave) l.leave = std::move(*leave);
  }
  if (!ok) {
    values_.warn("capacity", *raw,
                 "expected {\"max_size\": int >= 0, \"min_size\": int >= 0, \"leave\": [uids]}; the last good limit "
                 "stays in force");
    return last_limit_;
  }
  last_limit_ = l;
  return l;
}

void store_protocol::publish_report(const json& report) {
  client_->set("report", report);
}

}  // namespace dra::elastic::detail
