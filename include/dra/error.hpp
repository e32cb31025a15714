#pragma once
// Exceptions thrown by dra. Bad user input is std::invalid_argument (Python: ValueError);
// runtime failures derive from dra::error so callers can catch all of dra's own failures at once.
#include <cstdio>
#include <stdexcept>
#include <string>

namespace dra {

/// Base of every runtime failure raised by dra itself.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A communicator could not be built, used or torn down (Gloo, NCCL).
class comm_error : public error {
 public:
  using error::error;
};

/// Membership could not be agreed: store unreachable, a peer vanished, epochs disagree.
class membership_error : public error {
 public:
  using error::error;
};

/// A bounded wait ran out (store, peer, communicator init). Python sees TimeoutError.
class timeout_error : public error {
 public:
  using error::error;
};

/// State offered by a joiner or read from a checkpoint does not match the world's.
class state_mismatch_error : public error {
 public:
  using error::error;
};

namespace detail {
/// Destructors must not throw: failures there are logged, never raised.
inline void log_check(bool ok, const char* what) noexcept {
  if (!ok) std::fprintf(stderr, "[dra] check failed (ignored in destructor): %s\n", what);
}

[[noreturn]] inline void throw_invalid(const std::string& field, const std::string& problem) {
  throw std::invalid_argument(field + ": " + problem);
}
}  // namespace detail

}  // namespace dra
