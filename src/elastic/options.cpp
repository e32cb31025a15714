// The controller's configuration: the launch environment, option validation, and what every
// process of a job must agree on. The option table (one table for Python's keywords, DRA_OPTIONS
// and C++) is option_table.cpp.
#include "dra/torch/elastic/options.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dra/error.hpp"
#include "dra/torch/elastic/codec_hook.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "small.hpp"
#include "store_protocol.hpp"

namespace dra::elastic {

using detail::number;

namespace {

using json = nlohmann::json;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback) {
  const std::string v = env_or(name, "");
  if (v.empty()) return fallback;
  try {
    std::size_t used = 0;
    const int out = std::stoi(v, &used);
    if (used == v.size()) return out;
  } catch (const std::exception&) {
  }
  dra::detail::throw_invalid(name, "must be an integer, got '" + v + "'");
}

void check_seconds(double value, const char* option) {
  if (!(std::isfinite(value) && value > 0.0))
    dra::detail::throw_invalid(option, "must be a positive number of seconds, got " + number(value));
}

}  // namespace

controller_options controller_options::from_env() {
  controller_options o;
  apply_options(o, environment_options_json(), "DRA_OPTIONS");
  return o;
}

const char* to_string(role r) noexcept {
  switch (r) {
    case role::local:
      return "local";
    case role::candidate:
      return "candidate";
    case role::member:
      return "member";
    case role::released:
      return "released";
    case role::finished:
      return "finished";
    case role::rejected:
      return "rejected";
  }
  return "?";
}

const char* to_string(release_mode m) noexcept {
  switch (m) {
    case release_mode::standby:
      return "standby";
    case release_mode::exit:
      return "exit";
    case release_mode::to_caller:
      return "return";
  }
  return "?";
}

const char* to_string(change_phase p) noexcept {
  switch (p) {
    case change_phase::rebuild:
      return "rebuild";
    case change_phase::state_transfer:
      return "state_transfer";
    case change_phase::reshard:
      return "reshard";
    case change_phase::reduced:
      return "reduced";
  }
  return "?";
}

launch_info launch_info::from_env() {
  launch_info l;
  l.join = env_or("DRA_JOIN", "0") == "1";
  if (l.join) l.join_uid = env_int("DRA_JOIN_UID", -1);
  const std::string dedicated = env_or("DRA_STORE", "");
  const std::string host = env_or("MASTER_ADDR", ""), port = env_or("MASTER_PORT", "");
  if (!dedicated.empty()) {
    // A store that outlives every training process (python -m dra store): the job then
    // survives the loss of any rank, rank 0 and torchrun's node 0 included.
    const auto colon = dedicated.rfind(':');
    if (colon == std::string::npos || colon == 0)
      dra::detail::throw_invalid("DRA_STORE", "must be host:port, got '" + dedicated + "'");
    l.store_host = dedicated.substr(0, colon);
    try {
      l.store_port = std::stoi(dedicated.substr(colon + 1));
    } catch (const std::exception&) {
      dra::detail::throw_invalid("DRA_STORE", "port must be an integer, got '" + dedicated + "'");
    }
  } else if (!host.empty() && !port.empty()) {
    l.store_host = host;
    l.store_port = env_int("MASTER_PORT", 0);
  }
  l.uid = env_int("RANK", 0);
  l.universe_size = env_int("WORLD_SIZE", 1);
  if (l.store_host.empty()) {
    // Alone, without torchrun: a private store on a free port, a world of one.
    l.store_host = "127.0.0.1";
    l.host_store = true;
  } else if (!l.join && l.uid == 0 && dedicated.empty()) {
    // Under torchrun the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True), or rank 0 when
    // the agent does not share its store. Processes started by hand use a dedicated store, or
    // rank 0 hosts it when it sets DRA_HOST_STORE=1.
    const bool torchrun = !env_or("TORCHELASTIC_RUN_ID", "").empty();
    const bool agent_store = env_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
    l.host_store = env_or("DRA_HOST_STORE", torchrun && !agent_store ? "1" : "0") == "1";
  }
  const std::string run = env_or("DRA_JOB_ID", env_or("TORCHELASTIC_RUN_ID", "job"));
  // c10d's PrefixStore joins prefix and key with a "/": keys read dra/<job>/<restart>/<key>.
  l.job_prefix = "dra/" + run + "/" + env_or("TORCHELASTIC_RESTART_COUNT", "0");
  return l;
}

