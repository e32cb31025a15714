#pragma once
// Values read from the job's store (internal to dra::dra). Any client of the store can write any
// key (a device pool, an RL coordinator, a buggy script), so nothing read there is trusted: each
// reader parses through one of these functions, and a value that does not parse is ignored with
// one warning naming the key and the value, never an exception (the caller decides what "ignored"
// means for its key: absent, the last good value, or a handled dra::error).
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dra::elastic::detail {

/// Values larger than this are not parsed (a huge value written by mistake costs nothing).
constexpr std::size_t kMaxStoreValueBytes = std::size_t{4} << 20;

/// Parses store values; warns once per (key, value) about those that do not parse.
class store_values {
 public:
  explicit store_values(std::string prefix) : prefix_(std::move(prefix)) {}

  /// `raw` as JSON, or nothing (warned).
  std::optional<nlohmann::json> json_of(const std::string& key, const std::string& raw);
  /// `raw` as a JSON object, or nothing (warned).
  std::optional<nlohmann::json> object_of(const std::string& key, const std::string& raw);
  /// `raw` as an integer in [lo, hi], or nothing (warned).
  std::optional<std::int64_t> int_of(const std::string& key, const std::string& raw, std::int64_t lo, std::int64_t hi);
  /// A comma-separated list of uids ("3,10000,"); items that are not uids are left out (warned).
  std::vector<int> uid_list_of(const std::string& key, const std::string& raw);
  /// One warning for this (key, value), then silence (at most kMaxWarnings in all).
  void warn(const std::string& key, const std::string& raw, const std::string& why);
  /// Warnings printed so far (the fault campaign counts them).
  std::size_t warnings() const;

 private:
  static constexpr std::size_t kMaxWarnings = 200;
  std::string prefix_;
  mutable std::mutex mutex_;
  std::set<std::pair<std::string, std::string>> warned_;
  std::size_t printed_ = 0;
};

// Field readers for values already parsed as JSON: nothing when the field is absent, of another
// type or out of range (the caller warns once for the whole value).
std::optional<std::int64_t> int_field(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi);
std::optional<std::vector<int>> uid_array(const nlohmann::json& j);
std::optional<std::string> string_field(const nlohmann::json& j, const char* name);

/// A uid: 0 .. INT_MAX (late joiners from 10000).
constexpr std::int64_t kMaxUid = 2147483647;
/// A world epoch handed out by epoch_seq.
constexpr std::int64_t kMaxEpoch = std::int64_t{1} << 53;

/// What c10d's add() takes for a counter (std::stoll of the value: a leading integer); a value it
/// refuses makes the store server close the adding client's connection.
bool counter_accepts(const std::string& raw) noexcept;

}  // namespace dra::elastic::detail
