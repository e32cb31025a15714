// Bindings of RL post-training's stage balance (include/dra/rl/stage_balance.hpp) and the RL
// pipeline simulators (include/dra/rl/pipeline.hpp: phases; events.hpp: event by event, in-step
// moves). Results come back as plain dicts (to_dict.hpp, from the result classes bound here) so
// dra.rl writes JSON, tables and plots without further glue.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "dra/rl/events.hpp"
#include "dra/rl/pipeline.hpp"
#include "dra/rl/stage_balance.hpp"
#include "kwargs_init.hpp"
#include "rl_snapshot.hpp"
#include "to_dict.hpp"

namespace py = pybind11;
using namespace dra::policy;
using namespace dra::sim;

namespace {

rl_pipeline pipeline_from(const std::string& name) {
  if (name == "one_step_off") return rl_pipeline::one_step_off;
  if (name == "synchronous") return rl_pipeline::synchronous;
  throw py::value_error("pipeline: unknown pipeline '" + name + "'; use 'one_step_off' or 'synchronous'");
}

stage_action direction_from(const std::string& name) {
  if (name == "to_rollout") return stage_action::to_rollout;
  if (name == "to_train") return stage_action::to_train;
  throw py::value_error("direction: unknown direction '" + name + "'; use 'to_rollout' or 'to_train'");
}

// A switch's cost by part (a dict of its own in the results).
struct switch_cost_split {
  double agree_s, rebuild_s, weights_s, optimizer_s, rollout_start_s;
};

}  // namespace

