#pragma once
// The elastic world's protocol over the job's c10d store (internal to dra::dra): the key schema
// and every agreement that goes through the store. The controller never names a key.
//
// Any client of the store can write any of these keys: every value read is parsed through
// store_values (a value that does not parse is ignored with one warning: absent, the last good
// value, or a dra::error the controller handles), and the counters are repaired when a value they
// cannot count from was written over them.
//
// Keys, under "dra/<job>/<restart>/":
//   universe, late_uid          processes launched together; the counter late joiners number from
//   cfg/<uid>, sig/<uid>        each process's configuration, model signature and state layout
//                               (compared at start)
//   epoch_seq                   the world epochs handed out (decisions and recoveries take the next)
//   dec/<epoch>                 the leader's decision for the world of <epoch> (its members learn
//                               that one exists from a flag in the next gradient all-reduce)
//   cands, waiting/<uid>        registered candidates; a waiting one's model signature
//   admit/<uid>                 a candidate's admission (epoch, members, joined), rejection, or
//                               dismissal (named in capacity's "leave" before it was admitted)
//   fault/<epoch>/alive/<uid>   survivors' check-in after a failure in the world of <epoch>
//   beat/<uid>                  a counter each process's heartbeat thread raises (liveness: a
//                               member that neither checks in nor beats is dead)
//   rebuild/<uid>               the world epoch a process is rebuilding, for the rebuild phase of a
//                               world change (erased after it): a recovery waits longer for a
//                               member that beats and is still inside a rebuild
//   fault/<epoch>/result        the first stored proposal of the next world (everyone adopts it);
//                               one that does not parse sends every survivor to the next room,
//                               fault/<epoch>/r<k>/..., where they agree again
//   gone/<uid>                  a process that left the job mid-training (an uncaught exception): a
//                               recovery does not wait for it
//   child/<epoch>, child/<epoch>/again
//                               the world that followed the world of <epoch> (claimed by the first
//                               member to enter it, in both keys): a group of survivors that agreed
//                               on another world after overwritten keys split them steps out
//                               instead of training on as a second world
//   done                        the job finished
//   capacity                    written by an outside actor (a device pool, an RL coordinator):
//                               {"max_size", "min_size", "leave": [uids that must go now]}
//   report                      written by the leader at most once a second: the job's live state
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dra/policy/types.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "store_client.hpp"
#include "store_values.hpp"

namespace dra::elastic::detail {

/// Late joiners' uids are kLateUidBase + n, n from the store's "late_uid" counter.
constexpr int kLateUidBase = 10000;

/// A per-process or per-epoch key of the schema above: `base` ("beat/", "dec/", ...) and the id.
inline std::string key(const char* base, std::int64_t id) {
  return std::string(base) + std::to_string(id);
}

/// The leader's decision as every member reads it: the decision value object and where it applies.
struct published_decision {
  policy::decision decision;
  std::int64_t epoch = 0;         ///< the world epoch it creates
  std::int64_t decided_step = 0;  ///< the committed step it was taken at
};

/// A candidate's admission to a world.
struct admission {
  std::int64_t epoch = 0;
  std::vector<int> members;
  std::vector<int> joined;
  bool recovery = false;  ///< admitted into a recovery's world: the state comes from its rank 0
};

/// How a candidate's wait ended.
struct admission_result {
  /// dismissed: the outside actor named it in capacity's "leave" before it was admitted.
  enum class outcome { admitted, rejected, done, dismissed };
  outcome what = outcome::done;
  admission admitted;
  std::string why;  ///< the rejection's or dismissal's reason
};

/// The next world after a failure, as the survivors agreed on it.
struct agreement {
  std::int64_t epoch = 0;
  std::vector<int> members;
  /// No member here held the state while these members of the world were alive elsewhere (their
  /// heartbeat moved, they never came): the ones here were split off and step out; members is empty.
  std::vector<int> elsewhere;
};

/// An outside actor's limit on the job's size (a device pool, an RL coordinator), when one is set:
/// the world is grown to min_size as soon as candidates allow and shrunk to max_size at once (the
/// members in `leave` first); members named in `leave` go at once even within max_size (the actor
/// takes their devices back); the policy decides within. 0: no bound.
struct size_limit {
  int max_size = 0;
  int min_size = 0;
  std::vector<int> leave;
};

class store_protocol {
 public:
  store_protocol(const launch_info& launch, std::chrono::milliseconds timeout);
  /// Over a client already connected (its prefix is the job's).
  store_protocol(std::unique_ptr<store_client> client, const std::string& job_prefix);
  ~store_protocol();

