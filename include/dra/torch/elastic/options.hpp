#pragma once
// The job contract's options: one table of every option a controller takes, under the names
// Python and C++ share. Python's keywords (dra.Controller(**options), dra.Options), DRA_OPTIONS
// (a JSON object: what `dra run` or a device pool gives every worker) and a C++ program all go
// through it, so a LibTorch trainer started by a launcher gets the options a Python one gets.
// Values are JSON; a bad one throws std::invalid_argument naming the option and the fix.
#include <string>
#include <vector>

#include "dra/torch/elastic/controller.hpp"

namespace dra::elastic {

/// Every option name, sorted (Python: dra.Options.names()).
std::vector<std::string> option_names();

/// Whether `name` is an engine section (estimator, throughput, limits, convergence, goodput,
/// convergence_aware, energy): a config object whose fields Python sets from a dict or an object.
/// From JSON in C++ (DRA_OPTIONS read by a LibTorch trainer) a section is refused with the reason:
/// C++ programs set controller_options::engine directly.
bool is_option_section(const std::string& name);

/// What an option takes, in words ("an integer", "a dict {step: size}"), for error messages.
/// Throws std::invalid_argument for an unknown name, listing the valid ones.
std::string option_expects(const std::string& name);

/// Sets one option from its value as JSON text ("3", "\"exit\"", "{\"10\": 2}"; null keeps the
/// default). Throws std::invalid_argument "<name>: <problem>" (an unknown name lists the valid
/// ones) and leaves `o` unchanged.
void set_option(controller_options& o, const std::string& name, const std::string& json_value);

/// Applies a JSON object of options (DRA_OPTIONS' format) to `o`. `source` names where the text
/// came from in errors ("DRA_OPTIONS: not JSON ..."). Throws std::invalid_argument; `o` is then
/// unchanged.
void apply_options(controller_options& o, const std::string& json_object, const std::string& source = "options");

/// DRA_OPTIONS as a JSON object's text ("{}" when unset or empty), checked to be an object.
std::string environment_options_json();

}  // namespace dra::elastic
