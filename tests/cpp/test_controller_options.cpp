// The job contract in C++: the one option table (include/dra/torch/elastic/options.hpp) that
// Python's keywords, DRA_OPTIONS and a C++ program share, and release 0.1's names kept as
// deprecated aliases (docs/guide/compatibility.md).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "dra/torch/elastic/controller.hpp"
#include "dra/torch/elastic/options.hpp"

#undef CHECK
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

using namespace dra::elastic;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("options.table.sets_every_flat_option_from_json") {
  controller_options o;
  set_option(o, "policy", R"("none")");
  set_option(o, "max_size", "4");
  set_option(o, "release", R"("exit")");
  set_option(o, "resize_schedule", R"({"10": 2, "20": 3})");
  set_option(o, "fault_timeout_s", "2");
  set_option(o, "handoff", R"("deferred")");
  set_option(o, "events_path", R"("out/events.jsonl")");
  set_option(o, "start_size", "null");  // null keeps the default
  CHECK(o.engine.policy == "none");
  CHECK(o.engine.limits.max_size == 4);
  CHECK(o.release == release_mode::exit);
  CHECK(o.resize_schedule == std::map<std::int64_t, int>{{10, 2}, {20, 3}});
  CHECK(o.fault_timeout_s == 2.0);
  CHECK(o.deferred_handoff);
  CHECK(o.events_path == "out/events.jsonl");
  CHECK(o.start_size == 0);
  const auto names = option_names();
  CHECK(std::find(names.begin(), names.end(), "resize_schedule") != names.end());
  CHECK(std::find(names.begin(), names.end(), "config_fingerprint") == names.end());
  CHECK(is_option_section("limits"));
  CHECK_FALSE(is_option_section("max_size"));
}

TEST_CASE("options.table.a_bad_value_names_the_option_and_changes_nothing") {
  controller_options o;
  CHECK(error_of([&] { set_option(o, "max_size", "1000000000000"); }).rfind("max_size: must lie in [1, ", 0) == 0);
  CHECK(error_of([&] { set_option(o, "min_size", "1.5"); }) == "min_size: expected an integer, got 1.5 (float)");
  CHECK(error_of([&] { set_option(o, "verify", "1"); }) == "verify: expected True or False, got 1 (int)");
  CHECK(error_of([&] { set_option(o, "release", R"("later")"); }) ==
        "release: must be 'standby', 'exit' or 'return', got 'later'");
  CHECK(error_of([&] { set_option(o, "cooldown", "3"); }).rfind("unknown option 'cooldown'; valid options: ", 0) == 0);
  CHECK(error_of([&] { set_option(o, "resize_schedule", R"({"x": 2})"); }).rfind("resize_schedule:", 0) == 0);
  CHECK(error_of([&] { apply_options(o, R"({"limits": {"min_size": 2}})"); }).rfind("limits: an engine section", 0) ==
        0);
  CHECK(error_of([&] { apply_options(o, "[1]", "DRA_OPTIONS"); }) ==
        "DRA_OPTIONS: expected a JSON object of options, got [1] (list)");
  CHECK(error_of([&] { apply_options(o, "{", "DRA_OPTIONS"); }).rfind("DRA_OPTIONS: not JSON", 0) == 0);
  CHECK(error_of([&] { apply_options(o, R"({"policy": "none", "max_size": 0})"); }).rfind("max_size:", 0) == 0);
  CHECK(o.engine.policy == controller_options{}.engine.policy);  // the failed object changed nothing
}

