#pragma once
// The contract between a running elastic job and the actors outside it (a launcher, a device
// pool, an RL coordinator), from the outside: the store keys they write and read, in one place.
// The job's side (the controller's leader) reads `capacity` and writes `report`, `done` and the
// `late_uid` counter; docs/guide/elastic.md ("Driving a job from outside") documents each key.
// Keys live under dra/<job>/<restart>/ in the job's c10d store.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dra::elastic {

/// The key names under the job's prefix.
namespace job_keys {
inline constexpr const char* capacity = "capacity";  ///< outside -> job: {"min_size", "max_size", "leave": [uids]}
inline constexpr const char* report = "report";      ///< job -> outside: the leader's live state, about once a second
inline constexpr const char* done = "done";          ///< job -> outside: the job finished
inline constexpr const char* final_world =
    "final";  ///< job -> outside: {"members": [uids]} of the world that finished it (set just before done)
inline constexpr const char* late_uid = "late_uid";  ///< the counter late joiners' uids come from (10000 + n)
inline constexpr const char* universe = "universe";  ///< job -> outside: the processes launched together (set at start)
inline constexpr const char* config = "cfg/";  ///< process -> all: cfg/<uid>, its options, written as it checks in
}  // namespace job_keys

/// The first late joiner's uid (a joiner's uid is this + the job's late_uid count before it).
inline constexpr int late_uid_base = 10000;

/// An outside actor's handle on one job: a client of the job's store.
class job_control {
 public:
  /// Connects to the store at host:port (retrying until `timeout`; dra::timeout_error names the
  /// address). `job` is the job id (DRA_JOB_ID, or torchrun's run id), `restart` torchrun's
  /// restart count (0 under `dra run` and the pool).
  job_control(const std::string& host, int port, const std::string& job, int restart = 0,
              std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~job_control();
  job_control(const job_control&) = delete;
  job_control& operator=(const job_control&) = delete;

  /// Writes `capacity`: the world is grown to `min_size` as soon as candidates wait and shrunk to
  /// `max_size` at once (the uids in `leave` first); a member in `leave` goes even within the
  /// bounds, a candidate in it is never admitted. 0: no bound. Throws std::invalid_argument for
  /// bounds that cannot hold (min_size > max_size > 0, negative values).
  void set_capacity(int min_size, int max_size, const std::vector<int>& leave = {});
  /// The leader's latest `report` as JSON text, or "" before the first one.
  std::string report();
  /// Whether the job finished (`done`).
  bool done();
  /// The uids of the world that finished the job (`final`, written just before `done`), or nullopt
  /// while it runs (or when the value is not a list of uids). A launcher's worker outside it that
  /// still runs after the end was left out of the job without knowing it (stuck in its own code).
  std::optional<std::vector<int>> final_members();
  /// The step at which a stop request (a worker's SIGTERM under DRA_STOP_ON_SIGTERM, ctl.stop())
  /// ended the job's training, or nullopt (it ran to its loop's end, or runs).
  std::optional<std::int64_t> stopped_at();
  /// Whether the job's processes formed their dra world (`universe` is set): a launcher tells a
  /// dra job (which survives a worker's death in place) from a script without dra.
  bool started();
  /// Whether process `uid` checked in (wrote `cfg/<uid>` at its start). The founding processes
  /// wait for each other's check-in (up to store_timeout_s) before the first world forms: a
  /// launcher whose founding worker exits before it checked in restarts it in its place, or stops
  /// the others, rather than let them wait for it and fail.
  bool checked_in(int uid);
  /// Claims a late joiner's uid from `late_uid` (start the joiner with DRA_JOIN=1 and
  /// DRA_JOIN_UID=<uid>, so that it can later be named in `leave`).
  int claim_late_uid();
  /// The key prefix ("dra/<job>/<restart>").
  const std::string& prefix() const noexcept { return prefix_; }
  std::string address() const;

 private:
  struct client;
  std::string prefix_;
  std::unique_ptr<client> client_;
};

}  // namespace dra::elastic
