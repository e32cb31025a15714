#pragma once
// Energy accounting (docs/design/sustainable.md): where a joule figure comes from, how cumulative counters are
// turned into per-step and per-job energy, and the model used where nothing can be read.
//
// Every figure carries its source. `measured` means a hardware counter was read (NVML's total
// energy, RAPL's energy_uj); `estimated` means a model produced it (CPU-seconds x watts per core);
// `replayed` means it comes from a recorded trace (Zeus's measured profiles). A sum of figures is
// only as good as its weakest part: measured + estimated is estimated.
//
// Header-only, no I/O: the readers that touch the hardware live in src/energy (readers.hpp).
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"

namespace dra::energy {

enum class energy_source { measured, estimated, replayed };

inline const char* to_string(energy_source s) noexcept {
  switch (s) {
    case energy_source::measured:
      return "measured";
    case energy_source::estimated:
      return "estimated";
    case energy_source::replayed:
      return "replayed";
  }
  return "unknown";
}

/// The label of a figure built from two others: measured only when both are measured.
inline energy_source combine(energy_source a, energy_source b) noexcept {
  if (a == b) return a;
  if (a == energy_source::replayed || b == energy_source::replayed) return energy_source::replayed;
  return energy_source::estimated;
}

/// A cumulative energy counter: joules since an arbitrary origin, never decreasing.
class energy_reader {
 public:
  virtual ~energy_reader() = default;
  /// Short name for logs: "nvml", "rapl", "cpu-model", ...
  virtual std::string name() const = 0;
  virtual energy_source source() const noexcept = 0;
  /// Joules since the reader was created (monotonic). Throws dra::error when the counter can no
  /// longer be read (a device vanished, a file became unreadable).
  virtual double read_joules() = 0;
  /// What the reader covers, for the record ("2 GPUs", "package-0, package-1", "process CPU time").
  virtual std::string scope() const = 0;
};

/// Turns a hardware counter that wraps at `max_range` (RAPL's energy_uj wraps at
/// max_energy_range_uj, every few minutes to hours under load) into a monotonic total.
/// One wrap between two reads is assumed; read at least once per wrap period (RAPL: minutes).
class counter_unwrapper {
 public:
  /// max_range: the value at which the counter wraps to 0 (0: never wraps).
  explicit counter_unwrapper(std::uint64_t max_range = 0) : max_range_(max_range) {}

  /// Feeds a raw reading; returns the monotonic total (in the counter's units) since the first one.
  std::uint64_t update(std::uint64_t raw) {
    if (!started_) {
      started_ = true;
      last_ = raw;
      return total_;
    }
    if (raw >= last_) {
      total_ += raw - last_;
    } else if (max_range_ > 0 && last_ <= max_range_) {
      total_ += (max_range_ - last_) + raw;  // wrapped once: up to max_range, then from 0
      ++wraps_;
    } else {
      // A counter without a known range went backwards (a driver reset): count nothing for this
      // interval rather than a huge bogus delta, and restart from the new value.
      ++resets_;
    }
    last_ = raw;
    return total_;
  }
  std::uint64_t total() const noexcept { return total_; }
  std::uint64_t wraps() const noexcept { return wraps_; }
  std::uint64_t resets() const noexcept { return resets_; }

 private:
  std::uint64_t max_range_ = 0;
  std::uint64_t last_ = 0;
  std::uint64_t total_ = 0;
  std::uint64_t wraps_ = 0;
  std::uint64_t resets_ = 0;
  bool started_ = false;
};

/// The estimate used where no counter can be read: busy CPU time x a stated power per busy core.
/// The default, 10 W per busy core, is a server CPU's TDP shared over its cores (e.g. 205 W over
/// 20 cores) and counts neither idle power nor memory, disks or the network: it is a rough
/// estimate, always labelled `estimated`.
struct cpu_model_config {
  double watts_per_core = 10.0;
  void validate() const {
    if (!(watts_per_core > 0.0) || !std::isfinite(watts_per_core))
      dra::detail::throw_invalid("watts_per_core",
                                 "must be a finite number > 0, got " + std::to_string(watts_per_core));
  }
};

/// Estimated energy from a CPU-seconds clock (the process's, or a group of processes').
class cpu_model_reader final : public energy_reader {
 public:
  /// cpu_seconds: a monotonic clock of busy CPU seconds (summed over cores).
  cpu_model_reader(std::function<double()> cpu_seconds, cpu_model_config config = {},
                   std::string scope = "process CPU time")
      : cpu_seconds_(std::move(cpu_seconds)), config_((config.validate(), config)), scope_(std::move(scope)) {
    if (!cpu_seconds_) dra::detail::throw_invalid("cpu_seconds", "must be a callable returning CPU seconds");
    origin_ = cpu_seconds_();
  }
  std::string name() const override { return "cpu-model"; }
  energy_source source() const noexcept override { return energy_source::estimated; }
  std::string scope() const override {
    return scope_ + " x " + std::to_string(config_.watts_per_core) + " W per busy core";
  }
  double read_joules() override { return (cpu_seconds_() - origin_) * config_.watts_per_core; }
  const cpu_model_config& config() const noexcept { return config_; }

