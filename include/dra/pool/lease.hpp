#pragma once
// Leases: what the pool has handed out (docs/design/pool.md). A lease gives one worker of one job a
// share of one device until it is released: by the job (it shrank or ended), by the pool (a
// preemption the job carried out), or because its worker stopped sending heartbeats. The book is
// plain bookkeeping with ids that never repeat; the service persists it (SQLite) and restores it
// with restore(), so a restarted pool keeps every lease.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/pool/inventory.hpp"

namespace dra::pool {

enum class lease_state { active, releasing };

inline const char* to_string(lease_state s) noexcept {
  return s == lease_state::active ? "active" : "releasing";
}

struct lease {
  std::int64_t id = 0;
  std::string job;
  std::string device;       ///< device id
  double share = 1.0;       ///< fraction of the device
  double granted_at = 0.0;  ///< pool clock (seconds)
  double heartbeat_at = 0.0;
  lease_state state = lease_state::active;  ///< releasing: the pool asked the job to give it back
};

class lease_book {
 public:
  /// Grants a lease; throws (and changes nothing) when the device has less than `share` free.
  const lease& grant(const inventory& inv, const std::string& job, const std::string& device_id, double share,
                     double now) {
    if (!inv.contains(device_id)) dra::detail::throw_invalid("device", "no device '" + device_id + "' in the pool");
    if (!(share > 0.0 && share <= 1.0))
      dra::detail::throw_invalid("share", "must lie in (0, 1], got " + std::to_string(share));
    if (free_share(device_id) + 1e-9 < share)
      dra::detail::throw_invalid("device", "device '" + device_id + "' has " + std::to_string(free_share(device_id)) +
                                               " free, less than the " + std::to_string(share) + " asked for");
    lease l;
    l.id = next_id_++;
    l.job = job, l.device = device_id, l.share = share, l.granted_at = now, l.heartbeat_at = now;
    return leases_.emplace(l.id, l).first->second;
  }

  /// Puts back a lease read from durable state (its id is kept; later ids continue above it).
  void restore(const lease& l) {
    if (l.id <= 0) dra::detail::throw_invalid("id", "a restored lease needs an id > 0");
    // Ids never repeat: the largest id would have wrapped the next one (signed overflow).
    if (l.id == std::numeric_limits<std::int64_t>::max())
      dra::detail::throw_invalid("id",
                                 "lease id " + std::to_string(l.id) + " leaves no id after it; the state is corrupt");
    if (!(l.share > 0.0 && l.share <= 1.0))
      dra::detail::throw_invalid(
          "share", "lease " + std::to_string(l.id) + ": a share must lie in (0, 1], got " + std::to_string(l.share));
    if (leases_.count(l.id)) dra::detail::throw_invalid("id", "lease " + std::to_string(l.id) + " exists already");
    leases_.emplace(l.id, l);
    next_id_ = std::max(next_id_, l.id + 1);
  }

  /// Removes a lease; returns it. Unknown ids throw.
  lease release(std::int64_t id) {
    const auto it = find(id);
    lease l = it->second;
    leases_.erase(it);
    return l;
  }

  void mark_releasing(std::int64_t id) { find(id)->second.state = lease_state::releasing; }
  void heartbeat(std::int64_t id, double now) { find(id)->second.heartbeat_at = now; }
  bool contains(std::int64_t id) const { return leases_.count(id) > 0; }
  const lease& at(std::int64_t id) const { return const_cast<lease_book*>(this)->find(id)->second; }

  /// Leases whose last heartbeat is older than `timeout_s` (their workers are presumed dead).
  std::vector<std::int64_t> expired(double now, double timeout_s) const {
    std::vector<std::int64_t> out;
    for (const auto& [id, l] : leases_)
      if (now - l.heartbeat_at > timeout_s) out.push_back(id);
    return out;
  }

  /// Share of a device not covered by any lease (releasing ones still count as held).
  double free_share(const std::string& device_id) const {
    double held = 0.0;
    for (const auto& [id, l] : leases_)
      if (l.device == device_id) held += l.share;
    return std::max(0.0, 1.0 - held);
  }

  std::vector<lease> of_job(const std::string& job) const {
    std::vector<lease> out;
    for (const auto& [id, l] : leases_)
      if (l.job == job) out.push_back(l);
    return out;
  }
  int count(const std::string& job, bool include_releasing = true) const {
    int n = 0;
    for (const auto& [id, l] : leases_)
      if (l.job == job && (include_releasing || l.state == lease_state::active)) ++n;
    return n;
  }

  /// Every lease, by id.
  std::vector<lease> all() const {
    std::vector<lease> out;
    out.reserve(leases_.size());
    for (const auto& [id, l] : leases_) out.push_back(l);
    return out;
  }
  std::size_t size() const noexcept { return leases_.size(); }
  std::int64_t next_id() const noexcept { return next_id_; }
  void set_next_id(std::int64_t id) { next_id_ = std::max(next_id_, id); }

 private:
  std::map<std::int64_t, lease>::iterator find(std::int64_t id) {
    const auto it = leases_.find(id);
    if (it == leases_.end()) dra::detail::throw_invalid("lease", "no lease " + std::to_string(id) + " in the pool");
    return it;
  }

  std::map<std::int64_t, lease> leases_;
  std::int64_t next_id_ = 1;
};

}  // namespace dra::pool