void launch_info::validate() const {
  if (join && join_uid != -1 && join_uid < detail::kLateUidBase)
    dra::detail::throw_invalid("DRA_JOIN_UID", "must be >= " + std::to_string(detail::kLateUidBase) +
                                                   " (claimed from the job's late_uid counter), got " +
                                                   std::to_string(join_uid));
  if (universe_size < 1) dra::detail::throw_invalid("WORLD_SIZE", "must be >= 1, got " + std::to_string(universe_size));
  if (!join && (uid < 0 || uid >= universe_size))
    dra::detail::throw_invalid(
        "RANK", "must lie in [0, WORLD_SIZE=" + std::to_string(universe_size) + "), got " + std::to_string(uid));
}

int controller_options::fit_to_job(int universe_size) {
  const int first = start_size == 0 ? universe_size : start_size;
  if (first > universe_size)
    dra::detail::throw_invalid("start_size", "must lie in [1, " + std::to_string(universe_size) +
                                                 "] (the processes launched), got " + std::to_string(first));
  auto& limits = engine.limits;
  const bool max_given = limits.max_size != policy::constraints{}.max_size;
  if (limits.min_size > universe_size && !max_given)
    dra::detail::throw_invalid("min_size", std::to_string(limits.min_size) + " is more than the " +
                                               std::to_string(universe_size) +
                                               " process(es) launched; lower it, launch more, or set max_size when "
                                               "late joiners will come");
  if (!max_given) limits.max_size = universe_size;
  if (batch == batch_mode::adascale) engine.goodput.adapt_batch = true;
  validate();
  return first;
}

void controller_options::validate() const {
  engine.validate();
  if (start_size < 0)
    dra::detail::throw_invalid("start_size",
                               "must be >= 1 (or 0 / None: every process launched), got " + std::to_string(start_size));
  check_seconds(fault_timeout_s, "fault_timeout_s");
  check_seconds(store_timeout_s, "store_timeout_s");
  if (!(std::isfinite(capacity_poll_s) && capacity_poll_s >= 0.0))
    dra::detail::throw_invalid("capacity_poll_s",
                               "must be >= 0 seconds (0: read capacity at every step), got " + number(capacity_poll_s));
  if (!(std::isfinite(chunk_mb) && chunk_mb * 1048576.0 >= 1024.0))
    dra::detail::throw_invalid("chunk_mb", "must be >= 1/1024 (1 KiB), got " + number(chunk_mb));
  if (max_resize_retries < 0)
    dra::detail::throw_invalid("max_resize_retries", "must be >= 0, got " + std::to_string(max_resize_retries));
  if (status_every < 0) dra::detail::throw_invalid("status_every", "must be >= 0 (0 = no status line)");
  if (deferred_handoff && verify)
    dra::detail::throw_invalid("handoff",
                               "'deferred' with verify=True: the digest is compared when the world change completes, "
                               "before the deferred optimizer state arrived; use handoff='full' to verify");
  if (backend.empty()) dra::detail::throw_invalid("backend", "must name a backend, e.g. 'gloo'");
  sparsity.validate();
  if (!compress.empty()) codec_hook::validate_spec(compress, sparsity);
  // `sparsity` configures the 'masked' codec only: with another codec (or none) it would be ignored.
  if (!(sparsity == dra::compress::rigl_config{}) && compress.rfind("masked", 0) != 0)
    dra::detail::throw_invalid("sparsity",
                               "configures sparse training, which runs with compress='masked' only; "
                               "compress is '" +
                                   compress + "': set compress='masked' or drop sparsity");
  if (batch == batch_mode::adascale && engine.policy != "goodput")
    dra::detail::throw_invalid("batch_mode",
                               "'adascale' adapts the global batch by the gradient noise scale, which only "
                               "the 'goodput' policy does; use policy='goodput' or batch_mode='fixed'");
  const auto& limits = engine.limits;
  for (const auto& [step, size] : resize_schedule) {
    const std::string at = " at step " + std::to_string(step);
    if (step < 1) dra::detail::throw_invalid("resize_schedule", "steps must be >= 1, got " + std::to_string(step));
    if (size < limits.min_size || size > limits.max_size)
      dra::detail::throw_invalid("resize_schedule",
                                 "size " + std::to_string(size) + at + " lies outside [min_size, max_size] = [" +
                                     std::to_string(limits.min_size) + ", " + std::to_string(limits.max_size) + "]");
  }
}

