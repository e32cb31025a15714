#pragma once
// Events of an elastic world and the leader's status line (internal to dra::dra). An event is a
// struct, serialised once into a JSON line: kept in memory (the controller's events()), appended
// to the events file, and printed on stderr. Diagnostics never stop training: a line is appended
// whole or not at all (one write of the whole line; a short one, on a full disk, is cut back), and
// a file that cannot be written is warned about once and skipped until it can again.
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "world_change.hpp"

namespace dra::elastic::detail {

/// The job's running totals every event carries: the world's energy (members' processes; NaN
/// before the first figure) and the gradient codec's bytes.
struct job_figures {
  double energy_step_j = std::numeric_limits<double>::quiet_NaN();
  double energy_job_j = std::numeric_limits<double>::quiet_NaN();
  std::string energy_source;
  std::string compress;  ///< the codec's spec ("" none)
  std::uint64_t bytes_sent = 0, bytes_dense = 0;
};

/// What the leader reports once a world change is done.
struct world_event {
  world_change change;
  std::int64_t step = 0;
  std::int64_t data_epoch = 0;
  int after = 0;
  double rebuild_s = 0.0, transfer_s = 0.0, reshard_s = 0.0;
  std::uint64_t state_bytes = 0;
  std::uint64_t skipped_bytes = 0;   ///< not sent: the joiners held them already (deferred handoff)
  std::uint64_t deferred_bytes = 0;  ///< sent after the change, during the joiners' first step
  std::int64_t global_batch = 0;
  std::string batch_mode;
  std::optional<bool> params_identical;
  std::string backend;
  std::string release;  ///< on the start event only
  job_figures figures;
};

/// "[dra] step N loss L world W samples/s S energy E J/step (J total, source) codec C x" on the
/// leader every N steps; the rate's window starts when the world is entered.
class status_line {
 public:
  void restart() noexcept;
  void committed(std::int64_t samples) noexcept { samples_ += samples; }
  void maybe_print(std::int64_t steps, std::int64_t every, double loss, int world, const job_figures& f) noexcept;

 private:
  std::chrono::steady_clock::time_point since_{};
  std::int64_t samples_ = 0;
};

class event_log {
 public:
  explicit event_log(std::string path) : path_(std::move(path)) {}
  void world(const world_event& e);
  void rejected(std::int64_t step, std::int64_t epoch, int uid, const std::string& reason);
  /// A step refused because a rank did not train its batch (it is redone).
  void refused(std::int64_t step, std::int64_t epoch, const std::string& reason);
  /// The job's end, on the leader: one line on stdout with its steps, energy and codec bytes (not an
  /// event: readers of the events file expect world changes).
  static void print_summary(std::int64_t steps, int world, const job_figures& f) noexcept;
  /// The latest events, oldest first: at least the last `kept_lines` (all of them until then); the
  /// events file holds every one. A job whose world changed every few seconds for days kept every
  /// line in memory (600 bytes a change, never returned).
  const std::vector<std::string>& lines() const noexcept { return lines_; }
  /// Events written since the log was made (lines() drops the oldest past kept_lines).
  std::uint64_t count() const noexcept { return count_; }
  static constexpr std::size_t kept_lines = 1000;
  const std::string& last() const noexcept;
  status_line status;

 private:
  template <class Json>
  void write(Json& ev);
  /// Appends `line` and a newline to the file, whole or not at all; false (errno set) when not.
  bool append(const std::string& line) const noexcept;

  std::string path_;
  std::vector<std::string> lines_;
  std::uint64_t count_ = 0;
  std::size_t unwritten_ = 0;  ///< lines not written since the file last failed (0: it works)
};

}  // namespace dra::elastic::detail
