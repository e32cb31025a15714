#include "store_client.hpp"

#include <algorithm>
#include <cctype>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dra/error.hpp"

namespace dra::elastic {

namespace {

std::string first_line(const std::exception& e) {
  const std::string text = e.what();
  return text.substr(0, text.find('\n'));
}

bool mentions_timeout(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos;
}

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

controller::store_client::store_client(const std::string& host, int port, bool host_store, const std::string& prefix,
                                       std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  if (port < 0 || port > 65535)
    dra::detail::throw_invalid("store_port", "must lie in [0, 65535], got " + std::to_string(port));
  if (timeout.count() <= 0) dra::detail::throw_invalid("store_timeout", "must be > 0");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  // TCPStore's own connect loop honours its timeout, but a refused connection can fail at once:
  // retry until the deadline so that a store starting a moment later is still found.
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      c10d::TCPStoreOptions o;
      o.port = static_cast<std::uint16_t>(port);
      o.isServer = host_store;
      o.waitWorkers = false;
      o.timeout = std::max(std::chrono::milliseconds(500), std::min(timeout, left));
      tcp_ = c10::make_intrusive<c10d::TCPStore>(host, o);
      break;
    } catch (const std::exception& e) {
      last = first_line(e);
      if (host_store || std::chrono::steady_clock::now() >= deadline)
        throw dra::timeout_error("dra: the store at " + host + ":" + std::to_string(port) + " could not be " +
                                 (host_store ? "started" : "reached within " + std::to_string(timeout.count()) + " ms") +
                                 " (" + last + "); check MASTER_ADDR/MASTER_PORT (or the address given to dra) " +
                                 "and that the store process runs");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  address_ = host + ":" + std::to_string(tcp_->getPort());
  tcp_->setTimeout(timeout);
  store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp_);
}

controller::store_client::~store_client() = default;

template <class F>
auto controller::store_client::guarded(const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dra::error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string line = first_line(e);
    if (mentions_timeout(line))
      throw dra::timeout_error("dra: waiting for '" + key + "' on the store at " + address_ + " timed out (" + line + ")");
    throw dra::membership_error("dra: the store at " + address_ + " failed during '" + key + "': " + line);
  }
}

void controller::store_client::set(const std::string& key, const nlohmann::json& value) {
  guarded(key, [&] {
    store_->set(key, bytes(value.dump()));
    return 0;
  });
}

nlohmann::json controller::store_client::get(const std::string& key, std::optional<std::chrono::milliseconds> timeout) {
  return guarded(key, [&] {
    store_->wait({key}, timeout.value_or(timeout_));
    return nlohmann::json::parse(text(store_->get(key)));
  });
}

std::optional<nlohmann::json> controller::store_client::try_get(const std::string& key) {
  return guarded(key, [&]() -> std::optional<nlohmann::json> {
    if (!store_->check({key})) return std::nullopt;
    return nlohmann::json::parse(text(store_->get(key)));
  });
}

bool controller::store_client::exists(const std::string& key) {
  return guarded(key, [&] { return store_->check({key}); });
}

std::int64_t controller::store_client::add(const std::string& key, std::int64_t amount) {
  return guarded(key, [&] { return store_->add(key, amount); });
}

bool controller::store_client::claim(const std::string& key, const std::string& value) {
  return guarded(key, [&] { return text(store_->compareSet(key, {}, bytes(value))) == value; });
}

void controller::store_client::erase(const std::string& key) {
  guarded(key, [&] { return store_->deleteKey(key); });
}

void controller::store_client::append_list(const std::string& key, int item) {
  guarded(key, [&] {
    store_->append(key, bytes(std::to_string(item) + ","));
    return 0;
  });
}

std::vector<int> controller::store_client::read_list(const std::string& key) {
  const std::string raw = guarded(key, [&]() -> std::string {
    if (!store_->check({key})) return {};
    return text(store_->get(key));
  });
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos < raw.size()) {
    const auto comma = raw.find(',', pos);
    const auto item = raw.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) out.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace dra::elastic