std::chrono::milliseconds controller_options::fault_timeout_ms() const {
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(fault_timeout_s * 1000.0)));
}
std::chrono::milliseconds controller_options::store_timeout_ms() const {
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(store_timeout_s * 1000.0)));
}
std::size_t controller_options::chunk_size_bytes() const {
  return static_cast<std::size_t>(std::llround(chunk_mb * 1048576.0));
}

namespace {
// One warning per deprecated name and process: a trainer built against release 0.1 keeps working
// and says once what to rename.
void deprecated_once(const char* old_name, const char* use) {
  static std::atomic<unsigned> warned{0};
  static const char* const names[] = {"schedule",    "decide_every",  "fault_timeout", "store_timeout",
                                      "chunk_bytes", "gloo_hostname", "start_size"};
  unsigned bit = 0;
  while (bit < std::size(names) && std::string(names[bit]) != old_name) ++bit;
  if (warned.fetch_or(1u << bit) & (1u << bit)) return;
  std::fprintf(stderr,
               "[dra] warning: controller_options::%s is release 0.1's name, deprecated since 0.2 and removed in "
               "0.4; use %s (docs/guide/compatibility.md)\n",
               old_name, use);
}
}  // namespace

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
controller_options::controller_options() = default;
controller_options::controller_options(const controller_options&) = default;
controller_options::controller_options(controller_options&&) = default;
controller_options& controller_options::operator=(const controller_options&) = default;
controller_options& controller_options::operator=(controller_options&&) = default;
controller_options::~controller_options() = default;

