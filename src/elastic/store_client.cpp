#include "store_client.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "../comm/descriptors.hpp"
#include "dra/error.hpp"
#include "store_values.hpp"

namespace dra::elastic::detail {

namespace {

std::string first_line(const std::exception& e) {
  const std::string text = e.what();
  return text.substr(0, text.find('\n'));
}

// The connected TCP sockets of this process whose peer is `port`.
std::vector<int> sockets_to_port(int port) {
  std::vector<int> found;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return found;
  while (const dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    struct stat st{};
    int type = 0;
    socklen_t type_len = sizeof type;
    if (fd <= 2 || fd == dirfd(fds) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM)
      continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    int peer_port = -1;
    if (peer.ss_family == AF_INET) peer_port = ntohs(reinterpret_cast<const sockaddr_in*>(&peer)->sin_port);
    if (peer.ss_family == AF_INET6) peer_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_port);
    if (peer_port == port) found.push_back(fd);
  }
  closedir(fds);
  return found;
}

// c10d's client bounds only its waits by the store timeout: an add, set, get or check whose request
// or answer a cut link holds blocks in recv() until the kernel gives the connection up (about 15
// minutes of retransmissions), so a process cut off from the store's host hung in its recovery and
// its heartbeat for good. TCP_USER_TIMEOUT has the kernel drop a connection whose sent data stays
// unacknowledged for `bound`: the op then fails and the store is reported gone. A store that is only
// slow acknowledges what it receives and is not affected. c10d does not hand out its socket: the
// sockets to the store's port that were not there before it connected (`before`) are its own.
void bound_unacknowledged_sends(int port, const std::vector<int>& before, std::chrono::milliseconds bound) {
#ifdef TCP_USER_TIMEOUT
  const auto ms = static_cast<unsigned>(std::clamp<long long>(bound.count(), 1, INT_MAX));
  for (const int fd : sockets_to_port(port))
    if (std::find(before.begin(), before.end(), fd) == before.end())
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
#else
  (void)port;
  (void)before;
  (void)bound;
#endif
}

bool mentions_timeout(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos;
}

std::vector<std::uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// Polls until something accepts a TCP connection at host:port, or throws dra::timeout_error at
// the deadline. Each attempt is a non-blocking connect bounded by the time left. With
// `refused_ends`, a refused connection ends the wait at once (a store that was there and is gone).
void wait_until_listening(const std::string& host, int port, std::chrono::steady_clock::time_point deadline,
                          bool refused_ends = false) {
  std::string last = "nothing accepted a connection";
  bool refused = false;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
          // Out of file descriptors: no wait makes the store reachable, and "nothing accepted a
          // connection" would send the user looking for a store that is there.
          ::freeaddrinfo(found);
          const auto why = dra::detail::out_of_descriptors();
          throw dra::comm_error("dra: cannot connect to the store at " + host + ":" + std::to_string(port) + ": " +
                                why.value_or(std::strerror(EMFILE)));
        }
        if (fd < 0) continue;
        bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
          pollfd p{fd, POLLOUT, 0};
          if (::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(left.count(), 1, 1000))) == 1) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            ok = err == 0;
            if (!ok) last = std::strerror(err);
            refused = refused || err == ECONNREFUSED;
          }
        } else if (!ok) {
          last = std::strerror(errno);
          refused = refused || errno == ECONNREFUSED;
        }
        if (ok) {
          // A connect to a free local port in the ephemeral range can connect the socket to itself
          // (TCP simultaneous open): that is no listener.
          sockaddr_storage mine{}, peer{};
          socklen_t ml = sizeof mine, pl = sizeof peer;
          if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &ml) == 0 &&
              ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0 && ml == pl &&
              std::memcmp(&mine, &peer, ml) == 0) {
            ok = false;
            last = "nothing listens there";
          }
        }
        ::close(fd);
        if (ok) {
          ::freeaddrinfo(found);
          return;
        }
      }
      ::freeaddrinfo(found);
    }
    if (std::chrono::steady_clock::now() >= deadline || (refused_ends && refused))
      throw dra::timeout_error(
          "dra: the store at " + host + ":" + std::to_string(port) + " could not be reached (" + last +
          "); check MASTER_ADDR/MASTER_PORT or DRA_STORE (or the address given to dra) and that the "
          "store process runs");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}
