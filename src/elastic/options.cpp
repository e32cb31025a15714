// The controller's configuration: the option table (include/dra/torch/elastic/options.hpp: one
// table for Python's keywords, DRA_OPTIONS and C++), the launch environment, option validation,
// and what every process of a job must agree on.
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
#include "store_protocol.hpp"

namespace dra::elastic {

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

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void check_seconds(double value, const char* option) {
  if (!(std::isfinite(value) && value > 0.0))
    dra::detail::throw_invalid(option, "must be a positive number of seconds, got " + number(value));
}

// ---- the option table -----------------------------------------------------------------------------
// A value shown as Python shows it (options come mostly from Python keywords): 1.5 (float).
std::string shown(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "None (NoneType)";
    case json::value_t::boolean:
      return std::string(v.get<bool>() ? "True" : "False") + " (bool)";
    case json::value_t::string:
      return "'" + v.get<std::string>() + "' (str)";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return v.dump() + " (int)";
    case json::value_t::number_float:
      return number(v.get<double>()) + " (float)";
    case json::value_t::object:
      return v.dump() + " (dict)";
    case json::value_t::array:
      return v.dump() + " (list)";
    default:
      return v.dump();
  }
}

long long as_int(const json& v, const std::string& name, long long lo = 0, long long hi = INT_MAX) {
  if (!v.is_number_integer()) dra::detail::throw_invalid(name, "expected an integer, got " + shown(v));
  if (v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(LLONG_MAX))
    dra::detail::throw_invalid(name,
                               "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  const long long out = v.get<long long>();
  if (out < lo || out > hi)
    dra::detail::throw_invalid(
        name, "must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(out));
  return out;
}

double as_float(const json& v, const std::string& name) {
  if (!v.is_number()) dra::detail::throw_invalid(name, "expected a number, got " + shown(v));
  return v.get<double>();
}

bool as_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) dra::detail::throw_invalid(name, "expected True or False, got " + shown(v));
  return v.get<bool>();
}

std::string as_str(const json& v, const std::string& name) {
  if (!v.is_string()) dra::detail::throw_invalid(name, "expected a string, got " + shown(v));
  return v.get<std::string>();
}

std::string one_of(const json& v, const std::string& name, std::initializer_list<const char*> allowed,
                   const std::string& why = "") {
  const auto s = as_str(v, name);
  for (const char* a : allowed)
    if (s == a) return s;
  std::string list;
  std::size_t i = 0;
  for (const char* a : allowed) {
    list += (i == 0 ? "'" : i + 1 == allowed.size() ? " or '" : ", '") + std::string(a) + "'";
    ++i;
  }
  dra::detail::throw_invalid(name, "must be " + list + why + ", got '" + s + "'");
}

struct option_entry {
  const char* expects;  ///< in words, for the messages of callers that cannot convert a value
  bool section = false;
  std::function<void(controller_options&, const json&)> set;
};

[[noreturn]] void section_from_json(const std::string& name) {
  dra::detail::throw_invalid(name,
                             "an engine section is set from Python (a dict or a dra config object); a C++ program "
                             "sets controller_options::engine directly, and DRA_OPTIONS read in C++ takes the flat "
                             "options only");
}

option_entry section(const char* name) {
  return {"a config object or a dict of its options", true,
          [name](controller_options&, const json&) { section_from_json(name); }};
}