  std::string address() const;
  /// Whether the store stopped answering this process (a reconnection failed too).
  bool gone() const noexcept;
  /// Bounds how long this process's store operations may spend reconnecting (store_client).
  void bound_reconnects(std::chrono::milliseconds bound) noexcept;
  /// The job-prefixed store (communicators rendezvous under it).
  const c10::intrusive_ptr<c10d::Store>& store() const;

  // -- start ---------------------------------------------------------------------------------
  /// A late joiner's uid: 10000 + the number of late joiners before it.
  int claim_late_uid();
  void set_universe(int size);
  /// `launched` (the fallback, from WORLD_SIZE) when the stored value does not parse.
  int universe(int launched);
  /// Publishes this process's configuration, signature and state layout, then compares them with
  /// those of `others`. Throws std::invalid_argument naming the options that differ, or
  /// dra::state_mismatch_error naming the first differing tensor or layout part (compared only
  /// when `compare_signatures`: a late joiner's state is checked at admission instead). A stored
  /// value that does not parse is not compared (warned).
  void check_consistency(int uid, const nlohmann::json& config, const std::vector<tensor_spec>& signature,
                         const state_layout& layout, const std::vector<int>& others, bool compare_signatures);

  // -- candidates ----------------------------------------------------------------------------
  void register_candidate(int uid, const std::vector<tensor_spec>& signature, const state_layout& layout);
  /// Withdraws a waiting candidate; a store already gone is ignored (the job is over anyway).
  void withdraw(int uid) noexcept;
  /// Ends a waiting candidate's wait without admitting it (its device is being taken back).
  void dismiss(int uid, const std::string& why);
  std::vector<int> registered_candidates();
  /// The registered candidates that are waiting and not in `members`, ascending. A candidate
  /// whose model or state layout differs from the world's is rejected on the spot (before anything
  /// is sent) and reported to `rejected`.
  std::vector<int> admissible_candidates(const std::vector<int>& members, const std::vector<tensor_spec>& signature,
                                         const state_layout& layout,
                                         const std::function<void(int uid, const std::string& why)>& rejected);
  /// True while any candidate outside `members` is still waiting: one registered now, one this
  /// process saw registered earlier, or one that was a member of a world this process was in (a
  /// member a shrink stood by waits as a candidate). A list another client wrote over reads as
  /// empty, and the job's end must still reach the candidates it lost.
  bool any_waiting(const std::vector<int>& members = {});
  /// Remembers the uids of a world this process entered (any_waiting looks for them too).
  void note_members(const std::vector<int>& members);
  /// Whether a value another client wrote was found in this job's keys (warned).
  bool tampered() const;
  void admit(const std::vector<int>& joined, const admission& a);
  using outcome = admission_result::outcome;
  using wait_result = admission_result;
  /// Waits (polling, so the job's end is noticed too) until this candidate is admitted or
  /// rejected, or the job is done (then it withdraws). Throws dra::membership_error (after
  /// withdrawing) when every other process that may hold the training state is gone: each one not
  /// itself waiting left the job (gone/<uid>), or its heartbeat stood still for longer than a
  /// recovery waits for a late member, or it never beat within the store's timeout; nobody is
  /// left to admit this candidate or hand it the state. `check`, when set, is called about every
  /// 100 ms; an exception from it withdraws the candidate and leaves the wait.
  admission_result wait_for_admission(int uid, const std::function<void()>& check = {});
  /// One look: the candidate's admission or rejection, the job's end (then it withdraws), or
  /// nothing yet.
  std::optional<admission_result> poll_admission(int uid, bool check_done);

