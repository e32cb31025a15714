#pragma once
// Bounded, error-mapped operations on the job's c10d store (internal to dra::dra). Every wait is
// bounded; a store that cannot be reached raises dra::timeout_error naming host:port, a store
// that goes away mid-job raises dra::membership_error (or timeout_error) naming the key.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Store;
class TCPStore;
}  // namespace c10d

namespace dra::elastic::detail {

class store_client {
 public:
  /// Connects (retrying until `timeout`), or hosts the store when `host_store` (port 0: a free
  /// port). Keys live under `prefix`.
  store_client(const std::string& host, int port, bool host_store, const std::string& prefix,
               std::chrono::milliseconds timeout);
  ~store_client();

  const std::string& address() const noexcept { return address_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// The job-prefixed store (the communicators rendezvous under it).
  const c10::intrusive_ptr<c10d::Store>& store() const noexcept { return store_; }

  void set(const std::string& key, const nlohmann::json& value);
  /// Blocks until `key` exists, at most `timeout` (default: the store timeout).
  nlohmann::json get(const std::string& key, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  std::optional<nlohmann::json> try_get(const std::string& key);
  bool exists(const std::string& key);
  std::int64_t add(const std::string& key, std::int64_t amount);
  /// Atomically sets `key` to `value` unless it exists; true when this call set it.
  bool claim(const std::string& key, const std::string& value);
  void erase(const std::string& key);
  void append_list(const std::string& key, int item);
  std::vector<int> read_list(const std::string& key);

 private:
  template <class F>
  auto guarded(const std::string& key, F&& f) -> decltype(f());

  std::string address_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::TCPStore> tcp_;
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace dra::elastic::detail
