// What the simulator's tests share: the Pollux data the project ships (its profiles loaded once)
// and writing a small file for a test.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "dra/sim/simulator.hpp"

namespace sim_test {

/// data/pollux of the repository (DRA_SOURCE_DIR: its root, set by tests/cpp/CMakeLists.txt).
inline std::filesystem::path data_dir() {
  return std::filesystem::path(DRA_SOURCE_DIR) / "data" / "pollux";
}

/// The shipped profiles, loaded once per test binary.
inline const dra::sim::profile_library& shipped() {
  static const dra::sim::profile_library lib = dra::sim::profile_library::load((data_dir() / "traces").string());
  return lib;
}

inline void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

}  // namespace sim_test
