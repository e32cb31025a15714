// Bindings of RL post-training's stage balance (include/dra/rl/stage_balance.hpp) and the RL
// pipeline simulators (include/dra/rl/pipeline.hpp: phases; events.hpp: event by event, in-step
// moves). Results come back as plain dicts so dra.rl writes JSON, tables and plots without glue.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <string>

#include "bindings.hpp"
#include "dra/rl/events.hpp"
#include "dra/rl/pipeline.hpp"
#include "dra/rl/stage_balance.hpp"
#include "kwargs_init.hpp"

namespace py = pybind11;
using namespace dra::policy;
using namespace dra::sim;

namespace {

py::object num(double v) {
  return std::isfinite(v) ? py::object(py::float_(v)) : py::object(py::none());
}

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

py::dict prediction_to_dict(const stage_prediction& p) {
  py::dict d;
  d["rollout"] = p.rollout;
  d["train"] = p.train;
  d["rollout_s"] = p.rollout_s;
  d["train_s"] = p.train_s;
  d["rollout_sd_s"] = p.rollout_sd_s;
  d["train_sd_s"] = p.train_sd_s;
  d["weight_sync_s"] = p.weight_sync_s;
  d["step_s"] = p.step_s;
  return d;
}

py::dict decision_to_dict(const stage_decision& s) {
  py::dict d;
  d["action"] = to_string(s.kind);
  d["rollout"] = s.rollout;
  d["train"] = s.train;
  d["moved"] = s.moved;
  d["current"] = prediction_to_dict(s.current);
  d["target"] = prediction_to_dict(s.target);
  d["switch_cost_s"] = s.switch_cost_s;
  d["payback_steps"] = num(s.payback_steps);
  d["reason"] = s.reason;
  return d;
}

py::dict run_to_dict(const rl_run_result& r) {
  py::dict d;
  d["name"] = r.name;
  d["rollout"] = r.rollout;
  d["steps"] = r.steps;
  d["total_s"] = r.total_s;
  d["samples_per_s"] = r.samples_per_s;
  d["generated_tokens_per_s"] = r.generated_tokens_per_s;
  d["bubble_fraction"] = r.bubble_fraction;
  d["mean_rollout_devices"] = r.mean_rollout_devices;
  d["switches"] = r.switches;
  d["switch_total_s"] = r.switch_total_s;
  d["switch_exposed_s"] = r.switch_exposed_s;
  d["hidden_fraction"] = r.hidden_fraction;
  // Phases as columns: compact and ready for plotting.
  py::dict ph;
  std::vector<int> phase, rollout, train, trained;
  std::vector<double> start, duration, roll_s, train_s, idle, sw_total, sw_exposed, mean_len, longest, predicted;
  std::vector<std::string> action;
  for (const auto& p : r.phases) {
    phase.push_back(p.phase);
    rollout.push_back(p.rollout);
    train.push_back(p.train);
    trained.push_back(p.trained_sequences);
    start.push_back(p.start_s);
    duration.push_back(p.duration_s);
    roll_s.push_back(p.rollout_s);
    train_s.push_back(p.train_s);
    idle.push_back(p.idle_device_s);
    sw_total.push_back(p.switch_total_s);
    sw_exposed.push_back(p.switch_exposed_s);
    mean_len.push_back(p.mean_length);
    longest.push_back(p.longest);
    predicted.push_back(p.predicted_s);
    action.push_back(p.action);
  }
  ph["phase"] = phase;
  ph["rollout"] = rollout;
  ph["train"] = train;
  ph["trained_sequences"] = trained;
  ph["start_s"] = start;
  ph["duration_s"] = duration;
  ph["rollout_s"] = roll_s;
  ph["train_s"] = train_s;
  ph["idle_device_s"] = idle;
  ph["switch_total_s"] = sw_total;
  ph["switch_exposed_s"] = sw_exposed;
  ph["mean_length"] = mean_len;
  ph["longest"] = longest;
  ph["predicted_s"] = predicted;
  ph["action"] = action;
  d["phases"] = ph;
  py::list switches;
  for (const auto& s : r.switch_log) {
    py::dict w;
    w["phase"] = s.phase;
    w["direction"] = s.direction;
    w["moved"] = s.moved;
    py::dict parts;
    parts["agree_s"] = s.agree_s;
    parts["rebuild_s"] = s.rebuild_s;
    parts["weights_s"] = s.weights_s;
    parts["optimizer_s"] = s.optimizer_s;
    parts["rollout_start_s"] = s.rollout_start_s;
    w["cost_split"] = parts;
    w["total_s"] = s.total_s;
    w["exposed_s"] = s.exposed_s;
    w["hidden_s"] = s.hidden_s;
    w["payback_steps"] = num(s.payback_steps);
    w["predicted_payback_steps"] = num(s.predicted_payback_steps);
    w["reason"] = s.reason;
    switches.append(w);
  }
  d["switch_log"] = switches;
  d["generated_sequences"] = r.generated_sequences;
  d["trained_sequences"] = r.trained_sequences;
  d["exactly_once"] = r.exactly_once;
  d["tail_share"] = r.tail_share;
  d["rollout_share"] = r.rollout_share;
  py::dict roles;
  std::vector<double> t;
  std::vector<int> rr, tr, mv;
  for (const auto& x : r.roles)
    t.push_back(x.t), rr.push_back(x.rollout), tr.push_back(x.train), mv.push_back(x.moving);
  roles["t"] = t;
  roles["rollout"] = rr;
  roles["train"] = tr;
  roles["moving"] = mv;
  d["roles"] = roles;
  return d;
}

py::list runs_to_list(const std::vector<rl_run_result>& runs) {
  py::list out;
  for (const auto& r : runs) out.append(run_to_dict(r));
  return out;
}

py::dict window_decision_to_dict(const window_decision& w) {
  py::dict d;
  d["action"] = to_string(w.kind);
  d["moved"] = w.moved;
  d["train"] = w.train;
  d["wait_s"] = w.wait_s;
  d["predicted_current_s"] = w.predicted_current_s;
  d["predicted_target_s"] = w.predicted_target_s;
  d["switch_cost_s"] = w.switch_cost_s;
  d["payback_steps"] = num(w.payback_steps);
  d["reason"] = w.reason;
  return d;
}

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
      .def_readwrite("group_size", &stage_balance_config::group_size,
                     "Samples per prompt (GRPO's group): their lengths move together, so a step varies like "
                     "sequences / group_size independent draws (1: independent).")
      .def_readwrite("expected_max", &stage_balance_config::expected_max,
                     "One-step-off objective: E[max(rollout, train)] over the batches' spread (True), or the max "
                     "of the two means (False).")
      .def_readwrite("lengths", &stage_balance_config::lengths)
      .def_readwrite("generation", &stage_balance_config::generation)
      .def_readwrite("training", &stage_balance_config::training)
      .def("validate", &stage_balance_config::validate);

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
            return window_decision_to_dict(p.decide_window(w));
          },
          py::kw_only(), py::arg("rollout"), py::arg("train"), py::arg("idle_rollout"), py::arg("step"),
          py::arg("remaining_steps") = -1, py::arg("sequences_per_step") = 1, py::arg("updates_per_step") = 1,
          py::arg("updates_left") = 1, py::arg("wait_complete") = true, py::arg("wait_queued") = 0,
          py::arg("wait_in_flight") = std::vector<double>{}, py::arg("next_exists") = true, py::arg("next_queued") = 0,
          py::arg("next_in_flight") = std::vector<double>{},
          "One decision at a boundary of the trainers' world without a per-phase barrier: in a step's window "
          "(updates_left == updates_per_step) or between two updates. Feed every one, in order.")
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
            return prediction_to_dict(p.predict(rollout, sequences));
          },
          py::arg("rollout"), py::arg("sequences"))
      .def(
          "predict_all",
          [](const stage_balance_policy& p, int sequences) {
            py::list out;
            for (const auto& x : p.predict_all(sequences)) out.append(prediction_to_dict(x));
            return out;
          },
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
            return decision_to_dict(p.decide(s));
          },
          py::arg("rollout"), py::arg("train"), py::arg("step"), py::arg("steps_since_switch"),
          py::arg("remaining_steps") = -1, py::arg("sequences_per_step") = 1,
          "One decision at a step boundary (feed every one, in order).")
      .def_property_readonly("lengths", &stage_balance_policy::lengths, py::return_value_policy::reference_internal)
      .def_property_readonly("weight_sync_s", &stage_balance_policy::weight_sync_s)
      .def_property_readonly("generation_fit", [](const stage_balance_policy& p) {
        py::dict d;
        d["fixed_s"] = p.generation().fixed_s();
        d["per_sequence_s"] = p.generation().per_sequence_s();
        d["per_kilotoken_s"] = p.generation().per_kilotoken_s();
        d["observations"] = p.generation().observations();
        return d;
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
         const std::function<void(int, int)>& progress) {
        length_distribution dist{lengths, source};
        rl_event_config c;
        c.devices = devices;
        c.workload = workload;
        c.costs = costs;
        c.policy = policy;
        c.initial_rollout = initial_rollout;
        c.oracle_lookahead = oracle_lookahead;
        rl_event_report r;
        {
          const rl_event_sim sim(dist, c);
          py::gil_scoped_release release;
          r = sim.report([&](int done, int total) {
            if (!progress) return;
            py::gil_scoped_acquire acquire;
            progress(done, total);
          });
        }
        py::dict d;
        d["length_source"] = r.length_source;
        d["barrier_free"] = runs_to_list(r.barrier_free);
        d["barrier"] = runs_to_list(r.barrier);
        d["synchronous"] = runs_to_list(r.synchronous);
        d["best_barrier_free"] = r.best_barrier_free;
        d["best_barrier"] = r.best_barrier;
        d["best_synchronous"] = r.best_synchronous;
        d["dynamic"] = run_to_dict(r.dynamic);
        d["oracle_within_step"] = run_to_dict(r.oracle);
        d["colocated"] = run_to_dict(r.colocated);
        return d;
      },
      py::arg("lengths"), py::arg("source"), py::arg("devices") = 8,
      py::arg_v("workload", rl_workload{}, "RlWorkload()"), py::arg_v("costs", rl_cost_model{}, "RlCostModel()"),
      py::arg_v("policy", stage_balance_config{}, "StageBalanceConfig()"), py::arg("initial_rollout") = 0,
      py::arg("oracle_lookahead") = 2, py::arg("progress") = nullptr,
      "The event simulator: every static split one-step-off without and with the per-phase barrier and "
      "synchronous, the stage-balance policy moving devices inside a step, the within-step oracle and "
      "colocated time sharing, on the same lengths.");

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
        py::dict d;
        d["length_source"] = r.length_source;
        py::list statics;
        for (const auto& s : r.statics) statics.append(run_to_dict(s));
        d["statics"] = statics;
        d["best_static"] = r.best_static;
        d["dynamic"] = run_to_dict(r.dynamic);
        d["oracle"] = run_to_dict(r.oracle);
        d["colocated"] = run_to_dict(r.colocated);
        return d;
      },
      py::arg("lengths"), py::arg("source"), py::arg("devices") = 8, py::arg("pipeline") = "one_step_off",
      py::arg_v("workload", rl_workload{}, "RlWorkload()"), py::arg_v("costs", rl_cost_model{}, "RlCostModel()"),
      py::arg_v("policy", stage_balance_config{}, "StageBalanceConfig()"), py::arg("initial_rollout") = 0,
      py::arg("progress") = nullptr,
      "Every static split, the stage-balance policy, the per-phase oracle and colocated time sharing on the same "
      "lengths.");
}
