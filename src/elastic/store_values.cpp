#include "store_values.hpp"

#include <cctype>
#include <climits>
#include <cstdio>
#include <string>

namespace dra::elastic::detail {

using json = nlohmann::json;

namespace {

// The value as a warning shows it: at most 80 characters, control bytes escaped.
std::string shown(const std::string& raw) {
  std::string out;
  for (std::size_t i = 0; i < raw.size() && out.size() < 80; ++i) {
    const auto c = static_cast<unsigned char>(raw[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (out.size() >= 80 && raw.size() > 80) out += "...";
  return out;
}

}  // namespace

void store_values::warn(const std::string& key, const std::string& raw, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (printed_ >= kMaxWarnings) return;
  if (!warned_.emplace(key, raw.substr(0, 256)).second) return;
  ++printed_;
  std::fprintf(stderr, "[dra] ignoring the store value of '%s/%s' (\"%s\", %zu bytes): %s; warned once%s\n",
               prefix_.c_str(), key.c_str(), shown(raw).c_str(), raw.size(), why.c_str(),
               printed_ == kMaxWarnings ? " (further store values that do not parse are ignored silently)" : "");
  std::fflush(stderr);
}

std::size_t store_values::warnings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return printed_;
}

std::optional<json> store_values::json_of(const std::string& key, const std::string& raw) {
  if (raw.size() > kMaxStoreValueBytes) {
    warn(key, raw, "larger than " + std::to_string(kMaxStoreValueBytes >> 20) + " MiB");
    return std::nullopt;
  }
  json j = json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    warn(key, raw, "not JSON");
    return std::nullopt;
  }
  return j;
}

std::optional<json> store_values::object_of(const std::string& key, const std::string& raw) {
  auto j = json_of(key, raw);
  if (j && !j->is_object()) {
    warn(key, raw, "expected a JSON object");
    return std::nullopt;
  }
  return j;
}

std::optional<std::int64_t> store_values::int_of(const std::string& key, const std::string& raw, std::int64_t lo,
                                                 std::int64_t hi) {
  auto j = json_of(key, raw);
  if (!j) return std::nullopt;
  const json wrapped = {{"v", *j}};
  if (auto v = int_field(wrapped, "v", lo, hi)) return v;
  warn(key, raw, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return std::nullopt;
}

std::vector<int> store_values::uid_list_of(const std::string& key, const std::string& raw) {
  std::vector<int> out;
  if (raw.size() > kMaxStoreValueBytes) {
    warn(key, raw, "larger than " + std::to_string(kMaxStoreValueBytes >> 20) + " MiB");
    return out;
  }
  std::size_t pos = 0;
  while (pos < raw.size()) {
    const auto comma = raw.find(',', pos);
    const std::string item = raw.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) {
      bool digits = item.size() <= 10;
      for (const char c : item) digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
      const long long v = digits ? std::stoll(item) : -1;
      if (v >= 0 && v <= kMaxUid) {
        out.push_back(static_cast<int>(v));
      } else {
        warn(key, raw, "item '" + item.substr(0, 40) + "' is not a uid");
      }
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::optional<std::int64_t> int_field(const json& j, const char* name, std::int64_t lo, std::int64_t hi) {
  if (!j.is_object()) return std::nullopt;
  const auto it = j.find(name);
  if (it == j.end()) return std::nullopt;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned()) {
      const auto u = it->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(hi)) return std::nullopt;
      const auto v = static_cast<std::int64_t>(u);
      return v >= lo ? std::optional<std::int64_t>(v) : std::nullopt;
    }
    const auto v = it->get<std::int64_t>();
    return v >= lo && v <= hi ? std::optional<std::int64_t>(v) : std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::vector<int>> uid_array(const json& j) {
  if (!j.is_array()) return std::nullopt;
  std::vector<int> out;
  out.reserve(j.size());
  for (const auto& e : j) {
    const json wrapped = {{"v", e}};
    const auto v = int_field(wrapped, "v", 0, kMaxUid);
    if (!v) return std::nullopt;
    out.push_back(static_cast<int>(*v));
  }
  return out;
}

std::optional<std::string> string_field(const json& j, const char* name) {
  if (!j.is_object()) return std::nullopt;
  const auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

bool counter_accepts(const std::string& raw) noexcept {
  try {
    (void)std::stoll(raw);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace dra::elastic::detail
