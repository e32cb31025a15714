#pragma once
// What the compiled elastic tests share: a free loopback port, a process's launch_info for a
// store the test owns, and the options of a healthy world (generous timeouts). Used by
// test_controller.cpp and test_backend_outside.cpp.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "dra/torch/elastic/controller.hpp"

namespace dra_test {

// A port nothing listens on at the moment (the OS picks it; the caller binds it right after).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Process `uid` of a job of `universe` processes whose store is at 127.0.0.1:port (`host`: this
// process hosts it; `join`: a late joiner).
inline dra::elastic::launch_info launch(int port, int uid, int universe, const std::string& job, bool host = false,
                                        bool join = false) {
  dra::elastic::launch_info l;
  l.store_host = "127.0.0.1";
  l.store_port = port;
  l.host_store = host;
  l.join = join;
  l.uid = uid;
  l.universe_size = universe;
  l.job_prefix = "dra/test-" + job + "/0";
  return l;
}

// Healthy worlds get generous timeouts: on a loaded 2-core machine a thread can stall for
// seconds, and a collective timeout there would be a spurious "fault". Failure paths under test
// are bounded by the store timeout.
inline dra::elastic::controller_options healthy_options(const std::string& backend = "gloo") {
  dra::elastic::controller_options o;
  o.fault_timeout_s = 8.0;
  o.store_timeout_s = 10.0;
  o.engine.decide_every = 1000000;  // only the schedule resizes: the test knows when
  o.verify = true;
  o.backend = backend;
  o.backend_address = "127.0.0.1";
  o.chunk_mb = 1024.0 / 1048576.0;  // 1 KiB: several chunks even for a tiny model
  return o;
}

}  // namespace dra_test
