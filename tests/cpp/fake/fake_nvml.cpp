// A stand-in for libnvidia-ml with the five entry points dra's NVML reader resolves, so the dlopen
// path, the device loop and the error handling run on a machine without a GPU. The test drives it
// through fake_nvml_set(): device count, per-device energy (mJ), and the code the energy query
// returns (3 = NVML_ERROR_NOT_SUPPORTED, as on pre-Volta GPUs).
#include <cstring>

namespace {
unsigned int g_devices = 2;
unsigned long long g_energy_mj[8] = {};
int g_energy_rc = 0;
int g_inits = 0;
struct device_tag {
  unsigned int index;
} g_tags[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
}  // namespace

extern "C" {
void fake_nvml_set(unsigned int devices, int energy_rc) {
  g_devices = devices;
  g_energy_rc = energy_rc;
}
void fake_nvml_set_energy_mj(unsigned int index, unsigned long long mj) {
  if (index < 8) g_energy_mj[index] = mj;
}
int fake_nvml_inits() {
  return g_inits;
}

int nvmlInit_v2() {
  ++g_inits;
  return 0;
}
int nvmlShutdown() {
  --g_inits;
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = g_devices;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= g_devices || index >= 8) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &g_tags[index];
  return 0;
}
int nvmlDeviceGetTotalEnergyConsumption(void* device, unsigned long long* mj) {
  if (g_energy_rc != 0) return g_energy_rc;
  *mj = g_energy_mj[static_cast<device_tag*>(device)->index];
  return 0;
}
const char* nvmlErrorString(int rc) {
  return rc == 3 ? "Not Supported" : "Unknown Error";
}
}