// Every option, by its name in Python and in DRA_OPTIONS. null keeps the default.
const std::map<std::string, option_entry>& option_table() {
  static const std::map<std::string, option_entry> table = {
      {"policy",
       {"a string", false, [](controller_options& o, const json& v) { o.engine.policy = as_str(v, "policy"); }}},
      {"min_size",
       {"an integer", false,
        [](controller_options& o, const json& v) {
          o.engine.limits.min_size = static_cast<int>(as_int(v, "min_size", 1));
        }}},
      {"max_size",
       {"an integer", false,
        [](controller_options& o, const json& v) {
          o.engine.limits.max_size = static_cast<int>(as_int(v, "max_size", 1));
        }}},
      {"decide_every",
       {"an integer", false,
        [](controller_options& o, const json& v) {
          o.engine.decide_every = as_int(v, "decide_every", 1, LLONG_MAX / 4);
        }}},
      {"resize_cost_s",
       {"a number", false,
        [](controller_options& o, const json& v) { o.engine.costs.resize_cost_s = as_float(v, "resize_cost_s"); }}},
      {"horizon_steps",
       {"a number", false,
        [](controller_options& o, const json& v) { o.engine.costs.horizon_steps = as_float(v, "horizon_steps"); }}},
      {"estimator", section("estimator")},
      {"throughput", section("throughput")},
      {"limits", section("limits")},
      {"convergence", section("convergence")},
      {"goodput", section("goodput")},
      {"convergence_aware", section("convergence_aware")},
      {"energy", section("energy")},
      {"start_size",
       {"an integer", false,
        [](controller_options& o, const json& v) { o.start_size = static_cast<int>(as_int(v, "start_size", 1)); }}},
      {"release",
       {"a string", false,
        [](controller_options& o, const json& v) {
          const auto s = one_of(v, "release", {"standby", "exit", "return"});
          o.release = s == "exit"     ? release_mode::exit
                      : s == "return" ? release_mode::to_caller
                                      : release_mode::standby;
        }}},
      {"batch_mode",
       {"a string", false,
        [](controller_options& o, const json& v) {
          o.batch = one_of(v, "batch_mode", {"fixed", "adascale"}, " (global batch kept or adapted)") == "adascale"
                        ? batch_mode::adascale
                        : batch_mode::fixed;
        }}},
      {"resize_schedule",
       {"a dict {step: size}", false,
        [](controller_options& o, const json& v) {
          if (!v.is_object())
            dra::detail::throw_invalid("resize_schedule", "expected a dict {step: size}, got " + shown(v));
          std::map<std::int64_t, int> schedule;
          for (const auto& [key, size] : v.items()) {
            // Keys are strings of digits in JSON (a Python dict's int keys arrive that way too).
            json step;
            try {
              std::size_t used = 0;
              step = std::stoll(key, &used);
              if (used != key.size()) step = key;
            } catch (const std::exception&) {
              step = key;
            }
            schedule[as_int(step, "resize_schedule", 1, LLONG_MAX / 4)] =
                static_cast<int>(as_int(size, "resize_schedule", 1));
          }
          o.resize_schedule = std::move(schedule);
        }}},
      {"fault_timeout_s",
       {"a number", false,
        [](controller_options& o, const json& v) { o.fault_timeout_s = as_float(v, "fault_timeout_s"); }}},
      {"store_timeout_s",
       {"a number", false,
        [](controller_options& o, const json& v) { o.store_timeout_s = as_float(v, "store_timeout_s"); }}},
      {"chunk_mb",
       {"a number", false, [](controller_options& o, const json& v) { o.chunk_mb = as_float(v, "chunk_mb"); }}},
      {"verify",
       {"True or False", false, [](controller_options& o, const json& v) { o.verify = as_bool(v, "verify"); }}},
      {"handoff",
       {"a string", false,
        [](controller_options& o, const json& v) {
          o.deferred_handoff = one_of(v, "handoff", {"full", "deferred"}) == "deferred";
        }}},
      {"capacity_poll_s",
       {"a number", false,
        [](controller_options& o, const json& v) { o.capacity_poll_s = as_float(v, "capacity_poll_s"); }}},
      {"events_path",
       {"a path", false, [](controller_options& o, const json& v) { o.events_path = as_str(v, "events_path"); }}},
      {"status_every",
       {"an integer", false,
        [](controller_options& o, const json& v) { o.status_every = as_int(v, "status_every", 0, LLONG_MAX / 4); }}},
      {"max_resize_retries",
       {"an integer", false,
        [](controller_options& o, const json& v) {
          o.max_resize_retries = static_cast<int>(as_int(v, "max_resize_retries", 0, 1000));
        }}},
      {"backend", {"a string", false, [](controller_options& o, const json& v) { o.backend = as_str(v, "backend"); }}},
      {"backend_address",
       {"a string", false,
        [](controller_options& o, const json& v) { o.backend_address = as_str(v, "backend_address"); }}},
      {"config_fingerprint",
       {"a string", false,
        [](controller_options& o, const json& v) { o.config_fingerprint = as_str(v, "config_fingerprint"); }}},
      {"compress",
       {"a string", false, [](controller_options& o, const json& v) { o.compress = as_str(v, "compress"); }}},
      {"sparsity",
       {"a dict such as {'max_sparsity': 0.9, 'every': 100}", false,
        [](controller_options& o, const json& v) {
          if (!v.is_object())
            dra::detail::throw_invalid("sparsity",
                                       "expected a dict such as {'max_sparsity': 0.9, 'every': 100}, got " + shown(v));
          auto& c = o.sparsity;
          const std::map<std::string, std::function<void(const json&)>> fields = {
              {"max_sparsity", [&](const json& x) { c.max_sparsity = as_float(x, "sparsity.max_sparsity"); }},
              {"every", [&](const json& x) { c.every = as_int(x, "sparsity.every", 1, LLONG_MAX / 4); }},
              {"alpha", [&](const json& x) { c.alpha = as_float(x, "sparsity.alpha"); }},
              {"end_step", [&](const json& x) { c.end_step = as_int(x, "sparsity.end_step", 0, LLONG_MAX / 4); }},
              {"step_up", [&](const json& x) { c.step_up = as_float(x, "sparsity.step_up"); }},
              {"step_down", [&](const json& x) { c.step_down = as_float(x, "sparsity.step_down"); }},
              {"ramp_start", [&](const json& x) { c.ramp_start = as_int(x, "sparsity.ramp_start", 0, LLONG_MAX / 4); }},
              {"ramp_steps", [&](const json& x) { c.ramp_steps = as_int(x, "sparsity.ramp_steps", 0, LLONG_MAX / 4); }},
          };
          for (const auto& [key, value] : v.items()) {
            const auto it = fields.find(key);
            if (it == fields.end()) {
              std::string valid;
              for (const auto& [n, _] : fields) valid += (valid.empty() ? "" : ", ") + n;
              dra::detail::throw_invalid("sparsity", "unknown key '" + key + "'; valid: " + valid);
            }
            it->second(value);
          }
        }}},
  };
  return table;
}

