// NVML's total-energy counter, with libnvidia-ml loaded at run time (dlopen), the way src/comm/nccl
// loads NCCL: dra never links NVML, and a machine without a GPU driver simply has no such reader.
// Only query functions are resolved: dra never changes a device's power limit, clocks or modes.
#include <dlfcn.h>

#include <string>

#include "dra/energy/readers.hpp"
#include "dra/error.hpp"

namespace dra::energy {

struct nvml_reader::api {
  // Declared here (no nvml.h needed): the ABI of these entry points is fixed by NVML.
  using init_fn = int (*)();
  using shutdown_fn = int (*)();
  using count_fn = int (*)(unsigned int*);
  using handle_fn = int (*)(unsigned int, void**);
  using energy_fn = int (*)(void*, unsigned long long*);
  using error_string_fn = const char* (*)(int);

  void* lib = nullptr;
  bool initialised = false;
  init_fn init = nullptr;
  shutdown_fn shutdown = nullptr;
  count_fn count = nullptr;
  handle_fn handle = nullptr;
  energy_fn energy = nullptr;
  error_string_fn error_string = nullptr;

  std::string describe(int rc) const {
    const char* s = error_string ? error_string(rc) : nullptr;
    return s ? std::string(s) + " (" + std::to_string(rc) + ")" : "NVML error " + std::to_string(rc);
  }
  ~api() {
    if (initialised && shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

namespace {
template <class Fn>
Fn resolve(void* lib, const char* name, const std::string& library) {
  void* sym = dlsym(lib, name);
  if (!sym) throw dra::error("NVML: " + library + " has no " + name + " (driver too old?)");
  return reinterpret_cast<Fn>(sym);
}
}  // namespace

nvml_reader::nvml_reader(std::string library, std::vector<int> devices) : api_(std::make_unique<api>()) {
  api_->lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api_->lib) {
    const char* err = dlerror();
    throw dra::error("NVML: cannot load " + library + " (" + (err ? err : "unknown") + "); no NVIDIA driver here");
  }
  api_->init = resolve<api::init_fn>(api_->lib, "nvmlInit_v2", library);
  api_->shutdown = resolve<api::shutdown_fn>(api_->lib, "nvmlShutdown", library);
  api_->count = resolve<api::count_fn>(api_->lib, "nvmlDeviceGetCount_v2", library);
  api_->handle = resolve<api::handle_fn>(api_->lib, "nvmlDeviceGetHandleByIndex_v2", library);
  api_->energy = resolve<api::energy_fn>(api_->lib, "nvmlDeviceGetTotalEnergyConsumption", library);
  api_->error_string = reinterpret_cast<api::error_string_fn>(dlsym(api_->lib, "nvmlErrorString"));

  if (int rc = api_->init(); rc != 0) throw dra::error("NVML: nvmlInit failed: " + api_->describe(rc));
  api_->initialised = true;
  unsigned int count = 0;
  if (int rc = api_->count(&count); rc != 0) throw dra::error("NVML: nvmlDeviceGetCount failed: " + api_->describe(rc));
  if (count == 0) throw dra::error("NVML: no GPU visible to the driver");
  if (devices.empty())
    for (unsigned int i = 0; i < count; ++i) devices.push_back(static_cast<int>(i));
  for (int index : devices) {
    if (index < 0 || static_cast<unsigned int>(index) >= count)
      dra::detail::throw_invalid("devices", "NVML index " + std::to_string(index) + " out of range [0, " +
                                                std::to_string(count) + "); pass indices the driver lists");
    void* h = nullptr;
    if (int rc = api_->handle(static_cast<unsigned int>(index), &h); rc != 0)
      throw dra::error("NVML: no handle for device " + std::to_string(index) + ": " + api_->describe(rc));
    unsigned long long mj = 0;
    if (int rc = api_->energy(h, &mj); rc != 0)
      throw dra::error("NVML: device " + std::to_string(index) + " cannot report total energy: " + api_->describe(rc) +
                       " (needs a Volta or newer GPU)");
    handles_.push_back(h);
    indices_.push_back(index);
    counters_.emplace_back(0);
    counters_.back().update(mj);
  }
}

nvml_reader::~nvml_reader() = default;

std::string nvml_reader::scope() const {
  std::string out;
  for (int i : indices_) out += (out.empty() ? "" : ",") + std::to_string(i);
  return "NVML GPU " + out;
}

double nvml_reader::read_joules() {
  std::uint64_t total_mj = 0;
  for (std::size_t i = 0; i < handles_.size(); ++i) {
    unsigned long long mj = 0;
    if (int rc = api_->energy(handles_[i], &mj); rc != 0)
      throw dra::error("NVML: reading device " + std::to_string(indices_[i]) + " failed: " + api_->describe(rc));
    total_mj += counters_[i].update(mj);
  }
  return 1e-3 * static_cast<double>(total_mj);
}

}  // namespace dra::energy
