#pragma once
// The elastic world's protocol over the job's c10d store (internal to dra::dra): the key schema and
// every agreement that goes through the store, so the controller never names a key and each
// agreement is testable alone. The keys and what each holds: docs/design/elastic.md, "The store
// protocol".
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dra/policy/types.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "store_client.hpp"

namespace dra::elastic::detail {

/// Late joiners' uids are kLateUidBase + n, n from the store's "late_uid" counter.
constexpr int kLateUidBase = 10000;

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
  ~store_protocol();

  std::string address() const;
  /// The job-prefixed store (communicators rendezvous under it).
  const c10::intrusive_ptr<c10d::Store>& store() const;

  // -- start ---------------------------------------------------------------------------------
  /// A late joiner's uid: 10000 + the number of late joiners before it.
  int claim_late_uid();
  void set_universe(int size);
  int universe();
  /// Publishes this process's configuration and signature, then compares them with those of
  /// `others`. Throws std::invalid_argument naming the options that differ, or
  /// dra::state_mismatch_error naming the first differing tensor (signatures compared only when
  /// `compare_signatures`: a late joiner's model is checked at admission instead).
  void check_consistency(int uid, const nlohmann::json& config, const std::vector<tensor_spec>& signature,
                         const std::vector<int>& others, bool compare_signatures);

  // -- candidates ----------------------------------------------------------------------------
  void register_candidate(int uid, const std::vector<tensor_spec>& signature);
  /// Withdraws a waiting candidate; a store already gone is ignored (the job is over anyway).
  void withdraw(int uid) noexcept;
  /// Ends a waiting candidate's wait without admitting it (its device is being taken back).
  void dismiss(int uid, const std::string& why);
  std::vector<int> registered_candidates();
  /// The registered candidates that are waiting and not in `members`, ascending. A candidate
  /// whose model differs from `signature` is rejected on the spot and reported to `rejected`.
  std::vector<int> admissible_candidates(const std::vector<int>& members, const std::vector<tensor_spec>& signature,
                                         const std::function<void(int uid, const std::string& why)>& rejected);
  /// True while any registered candidate is still waiting.
  bool any_waiting();
  void admit(const std::vector<int>& joined, const admission& a);
  using outcome = admission_result::outcome;
  using wait_result = admission_result;
  /// Waits (polling, so the job's end is noticed too) until this candidate is admitted or
  /// rejected, or the job is done (then it withdraws).
  admission_result wait_for_admission(int uid);
  /// One look: the candidate's admission or rejection, the job's end (then it withdraws), or
  /// nothing yet.
  std::optional<admission_result> poll_admission(int uid, bool check_done);

  // -- decisions ------------------------------------------------------------------------------
  std::int64_t next_epoch();
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
  /// is alive but late and is waited for until `window` + `late_grace`; one without a heartbeat
  /// is waited for until `window`.
  /// `holds_state`: whether this process holds the world's training state (a joiner whose
  /// handoff did not complete does not); the agreed world starts with a process that does, and
  /// dra::membership_error is thrown when none survived.
  /// `admit_if_waiting`: the joiners of the decision that created this world; one that never got
  /// its admission (the leader died first) but still waits is admitted into the agreed world
  /// (recovery keeps live candidates), unless an admission it never took is still pending (it
  /// died waiting).
  agreement agree_on_survivors(std::int64_t failed_epoch, const std::vector<int>& old_members, int uid,
                               bool holds_state, std::chrono::milliseconds window,
                               const std::vector<int>& admit_if_waiting = {});

  /// Starts this process's heartbeat: a thread with its own store connection (a blocking wait on
  /// the main connection never delays it) raises beat/<uid> every `interval`; a member whose
  /// counter stands still for `stale` is taken for dead by a recovery; one that beats is waited
  /// for `late_grace` past the recovery's window. Stops with the protocol, or when the store goes.
  void start_heartbeat(int uid, std::chrono::milliseconds interval, std::chrono::milliseconds stale,
                       std::chrono::milliseconds late_grace);

  // -- the job's end and the outside ---------------------------------------------------------
  void mark_done();
  bool done();
  std::optional<size_limit> limit();
  void publish_report(const nlohmann::json& report);

 private:
  class heartbeat;
  std::string host_, prefix_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<store_client> client_;
  std::unique_ptr<heartbeat> heartbeat_;  // last: stopped first
  std::chrono::milliseconds beat_stale_{0}, late_grace_{0};
};

nlohmann::json to_json(const policy::decision& d);
/// What every process of a job must agree on (compared at start by check_consistency).
nlohmann::json config_fingerprint(const controller_options& o, const elastic_sampler& sampler, int start_size);
policy::decision decision_from_json(const nlohmann::json& j);

}  // namespace dra::elastic::detail
