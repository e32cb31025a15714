// The joiners' side of the store protocol: registration, consistency checks against the world,
// candidacy and admission. The keys and agreements of a running world are in store_protocol.cpp.
#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"
#include "dra/torch/elastic/job_control.hpp"
#include "store_protocol.hpp"

namespace dra::elastic::detail {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

json signature_json(const std::vector<tensor_spec>& sig) {
  json out = json::array();
  for (const auto& s : sig) out.push_back({s.name, s.shape, s.dtype});
  return out;
}

// A signature as signature_json wrote it, or nothing.
std::optional<std::vector<tensor_spec>> signature_from_json(const json& j) {
  if (!j.is_array()) return std::nullopt;
  std::vector<tensor_spec> out;
  for (const auto& e : j) {
    if (!e.is_array() || e.size() != 3 || !e[0].is_string() || !e[1].is_array() || !e[2].is_string())
      return std::nullopt;
    tensor_spec t{e[0].get<std::string>(), {}, e[2].get<std::string>()};
    for (const auto& d : e[1]) {
      if (!d.is_number_integer()) return std::nullopt;
      t.shape.push_back(d.get<std::int64_t>());
    }
    out.push_back(std::move(t));
  }
  return out;
}

json layout_json(const state_layout& l) {
  json out = json::object();
  for (const auto& [k, v] : l) out[k] = v;
  return out;
}

// A layout as layout_json wrote it (absent: none), or nothing.
std::optional<state_layout> layout_from_json(const json& j) {
  state_layout out;
  if (j.is_null()) return out;
  if (!j.is_object()) return std::nullopt;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) return std::nullopt;
    out[k] = v.get<std::string>();
  }
  return out;
}

// What a process registers: {"model": signature, "layout": layout} (sig/<uid>) or
// {"sig": signature, "layout": layout} (waiting/<uid>).
struct registration {
  std::vector<tensor_spec> signature;
  state_layout layout;
};
std::optional<registration> registration_from_json(const json& j, const char* model_field) {
  if (!j.is_object() || !j.contains(model_field)) return std::nullopt;
  auto sig = signature_from_json(j.at(model_field));
  auto layout = layout_from_json(j.value("layout", json()));
  if (!sig || !layout) return std::nullopt;
  return registration{std::move(*sig), std::move(*layout)};
}

// The joiners' admission message, or nothing when it is not one.
std::optional<admission_result> admission_from_json(const json& msg, int uid) {
  admission_result r;
  for (const char* field : {"rejected", "dismissed"}) {
    if (!msg.is_object() || !msg.contains(field)) continue;
    const auto why = string_field(msg, field);
    if (!why) return std::nullopt;
    r.what =
        std::string(field) == "rejected" ? admission_result::outcome::rejected : admission_result::outcome::dismissed;
    r.why = *why;
    return r;
  }
  const auto epoch = int_field(msg, "epoch", 1, kMaxEpoch);
  const auto members = msg.is_object() && msg.contains("members") ? uid_array(msg.at("members")) : std::nullopt;
  const auto joined = msg.is_object() && msg.contains("joined") ? uid_array(msg.at("joined")) : std::nullopt;
  const auto recovery = msg.is_object() ? msg.value("recovery", json(false)) : json();
  if (!epoch || !members || !joined || !recovery.is_boolean()) return std::nullopt;
  if (std::find(members->begin(), members->end(), uid) == members->end()) return std::nullopt;
  r.what = admission_result::outcome::admitted;
  r.admitted = {*epoch, *members, *joined, recovery.get<bool>()};
  return r;
}

}  // namespace

void store_protocol::check_consistency(int uid, const json& config, const std::vector<tensor_spec>& signature,
                                       const state_layout& layout, const std::vector<int>& others,
                                       bool compare_signatures) {
  client_->set(key(job_keys::config, uid), config);
  client_->set(key("sig/", uid), {{"model", signature_json(signature)}, {"layout", layout_json(layout)}});
  const std::string me = "process " + std::to_string(uid);
  for (int other : others) {
    if (other == uid) continue;
    const std::string them = "process " + std::to_string(other);
    const std::string cfg_key = key(job_keys::config, other);
    const auto theirs = values_.object_of(cfg_key, client_->get(cfg_key));
    if (theirs && *theirs != config) {
      std::string diff;
      for (const auto& [k, v] : config.items())
        if (!theirs->contains(k) || theirs->at(k) != v) diff += (diff.empty() ? "'" : ", '") + k + "'";
      throw std::invalid_argument("dra: inconsistent configuration: " + me + " and " + them + " differ in [" + diff +
                                  "]; every process of a job must pass the same options");
    }
    if (!compare_signatures) continue;
    const std::string sig_key = key("sig/", other);
    const std::string raw = client_->get(sig_key);
    const auto j = values_.json_of(sig_key, raw);
    const auto reg = j ? registration_from_json(*j, "model") : std::nullopt;
    if (!reg) {
      if (j) values_.warn(sig_key, raw, "not a model signature and layout");
      continue;
    }
    std::string problem = signature_mismatch(reg->signature, signature, them, me);
    if (problem.empty()) problem = layout_mismatch(reg->layout, layout, them, me);
    if (!problem.empty())
      throw dra::state_mismatch_error("dra: " + me + "'s state differs from " + them + "'s: " + problem);
  }
}

