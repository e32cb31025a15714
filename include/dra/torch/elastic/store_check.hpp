#pragma once
// What the elastic protocol makes of a value another client wrote into one of its store keys
// (part of dra::dra): the entry point of the store fuzzer (`python -m dra.bench faults`, its
// outside-writers class, and tests/python/test_faults_outside.py). Not needed to train.
#include <string>
#include <vector>

namespace dra::elastic::testing {

/// The keys the elastic protocol reads, one per family as the fuzzer names them ("capacity",
/// "dec/<epoch>", "fault/<epoch>/result", ...).
std::vector<std::string> store_key_families();

/// Writes `value` (any bytes) into the key of `family` under a fresh job prefix `job` on the store
/// at host:port, then runs every reader of the protocol that reads that key. Returns "read" (the
/// protocol took the value), "ignored" (it did not parse: ignored with one warning), or
/// "handled: <what>" (a dra::error the controller handles, or a configuration that parses but
/// differs, refused at start with std::invalid_argument as a bad option is). Anything else escapes:
/// a crash, which the fuzzer reports with the value. Throws std::invalid_argument for an unknown
/// family.
std::string read_store_value(const std::string& host, int port, const std::string& job, const std::string& family,
                             const std::string& value);

/// One survivors' agreement after world epoch 1 (the recovery's first step) by process `uid` of
/// `old_members`, under job prefix `job`, with this process's heartbeat running (`stale_ms`: a
/// member whose beat/<uid> counter stood still that long is dead; late members are waited for up to
/// another `window_ms`). Returns "members <uids>", "elsewhere <uids>" (nobody here held the state
/// and these members beat but never came: this process steps out) or "handled: <what>" (a
/// dra::error, such as the state being lost).
std::string agree_after_failure(const std::string& host, int port, const std::string& job, int uid,
                                const std::vector<int>& old_members, bool holds_state, int window_ms, int stale_ms);

}  // namespace dra::elastic::testing