// c10d's connect loop sleeps a jittered back-off (0.5-1.5 s at first) after a failed attempt
// whenever its own deadline has not passed, and a dying store's lingering listener fails every
// attempt at once (accept, then reset): a reconnection bounded to 200 ms took up to 2 s inside the
// leader's step. A reconnection therefore runs c10d's constructor on a thread of its own and gives
// it up at the deadline. A thread given up finishes within c10d's timeout plus one back-off; the
// process joins such threads at exit (its atexit handler runs before the static destructors of the
// libraries loaded before it), so none runs into a library being torn down.
class abandoned_connects {
 public:
  static abandoned_connects& instance() {
    static abandoned_connects* one = [] {
      auto* made = new abandoned_connects();  // never destroyed: the exit handler still reads it
      std::atexit([] { abandoned_connects::instance().join_all(); });
      return made;
    }();
    return *one;
  }
  void keep(std::thread t) {
    std::lock_guard<std::mutex> lock(mutex_);
    threads_.push_back(std::move(t));
  }
  void join_all() {
    std::vector<std::thread> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      all.swap(threads_);
    }
    for (auto& t : all)
      if (t.joinable()) t.join();
  }

 private:
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

c10::intrusive_ptr<c10d::TCPStore> connect_within(const std::string& host, int port, const c10d::TCPStoreOptions& o,
                                                  std::chrono::steady_clock::time_point deadline) {
  auto& keeper = abandoned_connects::instance();  // its exit handler is in place before the thread runs
  auto result = std::make_shared<std::promise<c10::intrusive_ptr<c10d::TCPStore>>>();
  auto done = result->get_future();
  std::thread attempt([result, host, o] {
    try {
      result->set_value(c10::make_intrusive<c10d::TCPStore>(host, o));
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  });
  // A connection that succeeds at the deadline is kept: the wait ends a little after it.
  if (done.wait_until(deadline + std::chrono::milliseconds(20)) != std::future_status::ready) {
    keeper.keep(std::move(attempt));
    throw dra::timeout_error("dra: the store at " + host + ":" + std::to_string(port) +
                             " accepted the reconnection but did not answer it in time (a dying store)");
  }
  attempt.join();
  return done.get();
}

// c10d names the peer of every socket it opens: a reverse lookup (getnameinfo without
// NI_NUMERICHOST, of the v4-mapped address, which /etc/hosts seldom lists) that it gives up for
// the rest of the process once one fails. On a host whose resolver does not answer, a process's
// first connection therefore waits out the resolver's timeouts (glibc: 5 s x 2 attempts per
// server) inside c10d's own connect timeout, and a store timeout of 10 s fails against a store
// that is up. The first contact of a process gets at least kFirstContact (the store was seen
// listening first, so an absent store is still named at the deadline), and a slow one is named
// once, with the fix.
std::atomic<bool> contacted{false};
constexpr std::chrono::milliseconds kFirstContact{45000};

std::chrono::milliseconds contact_budget(std::chrono::milliseconds wanted) {
  return contacted.load() ? wanted : std::max(wanted, kFirstContact);
}

void contact_made(std::chrono::steady_clock::time_point began, const std::string& address) {
  if (contacted.exchange(true)) return;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  if (took < 3.0) return;
  std::cerr << "[dra] the first connection to the store at " << address << " took " << static_cast<int>(took)
            << " s. The usual cause: c10d looks up the name of each peer it connects to, and this host's "
               "resolver (/etc/resolv.conf) does not answer; each process waits for it once. Make the resolver "
               "answer, or bound its wait: RES_OPTIONS='timeout:1 attempts:1'.\n"
            << std::flush;
}

std::string text(const std::vector<std::uint8_t>& b) {
  return {b.begin(), b.end()};
}

}  // namespace