TEST_CASE("options.from_env.reads_dra_options_as_a_launcher_sets_it") {
  ::setenv("DRA_OPTIONS", R"({"policy": "none", "release": "exit", "max_size": 3, "fault_timeout_s": 1.5})", 1);
  const auto o = controller_options::from_env();
  CHECK(o.engine.policy == "none");
  CHECK(o.release == release_mode::exit);
  CHECK(o.engine.limits.max_size == 3);
  CHECK(o.fault_timeout_s == 1.5);
  ::setenv("DRA_OPTIONS", R"({"nope": 1})", 1);
  CHECK(error_of([] { controller_options::from_env(); }).rfind("unknown option 'nope'", 0) == 0);
  ::setenv("DRA_OPTIONS", "  ", 1);
  CHECK(controller_options::from_env().engine.policy == controller_options{}.engine.policy);
  ::unsetenv("DRA_OPTIONS");
}

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
TEST_CASE("options.deprecated.release_0_1_names_are_adopted") {
  controller_options o;
  o.schedule = {{20, 3}};
  o.decide_every = 7;
  o.fault_timeout = std::chrono::milliseconds(2500);
  o.store_timeout = std::chrono::milliseconds(12000);
  o.chunk_bytes = 1u << 20;
  o.gloo_hostname = "127.0.0.1";
  o.start_size = -1;
  std::string seen;
  o.phase_hook = [&seen](const std::string& phase, const controller&) { seen = phase; };  // 0.1's signature
  o.adopt_deprecated_names();
  CHECK(o.resize_schedule == std::map<std::int64_t, int>{{20, 3}});
  CHECK(o.engine.decide_every == 7);
  CHECK(o.fault_timeout_s == 2.5);
  CHECK(o.store_timeout_s == 12.0);
  CHECK(o.chunk_mb == 1.0);
  CHECK(o.backend_address == "127.0.0.1");
  CHECK(o.start_size == 0);
  CHECK(o.schedule.empty());
  CHECK(o.fault_timeout_ms() == std::chrono::milliseconds(2500));
  o.validate();
  controller alone(o);  // a local controller: the hook is only called in world changes
  o.phase_hook(change_phase::state_transfer, alone);
  CHECK(seen == "state_transfer");
  const step_result& r = alone.step(1.0);  // 0.1's name of step_status
  CHECK(r.committed);
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

TEST_CASE("controller.stop.request_is_a_flag_alone") {
  controller alone(controller_options{});
  CHECK_FALSE(alone.stop_requested());
  alone.request_stop();
  CHECK(alone.stop_requested());
  CHECK(alone.rank() == 0);
  CHECK(alone.is_leader());
}

TEST_CASE("controller.step_signals.overflowed_norms_and_a_world_of_one_are_not_errors") {
  // A mixed-precision step whose gradients overflowed has NaN/inf norms beside its batches: counted
  // as non-finite by the estimator, never an error that ends training. Equal batches are a world of
  // one (big_batch = world size x small_batch). Timings the throughput model would drop are refused.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  step_signals s;
  s.small_batch = 8.0;
  s.big_batch = 16.0;
  s.small_sqr_norm = nan;
  s.big_sqr_norm = inf;
  CHECK_NOTHROW(s.validate());
  s.small_sqr_norm = s.big_sqr_norm = 1.0;
  s.big_batch = 8.0;
  CHECK_NOTHROW(s.validate());
  s.big_batch = 4.0;
  CHECK(error_of([&] { s.validate(); }).rfind("big_batch: needs 0 < small_batch <= big_batch", 0) == 0);
  step_signals partial;
  partial.small_sqr_norm = 1.0;
  CHECK(error_of([&] { partial.validate(); }).find("gradient statistics need all of") != std::string::npos);
  step_signals timing;
  timing.sync_time_s = 0.01;
  CHECK(error_of([&] { timing.validate(); }).rfind("sync_time_s: is the part of step_time_s", 0) == 0);
  timing.step_time_s = inf;
  CHECK(error_of([&] { timing.validate(); }).rfind("step_time_s: must be a finite number", 0) == 0);
  timing.step_time_s = 0.005;
  CHECK(error_of([&] { timing.validate(); }).find("exceeds step_time_s") != std::string::npos);
  timing.step_time_s = 0.1;
  CHECK_NOTHROW(timing.validate());
}