void store_protocol::register_candidate(int uid, const std::vector<tensor_spec>& signature,
                                        const state_layout& layout) {
  const std::string text = json{{"sig", signature_json(signature)}, {"layout", layout_json(layout)}}.dump();
  last_registration_[uid] = text;
  client_->set_text(key("waiting/", uid), text);
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
  auto ids = values_.uid_list_of("cands", client_->read_list("cands"));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  seen_candidates_.insert(ids.begin(), ids.end());
  return ids;
}

std::vector<int> store_protocol::admissible_candidates(const std::vector<int>& members,
                                                       const std::vector<tensor_spec>& signature,
                                                       const state_layout& layout,
                                                       const std::function<void(int, const std::string&)>& rejected) {
  std::vector<int> out;
  for (int uid : registered_candidates()) {
    if (rank_of(members, uid) >= 0) continue;
    const std::string waiting = key("waiting/", uid);
    const auto raw = client_->try_get(waiting);
    if (!raw) continue;
    const auto j = values_.json_of(waiting, *raw);
    const auto reg = j ? registration_from_json(*j, "sig") : std::nullopt;
    if (!reg) {
      // Not a registration (something wrote over it): not admitted; the candidate writes it again.
      if (j) values_.warn(waiting, *raw, "not a candidate's registration");
      continue;
    }
    std::string problem = signature_mismatch(signature, reg->signature);
    if (!problem.empty()) problem = "model mismatch: " + problem;
    if (problem.empty()) {
      problem = layout_mismatch(layout, reg->layout, "world", "joiner");
      if (!problem.empty()) problem = "state mismatch: " + problem;
    }
    if (!problem.empty()) {
      client_->erase(waiting);
      client_->set(key("admit/", uid), {{"rejected", problem}});
      rejected(uid, problem);
      continue;
    }
    out.push_back(uid);
  }
  return out;
}

bool store_protocol::any_waiting(const std::vector<int>& members) {
  (void)registered_candidates();  // adds the ones registered now to those seen
  for (int uid : seen_candidates_)
    if (std::find(members.begin(), members.end(), uid) == members.end() && client_->exists(key("waiting/", uid)))
      return true;
  return false;
}

void store_protocol::note_members(const std::vector<int>& members) {
  seen_candidates_.insert(members.begin(), members.end());
}

bool store_protocol::tampered() const {
  return values_.warnings() > 0;
}

void store_protocol::admit(const std::vector<int>& joined, const admission& a) {
  for (int uid : joined) {
    client_->erase(key("waiting/", uid));
    client_->set(key("admit/", uid), {{"epoch", a.epoch}, {"members", a.members}, {"joined", a.joined}});
  }
}

