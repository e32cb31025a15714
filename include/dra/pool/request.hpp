#pragma once
// What a workload asks the pool for (docs/design/pool.md): a device type, memory per device, a whole
// device or a fraction of one per worker, a priority, a minimum and a maximum number of
// workers, elastic or rigid, all-at-once (gang) or not. validate() checks a request against the
// pool's inventory and names the field and the fix; nothing is allocated for a bad request.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/pool/inventory.hpp"

namespace dra::pool {

/// Named priority classes, lowest first. A higher class is scheduled first and may shrink
/// elastic jobs of a lower class in place.
inline const std::vector<std::string>& priority_names() {
  static const std::vector<std::string> names{"low", "normal", "high", "critical"};
  return names;
}

/// 0 (low) .. 3 (critical); throws naming the accepted names.
inline int priority_level(const std::string& name) {
  const auto& n = priority_names();
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end())
    dra::detail::throw_invalid("priority", "unknown priority '" + name + "'; use one of low, normal, high, critical");
  return static_cast<int>(it - n.begin());
}

/// The least share of a device a worker may ask for: the finest share any enforcement holds (a
/// GPU fraction's MPS thread percentage is a whole percent). A smaller one also lets a request ask
/// for more workers than any scheduling round can place (1e-9 of each of 4 devices: 4e9 slots).
inline constexpr double min_fraction = 0.01;
/// The most workers one request may ask for.
inline constexpr int max_workers = 1000000;

inline const std::vector<std::string>& workload_kinds() {
  static const std::vector<std::string> kinds{"training", "inference"};
  return kinds;
}

struct request {
  std::string job;                  ///< the job's name, unique in the pool while it lives
  std::string kind = "training";    ///< "training" (data-parallel workers) or "inference" (replicas)
  std::string device_type = "any";  ///< a type from the inventory, or "any"
  double memory_gb = 0.0;           ///< memory each worker needs on its device (0: no requirement)
  double fraction = 1.0;            ///< share of one device per worker, in [min_fraction, 1]
  int min_size = 1;                 ///< workers the job needs to run at all
  int max_size = 1;                 ///< workers it can use
  std::string priority = "normal";  ///< low | normal | high | critical
  bool elastic = true;              ///< may run at any size in [min_size, max_size], resized in place
  bool gang = true;                 ///< the first min_size workers are granted together or not at all

  int priority_level() const { return dra::pool::priority_level(priority); }

  /// Throws std::invalid_argument naming the field and the fix; checks against the pool's devices.
  void validate(const inventory& inv) const {
    using dra::detail::throw_invalid;
    if (job.empty()) throw_invalid("job", "a request needs a job name");
    if (job.find_first_of(" /\t\n") != std::string::npos)
      throw_invalid("job", "'" + job + "' must not contain spaces or '/'; use letters, digits, '-', '_' or '.'");
    const auto& k = workload_kinds();
    if (std::find(k.begin(), k.end(), kind) == k.end())
      throw_invalid("kind", "unknown kind '" + kind + "'; use training or inference");
    if (device_type != "any" && !inv.has_type(device_type)) {
      std::string have;
      for (const auto& t : inv.types()) have += (have.empty() ? "" : ", ") + t;
      throw_invalid("device_type", "unknown device type '" + device_type + "'; the pool has: " +
                                       (have.empty() ? "no devices" : have) + " (or ask for 'any')");
    }
    if (!(memory_gb >= 0.0) || !std::isfinite(memory_gb))
      throw_invalid("memory_gb", "must be a finite number >= 0, got " + shown(memory_gb));
    const double most = inv.max_memory_gb(device_type);
    if (memory_gb > most + 1e-9)
      throw_invalid("memory_gb", shown(memory_gb) + " GB is more than any " +
                                     (device_type == "any" ? std::string() : "'" + device_type + "' ") +
                                     "device has (largest: " + shown(most) + " GB); ask for at most that");
    if (!(fraction >= min_fraction && fraction <= 1.0))
      throw_invalid("fraction", "must lie in [0.01, 1], got " + shown(fraction) +
                                    " (0.01 is the finest share any lease is held to); for more than one device "
                                    "ask for more workers (min_size/max_size)");
    if (min_size < 1) throw_invalid("min_size", "must be >= 1, got " + std::to_string(min_size));
    if (max_size > max_workers)
      throw_invalid("max_size", "must be <= " + std::to_string(max_workers) + ", got " + std::to_string(max_size) +
                                    "; ask for at most the workers the job can use");
    if (min_size > max_size)
      throw_invalid("min_size", "min_size " + std::to_string(min_size) + " > max_size " + std::to_string(max_size) +
                                    "; make min_size <= max_size");
    if (!elastic && min_size != max_size)
      throw_invalid("max_size", "a rigid request (elastic=false) has one size, got min_size " +
                                    std::to_string(min_size) + " and max_size " + std::to_string(max_size) +
                                    "; set them equal or make the request elastic");
    (void)priority_level();
    // In double: a tiny fraction makes room for more workers than an int holds.
    const double slots = std::floor(max_slots(inv) + 1e-9);
    if (static_cast<double>(min_size) > slots)
      throw_invalid("min_size", std::to_string(min_size) + " workers of fraction " + shown(fraction) +
                                    " can never fit: the pool has room for " +
                                    std::to_string(static_cast<long long>(slots)) + " such workers; lower min_size");
  }

  /// A fraction as a user wrote it (std::to_string shows 1e-9 as 0.000000).
  static std::string shown(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }

  /// Whether a device is suitable for one of this request's workers (type and memory).
  bool suits(const device& d) const {
    return (device_type == "any" || d.type == device_type) && d.memory_gb + 1e-9 >= memory_gb;
  }

  /// Workers of this request the whole inventory could hold if it were empty.
  double max_slots(const inventory& inv) const {
    double n = 0.0;
    for (const auto& d : inv.devices())
      if (suits(d)) n += std::floor(1.0 / fraction + 1e-9);
    return n;
  }
};

}  // namespace dra::pool
