// The store fuzzer's entry point (include/dra/torch/elastic/store_check.hpp): one value written by
// "another client" into one key, and every reader of the protocol that reads that key.
#include "dra/torch/elastic/store_check.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "dra/error.hpp"
#include "store_client.hpp"
#include "store_protocol.hpp"

namespace dra::elastic::testing {

using namespace std::chrono_literals;
using detail::store_client;
using detail::store_protocol;

namespace {

const std::vector<tensor_spec> kSignature = {{"w", {2, 3}, "torch.float32"}, {"b", {3}, "torch.float32"}};
const state_layout kLayout = {{"optimizer", "torch.optim.sgd.SGD"}, {"codec", "none"}};

nlohmann::json config() {
  return {{"policy", "none"}, {"decide_every", 10}};
}

// Each family: the key it writes (under the job), what is written first (the rest of a plausible
// job), and the readers.
struct family {
  std::string key;
  std::function<void(store_client&)> before;
  std::function<void(store_protocol&)> read;
};

const std::map<std::string, family>& families() {
  static const std::map<std::string, family> table = {
      {"universe", {"universe", {}, [](store_protocol& p) { p.universe(7); }}},
      {"late_uid", {"late_uid", {}, [](store_protocol& p) { p.claim_late_uid(); }}},
      {"cfg/<uid>",
       {"cfg/1", [](store_client& c) { c.set("sig/1", {{"model", nlohmann::json::array()}}); },
        [](store_protocol& p) { p.check_consistency(0, config(), kSignature, kLayout, {0, 1}, false); }}},
      {"sig/<uid>",
       {"sig/1", [](store_client& c) { c.set("cfg/1", config()); },
        [](store_protocol& p) { p.check_consistency(0, config(), kSignature, kLayout, {0, 1}, true); }}},
      {"epoch_seq", {"epoch_seq", {}, [](store_protocol& p) { p.next_epoch(10); }}},
      {"dec/<epoch>",
       {"dec/5",
        {},
        [](store_protocol& p) {
          p.try_read_decision(5);
          p.latest_decided_world(5, {0, 1});
          p.read_decision(5, 50ms);
        }}},
      {"cands",
       {"cands",
        {},
        [](store_protocol& p) {
          p.registered_candidates();
          p.any_waiting({0});
          p.admissible_candidates({0}, kSignature, kLayout, [](int, const std::string&) {});
        }}},
      {"waiting/<uid>",
       {"waiting/10000", [](store_client& c) { c.append_list("cands", 10000); },
        [](store_protocol& p) {
          p.admissible_candidates({0}, kSignature, kLayout, [](int, const std::string&) {});
          p.any_waiting({0});
        }}},
      {"admit/<uid>",
       {"admit/10000",
        {},
        [](store_protocol& p) {
          p.register_candidate(10000, kSignature, kLayout);
          p.poll_admission(10000, true);
        }}},
      {"fault/<epoch>/alive/<uid>",
       {"fault/7/alive/1", {}, [](store_protocol& p) { p.agree_on_survivors(7, {0, 1}, 0, true, 0, 1ms); }}},
      {"fault/<epoch>/result",
       {"fault/7/result", {}, [](store_protocol& p) { p.agree_on_survivors(7, {0, 1}, 0, true, 0, 1ms); }}},
      {"beat/<uid>",
       {"beat/1",
        {},
        [](store_protocol& p) {
          p.start_heartbeat(0, 10ms, 20ms, 20ms);
          p.agree_on_survivors(7, {0, 1}, 0, true, 0, 1ms);
        }}},
      {"gone/<uid>", {"gone/1", {}, [](store_protocol& p) { p.agree_on_survivors(7, {0, 1}, 0, true, 0, 1ms); }}},
      // Read for its presence only (a member still inside a rebuild is waited for, up to a bound):
      // any value, a beating member 1 past the late grace.
      {"rebuild/<uid>",
       {"rebuild/1", [](store_client& c) { c.set("beat/1", 1); },
        [](store_protocol& p) {
          p.start_heartbeat(0, 10ms, 20ms, 20ms);
          p.agree_on_survivors(7, {0, 1}, 0, true, 0, 1ms);
        }}},
      {"capacity", {"capacity", {}, [](store_protocol& p) { p.limit(); }}},
      {"child/<epoch>", {"child/5", {}, [](store_protocol& p) { p.claim_child(5, 6); }}},
      {"child/<epoch>/again", {"child/5/again", {}, [](store_protocol& p) { p.claim_child(5, 6); }}},
      {"word/<epoch>/<step>", {"word/3/10", {}, [](store_protocol& p) { p.read_boundary(3, 10, 50ms); }}},
      {"done", {"done", {}, [](store_protocol& p) { p.done(); }}},
  };
  return table;
}

// The connection to the store at host:port that every case shares (made once, generous timeout).
std::shared_ptr<store_client> connection(const std::string& host, int port) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<store_client>> open;
  const std::string address = host + ":" + std::to_string(port);
  std::lock_guard<std::mutex> lock(mutex);
  auto& c = open[address];
  if (!c || c->gone()) c = std::make_shared<store_client>(host, port, false, "", 30s);
  // The store closes a connection on which add() met a value that is not a counter (the last case
  // may have done so): one round trip finds out (a store that is gone fails at once, by design),
  // and a new connection replaces it. A store that refuses the new one too fails the case's first op.
  try {
    c->exists("dra-fuzz-probe");
  } catch (const dra::error&) {
    c = std::make_shared<store_client>(host, port, false, "", 30s);
  }
  return c;
}

}  // namespace

