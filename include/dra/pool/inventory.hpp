#pragma once
// The devices a pool hands out (docs/design/pool.md): GPUs found through NVML, device slots made of
// CPU cores (a cgroup with a hard CPU quota, a CPU set and a memory limit), or devices declared
// in a file. The core only holds the description; discovery (NVML, cgroups, Ray's resources)
// lives in the Python service, which fills an inventory through these types.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "dra/error.hpp"

namespace dra::pool {

/// How a lease on a device is enforced. "soft" means the pool tells the worker what it may use
/// (an environment variable, a memory fraction it is asked to respect) but cannot stop it.
inline const std::vector<std::string>& enforcement_names() {
  static const std::vector<std::string> names{"cgroup", "cuda_visible_devices", "mps", "soft"};
  return names;
}

struct device {
  std::string id;              ///< unique in the pool: "slot0", "gpu0", "gpu0/mig-1g.10gb/0", "node2/gpu1"
  std::string type;            ///< what requests name: "cpu-slot", "nvidia-h100-80gb", ...
  std::string node = "local";  ///< the machine it sits on
  int group = 0;               ///< locality island inside the node (NVLink island, CPU socket); same group = close
  double memory_gb = 0.0;      ///< memory the device has (a slot: its cgroup memory limit)
  double compute = 1.0;        ///< relative compute (a slot: CPU cores of quota; a GPU: 1)
  std::string enforcement = "soft";

  void validate() const {
    if (id.empty()) dra::detail::throw_invalid("id", "a device needs a non-empty id");
    if (type.empty()) dra::detail::throw_invalid("type", "device '" + id + "' needs a type (e.g. 'cpu-slot')");
    if (node.empty()) dra::detail::throw_invalid("node", "device '" + id + "' needs a node name");
    if (!(memory_gb >= 0.0) || !std::isfinite(memory_gb))
      dra::detail::throw_invalid(
          "memory_gb", "device '" + id + "' must have a finite memory >= 0, got " + std::to_string(memory_gb));
    if (!(compute > 0.0) || !std::isfinite(compute))
      dra::detail::throw_invalid("compute",
                                 "device '" + id + "' must have compute > 0, got " + std::to_string(compute));
    const auto& e = enforcement_names();
    if (std::find(e.begin(), e.end(), enforcement) == e.end())
      dra::detail::throw_invalid("enforcement", "device '" + id + "': unknown '" + enforcement +
                                                    "'; use cgroup, cuda_visible_devices, mps or soft");
  }
};

/// The pool's devices, in a fixed order (the order is the tie-breaker of every placement).
class inventory {
 public:
  inventory() = default;
  explicit inventory(std::vector<device> devices) {
    for (auto& d : devices) add(std::move(d));
  }

  /// Adds a device; a duplicate id or a bad field throws and leaves the inventory unchanged.
  void add(device d) {
    d.validate();
    if (index_.count(d.id)) dra::detail::throw_invalid("id", "device '" + d.id + "' is already in the inventory");
    index_.emplace(d.id, devices_.size());
    devices_.push_back(std::move(d));
  }

  /// Removes every device of a node (a node that left the cluster); returns their ids.
  std::vector<std::string> remove_node(const std::string& node) {
    std::vector<std::string> gone;
    std::vector<device> kept;
    for (auto& d : devices_) (d.node == node ? gone.push_back(d.id) : kept.push_back(std::move(d)));
    devices_ = std::move(kept);
    index_.clear();
    for (std::size_t i = 0; i < devices_.size(); ++i) index_.emplace(devices_[i].id, i);
    return gone;
  }

  const std::vector<device>& devices() const noexcept { return devices_; }
  std::size_t size() const noexcept { return devices_.size(); }
  bool empty() const noexcept { return devices_.empty(); }
  bool contains(const std::string& id) const { return index_.count(id) > 0; }

  const device& at(const std::string& id) const {
    const auto it = index_.find(id);
    if (it == index_.end()) dra::detail::throw_invalid("device", "no device '" + id + "' in the inventory");
    return devices_[it->second];
  }
  std::size_t index_of(const std::string& id) const {
    const auto it = index_.find(id);
    if (it == index_.end()) dra::detail::throw_invalid("device", "no device '" + id + "' in the inventory");
    return it->second;
  }

  /// Device types present, sorted.
  std::vector<std::string> types() const {
    std::vector<std::string> t;
    for (const auto& d : devices_) t.push_back(d.type);
    std::sort(t.begin(), t.end());
    t.erase(std::unique(t.begin(), t.end()), t.end());
    return t;
  }

  bool has_type(const std::string& type) const {
    return std::any_of(devices_.begin(), devices_.end(), [&](const device& d) { return d.type == type; });
  }

  /// Largest memory of a device of this type ("any": of any type); 0 when there is none.
  double max_memory_gb(const std::string& type) const {
    double m = 0.0;
    for (const auto& d : devices_)
      if (type == "any" || d.type == type) m = std::max(m, d.memory_gb);
    return m;
  }

  /// Devices per node, in first-seen order of nodes.
  std::map<std::string, int> devices_per_node() const {
    std::map<std::string, int> n;
    for (const auto& d : devices_) ++n[d.node];
    return n;
  }

 private:
  std::vector<device> devices_;
  std::map<std::string, std::size_t> index_;
};

}  // namespace dra::pool
