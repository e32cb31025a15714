// RAPL energy counters from the powercap sysfs tree. Each top-level zone exposes energy_uj, a
// microjoule counter that wraps at max_energy_range_uj; the zones are read, unwrapped and summed.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dra/energy/readers.hpp"
#include "dra/error.hpp"

namespace dra::energy {
namespace {
namespace fs = std::filesystem;

// Reads one unsigned integer file; on failure fills `why` with the file, errno text and the fix.
bool read_u64(const std::string& path, std::uint64_t& value, std::string& why) {
  errno = 0;
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    why = path + ": " + (err ? std::strerror(err) : "cannot open");
    if (err == EACCES || err == EPERM)
      why +=
          " (since Linux 5.10 energy_uj is readable by root only: run as root, or grant read access, "
          "e.g. chmod o+r on the energy_uj files)";
    return false;
  }
  unsigned long long v = 0;
  if (!(in >> v)) {
    why = path + ": not an unsigned integer";
    return false;
  }
  value = v;
  return true;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

rapl_reader::rapl_reader(std::string root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw dra::error(
        "RAPL: " + root +
        " is not a directory (no powercap support on this machine; energy falls back to the estimated model)");
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string n = entry.path().filename().string();
    // Top-level zones only: intel-rapl:N (a sub-zone is intel-rapl:N:M and is part of its package).
    if (n.rfind("intel-rapl:", 0) == 0 && std::count(n.begin(), n.end(), ':') == 1)
      dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  if (dirs.empty())
    throw dra::error("RAPL: no intel-rapl:N zone under " + root +
                     " (RAPL absent; energy falls back to the estimated model)");

  std::vector<zone> packages, psys;
  std::string problems;
  for (const auto& d : dirs) {
    std::uint64_t raw = 0, range = 0;
    std::string why;
    if (!read_u64(d + "/energy_uj", raw, why)) {
      problems += (problems.empty() ? "" : "; ") + why;
      continue;
    }
    if (!read_u64(d + "/max_energy_range_uj", range, why)) range = 0;  // unknown range: no wrap handling
    zone z{d + "/energy_uj", read_line(d + "/name"), counter_unwrapper(range)};
    if (z.label.empty()) z.label = fs::path(d).filename().string();
    z.counter.update(raw);
    (z.label == "psys" ? psys : packages).push_back(std::move(z));
  }
  zones_ = psys.empty() ? std::move(packages) : std::move(psys);
  if (zones_.empty()) throw dra::error("RAPL: no readable zone: " + problems);
}

std::string rapl_reader::scope() const {
  std::string out;
  for (const auto& z : zones_) out += (out.empty() ? "" : ", ") + z.label;
  return "RAPL " + out;
}

double rapl_reader::read_joules() {
  std::uint64_t total_uj = 0;
  for (auto& z : zones_) {
    std::uint64_t raw = 0;
    std::string why;
    if (!read_u64(z.path, raw, why)) throw dra::error("RAPL: " + why);
    total_uj += z.counter.update(raw);
  }
  return 1e-6 * static_cast<double>(total_uj);
}

std::uint64_t rapl_reader::wraps() const {
  std::uint64_t w = 0;
  for (const auto& z : zones_) w += z.counter.wraps();
  return w;
}

}  // namespace dra::energy
