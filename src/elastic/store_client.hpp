#pragma once
// Bounded, error-mapped operations on the job's c10d store (internal to dra::dra). Every wait is
// bounded; a store that cannot be reached raises dra::timeout_error naming host:port, a store
// that goes away mid-job raises dra::membership_error (or timeout_error) naming the key. Values
// come back as the bytes stored: any client may have written them, so parsing them is the
// caller's business (store_values.hpp). The store server closes the connection of a client whose
// add() met a value that is not a counter: the client then reconnects once, and add() reports the
// value (bad_counter) instead of declaring the store gone.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"

namespace c10d {
class Store;
class TCPStore;
}  // namespace c10d

namespace dra::elastic::detail {

/// add() met a value that is not a counter (c10d refuses to add to it): the store is fine.
class bad_counter : public dra::membership_error {
 public:
  bad_counter(const std::string& what, std::string value) : dra::membership_error(what), value_(std::move(value)) {}
  const std::string& value() const noexcept { return value_; }

 private:
  std::string value_;
};

class store_client {
 public:
  /// Connects (retrying until `timeout`), or hosts the store when `host_store` (port 0: a free
  /// port). Keys live under `prefix`.
  store_client(const std::string& host, int port, bool host_store, const std::string& prefix,
               std::chrono::milliseconds timeout);
  /// Another view of `connection`'s store under `prefix`, over the same TCP connection (c10d's
  /// client serializes its operations), waiting at most `timeout`: no new connection to make. A
  /// view that has to reconnect makes its own.
  store_client(const store_client& connection, const std::string& prefix, std::chrono::milliseconds timeout);
  ~store_client();

  const std::string& address() const noexcept { return address_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// The job-prefixed store (the communicators rendezvous under it).
  const c10::intrusive_ptr<c10d::Store>& store() const noexcept { return store_; }

  void set(const std::string& key, const nlohmann::json& value);
  void set_text(const std::string& key, const std::string& value);
  /// Blocks until `key` exists, at most `timeout` (default: the store timeout); the bytes stored.
  std::string get(const std::string& key, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  std::optional<std::string> try_get(const std::string& key);
  bool exists(const std::string& key);
  /// Throws bad_counter when the value is not a counter (the connection is usable again).
  std::int64_t add(const std::string& key, std::int64_t amount);
  /// Atomically sets `key` to `desired` when it holds `expected` ("" : absent); the value after.
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  /// Atomically sets `key` to `value` unless it exists; true when this call set it.
  bool claim(const std::string& key, const std::string& value);
  void erase(const std::string& key);
  void append_list(const std::string& key, int item);
  /// The raw text of an append_list key ("" when absent).
  std::string read_list(const std::string& key);
  /// A store op failed and the store did not answer a new connection: it is gone for good, and
  /// every later op fails at once.
  bool gone() const noexcept { return gone_; }
  /// How long one reconnection may take, c10d's own retries included (default 2 s). A process
  /// whose peers wait for it in a collective bounds it below their fault timeout: a store that
  /// dies while accepting (its listening socket lingers a moment, then resets) must not hold the
  /// leader in its step until the others declare it dead, with no store left to recover through.
  void set_reconnect_within(std::chrono::milliseconds bound) noexcept { reconnect_within_ = bound; }
  const std::string& host() const noexcept { return host_; }
  int port() const noexcept { return port_; }

 private:
  template <class F>
  auto guarded(const std::string& key, F&& f) -> decltype(f());
  /// A new connection to the store (the old one was closed); false when nothing answers.
  bool reconnect();
  void connect(std::chrono::steady_clock::time_point deadline, bool reconnecting = false);

  std::string host_;
  int port_ = 0;
  std::string prefix_;
  std::string address_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::TCPStore> server_;  // this process hosts the store: keeps it alive
  c10::intrusive_ptr<c10d::TCPStore> tcp_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds reconnect_within_{2000};
  bool gone_ = false;
};

}  // namespace dra::elastic::detail
