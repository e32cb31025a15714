// The CPU-seconds clock behind the estimated energy model, and the reader detection order.
#include <sys/resource.h>
#include <time.h>

#include "dra/energy/readers.hpp"

namespace dra::energy {

double process_cpu_seconds() {
  timespec ts{};
  double self = 0.0;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0)
    self = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  rusage children{};
  double waited = 0.0;
  if (getrusage(RUSAGE_CHILDREN, &children) == 0) {
    waited = static_cast<double>(children.ru_utime.tv_sec + children.ru_stime.tv_sec) +
             1e-6 * static_cast<double>(children.ru_utime.tv_usec + children.ru_stime.tv_usec);
  }
  return self + waited;
}

detected_reader detect_energy_reader(const detect_options& options) {
  options.model.validate();
  detected_reader out;
  // Each counter in order of preference; a failure is recorded in notes and the next one is tried.
  auto attempt = [&](bool enabled, const char* name, auto make) {
    if (!enabled) {
      out.notes.push_back(std::string(name) + ": not tried (disabled)");
      return false;
    }
    try {
      out.reader = make();
      return true;
    } catch (const dra::error& e) {
      out.notes.push_back(std::string(name) + ": " + e.what());
      return false;
    }
  };
  if (attempt(options.try_nvml, "nvml", [&] { return std::make_unique<nvml_reader>(options.nvml_library); }))
    return out;
  if (attempt(options.try_rapl, "rapl", [&] { return std::make_unique<rapl_reader>(options.rapl_root); })) return out;
  out.reader = std::make_unique<cpu_model_reader>(&process_cpu_seconds, options.model);
  return out;
}

}  // namespace dra::energy
