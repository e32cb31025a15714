#include "event_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace dra::elastic::detail {

using json = nlohmann::json;

const char* to_string(change_cause c) noexcept {
  switch (c) {
    case change_cause::start:
      return "start";
    case change_cause::admit:
      return "admit";
    case change_cause::resize:
      return "resize";
    case change_cause::fault:
      return "fault";
  }
  return "?";
}

namespace {
json optional_json(double v, bool present) {
  return present ? json(v) : json(nullptr);
}
void add_figures(json& ev, const job_figures& f) {
  ev["energy_step_j"] = optional_json(f.energy_step_j, !std::isnan(f.energy_step_j));
  ev["energy_job_j"] = optional_json(f.energy_job_j, !std::isnan(f.energy_job_j));
  ev["energy_source"] = f.energy_source.empty() ? json(nullptr) : json(f.energy_source);
  if (f.compress.empty()) return;
  ev["compress"] = {{"codec", f.compress},
                    {"bytes_sent", f.bytes_sent},
                    {"bytes_dense", f.bytes_dense},
                    {"ratio", optional_json(static_cast<double>(f.bytes_dense) / static_cast<double>(f.bytes_sent),
                                            f.bytes_sent > 0)}};
}
}  // namespace

void event_log::world(const world_event& e) {
  const auto& c = e.change;
  const double total = c.agree_s + e.rebuild_s + e.transfer_s + e.reshard_s;
  json ev = {
      {"event", to_string(c.cause)},
      {"step", e.step},
      {"epoch", c.epoch},
      {"data_epoch", e.data_epoch},
      {"before", c.before},
      {"after", e.after},
      {"members", c.members},
      {"left", c.left},
      {"joined", c.joined},
      {"reason", c.reason},
      {"decided_step", c.decided_step >= 0 ? json(c.decided_step) : json(nullptr)},
      {"cost_s",
       {{"agree", c.agree_s}, {"rebuild", e.rebuild_s}, {"state_transfer", e.transfer_s}, {"reshard", e.reshard_s}}},
      {"total_s", total},
      {"state_bytes", e.state_bytes},
      {"state_skipped_bytes", e.skipped_bytes},
      {"state_deferred_bytes", e.deferred_bytes},
      {"state_gbps",
       optional_json(static_cast<double>(e.state_bytes) / e.transfer_s / 1e9, e.state_bytes > 0 && e.transfer_s > 0)},
      {"global_batch", e.global_batch},
      {"batch_mode", e.batch_mode},
      {"params_identical", e.params_identical ? json(*e.params_identical) : json(nullptr)},
      {"backend", e.backend},
  };
  if (!e.release.empty()) ev["release"] = e.release;
  add_figures(ev, e.figures);
  write(ev);
}

void event_log::print_summary(std::int64_t steps, int world, const job_figures& f) noexcept {
  char energy[128] = "";
  if (!std::isnan(f.energy_job_j))
    std::snprintf(energy, sizeof energy, " energy %.4g J (%s)", f.energy_job_j, f.energy_source.c_str());
  char codec[160] = "";
  if (!f.compress.empty())
    std::snprintf(codec, sizeof codec, " %s: %llu bytes sent for %llu dense", f.compress.c_str(),
                  static_cast<unsigned long long>(f.bytes_sent), static_cast<unsigned long long>(f.bytes_dense));
  std::printf("[dra] job finished at step %lld world %d%s%s\n", static_cast<long long>(steps), world, energy, codec);
  std::fflush(stdout);
}

void event_log::rejected(std::int64_t step, std::int64_t epoch, int uid, const std::string& reason) {
  json ev = {{"event", "rejected"}, {"step", step}, {"epoch", epoch}, {"uid", uid}, {"reason", reason}};
  write(ev);
}

void event_log::refused(std::int64_t step, std::int64_t epoch, const std::string& reason) {
  json ev = {{"event", "refused"}, {"step", step}, {"epoch", epoch}, {"reason", reason}};
  write(ev);
}

const std::string& event_log::last() const noexcept {
  static const std::string none;
  return lines_.empty() ? none : lines_.back();
}

template <class Json>
void event_log::write(Json& ev) {
  ev["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Text from peers or the store (a reason) may hold bytes that are not UTF-8: replaced, not thrown.
  if (lines_.size() >= 2 * kept_lines)  // the oldest half goes: at most 2 x kept_lines, amortised O(1)
    lines_.erase(lines_.begin(), lines_.end() - static_cast<std::ptrdiff_t>(kept_lines));
  lines_.push_back(ev.dump(-1, ' ', false, json::error_handler_t::replace));
  ++count_;
  const std::string& line = lines_.back();
  if (!path_.empty()) {
    if (append(line)) {
      if (unwritten_ > 0)
        std::fprintf(stderr, "[dra] events_path '%s' is writable again; %zu event(s) were not written to it\n",
                     path_.c_str(), unwritten_);
      unwritten_ = 0;
    } else {
      if (unwritten_ == 0)
        std::fprintf(stderr,
                     "[dra] cannot append to events_path '%s' (%s): events are kept in memory and on stderr, "
                     "training goes on (warned once)\n",
                     path_.c_str(), std::strerror(errno));
      ++unwritten_;
    }
  }
  std::fprintf(stderr, "[dra] %s\n", line.c_str());
  std::fflush(stderr);
}

bool event_log::append(const std::string& line) const noexcept {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  struct stat before{};
  const bool sized = ::fstat(fd, &before) == 0;
  const std::string record = line + "\n";
  std::size_t done = 0;
  int error = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (done < record.size() && done > 0 && sized) {
    // A partial line (a full disk took part of it): cut it back, so that readers never see half a
    // record. With O_APPEND the line went to the end of the file as it was before.
    if (::ftruncate(fd, before.st_size) != 0) {
      // Nothing more to do: the next whole line starts after the fragment.
    }
  }
  ::close(fd);
  if (done < record.size()) errno = error != 0 ? error : EIO;
  return done == record.size();
}

void status_line::restart() noexcept {
  since_ = std::chrono::steady_clock::now();
  samples_ = 0;
}

void status_line::maybe_print(std::int64_t steps, std::int64_t every, double loss, int world,
                              const job_figures& f) noexcept {
  if (every <= 0 || steps % every != 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - since_).count();
  char energy[96] = "";
  if (!std::isnan(f.energy_step_j))
    std::snprintf(energy, sizeof energy, " energy %.3g J/step (%.4g J total, %s)", f.energy_step_j, f.energy_job_j,
                  f.energy_source.c_str());
  char codec[96] = "";
  if (!f.compress.empty() && f.bytes_sent > 0)
    std::snprintf(codec, sizeof codec, " %s %.1fx fewer bytes", f.compress.c_str(),
                  static_cast<double>(f.bytes_dense) / static_cast<double>(f.bytes_sent));
  std::printf("[dra] step %lld loss %.4f world %d samples/s %.0f%s%s\n", static_cast<long long>(steps), loss, world,
              static_cast<double>(samples_) / std::max(dt, 1e-9), energy, codec);
  std::fflush(stdout);
  since_ = now;
  samples_ = 0;
}

}  // namespace dra::elastic::detail