admission_result store_protocol::wait_for_admission(int uid, const std::function<void()>& check) {
  // Polled (not a blocking wait) so that the job's end is noticed too; 5 ms keeps the admission
  // latency small next to a rebuild.
  const std::string waiting = key("waiting/", uid);
  const auto since = clock_type::now();
  std::map<int, beat_seen> beats;
  for (std::int64_t polls = 1;; ++polls) {
    if (auto r = poll_admission(uid, polls % 20 == 0)) return *r;
    if (check && polls % 20 == 0) {
      try {
        check();  // Ctrl-C in Python: the wait ends here, not when the job does
      } catch (...) {
        withdraw(uid);
        // An admission that landed since the poll names this process in the world being built:
        // said gone, so the members' rebuild fails at once and they recover without it.
        try {
          if (client_->exists(key("admit/", uid))) mark_gone(uid);
        } catch (const std::exception&) {
          // The store is gone: the job is over anyway.
        }
        throw;
      }
    }
    if (polls % 50 == 0 && beat_stale_.count() > 0) {
      if (const auto lost = state_holders_lost(uid, beats, since)) {
        if (done()) continue;  // the job ended meanwhile: the next poll withdraws and returns
        withdraw(uid);
        throw dra::membership_error("dra: process " + std::to_string(uid) +
                                    " waited for its admission while every process that held the training state left "
                                    "the job (" +
                                    *lost +
                                    "): the state is lost and nobody is left to admit this process; restart the job "
                                    "from a checkpoint");
      }
    }
    if (polls % 200 == 0 && last_registration_.count(uid)) {
      // Something wrote over this registration or the candidates' list: write it again (a missing
      // registration was taken by an admission on its way).
      const auto now = client_->try_get(waiting);
      if (now && *now != last_registration_.at(uid)) client_->set_text(waiting, last_registration_.at(uid));
      const auto cands = registered_candidates();
      if (now && std::find(cands.begin(), cands.end(), uid) == cands.end()) client_->append_list("cands", uid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<std::string> store_protocol::state_holders_lost(int uid, std::map<int, beat_seen>& seen,
                                                              clock_type::time_point waiting_since) {
  // Every process of the job: the universe launched together and the late joiners numbered so far.
  std::vector<int> uids;
  const auto universe_raw = client_->try_get("universe");
  const auto universe = universe_raw ? values_.int_of("universe", *universe_raw, 1, 1 << 20) : std::nullopt;
  if (!universe) return std::nullopt;  // the job has not started: nothing to judge
  for (int u = 0; u < *universe; ++u) uids.push_back(u);
  const auto late_raw = client_->try_get("late_uid");
  const auto late = late_raw ? values_.int_of("late_uid", *late_raw, 0, kMaxUid - kLateUidBase) : std::nullopt;
  if (late && *late > (1 << 16)) return std::nullopt;  // more than any job launches: a value written over it
  for (std::int64_t n = 0; late && n < *late; ++n) uids.push_back(kLateUidBase + static_cast<int>(n));
  const auto now = clock_type::now();
  // As long as a recovery waits for a member that beats but is late, and then some.
  const auto stale = std::max(beat_stale_, late_grace_) + beat_stale_;
  std::string lost;
  int judged = 0;
  for (int u : uids) {
    if (u == uid || client_->exists(key("waiting/", u))) continue;  // a waiting candidate holds no state
    std::string why;
    if (const auto g = client_->try_get(key("gone/", u)); g && values_.int_of(key("gone/", u), *g, 1, 1)) {
      why = "left";
    } else if (const auto beat = client_->try_get(key("beat/", u))) {
      auto it = seen.find(u);
      if (it == seen.end() || it->second.value != *beat) {
        seen[u] = beat_seen{*beat, now};
        return std::nullopt;  // it beats (or this is the first look): alive
      }
      if (now - it->second.at < stale) return std::nullopt;
      why = "no heartbeat for " +
            std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - it->second.at).count()) + " s";
    } else {
      // Never beat: still starting, unless it has had the store's whole timeout to do so. It may have
      // started and died (or hung) before its first heartbeat was published: the name says only what
      // the store shows.
      if (now - waiting_since < timeout_) return std::nullopt;
      why = "published no heartbeat (it died or hung before its first)";
    }
    ++judged;
    lost += (lost.empty() ? "" : ", ") + std::string("process ") + std::to_string(u) + " " + why;
  }
  if (judged == 0) return std::nullopt;  // no other process at all: a world of candidates only waits
  return lost;
}

std::optional<admission_result> store_protocol::poll_admission(int uid, bool check_done) {
  const std::string admit_key = key("admit/", uid);
  if (!client_->exists(admit_key)) {
    if (check_done && done()) {
      withdraw(uid);  // the leader waits for this before it leaves (it may host the store)
      return admission_result{};
    }
    return std::nullopt;
  }
  const std::string raw = client_->get(admit_key);
  client_->erase(admit_key);
  const auto j = values_.json_of(admit_key, raw);
  auto r = j ? admission_from_json(*j, uid) : std::nullopt;
  if (!r) {
    if (j) values_.warn(admit_key, raw, "not an admission, rejection or dismissal of process " + std::to_string(uid));
    // Not a message for this candidate: it keeps waiting (registered again if an admission
    // erased its registration on its way here; the world's recovery then keeps it).
    const auto cands = registered_candidates();
    if (!client_->exists(key("waiting/", uid)) && last_registration_.count(uid))
      client_->set_text(key("waiting/", uid), last_registration_.at(uid));
    if (std::find(cands.begin(), cands.end(), uid) == cands.end()) client_->append_list("cands", uid);
    return std::nullopt;
  }
  return r;
}

}  // namespace dra::elastic::detail
