// Small helpers the controller's translation units share (controller.cpp, world.cpp, options).
#pragma once

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

namespace dra::elastic::detail {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// A number as %g prints it (option values and checks in messages).
inline std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// A peer that died or was declared dead closes its sockets; a write to one (Gloo, the store) must
// fail with EPIPE, which the controller handles, not kill the process with SIGPIPE. Python ignores
// SIGPIPE already; a C++ trainer usually does not. A handler the program installed is left alone.
inline void ignore_default_sigpipe() {
#ifndef _WIN32
  struct sigaction current{};
  if (sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  if ((current.sa_flags & SA_SIGINFO) != 0) return;  // a sa_sigaction handler
  struct sigaction ignore{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
#endif
}

}  // namespace dra::elastic::detail
