// Whether this process is out of file descriptors: a communicator it builds (Gloo's or NCCL's
// sockets) then fails with whatever its library makes of EMFILE ("Cannot resolve 127.0.0.1 to a
// (local) address", a connect error), and no retry can succeed until the limit is raised.
#pragma once

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

namespace dra::detail {

/// A sentence naming the limit when no socket can be opened now (EMFILE: this process's
/// RLIMIT_NOFILE; ENFILE: the system's table), or nullopt when one can.
inline std::optional<std::string> out_of_descriptors() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    ::close(fd);
    return std::nullopt;
  }
  const int err = errno;
  if (err == ENFILE)
    return std::string("the system's file table is full (ENFILE: ") + std::strerror(err) +
           "): no process can open another file; raise fs.file-max or close files";
  if (err != EMFILE) return std::nullopt;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  return "this process cannot open another file descriptor (EMFILE: its open-files limit RLIMIT_NOFILE is " +
         text(lim.rlim_cur) + ", hard limit " + text(lim.rlim_max) +
         "); raise it (`ulimit -n`, a service's LimitNOFILE) or close files: every world it enters opens sockets to "
         "its peers";
}

}  // namespace dra::detail
