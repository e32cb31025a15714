// Two small helpers the controller's translation units share (controller.cpp, world.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace dra::elastic::detail {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

inline bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace dra::elastic::detail
