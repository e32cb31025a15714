// The outside actors' side of a job's store contract (include/dra/torch/elastic/job_control.hpp).
#include "dra/torch/elastic/job_control.hpp"

#include <nlohmann/json.hpp>

#include "dra/error.hpp"
#include "store_client.hpp"
#include "store_values.hpp"

namespace dra::elastic {

struct job_control::client {
  client(const std::string& host, int port, const std::string& prefix, std::chrono::milliseconds timeout)
      : store(host, port, false, prefix, timeout) {}
  detail::store_client store;
};

job_control::job_control(const std::string& host, int port, const std::string& job, int restart,
                         std::chrono::milliseconds timeout)
    : prefix_("dra/" + job + "/" + std::to_string(restart)) {
  if (job.empty()) dra::detail::throw_invalid("job", "must name the job (DRA_JOB_ID or torchrun's run id)");
  if (restart < 0) dra::detail::throw_invalid("restart", "must be >= 0, got " + std::to_string(restart));
  // c10d's PrefixStore joins prefix and key with "/": the keys the controller uses.
  client_ = std::make_unique<client>(host, port, prefix_, timeout);
}

job_control::~job_control() = default;

std::string job_control::address() const {
  return client_->store.address();
}

void job_control::set_capacity(int min_size, int max_size, const std::vector<int>& leave) {
  if (min_size < 0 || max_size < 0)
    dra::detail::throw_invalid("capacity", "sizes must be >= 0 (0: no bound), got min_size " +
                                               std::to_string(min_size) + ", max_size " + std::to_string(max_size));
  if (max_size > 0 && min_size > max_size)
    dra::detail::throw_invalid(
        "capacity", "min_size " + std::to_string(min_size) + " is above max_size " + std::to_string(max_size));
  client_->store.set(job_keys::capacity, {{"min_size", min_size}, {"max_size", max_size}, {"leave", leave}});
}

std::string job_control::report() {
  const auto j = client_->store.try_get(job_keys::report);
  return j ? *j : std::string();
}

bool job_control::done() {
  return client_->store.exists(job_keys::done);
}

std::optional<std::vector<int>> job_control::final_members() {
  const auto raw = client_->store.try_get(job_keys::final_world);
  if (!raw) return std::nullopt;
  const auto j = nlohmann::json::parse(*raw, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("members")) return std::nullopt;
  return detail::uid_array(j.at("members"));
}

std::optional<std::int64_t> job_control::stopped_at() {
  const auto raw = client_->store.try_get(job_keys::final_world);
  if (!raw) return std::nullopt;
  const auto j = nlohmann::json::parse(*raw, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("stopped_at") || !j.at("stopped_at").is_number_integer())
    return std::nullopt;
  return j.at("stopped_at").get<std::int64_t>();
}

bool job_control::started() {
  return client_->store.exists(job_keys::universe);
}

bool job_control::checked_in(int uid) {
  return client_->store.exists(job_keys::config + std::to_string(uid));
}

int job_control::claim_late_uid() {
  return late_uid_base + static_cast<int>(client_->store.add(job_keys::late_uid, 1)) - 1;
}

}  // namespace dra::elastic