  // -- decisions ------------------------------------------------------------------------------
  /// A new world epoch, above `known` (the highest epoch this process knows of): a counter
  /// overwritten with a value it cannot count from, or one that would hand out an old epoch, is
  /// set far past `known` first.
  std::int64_t next_epoch(std::int64_t known);
  /// Records that the world of `child` follows the world of `parent`; false when another world
  /// already followed it (this process's group was split from the others: it must step out).
  bool claim_child(std::int64_t parent, std::int64_t child);
  void publish_decision(std::int64_t current_epoch, const published_decision& d);
  published_decision read_decision(std::int64_t current_epoch, std::chrono::milliseconds timeout);
  /// The decision published for the world of `epoch`, if any (a recovery resumes an interrupted grow).
  std::optional<published_decision> try_read_decision(std::int64_t epoch);
  /// The leader's word at a step boundary (capacity_poll_s = 0: a change is applied at the
  /// boundary where it was decided): whether a decision was published for this epoch at `step`.
  /// The word of the step before is erased (every member has read it: it reduced since).
  void publish_boundary(std::int64_t epoch, std::int64_t step, bool decided);
  bool read_boundary(std::int64_t epoch, std::int64_t step, std::chrono::milliseconds timeout);

  // -- faults ---------------------------------------------------------------------------------
  /// The latest world decided from the world of `epoch`: a member that failed before it learnt of
  /// a published decision follows it (and the decisions after it) into the decided world, so every
  /// survivor recovers the same world. `members` is the world of `epoch`; `joiners` the last
  /// decision's joiners (empty when none was published).
  struct decided_world {
    std::int64_t epoch = 0;
    std::vector<int> members;
    std::vector<int> joiners;
  };
  decided_world latest_decided_world(std::int64_t epoch, std::vector<int> members);

  /// Every survivor checks in and waits for the other old members, then proposes the survivors;
  /// the first proposal stored wins and everyone adopts it. No single decider: a survivor that
  /// dies during the recovery cannot leave the others without a result. How long it waits for a
  /// member that has not checked in depends on that member's heartbeat (start_heartbeat): one
  /// whose counter stood still for the heartbeat's `stale` time is dead at once; one still beating
  /// is alive but late and is waited for until `window` + `late_grace`, longer while it is still
  /// inside a rebuild (rebuilding); one without a heartbeat is waited for until `window`.
  /// `holds_state`: whether this process holds the world's training state (a joiner whose
  /// handoff did not complete does not); the agreed world starts with a process that does, and
  /// dra::membership_error is thrown when none survived. `committed`: the steps its state has
  /// applied. Of the holders, one whose state is furthest on leads (rank 0 hands its state to the
  /// others): a step whose reduction finished on some members and timed out on another (its
  /// last receive) was committed by the world, and is kept rather than undone and redone.
  /// `admit_if_waiting`: the joiners of the decision that created this world; one that never got
  /// its admission (the leader died first) but still waits is admitted into the agreed world
  /// (recovery keeps live candidates), unless an admission it never took is still pending (it
  /// died waiting).
  agreement agree_on_survivors(std::int64_t failed_epoch, const std::vector<int>& old_members, int uid,
                               bool holds_state, std::int64_t committed, std::chrono::milliseconds window,
                               const std::vector<int>& admit_if_waiting = {});

