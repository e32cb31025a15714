#pragma once
// The energy readers that touch the machine, compiled in src/energy (library dra::energy, no
// torch): NVML's cumulative GPU energy counter (libnvidia-ml loaded at run time with dlopen, never a
// link-time dependency), RAPL from /sys/class/powercap, and the process's CPU clock for the model.
// `detect_energy_reader` picks the best one that works here and says why the others were not used.
#include <memory>
#include <string>
#include <vector>

#include "dra/energy/energy.hpp"

namespace dra::energy {

/// Busy CPU seconds of this process (all threads) plus its waited-for children.
double process_cpu_seconds();

/// Intel/AMD RAPL package counters under `<root>/intel-rapl:N/` (energy_uj, max_energy_range_uj,
/// name). Only top-level zones are summed (sub-zones such as core/dram are inside their package);
/// a "psys" zone is used alone when present, since it covers the packages too.
class rapl_reader final : public energy_reader {
 public:
  /// Throws dra::error naming the file and the fix when no zone can be read (absent powercap,
  /// permission denied: since Linux 5.10 energy_uj is readable by root only).
  explicit rapl_reader(std::string root = "/sys/class/powercap");
  std::string name() const override { return "rapl"; }
  energy_source source() const noexcept override { return energy_source::measured; }
  std::string scope() const override;
  double read_joules() override;
  /// Counter wraps seen so far, over all zones.
  std::uint64_t wraps() const;

 private:
  struct zone {
    std::string path, label;
    counter_unwrapper counter;
  };
  std::vector<zone> zones_;
};

/// NVML's nvmlDeviceGetTotalEnergyConsumption (millijoules since the driver loaded, Volta and later).
/// Reads only: never sets a power limit, clocks or modes.
class nvml_reader final : public energy_reader {
 public:
  /// library: the NVML shared library to dlopen (default libnvidia-ml.so.1); devices: NVML indices
  /// (empty: every device). Throws dra::error naming what failed (library absent, no device, energy
  /// counter not supported).
  explicit nvml_reader(std::string library = "libnvidia-ml.so.1", std::vector<int> devices = {});
  ~nvml_reader() override;
  nvml_reader(const nvml_reader&) = delete;
  nvml_reader& operator=(const nvml_reader&) = delete;
  std::string name() const override { return "nvml"; }
  energy_source source() const noexcept override { return energy_source::measured; }
  std::string scope() const override;
  double read_joules() override;

 private:
  struct api;
  std::unique_ptr<api> api_;
  std::vector<void*> handles_;
  std::vector<int> indices_;
  std::vector<counter_unwrapper> counters_;
};

struct detect_options {
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string rapl_root = "/sys/class/powercap";
  cpu_model_config model;
  bool try_nvml = true;
  bool try_rapl = true;
};

struct detected_reader {
  std::unique_ptr<energy_reader> reader;
  /// Why each better reader was not used ("nvml: libnvidia-ml.so.1 not found", ...).
  std::vector<std::string> notes;
};

/// NVML when a GPU's counter can be read, else RAPL, else the CPU model (estimated). Never throws
/// for an absent counter: that is what the fallback is for.
detected_reader detect_energy_reader(const detect_options& options = {});

}  // namespace dra::energy
