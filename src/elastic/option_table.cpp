// The controller's option table (include/dra/torch/elastic/options.hpp): one table for Python's
// keywords, DRA_OPTIONS and C++, each option with its parser, its check and what it expects.
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dra/error.hpp"
#include "dra/torch/elastic/codec_hook.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "dra/torch/elastic/options.hpp"
#include "small.hpp"

namespace dra::elastic {

using detail::number;

namespace {

using json = nlohmann::json;

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
      {"heal", {"True or False", false, [](controller_options& o, const json& v) { o.heal = as_bool(v, "heal"); }}},
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
  const char* env = std::getenv("DRA_OPTIONS");
  const std::string text = env != nullptr ? env : "";
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

}  // namespace dra::elastic