  /// Starts this process's heartbeat: a thread with its own store connection (a blocking wait on
  /// the main connection never delays it) raises beat/<uid> every `interval`; a member whose
  /// counter stands still for `stale` is taken for dead by a recovery; one that beats is waited
  /// for `late_grace` past the recovery's window. Stops with the protocol, or when the store goes.
  void start_heartbeat(int uid, std::chrono::milliseconds interval, std::chrono::milliseconds stale,
                       std::chrono::milliseconds late_grace);
  /// This process leaves the job mid-training (an uncaught exception): its heartbeat stops and a
  /// recovery takes it for dead at once. Never throws.
  void mark_gone(int uid) noexcept;
  /// This process entered the rebuild of the world of `epoch` (rebuilding), or its backend
  /// returned that world (rebuilt): a recovery's agreement waits for a member that beats and is
  /// still inside a rebuild past the late grace (see agree_in_room). Neither throws: a store that
  /// fails shows at the next operation that needs an answer.
  void rebuilding(int uid, std::int64_t epoch) noexcept;
  void rebuilt(int uid) noexcept;

  // -- the job's end and the outside ---------------------------------------------------------
  /// `stopped_at`: the step at which a stop request (a worker's SIGTERM) ended training, if one did.
  void mark_done(const std::vector<int>& members, std::optional<std::int64_t> stopped_at = std::nullopt);
  bool done();
  /// Member `uid` of world `epoch` ended its training loop after `step` committed steps (finish).
  /// A member of that world still training learns it at its recovery (loop_ended) instead of
  /// training on alone. Never throws: a store that fails makes the end's barrier fail too.
  void mark_loop_ended(std::int64_t epoch, int uid, std::int64_t step) noexcept;
  /// Who ended the training loop of world `epoch`, and after how many steps; nothing when nobody
  /// did (or the value does not parse: warned).
  struct loop_end {
    int uid = -1;
    std::int64_t step = 0;
  };
  std::optional<loop_end> loop_ended(std::int64_t epoch);
  /// The outside limit; a value that does not parse leaves the last good one in force (warned).
  std::optional<size_limit> limit();
  void publish_report(const nlohmann::json& report);
  /// Store values ignored so far because they did not parse.
  std::size_t ignored_values() const { return values_.warnings(); }

 private:
  class heartbeat;
  std::optional<published_decision> decision_of(const std::string& key, const std::string& raw);
  /// One room of agree_on_survivors; nothing when its result does not parse.
  std::optional<agreement> agree_in_room(const std::string& base, std::int64_t failed_epoch,
                                         const std::vector<int>& old_members, int uid, bool holds_state,
                                         std::int64_t committed, std::chrono::milliseconds window,
                                         const std::vector<int>& admit_if_waiting);
  std::int64_t repair_counter(const std::string& key, const std::string& seen, std::int64_t floor);
  /// A waiting candidate's look at the other processes' liveness (see wait_for_admission): a
  /// description of the lost state holders, or nothing while one may be alive.
  struct beat_seen {
    std::string value;
    std::chrono::steady_clock::time_point at;
  };
  std::optional<std::string> state_holders_lost(int uid, std::map<int, beat_seen>& seen,
                                                std::chrono::steady_clock::time_point waiting_since);
  enum class claim { mine, other, unknown };
  /// One key of claim_child: this world's claim, another world's, or unknown (values that are no
  /// claim kept coming back).
  claim claim_key(const std::string& k, std::int64_t parent, std::int64_t child);
  std::string host_, prefix_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<store_client> client_;
  store_values values_;
  std::optional<size_limit> last_limit_;
  std::map<int, std::string> last_registration_;  ///< what register_candidate wrote, by uid
  std::set<int> seen_candidates_;                 ///< every uid registered_candidates() returned or note_members noted
  std::unique_ptr<heartbeat> heartbeat_;          // last: stopped first
  std::chrono::milliseconds beat_stale_{0}, late_grace_{0};
};

nlohmann::json to_json(const policy::decision& d);
/// What every process of a job must agree on (compared at start by check_consistency).
nlohmann::json config_fingerprint(const controller_options& o, const elastic_sampler& sampler, int start_size);
/// A decision as to_json wrote it, or nothing when `j` is not one.
std::optional<policy::decision> decision_from_json(const nlohmann::json& j);

}  // namespace dra::elastic::detail