const option_entry& entry(const std::string& name) {
  const auto& table = option_table();
  const auto it = table.find(name);
  if (it == table.end()) {
    std::string valid;
    for (const auto& n : option_names()) valid += (valid.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown option '" + name + "'; valid options: " + valid);
  }
  return it->second;
}

}  // namespace

std::vector<std::string> option_names() {
  std::vector<std::string> out;
  for (const auto& [n, _] : option_table())
    if (n != "config_fingerprint") out.push_back(n);  // internal: Python adds its own options there
  return out;
}

bool is_option_section(const std::string& name) {
  return entry(name).section;
}

std::string option_expects(const std::string& name) {
  return entry(name).expects;
}

void set_option(controller_options& o, const std::string& name, const std::string& json_value) {
  const auto& e = entry(name);
  json v;
  try {
    v = json::parse(json_value);
  } catch (const json::exception&) {
    dra::detail::throw_invalid(name, "expected " + std::string(e.expects) + " as JSON, got '" + json_value + "'");
  }
  if (v.is_null()) return;
  controller_options changed = o;  // a failed option changes nothing
  e.set(changed, v);
  o = std::move(changed);
}

void apply_options(controller_options& o, const std::string& json_object, const std::string& source) {
  json all;
  try {
    all = json::parse(json_object);
  } catch (const json::exception& e) {
    dra::detail::throw_invalid(
        source, std::string("not JSON (") + e.what() + "); expected an object such as '{\"policy\": \"none\"}'");
  }
  if (!all.is_object()) dra::detail::throw_invalid(source, "expected a JSON object of options, got " + shown(all));
  controller_options changed = o;
  // Sections first, then the flat names that reach into them: `min_size` wins over `limits`'.
  for (const bool sections : {true, false})
    for (const auto& [name, value] : all.items())
      if (entry(name).section == sections && !value.is_null()) entry(name).set(changed, value);
  o = std::move(changed);
}

std::string environment_options_json() {
  const std::string text = env_or("DRA_OPTIONS", "");
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return "{}";
  json all;
  try {
    all = json::parse(text);
  } catch (const json::exception& e) {
    dra::detail::throw_invalid(
        "DRA_OPTIONS", std::string("not JSON (") + e.what() + "); expected an object such as '{\"policy\": \"none\"}'");
  }
  if (!all.is_object())
    dra::detail::throw_invalid("DRA_OPTIONS", "expected a JSON object of options, got " + shown(all));
  for (const auto& [name, _] : all.items()) entry(name);  // an unknown name is named now
  return all.dump();
}

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
  const bool any =
      !std::isnan(small_sqr_norm) || !std::isnan(small_batch) || !std::isnan(big_sqr_norm) || !std::isnan(big_batch);
  const bool all =
      !std::isnan(small_sqr_norm) && !std::isnan(small_batch) && !std::isnan(big_sqr_norm) && !std::isnan(big_batch);
  if (any && !all)
    dra::detail::throw_invalid("small_sqr_norm",
                               "gradient statistics need all of small_sqr_norm, small_batch, big_sqr_norm, big_batch");
  if (all && !(small_batch > 0.0 && big_batch > small_batch))
    dra::detail::throw_invalid("big_batch", "needs 0 < small_batch < big_batch, got " + std::to_string(small_batch) +
                                                " and " + std::to_string(big_batch));
  if (!std::isnan(step_time_s) && !(step_time_s > 0.0))
    dra::detail::throw_invalid("step_time_s", "must be > 0 seconds, got " + std::to_string(step_time_s));
  if (!std::isnan(sync_time_s) && !(sync_time_s >= 0.0))
    dra::detail::throw_invalid("sync_time_s", "must be >= 0 seconds, got " + std::to_string(sync_time_s));
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