void dra::python::bind_rl(py::module_& m) {
  py::class_<dra::signals::quantile_sketch_config> qcfg(
      m, "QuantileSketchConfig", "Relative accuracy, value range and half-life of a quantile sketch.");
  def_kwargs_init<dra::signals::quantile_sketch_config>(qcfg);
  qcfg.def_readwrite("relative_accuracy", &dra::signals::quantile_sketch_config::relative_accuracy)
      .def_readwrite("min_value", &dra::signals::quantile_sketch_config::min_value)
      .def_readwrite("max_value", &dra::signals::quantile_sketch_config::max_value)
      .def_readwrite("half_life", &dra::signals::quantile_sketch_config::half_life,
                     "Observations after which an observation's weight has halved; 0: no forgetting.")
      .def("validate", &dra::signals::quantile_sketch_config::validate);

  py::class_<dra::signals::quantile_sketch>(
      m, "QuantileSketch", "Streaming quantiles with exponential forgetting (log-spaced bins, DDSketch-style).")
      .def(py::init<dra::signals::quantile_sketch_config>(),
           py::arg_v("config", dra::signals::quantile_sketch_config{}, "QuantileSketchConfig()"))
      .def("add", &dra::signals::quantile_sketch::add, py::arg("value"))
      .def("quantile", &dra::signals::quantile_sketch::quantile, py::arg("q"))
      .def("expected_max_of", &dra::signals::quantile_sketch::expected_max_of, py::arg("n"),
           "Median of the longest of n draws: the quantile 0.5^(1/n).")
      .def_property_readonly("mean", &dra::signals::quantile_sketch::mean)
      .def_property_readonly("second_moment", &dra::signals::quantile_sketch::second_moment)
      .def_property_readonly("effective_count", &dra::signals::quantile_sketch::effective_count)
      .def_property_readonly("observations", &dra::signals::quantile_sketch::observations)
      .def_property_readonly("rejected", &dra::signals::quantile_sketch::rejected)
      .def_property_readonly("clamped", &dra::signals::quantile_sketch::clamped);

  py::class_<generation_model_config> gcfg(m, "GenerationModelConfig",
                                           "Decode slots and priors of the generation model.");
  def_kwargs_init<generation_model_config>(gcfg);
  gcfg.def_readwrite("max_concurrency", &generation_model_config::max_concurrency)
      .def_readwrite("kv_capacity_tokens", &generation_model_config::kv_capacity_tokens,
                     "Tokens of context one rollout device's KV cache holds (0: not limited).")
      .def_readwrite("prior_iteration_fixed_s", &generation_model_config::prior_iteration_fixed_s)
      .def_readwrite("prior_iteration_per_sequence_s", &generation_model_config::prior_iteration_per_sequence_s)
      .def_readwrite("prior_iteration_per_kilotoken_s", &generation_model_config::prior_iteration_per_kilotoken_s)
      .def_readwrite("prior_weight", &generation_model_config::prior_weight)
      .def_readwrite("forgetting", &generation_model_config::forgetting)
      .def("validate", &generation_model_config::validate);

  py::class_<stage_balance_config> scfg(
      m, "StageBalanceConfig",
      "Devices, role minimums, pipeline, cooldown, hysteresis and payback of the stage-balance policy.");
  def_kwargs_init<stage_balance_config>(scfg);
  scfg.def_readwrite("devices", &stage_balance_config::devices)
      .def_readwrite("min_rollout", &stage_balance_config::min_rollout)
      .def_readwrite("min_train", &stage_balance_config::min_train)
      .def_property(
          "pipeline", [](const stage_balance_config& c) { return std::string(to_string(c.pipeline)); },
          [](stage_balance_config& c, const std::string& v) { c.pipeline = pipeline_from(v); },
          "'one_step_off' (max of the stages) or 'synchronous' (their sum).")
      .def_readwrite("cooldown_steps", &stage_balance_config::cooldown_steps)
      .def_readwrite("hysteresis_decisions", &stage_balance_config::hysteresis_decisions)
      .def_readwrite("max_move", &stage_balance_config::max_move)
      .def_readwrite("min_relative_gain", &stage_balance_config::min_relative_gain)
      .def_readwrite("max_payback_steps", &stage_balance_config::max_payback_steps)
      .def_readwrite("prior_switch_cost_s", &stage_balance_config::prior_switch_cost_s)
      .def_readwrite("switch_cost_smoothing", &stage_balance_config::switch_cost_smoothing)
      .def_readwrite("weight_sync_smoothing", &stage_balance_config::weight_sync_smoothing)
      .def_readwrite("batch_smoothing", &stage_balance_config::batch_smoothing,
                     "Weight of a new batch in the measured scale of the fresh-batch model.")
      .def_readwrite("group_size", &stage_balance_config::group_size,
                     "Samples per prompt (GRPO's group): their lengths move together, so a step varies like "
                     "sequences / group_size independent draws (1: independent).")
      .def_readwrite("expected_max", &stage_balance_config::expected_max,
                     "One-step-off objective: E[max(rollout, train)] over the batches' spread (True), or the max "
                     "of the two means (False).")
      .def_readwrite("planner", &stage_balance_config::planner,
                     "How the dynamic run decides, live and in the event simulator: 'window' (decide_window) or "
                     "'lookahead' (StageBalancePolicy.plan on the leader's snapshot: trainer counts tried on the event "
                     "model with the fitted costs and drawn lengths).")
      .def_readwrite("lookahead_draws", &stage_balance_config::lookahead_draws,
                     "planner='lookahead': draws of the lengths not generated yet per decision.")
      .def_readwrite("lookahead_max_move", &stage_balance_config::lookahead_max_move,
                     "planner='lookahead': most devices moved by one decision.")
      .def_readwrite("lookahead_terminal_steps", &stage_balance_config::lookahead_terminal_steps,
                     "planner='lookahead': more times a trial counts its split's last step (the value of a move "
                     "after the horizon).")
      .def_readwrite("lengths", &stage_balance_config::lengths)
      .def_readwrite("generation", &stage_balance_config::generation)
      .def_readwrite("training", &stage_balance_config::training)
      .def("validate", &stage_balance_config::validate);

  def_to_dict(py::class_<generation_model>(m, "GenerationModel",
                                           "The decode-time fit of the stage-balance policy (generation_fit)."))
      .def_property_readonly("fixed_s", &generation_model::fixed_s)
      .def_property_readonly("per_sequence_s", &generation_model::per_sequence_s)
      .def_property_readonly("per_kilotoken_s", &generation_model::per_kilotoken_s)
      .def_property_readonly("observations", &generation_model::observations);
  // The results, as dicts: each property is named after its key (None where a payback is never
  // reached), a run's phases as columns.
  def_to_dict(py::class_<stage_prediction>(m, "StagePrediction", "Predicted stage and step times of one split."))
      .def_readonly("rollout", &stage_prediction::rollout)
      .def_readonly("train", &stage_prediction::train)
      .def_readonly("rollout_s", &stage_prediction::rollout_s)
      .def_readonly("train_s", &stage_prediction::train_s)
      .def_readonly("rollout_sd_s", &stage_prediction::rollout_sd_s)
      .def_readonly("train_sd_s", &stage_prediction::train_sd_s)
      .def_readonly("weight_sync_s", &stage_prediction::weight_sync_s)
      .def_readonly("step_s", &stage_prediction::step_s);
  def_to_dict(py::class_<stage_decision>(m, "StageDecision", "A stage-balance decision and what it predicts."))
      .def_property_readonly("action", [](const stage_decision& d) { return std::string(to_string(d.kind)); })
      .def_readonly("rollout", &stage_decision::rollout)
      .def_readonly("train", &stage_decision::train)
      .def_readonly("moved", &stage_decision::moved)
      .def_readonly("current", &stage_decision::current)
      .def_readonly("target", &stage_decision::target)
      .def_readonly("switch_cost_s", &stage_decision::switch_cost_s)
      .def_property_readonly("payback_steps", finite_or_none(&stage_decision::payback_steps))
      .def_readonly("reason", &stage_decision::reason);
  def_to_dict(py::class_<rl_phase_record>(m, "RlPhase", "One phase of a simulated RL run."))
      .def_readonly("phase", &rl_phase_record::phase)
      .def_readonly("rollout", &rl_phase_record::rollout)
      .def_readonly("train", &rl_phase_record::train)
      .def_readonly("trained_sequences", &rl_phase_record::trained_sequences)
      .def_readonly("start_s", &rl_phase_record::start_s)
      .def_readonly("duration_s", &rl_phase_record::duration_s)
      .def_readonly("rollout_s", &rl_phase_record::rollout_s)
      .def_readonly("train_s", &rl_phase_record::train_s)
      .def_readonly("idle_device_s", &rl_phase_record::idle_device_s)
      .def_readonly("switch_total_s", &rl_phase_record::switch_total_s)
      .def_readonly("switch_exposed_s", &rl_phase_record::switch_exposed_s)
      .def_readonly("mean_length", &rl_phase_record::mean_length)
      .def_readonly("longest", &rl_phase_record::longest)
      .def_readonly("predicted_s", &rl_phase_record::predicted_s)
      .def_readonly("action", &rl_phase_record::action);
  def_to_dict(py::class_<switch_cost_split>(m, "RlSwitchCostSplit", "A switch's cost by part (seconds)."))
      .def_readonly("agree_s", &switch_cost_split::agree_s)
      .def_readonly("rebuild_s", &switch_cost_split::rebuild_s)
      .def_readonly("weights_s", &switch_cost_split::weights_s)
      .def_readonly("optimizer_s", &switch_cost_split::optimizer_s)
      .def_readonly("rollout_start_s", &switch_cost_split::rollout_start_s);
  def_to_dict(py::class_<rl_switch_record>(m, "RlSwitch", "One switch of a simulated RL run."))
      .def_readonly("phase", &rl_switch_record::phase)
      .def_readonly("direction", &rl_switch_record::direction)
      .def_readonly("moved", &rl_switch_record::moved)
      .def_property_readonly("cost_split",
                             [](const rl_switch_record& s) {
                               return switch_cost_split{s.agree_s, s.rebuild_s, s.weights_s, s.optimizer_s,
                                                        s.rollout_start_s};
                             })
      .def_readonly("total_s", &rl_switch_record::total_s)
      .def_readonly("exposed_s", &rl_switch_record::exposed_s)
      .def_readonly("hidden_s", &rl_switch_record::hidden_s)
      .def_property_readonly("payback_steps", finite_or_none(&rl_switch_record::payback_steps))
      .def_property_readonly("predicted_payback_steps", finite_or_none(&rl_switch_record::predicted_payback_steps))
      .def_readonly("reason", &rl_switch_record::reason);
  def_to_dict(py::class_<rl_run_result>(m, "RlRun", "One schedule of a simulated RL run: totals, phases, switches."))
      .def_readonly("name", &rl_run_result::name)
      .def_readonly("rollout", &rl_run_result::rollout)
      .def_readonly("steps", &rl_run_result::steps)
      .def_readonly("total_s", &rl_run_result::total_s)
      .def_readonly("samples_per_s", &rl_run_result::samples_per_s)
      .def_readonly("generated_tokens_per_s", &rl_run_result::generated_tokens_per_s)
      .def_readonly("bubble_fraction", &rl_run_result::bubble_fraction)
      .def_readonly("mean_rollout_devices", &rl_run_result::mean_rollout_devices)
      .def_readonly("switches", &rl_run_result::switches)
      .def_readonly("switch_total_s", &rl_run_result::switch_total_s)
      .def_readonly("switch_exposed_s", &rl_run_result::switch_exposed_s)
      .def_readonly("hidden_fraction", &rl_run_result::hidden_fraction)
      .def_property_readonly(
          "phases", [](const rl_run_result& r) { return columns(r.phases); }, "The phases as columns.")
      .def_readonly("switch_log", &rl_run_result::switch_log)
      .def_readonly("generated_sequences", &rl_run_result::generated_sequences)
      .def_readonly("trained_sequences", &rl_run_result::trained_sequences)
      .def_readonly("exactly_once", &rl_run_result::exactly_once)
      .def_readonly("tail_share", &rl_run_result::tail_share)
      .def_readonly("rollout_share", &rl_run_result::rollout_share)
      .def_property_readonly(
          "roles", [](const rl_run_result& r) { return columns(r.roles); }, "Devices per role over time, as columns.");
  def_to_dict(py::class_<rl_role_sample>(m, "RlRoleSample", "Devices per role at one time of an event-simulated run."))
      .def_readonly("t", &rl_role_sample::t)
      .def_readonly("rollout", &rl_role_sample::rollout)
      .def_readonly("train", &rl_role_sample::train)
      .def_readonly("moving", &rl_role_sample::moving);
  def_to_dict(py::class_<window_decision>(m, "WindowDecision", "A stage-balance decision at a trainers' boundary."))
      .def_property_readonly("action", [](const window_decision& w) { return std::string(to_string(w.kind)); })
      .def_readonly("moved", &window_decision::moved)
      .def_readonly("train", &window_decision::train)
      .def_readonly("wait_s", &window_decision::wait_s)
      .def_readonly("predicted_current_s", &window_decision::predicted_current_s)
      .def_readonly("predicted_target_s", &window_decision::predicted_target_s)
      .def_readonly("switch_cost_s", &window_decision::switch_cost_s)
      .def_property_readonly("payback_steps", finite_or_none(&window_decision::payback_steps))
      .def_readonly("reason", &window_decision::reason);
  def_to_dict(py::class_<rl_sweep_result>(m, "RlSweep", "Every static split, the policy, the oracle and colocation."))
      .def_readonly("length_source", &rl_sweep_result::length_source)
      .def_readonly("statics", &rl_sweep_result::statics)
      .def_readonly("best_static", &rl_sweep_result::best_static)
      .def_readonly("dynamic", &rl_sweep_result::dynamic)
      .def_readonly("oracle", &rl_sweep_result::oracle)
      .def_readonly("colocated", &rl_sweep_result::colocated);

  py::class_<stage_balance_policy>(
      m, "StageBalancePolicy",
      "How many devices generate and how many train, and when moving one pays (RL post-training).")
      .def(py::init<stage_balance_config>(), py::arg_v("config", stage_balance_config{}, "StageBalanceConfig()"))
      .def_property_readonly("config", &stage_balance_policy::config)
      .def("observe_generation", &stage_balance_policy::observe_generation, py::arg("prompt_tokens"),
           py::arg("generated_tokens"), "One finished generation.")
      .def("observe_decode", &stage_balance_policy::observe_decode, py::arg("concurrency"), py::arg("context_tokens"),
           py::arg("iterations"), py::arg("seconds"),
           "Measured decode iterations of one rollout device; False when ignored.")
      .def("observe_train", &stage_balance_policy::observe_train, py::arg("devices"), py::arg("tokens_per_device"),
           py::arg("step_s"), py::arg("sync_s"), "One measured training step; False when ignored.")
      .def("observe_weight_sync", &stage_balance_policy::observe_weight_sync, py::arg("seconds"))
      .def("observe_engine_start", &stage_balance_policy::observe_engine_start, py::arg("seconds"),
           "A rollout engine started on a device that left the trainers.")
      .def("observe_batch", &stage_balance_policy::observe_batch, py::arg("rollout"), py::arg("sequences"),
           py::arg("seconds"),
           "A batch generated in `seconds` (first handed out to last finished) on `rollout` devices on average; "
           "False when ignored.")
      .def(
          "decide_window",
          [](stage_balance_policy& p, int rollout, int train, int idle_rollout, std::int64_t step,
             std::int64_t remaining_steps, int sequences_per_step, int updates_per_step, int updates_left,
             bool wait_complete, int wait_queued, std::vector<double> wait_in_flight, bool next_exists, int next_queued,
             std::vector<double> next_in_flight) {
            window_state w;
            w.rollout = rollout;
            w.train = train;
            w.idle_rollout = idle_rollout;
            w.step = step;
            w.remaining_steps = remaining_steps;
            w.sequences_per_step = sequences_per_step;
            w.updates_per_step = updates_per_step;
            w.updates_left = updates_left;
            w.wait_complete = wait_complete;
            w.wait_queued = wait_queued;
            w.wait_in_flight = std::move(wait_in_flight);
            w.next_exists = next_exists;
            w.next_queued = next_queued;
            w.next_in_flight = std::move(next_in_flight);
            return dict_of(p.decide_window(w));
          },
          py::kw_only(), py::arg("rollout"), py::arg("train"), py::arg("idle_rollout"), py::arg("step"),
          py::arg("remaining_steps") = -1, py::arg("sequences_per_step") = 1, py::arg("updates_per_step") = 1,
          py::arg("updates_left") = 1, py::arg("wait_complete") = true, py::arg("wait_queued") = 0,
          py::arg("wait_in_flight") = std::vector<double>{}, py::arg("next_exists") = true, py::arg("next_queued") = 0,
          py::arg("next_in_flight") = std::vector<double>{},
          "One decision at a boundary of the trainers' world without a per-phase barrier: in a step's window "
          "(updates_left == updates_per_step) or between two updates. Feed every one, in order.")
      .def(
          "plan",
          [](stage_balance_policy& p, const py::dict& snapshot) {
            const pipeline_snapshot s = snapshot_from(snapshot);
            planner_move mv;
            {
              py::gil_scoped_release unlocked;
              mv = rl_event_sim::plan(s, p);
            }
            py::dict out;
            out["trainers"] = mv.trainers;
            out["leave"] = mv.leave;
            out["join"] = mv.join;
            out["reason"] = mv.reason;
            return out;
          },
          py::arg("snapshot"),
          "The look-ahead planner on a leader's view of its pipeline (include/dra/rl/snapshot.hpp): every "
          "trainer count within lookahead_max_move tried on the event model with the costs fitted here "
          "(lookahead_draws draws of the lengths not generated yet); returns {'trainers', 'leave', 'join', "
          "'reason'} (slots that leave the trainers / join them; both empty: hold). The simulator's "
          "planner='lookahead' runs the same call on its own state. Keys: now_s, seed, steps, "
          "prompts_per_step, group_size, updates_per_step, prompt_tokens, max_generation_tokens, "
          "max_concurrency, [kv_capacity_tokens, kv_watermark, kv_reserve_ratio, horizon_windows], step, "
          "[update, training], published, [trainers_free_s], members (the trainers' slots, leader first), "
          "slots (per slot: role 'rollout'/'train'/'starting', version, clock_s, in_flight [(id, generated"
          "[, admitted_at])], waiting [(id, generated)]), batches (from `step` on: open, opened_s, "
          "complete_s, rollout_at_open, remaining, queued: per slot, ids), lengths (per batch, per "
          "sequence: the finished length, 0 if not finished), [last_switch: agree_s, rebuild_s, weights_s, "
          "optimizer_s]. A sequence's id is batch * sequences_per_step + prompt * group_size + sample.")
      .def("token_cost_s", &stage_balance_policy::token_cost_s,
           "Decode seconds per token at the observed operating point.")
      .def(
          "observe_switch",
          [](stage_balance_policy& p, const std::string& direction, double exposed_s) {
            p.observe_switch(direction_from(direction), exposed_s);
          },
          py::arg("direction"), py::arg("exposed_s"), "A measured switch: the seconds it lengthened its step.")
      .def(
          "switch_cost_s",
          [](const stage_balance_policy& p, const std::string& d) { return p.switch_cost_s(direction_from(d)); },
          py::arg("direction"))
      .def(
          "predict",
          [](const stage_balance_policy& p, int rollout, int sequences) {
            return dict_of(p.predict(rollout, sequences));
          },
          py::arg("rollout"), py::arg("sequences"))
      .def(
          "predict_all", [](const stage_balance_policy& p, int sequences) { return list_of(p.predict_all(sequences)); },
          py::arg("sequences"))
      .def(
          "decide",
          [](stage_balance_policy& p, int rollout, int train, std::int64_t step, std::int64_t steps_since_switch,
             std::int64_t remaining_steps, int sequences_per_step) {
            stage_state s;
            s.rollout = rollout;
            s.train = train;
            s.step = step;
            s.steps_since_switch = steps_since_switch;
            s.remaining_steps = remaining_steps;
            s.sequences_per_step = sequences_per_step;
            return dict_of(p.decide(s));
          },
          py::arg("rollout"), py::arg("train"), py::arg("step"), py::arg("steps_since_switch"),
          py::arg("remaining_steps") = -1, py::arg("sequences_per_step") = 1,
          "One decision at a step boundary (feed every one, in order).")
      .def_property_readonly("lengths", &stage_balance_policy::lengths, py::return_value_policy::reference_internal)
      .def_property_readonly("weight_sync_s", &stage_balance_policy::weight_sync_s)
      .def_property_readonly("generation_fit", [](const stage_balance_policy& p) {
        return to_dict(py::cast(&p.generation(), py::return_value_policy::reference));
      });

  py::class_<reasoning_lengths> rcfg(m, "ReasoningLengths",
                                     "Parametric reasoning-length generations: log-normal per prompt, hard prompts, "
                                     "correlated GRPO groups (data/rl-lengths/README.md).");
  def_kwargs_init<reasoning_lengths>(rcfg);
  rcfg.def_readwrite("median_tokens", &reasoning_lengths::median_tokens)
      .def_readwrite("prompt_sigma", &reasoning_lengths::prompt_sigma)
      .def_readwrite("group_sigma", &reasoning_lengths::group_sigma)
      .def_readwrite("tail_weight", &reasoning_lengths::tail_weight)
      .def_readwrite("tail_factor", &reasoning_lengths::tail_factor)
      .def("validate", &reasoning_lengths::validate);

  py::class_<rl_workload> wcfg(m, "RlWorkload",
                               "Steps, batch, prompt tokens, length scale/drift/limit and seed of a simulated RL run.");
  def_kwargs_init<rl_workload>(wcfg);
  wcfg.def_readwrite("steps", &rl_workload::steps)
      .def_readwrite("prompts_per_step", &rl_workload::prompts_per_step)
      .def_readwrite("group_size", &rl_workload::group_size)
      .def_readwrite("prompt_tokens", &rl_workload::prompt_tokens)
      .def_readwrite("length_scale", &rl_workload::length_scale)
      .def_readwrite("drift_final_scale", &rl_workload::drift_final_scale)
      .def_readwrite("max_generation_tokens", &rl_workload::max_generation_tokens)
      .def_readwrite("seed", &rl_workload::seed)
      .def_readwrite("updates_per_step", &rl_workload::updates_per_step,
                     "Optimizer steps per training step (mini-batches; event simulator).")
      .def_property(
          "lengths",
          [](const rl_workload& w) {
            return std::string(w.lengths == length_model::reasoning ? "reasoning" : "trace");
          },
          [](rl_workload& w, const std::string& v) {
            if (v == "trace")
              w.lengths = length_model::trace;
            else if (v == "reasoning")
              w.lengths = length_model::reasoning;
            else
              throw py::value_error("lengths: unknown length model '" + v + "'; use 'trace' or 'reasoning'");
          },
          "'trace' (lengths drawn from the given distribution) or 'reasoning' (the parametric model).")
      .def_readwrite("reasoning", &rl_workload::reasoning)
      .def("validate", &rl_workload::validate);

  py::class_<rl_cost_model> ccfg(m, "RlCostModel", "The RL simulator's ground-truth costs (seconds).");
  def_kwargs_init<rl_cost_model>(ccfg);
  ccfg.def_readwrite("max_concurrency", &rl_cost_model::max_concurrency)
      .def_readwrite("decode_fixed_s", &rl_cost_model::decode_fixed_s)
      .def_readwrite("decode_per_sequence_s", &rl_cost_model::decode_per_sequence_s)
      .def_readwrite("decode_per_kilotoken_s", &rl_cost_model::decode_per_kilotoken_s)
      .def_readwrite("train_fixed_s", &rl_cost_model::train_fixed_s)
      .def_readwrite("train_per_token_s", &rl_cost_model::train_per_token_s)
      .def_readwrite("sync_fixed_s", &rl_cost_model::sync_fixed_s)
      .def_readwrite("sync_per_rank_s", &rl_cost_model::sync_per_rank_s)
      .def_readwrite("weight_sync_s", &rl_cost_model::weight_sync_s)
      .def_readwrite("switch_agree_s", &rl_cost_model::switch_agree_s)
      .def_readwrite("switch_rebuild_s", &rl_cost_model::switch_rebuild_s)
      .def_readwrite("switch_weights_s", &rl_cost_model::switch_weights_s)
      .def_readwrite("switch_optimizer_s", &rl_cost_model::switch_optimizer_s)
      .def_readwrite("rollout_start_s", &rl_cost_model::rollout_start_s)
      .def_readwrite("colocated_switch_s", &rl_cost_model::colocated_switch_s)
      .def_readwrite("kv_capacity_tokens", &rl_cost_model::kv_capacity_tokens,
                     "KV-cache budget of a rollout device, tokens of context (0: unlimited).")
      .def_readwrite("kv_watermark", &rl_cost_model::kv_watermark)
      .def_readwrite("kv_reserve_ratio", &rl_cost_model::kv_reserve_ratio,
                     "Admission reserves this fraction of a sequence's remaining limit (0: vLLM-like greedy).")
      .def_readwrite("prefill_per_kilotoken_s", &rl_cost_model::prefill_per_kilotoken_s)
      .def_readwrite("weight_load_s", &rl_cost_model::weight_load_s)
      .def("validate", &rl_cost_model::validate);

  m.def(
      "rl_read_lengths",
      [](const std::string& path, const std::string& column) {
        return length_distribution::from_csv(path, column).values;
      },
      py::arg("path"), py::arg("column") = "GeneratedTokens",
      "One numeric column of a CSV (default: the Azure trace's GeneratedTokens); errors name file, line and column.");

  m.def(
      "rl_draw_lengths",
      [](const rl_workload& workload, const std::vector<double>& lengths) {
        return draw_batches(length_distribution{lengths, "given"}, workload);
      },
      py::arg_v("workload", rl_workload{}, "RlWorkload()"), py::arg("lengths") = std::vector<double>{},
      "Every step's generation lengths as the simulators draw them (a group's samples adjacent).");

  m.def(
      "rl_sim_events",
      [](const std::vector<double>& lengths, const std::string& source, int devices, const rl_workload& workload,
         const rl_cost_model& costs, const stage_balance_config& policy, int initial_rollout, int oracle_lookahead,
         const std::function<void(int, int)>& progress, int lookahead_samples) {
        if (lookahead_samples < 0)
          dra::detail::throw_invalid("lookahead_samples", "must be >= 0 (0: no look-ahead references), got " +
                                                              std::to_string(lookahead_samples));
        length_distribution dist{lengths, source};
        rl_event_config c;
        c.devices = devices;
        c.workload = workload;
        c.costs = costs;
        c.policy = policy;
        c.initial_rollout = initial_rollout;
        c.oracle_lookahead = oracle_lookahead;
        rl_event_report r;
        std::vector<rl_run_result> references;  // lookahead_samples > 0: paid oracle, look-aheads
        {
          const rl_event_sim sim(dist, c);
          py::gil_scoped_release release;
          int runs = 0;
          r = sim.report([&](int done, int total) {
            runs = total;
            if (!progress) return;
            py::gil_scoped_acquire acquire;
            progress(done, total + (lookahead_samples > 0 ? 3 : 0));
          });
          const auto tick = [&] {
            if (!progress) return;
            py::gil_scoped_acquire acquire;
            progress(runs + static_cast<int>(references.size()), runs + 3);
          };
          if (lookahead_samples > 0) {
            references.push_back(sim.run_oracle(false));
            tick();
            references.push_back(sim.run_lookahead_sampled(lookahead_samples, 2, true));
            tick();
            references.push_back(sim.run_lookahead_sampled(lookahead_samples, 2, false));
            tick();
          }
        }
        py::dict d;
        d["length_source"] = r.length_source;
        d["barrier_free"] = list_of(r.barrier_free);
        d["barrier"] = list_of(r.barrier);
        d["synchronous"] = list_of(r.synchronous);
        d["best_barrier_free"] = r.best_barrier_free;
        d["best_barrier"] = r.best_barrier;
        d["best_synchronous"] = r.best_synchronous;
        d["dynamic"] = dict_of(r.dynamic);
        d["dynamic_lookahead"] = dict_of(r.lookahead);
        d["oracle_within_step"] = dict_of(r.oracle);
        d["colocated"] = dict_of(r.colocated);
        if (!references.empty()) {
          py::dict refs;
          for (const auto& x : references) refs[py::str(x.name)] = dict_of(x);
          d["references"] = refs;
        }
        return d;
      },
      py::arg("lengths"), py::arg("source"), py::arg("devices") = 8,
      py::arg_v("workload", rl_workload{}, "RlWorkload()"), py::arg_v("costs", rl_cost_model{}, "RlCostModel()"),
      py::arg_v("policy", stage_balance_config{}, "StageBalanceConfig()"), py::arg("initial_rollout") = 0,
      py::arg("oracle_lookahead") = 2, py::arg("progress") = nullptr, py::arg("lookahead_samples") = 0,
      "The event simulator: every static split one-step-off without and with the per-phase barrier and "
      "synchronous, the stage-balance policy moving devices inside a step, the within-step oracle and "
      "colocated time sharing, on the same lengths; with lookahead_samples > 0 also the references "
      "oracle_within_step_paid, lookahead_sampled and lookahead_sampled_independent.");

  m.def(
      "rl_sim_sweep",
      [](const std::vector<double>& lengths, const std::string& source, int devices, const std::string& pipeline,
         const rl_workload& workload, const rl_cost_model& costs, const stage_balance_config& policy,
         int initial_rollout, const std::function<void(int, int)>& progress) {
        length_distribution dist{lengths, source};
        rl_sim_config c;
        c.devices = devices;
        c.pipeline = pipeline_from(pipeline);
        c.workload = workload;
        c.costs = costs;
        c.policy = policy;
        c.initial_rollout = initial_rollout;
        rl_sweep_result r;
        {
          const rl_pipeline_sim sim(dist, c);
          py::gil_scoped_release release;
          // Progress goes back to Python under the GIL.
          r = sim.sweep([&](int done, int total) {
            if (!progress) return;
            py::gil_scoped_acquire acquire;
            progress(done, total);
          });
        }
        return dict_of(std::move(r));
      },
      py::arg("lengths"), py::arg("source"), py::arg("devices") = 8, py::arg("pipeline") = "one_step_off",
      py::arg_v("workload", rl_workload{}, "RlWorkload()"), py::arg_v("costs", rl_cost_model{}, "RlCostModel()"),
      py::arg_v("policy", stage_balance_config{}, "StageBalanceConfig()"), py::arg("initial_rollout") = 0,
      py::arg("progress") = nullptr,
      "Every static split, the stage-balance policy, the per-phase oracle and colocated time sharing on the same "
      "lengths.");
}