store_client::store_client(const std::string& host, int port, bool host_store, const std::string& prefix,
                           std::chrono::milliseconds timeout)
    : host_(host), port_(port), prefix_(prefix), timeout_(timeout) {
  if (port < 0 || port > 65535)
    dra::detail::throw_invalid("store_port", "must lie in [0, 65535], got " + std::to_string(port));
  if (timeout.count() <= 0) dra::detail::throw_invalid("store_timeout", "must be > 0");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (host_store) {
    try {
      c10d::TCPStoreOptions o;
      o.port = static_cast<std::uint16_t>(port);
      o.isServer = true;
      // Multi-tenant like torch's env:// rendezvous: a script that keeps its own
      // init_process_group() on the same MASTER_PORT (rank 0 hosting, as under torchrun with
      // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) shares this process's server instead of failing with
      // EADDRINUSE, whichever of the two starts first.
      o.multiTenant = true;
      o.waitWorkers = false;
      o.timeout = contact_budget(timeout);  // the server connects a client of its own
      const auto began = std::chrono::steady_clock::now();
      server_ = c10::make_intrusive<c10d::TCPStore>(host, o);
      contact_made(began, host + ":" + std::to_string(server_->getPort()));
    } catch (const std::exception& e) {
      const std::string why = first_line(e);
      const bool in_use = why.find("in use") != std::string::npos || why.find("EADDRINUSE") != std::string::npos;
      throw dra::timeout_error(
          "dra: the store at " + host + ":" + std::to_string(port) + " could not be started (" + why + "); " +
          (in_use ? "another process listens on that port: a second job or launcher on the same MASTER_PORT, or a "
                    "store started without multi-tenancy (give each job its own MASTER_PORT, or point DRA_STORE at "
                    "a dedicated `dra store`)"
                  : "check MASTER_ADDR/MASTER_PORT (or the address given to dra)"));
    }
    port_ = server_->getPort();
    tcp_ = server_;
  } else {
    connect(deadline);
  }
  address_ = host + ":" + std::to_string(port_);
  tcp_->setTimeout(timeout);
  store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp_);
}

void store_client::connect(std::chrono::steady_clock::time_point deadline, bool reconnecting) {
  // c10d's own connect loop overruns the timeout it is given (it measured about twice a 30 s
  // timeout) and logs a stack trace per attempt: a client first waits, with its own bounded
  // loop, until the port accepts a connection, so that an absent store is reported at the
  // deadline dra promises, and a store that starts a moment later is still found.
  wait_until_listening(host_, port_, deadline, reconnecting);
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(port_);
    o.isServer = false;
    o.waitWorkers = false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    // A first connection gets at least a second; a reconnection only what is left of its bound
    // (c10d retries a reset or refused connection until this timeout).
    o.timeout = std::max(std::chrono::milliseconds(reconnecting ? 50 : 1000), left);
    if (!reconnecting) o.timeout = contact_budget(o.timeout);
    const auto began = std::chrono::steady_clock::now();
    const auto before = sockets_to_port(port_);
    tcp_ = reconnecting ? connect_within(host_, port_, o, deadline) : c10::make_intrusive<c10d::TCPStore>(host_, o);
    contact_made(began, host_ + ":" + std::to_string(port_));
    bound_unacknowledged_sends(port_, before, timeout_);
  } catch (const std::exception& e) {
    if (const auto why = dra::detail::out_of_descriptors())
      throw dra::comm_error("dra: cannot connect to the store at " + host_ + ":" + std::to_string(port_) + ": " + *why +
                            " (c10d: " + first_line(e) + ")");
    throw dra::timeout_error("dra: the store at " + host_ + ":" + std::to_string(port_) +
                             " could not be reached within " + std::to_string(timeout_.count()) + " ms (" +
                             first_line(e) +
                             "); check MASTER_ADDR/MASTER_PORT (or the address given to dra) and that the store "
                             "process runs");
  }
}