void controller_options::adopt_deprecated_names() {
  if (!schedule.empty()) {
    deprecated_once("schedule", "resize_schedule");
    if (resize_schedule.empty()) resize_schedule = schedule;
    schedule.clear();
  }
  if (decide_every != 0) {
    deprecated_once("decide_every", "engine.decide_every");
    engine.decide_every = decide_every;
    decide_every = 0;
  }
  if (fault_timeout.count() != 0) {
    deprecated_once("fault_timeout", "fault_timeout_s (seconds)");
    fault_timeout_s = static_cast<double>(fault_timeout.count()) / 1000.0;
    fault_timeout = std::chrono::milliseconds(0);
  }
  if (store_timeout.count() != 0) {
    deprecated_once("store_timeout", "store_timeout_s (seconds)");
    store_timeout_s = static_cast<double>(store_timeout.count()) / 1000.0;
    store_timeout = std::chrono::milliseconds(0);
  }
  if (chunk_bytes != 0) {
    deprecated_once("chunk_bytes", "chunk_mb (MiB)");
    chunk_mb = static_cast<double>(chunk_bytes) / 1048576.0;
    chunk_bytes = 0;
  }
  if (!gloo_hostname.empty()) {
    deprecated_once("gloo_hostname", "backend_address");
    if (backend_address.empty()) backend_address = gloo_hostname;
    gloo_hostname.clear();
  }
  if (start_size == -1) {
    deprecated_once("start_size", "start_size = 0 (every process launched)");
    start_size = 0;
  }
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

void step_signals::validate() const {
  // The two batch sizes say that gradient statistics were given (NaN: not given); a norm that is NaN
  // or inf beside them is a measurement that overflowed (an AMP step the GradScaler skips) and is
  // counted as non-finite by the estimator, never an error that would end the training run.
  const bool any =
      !std::isnan(small_sqr_norm) || !std::isnan(small_batch) || !std::isnan(big_sqr_norm) || !std::isnan(big_batch);
  const bool batches = !std::isnan(small_batch) && !std::isnan(big_batch);
  if (any && !batches)
    dra::detail::throw_invalid("small_sqr_norm",
                               "gradient statistics need all of small_sqr_norm, small_batch, big_sqr_norm, big_batch");
  // Equal batches are a world of one (big_batch = world size x small_batch): no second batch size,
  // so the step carries no gradient statistics (skipped, not an error: a job shrunk to one goes on).
  if (batches &&
      !(std::isfinite(small_batch) && std::isfinite(big_batch) && small_batch > 0.0 && big_batch >= small_batch))
    dra::detail::throw_invalid("big_batch", "needs 0 < small_batch <= big_batch (finite), got " +
                                                std::to_string(small_batch) + " and " + std::to_string(big_batch));
  if (!std::isnan(step_time_s) && !(std::isfinite(step_time_s) && step_time_s > 0.0))
    dra::detail::throw_invalid("step_time_s",
                               "must be a finite number of seconds > 0, got " + std::to_string(step_time_s));
  if (!std::isnan(sync_time_s) && std::isnan(step_time_s))
    dra::detail::throw_invalid("sync_time_s", "is the part of step_time_s spent synchronising; pass step_time_s too");
  if (!std::isnan(sync_time_s) && !(std::isfinite(sync_time_s) && sync_time_s >= 0.0))
    dra::detail::throw_invalid("sync_time_s",
                               "must be a finite number of seconds >= 0, got " + std::to_string(sync_time_s));
  if (!std::isnan(sync_time_s) && sync_time_s > step_time_s)
    dra::detail::throw_invalid("sync_time_s",
                               std::to_string(sync_time_s) + " s exceeds step_time_s " + std::to_string(step_time_s) +
                                   " s; it is the part of the step spent synchronising (both in seconds)");
}

namespace detail {

nlohmann::json config_fingerprint(const controller_options& o, const elastic_sampler& sampler, int start_size) {
  const auto& e = o.engine;
  nlohmann::json schedule = nlohmann::json::array();
  for (const auto& [s, n] : o.resize_schedule) schedule.push_back({s, n});
  return {
      {"global_batch", sampler.global_batch()},
      {"dataset_size", sampler.dataset_size()},
      {"seed", sampler.seed()},
      {"drop_last", sampler.drop_last()},
      {"shuffle", sampler.shuffle()},
      {"policy", e.policy},
      {"min_size", e.limits.min_size},
      {"max_size", e.limits.max_size},
      {"decide_every", e.decide_every},
      {"start_size", start_size},
      {"release", o.release ? to_string(*o.release) : "auto"},
      {"batch_mode", o.batch == batch_mode::adascale ? "adascale" : "fixed"},
      {"resize_schedule", schedule},
      {"verify", o.verify},
      {"handoff", o.deferred_handoff ? "deferred" : "full"},
      {"heal", o.heal},
      {"fault_timeout_s", o.fault_timeout_s},
      {"backend", o.backend},
      {"compress", o.compress},
      {"sparsity",
       {o.sparsity.max_sparsity, o.sparsity.every, o.sparsity.alpha, o.sparsity.end_step, o.sparsity.step_up,
        o.sparsity.step_down, o.sparsity.ramp_start, o.sparsity.ramp_steps}},
      {"extra", o.config_fingerprint},
  };
}

}  // namespace detail
}  // namespace dra::elastic