 private:
  std::function<double()> cpu_seconds_;
  cpu_model_config config_;
  std::string scope_;
  double origin_ = 0.0;
};

/// Several readers summed (several GPUs, or GPUs + CPU packages). Its source is the combination.
class sum_reader final : public energy_reader {
 public:
  explicit sum_reader(std::vector<std::unique_ptr<energy_reader>> parts) : parts_(std::move(parts)) {
    if (parts_.empty()) dra::detail::throw_invalid("parts", "needs at least one reader");
  }
  std::string name() const override {
    std::string out;
    for (const auto& p : parts_) out += (out.empty() ? "" : "+") + p->name();
    return out;
  }
  energy_source source() const noexcept override {
    energy_source s = parts_.front()->source();
    for (const auto& p : parts_) s = combine(s, p->source());
    return s;
  }
  std::string scope() const override {
    std::string out;
    for (const auto& p : parts_) out += (out.empty() ? "" : "; ") + p->scope();
    return out;
  }
  double read_joules() override {
    double j = 0.0;
    for (auto& p : parts_) j += p->read_joules();
    return j;
  }

 private:
  std::vector<std::unique_ptr<energy_reader>> parts_;
};

/// One step's (or any interval's) energy.
struct energy_interval {
  double joules = 0.0;
  double seconds = 0.0;
  energy_source source = energy_source::estimated;
  double watts() const noexcept { return seconds > 0.0 ? joules / seconds : 0.0; }
};

/// Per-step and per-job energy from a cumulative reader and a clock. Call `mark(now_s)` at each
/// step boundary; the interval since the previous mark is that step's energy. Not thread-safe:
/// one meter per training loop.
class energy_meter {
 public:
  explicit energy_meter(std::unique_ptr<energy_reader> reader) : reader_(std::move(reader)) {
    if (!reader_) dra::detail::throw_invalid("reader", "must not be null");
  }

  /// Starts (or restarts) the job's accounting at time now_s.
  void start(double now_s) {
    job_ = {};
    job_.source = reader_->source();
    last_step_ = job_;
    last_joules_ = reader_->read_joules();
    last_time_ = now_s;
    steps_ = 0;
    started_ = true;
  }

  /// Closes the current step at now_s and returns its energy. Starts the meter on first use.
  const energy_interval& mark(double now_s) {
    if (!started_) {
      start(now_s);
      return last_step_;
    }
    double j = reader_->read_joules();
    // A reading or a clock that is not a number keeps the last good one (counted in
    // bad_readings()): stored, it zeroed this step and the next.
    if (!std::isfinite(j)) ++bad_readings_, j = last_joules_;
    if (!std::isfinite(now_s)) ++bad_readings_, now_s = last_time_;
    last_step_.joules = std::max(0.0, j - last_joules_);
    last_step_.seconds = std::max(0.0, now_s - last_time_);
    last_step_.source = reader_->source();
    job_.joules += last_step_.joules;
    job_.seconds += last_step_.seconds;
    job_.source = combine(job_.source, last_step_.source);
    last_joules_ = j;
    last_time_ = now_s;
    ++steps_;
    return last_step_;
  }

  /// Leaves the time since the last mark out of the accounting (the process was out of the job,
  /// e.g. standing by): the next step is measured from now_s. Starts the meter on first use.
  void skip(double now_s) {
    if (!started_) {
      start(now_s);
      return;
    }
    last_joules_ = reader_->read_joules();
    last_time_ = now_s;
  }

  const energy_interval& last_step() const noexcept { return last_step_; }
  const energy_interval& job() const noexcept { return job_; }
  std::int64_t steps() const noexcept { return steps_; }
  /// Readings (energy or clock) that were not finite numbers, each replaced by the last good one.
  std::int64_t bad_readings() const noexcept { return bad_readings_; }
  const energy_reader& reader() const noexcept { return *reader_; }
  energy_source source() const noexcept { return reader_->source(); }

 private:
  std::unique_ptr<energy_reader> reader_;
  energy_interval last_step_, job_;
  double last_joules_ = 0.0, last_time_ = 0.0;
  std::int64_t steps_ = 0;
  std::int64_t bad_readings_ = 0;
  bool started_ = false;
};

}  // namespace dra::energy