bool store_client::reconnect() {
  if (gone_) return false;
  try {
    // A store that closed this connection but still listens answers at once; one that is gone
    // refuses the connection, which ends the attempt at once (waiting would hold the leader in
    // its step while its peers' collectives time out). reconnect_within_ bounds a host that does
    // not answer, and a dying store whose lingering listener accepts and then resets.
    connect(std::chrono::steady_clock::now() + std::min(timeout_, reconnect_within_), true);
    tcp_->setTimeout(timeout_);
    store_ = c10::make_intrusive<c10d::PrefixStore>(prefix_, tcp_);
    return true;
  } catch (const std::exception&) {
    gone_ = true;
    return false;
  }
}

store_client::store_client(const store_client& connection, const std::string& prefix, std::chrono::milliseconds timeout)
    : host_(connection.host_),
      port_(connection.port_),
      prefix_(prefix),
      address_(connection.address_),
      timeout_(timeout),
      tcp_(connection.tcp_),
      store_(c10::make_intrusive<c10d::PrefixStore>(prefix, connection.tcp_)),
      reconnect_within_(connection.reconnect_within_),
      gone_(connection.gone_) {}

store_client::~store_client() = default;

template <class F>
auto store_client::guarded(const std::string& key, F&& f) -> decltype(f()) {
  std::string line;
  if (!gone_) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        return f();
      } catch (const dra::error&) {
        throw;
      } catch (const std::exception& e) {
        line = first_line(e);
        if (mentions_timeout(line))
          throw dra::timeout_error("dra: waiting for '" + key + "' on the store at " + address_ + " timed out (" +
                                   line + ")");
      }
      // The connection failed: the store closed it (it does so to a client whose add() met a
      // value that is not a counter) or it is gone. One new connection, one more try.
      if (attempt == 0 && !reconnect()) break;
    }
  } else {
    line = "it stopped answering earlier";
  }
  gone_ = gone_ || !line.empty();
  throw dra::membership_error("dra: the store at " + address_ + " failed during '" + key + "': " + line);
}

void store_client::set(const std::string& key, const nlohmann::json& value) {
  set_text(key, value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void store_client::set_text(const std::string& key, const std::string& value) {
  guarded(key, [&] {
    store_->set(key, bytes(value));
    return 0;
  });
}

std::string store_client::get(const std::string& key, std::optional<std::chrono::milliseconds> timeout) {
  return guarded(key, [&] {
    store_->wait({key}, timeout.value_or(timeout_));
    return text(store_->get(key));
  });
}

std::optional<std::string> store_client::try_get(const std::string& key) {
  return guarded(key, [&]() -> std::optional<std::string> {
    if (!store_->check({key})) return std::nullopt;
    return text(store_->get(key));
  });
}

bool store_client::exists(const std::string& key) {
  return guarded(key, [&] { return store_->check({key}); });
}

std::int64_t store_client::add(const std::string& key, std::int64_t amount) {
  if (!gone_) {
    try {
      return store_->add(key, amount);
    } catch (const std::exception& e) {
      if (mentions_timeout(first_line(e)) || !reconnect())
        throw dra::membership_error("dra: the store at " + address_ + " failed during '" + key + "': " + first_line(e));
    }
    // Reconnected: the store is there. Did the add meet a value it cannot add to?
    const auto now = try_get(key);
    if (now && !counter_accepts(*now))
      throw bad_counter("dra: '" + key + "' on the store at " + address_ + " does not hold a counter", *now);
  }
  return guarded(key, [&] { return store_->add(key, amount); });
}

std::string store_client::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return guarded(key, [&] { return text(store_->compareSet(key, bytes(expected), bytes(desired))); });
}

bool store_client::claim(const std::string& key, const std::string& value) {
  return compare_set(key, "", value) == value;
}

void store_client::erase(const std::string& key) {
  guarded(key, [&] { return store_->deleteKey(key); });
}

void store_client::append_list(const std::string& key, int item) {
  guarded(key, [&] {
    store_->append(key, bytes(std::to_string(item) + ","));
    return 0;
  });
}

std::string store_client::read_list(const std::string& key) {
  return guarded(key, [&]() -> std::string {
    if (!store_->check({key})) return {};
    return text(store_->get(key));
  });
}

}  // namespace dra::elastic::detail