std::vector<std::string> store_key_families() {
  std::vector<std::string> out;
  for (const auto& [name, _] : families()) out.push_back(name);
  return out;
}

std::string read_store_value(const std::string& host, int port, const std::string& job, const std::string& family,
                             const std::string& value) {
  const auto it = families().find(family);
  if (it == families().end()) {
    std::string known;
    for (const auto& name : store_key_families()) known += (known.empty() ? "" : ", ") + name;
    throw std::invalid_argument("family: unknown store key family '" + family + "'; known: " + known);
  }
  // Every case of a run goes over one connection per store (each case under its own job prefix):
  // thousands of new connections to c10d's store made some wait out their connect timeout on a
  // loaded host.
  const auto base = connection(host, port);
  store_client other(*base, job, 2s);  // "another client": writes the value as bytes
  if (it->second.before) it->second.before(other);
  other.set_text(it->second.key, value);
  store_protocol protocol(std::make_unique<store_client>(*base, job, 5s), job);
  try {
    it->second.read(protocol);
  } catch (const dra::error& e) {
    return std::string("handled: ") + e.what();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (family != "cfg/<uid>" || what.find("inconsistent configuration") == std::string::npos) throw;
    return "handled: " + what;
  }
  return protocol.ignored_values() > 0 ? "ignored" : "read";
}

std::string agree_after_failure(const std::string& host, int port, const std::string& job, int uid,
                                const std::vector<int>& old_members, bool holds_state, int window_ms, int stale_ms) {
  store_protocol protocol(std::make_unique<store_client>(host, port, false, job, 5s), job);
  const std::chrono::milliseconds window(window_ms), stale(stale_ms);
  protocol.start_heartbeat(uid, std::max(stale / 5, std::chrono::milliseconds(1)), stale, window);
  try {
    const auto a = protocol.agree_on_survivors(1, old_members, uid, holds_state, 0, window, {});
    const auto& uids = a.members.empty() ? a.elsewhere : a.members;
    std::string out = a.members.empty() ? "elsewhere" : "members";
    for (int u : uids) out += " " + std::to_string(u);
    return out;
  } catch (const dra::error& e) {
    return std::string("handled: ") + e.what();
  }
}

}  // namespace dra::elastic::testing
