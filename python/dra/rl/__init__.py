"""RL post-training: move devices between rollout and training (docs/design/rl.md, docs/guide/rl.md).

The stage-balance policy and the pipeline simulators are C++ (``include/dra/rl/stage_balance.hpp``;
``include/dra/rl/pipeline.hpp``, phase by phase; ``include/dra/rl/events.hpp``, event by event with
devices moved inside a step), bound as ``dra._core.StageBalancePolicy``, ``dra._core.rl_sim_sweep``
and ``dra._core.rl_sim_events``; this package finds the shipped length traces, names the
scenarios, and turns results into JSON, markdown and plots. Command line: ``dra-sim rl``.

    import dra.rl
    doc = dra.rl.simulate("long_tail")                # phase model
    doc = dra.rl.simulate_pipeline("longgen")         # event model: the three-part report
    print(doc["summary"]["resizing"]["dynamic_time_vs_best_static"])
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra import _core

StageBalancePolicy = _core.StageBalancePolicy
StageBalanceConfig = _core.StageBalanceConfig
QuantileSketch = _core.QuantileSketch
QuantileSketchConfig = _core.QuantileSketchConfig

#: The trace files dra ships (``data/azure-llm-inference-2023``), by short name.
TRACES: dict[str, str] = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}

#: Named settings. Each is a dict of `simulate` options; the values were fixed before any result
#: was looked at and are explained in docs/guide/rl.md.
SCENARIOS: dict[str, dict[str, Any]] = {
    # The DynaResize setting as the issue states it: 8 devices, a long tail (the code service's
    # lengths: median 13, max 1899 tokens), one-step-off pipeline, no drift.
    "long_tail": {"trace": "code", "drift": 1.0},
    # The same with generation lengths growing 4x over training (reasoning RL lengthens answers).
    "long_tail_drift": {"trace": "code", "drift": 4.0},
    # Conversation lengths (median 129, max 1000), growing 4x.
    "conv_drift": {"trace": "conv", "drift": 4.0},
    # No tail (every generation 211 tokens, the conv mean) and a training cost 4x the default:
    # training-bound, nothing to rebalance. Dynamic allocation should bring nothing here.
    "training_bound": {"constant_length": 211.0, "costs": {"train_per_token_s": 2e-3}},
}

__all__ = [
    "PIPELINE_SCENARIOS",
    "SCENARIOS",
    "TRACES",
    "QuantileSketch",
    "QuantileSketchConfig",
    "StageBalanceConfig",
    "StageBalancePolicy",
    "data_dir",
    "markdown",
    "pipeline_markdown",
    "reasoning_lengths",
    "simulate",
    "simulate_pipeline",
    "trace_lengths",
]


def data_dir() -> Path:
    """The Azure LLM inference trace dra ships, or ``$DRA_RL_DATA`` when set."""
    env = os.environ.get("DRA_RL_DATA")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parent / "data" / "azure-llm-inference-2023", here.parents[3] / "data" / "azure-llm-inference-2023"]
    for c in candidates:
        if (c / TRACES["conv"]).is_file():
            return c
    raise FileNotFoundError(
        "dra.rl: no length trace found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); set DRA_RL_DATA to a folder holding "
        + TRACES["conv"]
    )


@functools.lru_cache(maxsize=8)
def _lengths_cached(path: str, column: str) -> tuple[float, ...]:
    return tuple(_core.rl_read_lengths(path, column))


def trace_lengths(trace: str | os.PathLike[str], column: str = "GeneratedTokens") -> list[float]:
    """Generation lengths: ``trace`` is a shipped trace name (``conv``, ``code``) or a CSV path."""
    path = data_dir() / TRACES[str(trace)] if str(trace) in TRACES else Path(trace)
    return list(_lengths_cached(str(Path(path).resolve()), column))


#: Bounds of how much one simulation runs (``simulate``, ``simulate_pipeline``,
#: ``dra-sim rl``; docs/guide/rl.md, "Bounds"), measured
#: on the project's 2-core machine: the phase model takes about
#: ``PHASE_S_PER_WORK x steps x devices x (devices + 48)`` seconds (8 devices: 1.2 ms per step;
#: 64: 21 ms; 512: 0.7 s), its JSON about 135 bytes per step and device.
MAX_STEPS = 100_000
MAX_DEVICES = 1024
MAX_WORK = 240_000_000  # steps x devices x (devices + 48): about 10 minutes
PHASE_S_PER_WORK = 2.5e-6
#: The event model (--pipeline-scenario) costs about ``EVENT_S_PER_WORK x steps x (devices + 16)
#: x (1 + lookahead samples / 8)`` seconds on the costliest shipped setting (longgen: 0.75 s per
#: step at 8 devices, 1.5 s at 32; 12 look-ahead samples 2-2.5x); its planner and oracle grow
#: faster than linearly in steps and devices, hence the tighter bounds.
MAX_EVENT_WORK = 19_000  # about 10 minutes
MAX_EVENT_DEVICES = 64
EVENT_S_PER_WORK = 0.031
MAX_LOOKAHEAD_SAMPLES = 64
#: Both models draw and hold every sequence of a step: about ``SEQUENCE_S x steps x sequences per
#: step`` seconds more (estimated from one run: 6.4 million sequences, 10 s a step), bounded like the
#: rest at about 10 minutes; ``rl_workload`` refuses more than 1,000,000 sequences per step.
MAX_SEQUENCE_WORK = 300_000_000  # steps x prompts_per_step x group_size
SEQUENCE_S = 2e-6


def _check_bounds(devices: int, steps: Any, most_devices: int, model: str) -> None:
    """The sizes past which a run cannot end in reasonable time (the CLI also bounds the work)."""
    if devices > most_devices:
        raise ValueError(f"devices: {devices} is above the {model}'s bound {most_devices} (every static split is "
                         f"simulated, and the cost grows faster than the devices); give at most {most_devices}")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > MAX_STEPS:
        raise ValueError(f"steps: {steps} is above the bound {MAX_STEPS:,}; give at most {MAX_STEPS:,}")


def _check_int(name: str, value: Any) -> None:
    """An integer argument checked here (pybind's own message for another type lists signatures)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r} ({type(value).__name__})")


def simulate(
    scenario: str | None = None,
    *,
    trace: str | None = None,
    constant_length: float | None = None,
    drift: float | None = None,
    devices: int = 8,
    pipeline: str = "one_step_off",
    steps: int = 200,
    seed: int = 1,
    workload: dict[str, Any] | None = None,
    costs: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    initial_rollout: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Every static split, the stage-balance policy, the per-phase oracle and colocated time sharing.

    ``scenario`` names a preset of :data:`SCENARIOS`; explicit arguments override it. Lengths come
    from ``trace`` (a shipped trace name or CSV path, default ``conv``) or are all
    ``constant_length``. ``workload``/``costs``/``policy`` set fields of ``RlWorkload``,
    ``RlCostModel`` and ``StageBalanceConfig`` (unknown names raise ValueError). Returns the runs
    and a ``summary`` with the ratios."""
    for name, value in (("devices", devices), ("initial_rollout", initial_rollout)):
        _check_int(name, value)
    _check_bounds(devices, (workload or {}).get("steps", steps), MAX_DEVICES, "phase model")
    preset: dict[str, Any] = {}
    if scenario is not None:
        if scenario not in SCENARIOS:
            raise ValueError(f"scenario: unknown scenario '{scenario}'; use one of: {', '.join(SCENARIOS)}")
        preset = SCENARIOS[scenario]
    if trace is not None and constant_length is not None:
        raise ValueError("trace/constant_length: give one source of generation lengths, not both")
    if trace is None and constant_length is None:  # a source given overrides the scenario's, whichever it is
        trace, constant_length = preset.get("trace"), preset.get("constant_length")
    drift = drift if drift is not None else preset.get("drift", 1.0)
    if constant_length is not None:
        if not constant_length >= 1:
            raise ValueError(f"constant_length: must be >= 1 token, got {constant_length}")
        lengths, source = [float(constant_length)], f"constant {constant_length:g} tokens"
    else:
        trace = trace or "conv"
        lengths = trace_lengths(trace)
        source = f"{TRACES.get(trace, trace)}:GeneratedTokens"
    w = {"steps": steps, "seed": seed, "drift_final_scale": drift, **(preset.get("workload") or {}), **(workload or {})}
    if str(w.get("lengths", "trace")) != "trace":  # it replaced the trace or constant while the output named them
        raise ValueError(f"workload lengths={w['lengths']}: the phase model draws its lengths from {source}; the "
                         "reasoning length model runs in the event model (simulate_pipeline, dra-sim rl "
                         "--pipeline-scenario); drop lengths= here")
    c = {**(preset.get("costs") or {}), **(costs or {})}
    _not_set_by_the_run(policy)
    p = {**(preset.get("policy") or {}), **(policy or {})}
    wl, cm, pc = (_typed(_core.RlWorkload, w, "workload"), _typed(_core.RlCostModel, c, "costs"),
                  _typed(_core.StageBalanceConfig, p, "policy"))
    raw = _core.rl_sim_sweep(lengths, source, devices, pipeline, wl, cm, pc, initial_rollout, progress)
    best = raw["statics"][raw["best_static"]]
    dyn, oracle, colo = raw["dynamic"], raw["oracle"], raw["colocated"]
    raw["settings"] = {
        "scenario": scenario,
        "length_source": source,
        "devices": devices,
        "pipeline": pipeline,
        "workload": _settings(wl),
        "costs": _settings(cm),
        "policy": p,
        "initial_rollout": initial_rollout,
    }
    raw["summary"] = {
        "label": "simulated",
        "best_static_rollout": best["rollout"],
        "best_static_samples_per_s": best["samples_per_s"],
        "dynamic_samples_per_s": dyn["samples_per_s"],
        "dynamic_vs_best_static": dyn["samples_per_s"] / best["samples_per_s"] - 1.0,
        "dynamic_time_vs_best_static": dyn["total_s"] / best["total_s"] - 1.0,
        "oracle_vs_best_static": oracle["samples_per_s"] / best["samples_per_s"] - 1.0,
        "dynamic_vs_colocated": dyn["samples_per_s"] / colo["samples_per_s"] - 1.0,
        "best_static_vs_colocated": best["samples_per_s"] / colo["samples_per_s"] - 1.0,
        "dynamic_switches": dyn["switches"],
        "dynamic_hidden_fraction": dyn["hidden_fraction"],
        "dynamic_bubble": dyn["bubble_fraction"],
        "best_static_bubble": best["bubble_fraction"],
        "prediction_error": _prediction_error(dyn),
        "prediction_bias": _prediction_bias(dyn),
    }
    return raw


def _prediction_error(run: dict[str, Any]) -> float | None:
    """Median |predicted / actual - 1| of the phase durations the policy predicted (no switch)."""
    ph = run["phases"]
    errs = sorted(
        abs(p / d - 1.0)
        for p, d, a in zip(ph["predicted_s"], ph["duration_s"], ph["action"])
        if p > 0 and d > 0 and a == "hold"
    )
    return errs[len(errs) // 2] if errs else None


def _prediction_bias(run: dict[str, Any]) -> float | None:
    """Sum of the predicted phase durations / sum of the actual ones - 1 (the same phases as
    _prediction_error): how far off the policy's view of the run's total time was."""
    ph = run["phases"]
    pairs = [(p, d) for p, d, a in zip(ph["predicted_s"], ph["duration_s"], ph["action"]) if p > 0 and d > 0 and a == "hold"]
    return sum(p for p, _ in pairs) / sum(d for _, d in pairs) - 1.0 if pairs else None


def markdown(doc: dict[str, Any]) -> str:
    """A readable table of one `simulate` result (simulated figures)."""
    s, st = doc["summary"], doc["settings"]
    lines = [
        f"### RL pipeline, simulated: {st['scenario'] or 'custom'} ({st['length_source']}, drift x{st['workload']['drift_final_scale']:g}, "
        f"{st['devices']} devices, {st['pipeline']}, {st['workload']['steps']} steps)",
        "",
        "| schedule | rollout devices | samples/s | time (s) | bubble | switches | hidden |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(name: str, r: dict[str, Any], rollout: str) -> str:
        hidden = f"{100 * r['hidden_fraction']:.0f} %" if r["switches"] else "-"
        return (
            f"| {name} | {rollout} | {r['samples_per_s']:.4g} | {r['total_s']:.0f} | {100 * r['bubble_fraction']:.1f} % | "
            f"{r['switches']} | {hidden} |"
        )

    for i, r in enumerate(doc["statics"]):
        mark = " (best)" if i == doc["best_static"] else ""
        lines.append(row(f"static{mark}", r, str(r["rollout"])))
    lines.append(row("dynamic (stage balance)", doc["dynamic"], f"{doc['dynamic']['mean_rollout_devices']:.2f} (mean)"))
    lines.append(row("oracle (per-phase best, free switches)", doc["oracle"], f"{doc['oracle']['mean_rollout_devices']:.2f} (mean)"))
    lines.append(row("colocated time sharing", doc["colocated"], "all, then all"))
    err = s["prediction_error"]
    lines += [
        "",
        f"Dynamic vs best static: throughput {100 * s['dynamic_vs_best_static']:+.1f} %, time "
        f"{100 * s['dynamic_time_vs_best_static']:+.1f} % (oracle bound {100 * s['oracle_vs_best_static']:+.1f} %); "
        f"vs colocated {100 * s['dynamic_vs_colocated']:+.1f} %. Policy prediction error (median) "
        + (f"{100 * err:.1f} %." if err is not None else "n/a."),
    ]
    return "\n".join(lines) + "\n"


# ---- the event simulator: rollout-bound long generations, devices moved inside a step -----------

#: Costs of one device of the ``longgen`` scenarios: a replica of Qwen2.5-32B (DAPO's model) on two
#: H100-class GPUs (tensor parallel 2). Estimates, derived term by term in docs/guide/rl.md
#: ("Rollout-bound regime"); the colocated rollout share they give is checked against published
#: figures in data/rl-lengths/README.md.
LONGGEN_COSTS: dict[str, Any] = {
    "max_concurrency": 256,  # vLLM's max_num_seqs
    "kv_capacity_tokens": 270_000.0,  # 2 x (0.9 x 80 GB - 32.8 GB weights - 3 GB) / 262 KB per token
    "decode_fixed_s": 0.022,  # 65.5 GB of bf16 weights per iteration at ~45 % of 6.7 TB/s
    "decode_per_sequence_s": 8e-5,  # 2 x 32.5e9 FLOP per token at ~800 TFLOP/s
    "decode_per_kilotoken_s": 3.9e-5,  # 262 KB of KV per token of context at 6.7 TB/s
    "prefill_per_kilotoken_s": 0.04,  # 2 x 32.5e9 FLOP per token at ~1.6 PFLOP/s
    "train_per_token_s": 3.3e-4,  # 8 x 32.5e9 FLOP per token (forward, backward, log-probs) at 40 % MFU of 2 GPUs
    "train_fixed_s": 0.5,
    "sync_fixed_s": 0.5,
    "weight_sync_s": 1.3,  # 65.5 GB to the host staging buffer, both GPUs at ~25 GB/s
    "weight_load_s": 1.3,  # and back onto a rollout device
    "switch_agree_s": 0.05,
    "switch_rebuild_s": 0.5,
    "switch_weights_s": 1.3,  # a joiner between two updates receives the current weights
    "switch_optimizer_s": 4.0,  # its share of fp32 master weights and Adam moments, streamed (deferred)
    "rollout_start_s": 5.0,  # engine start on a device leaving the trainers
    "colocated_switch_s": 10.0,  # per step: engine sleep / wake and the training state's offload and reload
}

#: The reasoning workload of the ``longgen`` scenarios (sources and assumptions:
#: data/rl-lengths/README.md): mean ~3.3k tokens at the first step, a tail cut at 20,480 (DAPO's
#: limit), doubling over training, GRPO groups of 8 correlated samples, 8 updates per step.
LONGGEN_WORKLOAD: dict[str, Any] = {
    "prompts_per_step": 64,
    "group_size": 8,
    "prompt_tokens": 512.0,
    "max_generation_tokens": 20480.0,
    "drift_final_scale": 2.0,
    "updates_per_step": 8,
    "lengths": "reasoning",
    "reasoning": {"median_tokens": 2000.0, "prompt_sigma": 0.7, "group_sigma": 0.35, "tail_weight": 0.1, "tail_factor": 4.0},
}

#: Named settings of the event simulator; fixed before any dynamic result was looked at, except
#: where docs/guide/rl.md says otherwise.
PIPELINE_SCENARIOS: dict[str, dict[str, Any]] = {
    # Rollout-bound long generations, vLLM-like admission (greedy, preempt on KV overflow).
    "longgen": {"workload": LONGGEN_WORKLOAD, "costs": LONGGEN_COSTS},
    # The same with SGLang-like admission (reserve 30 % of what a sequence may still generate).
    "longgen_reserve": {"workload": LONGGEN_WORKLOAD, "costs": {**LONGGEN_COSTS, "kv_reserve_ratio": 0.3}},
    # Today's Azure-derived settings in the event model (7B estimates of the phase model).
    "azure_code": {"trace": "code", "workload": {"updates_per_step": 4}},
    "azure_conv_drift": {"trace": "conv", "workload": {"updates_per_step": 4, "drift_final_scale": 4.0}},
}


def _settings(config: Any) -> dict[str, Any]:
    """A bound settings object's fields as a JSON-ready dict (nested settings objects as dicts)."""
    out: dict[str, Any] = {}
    for k in dir(config):
        if k.startswith("_") or k == "validate":
            continue
        v = getattr(config, k)
        out[k] = _settings(v) if type(v).__module__.startswith("dra.") else v
    return out


def _typed(cls: Any, values: dict[str, Any], what: str) -> Any:
    """``cls(**values)``, refusing a JSON ``true``/``false`` for a number and a number for a flag
    (pybind takes ``steps=true`` as 1 step and ``expected_max=1`` as True)."""
    default = cls()
    for k, v in values.items():
        d = getattr(default, k, None)
        if d is not None and (isinstance(v, bool) != isinstance(d, bool)) and isinstance(v, (bool, int, float)):
            want = "true or false" if isinstance(d, bool) else "a number"
            raise ValueError(f"{what} {k}: expected {want}, got {v!r}")
    return cls(**values)


def _not_set_by_the_run(policy: dict[str, Any] | None) -> None:
    """Policy options the run sets itself from its own arguments: a value given here was recorded in
    the settings and ignored (``devices=99`` ran with 8)."""
    for name, instead in (("devices", "devices (--devices)"), ("pipeline", "pipeline (--pipeline)")):
        if name in (policy or {}):
            raise ValueError(f"policy {name}: set by the run itself; drop it from policy and give {instead}")


def _workload(values: dict[str, Any]) -> Any:
    values = dict(values)
    reasoning = values.pop("reasoning", None)
    w = _typed(_core.RlWorkload, values, "workload")
    if reasoning is not None:
        w.reasoning = reasoning if isinstance(reasoning, _core.ReasoningLengths) else _core.ReasoningLengths(**reasoning)
        w.validate()
    return w


def reasoning_lengths(steps: int = 1, seed: int = 1, **workload: Any) -> list[list[float]]:
    """Generation lengths of the ``longgen`` workload (or with ``workload`` fields overridden),
    step by step, as the simulator draws them."""
    w = {**LONGGEN_WORKLOAD, "steps": steps, "seed": seed, **workload}
    return [list(b) for b in _core.rl_draw_lengths(_workload(w))]


def simulate_pipeline(
    scenario: str | None = None,
    *,
    trace: str | None = None,
    devices: int = 8,
    steps: int = 200,
    seed: int = 1,
    workload: dict[str, Any] | None = None,
    costs: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    initial_rollout: int = 0,
    oracle_lookahead: int = 2,
    progress: Callable[[int, int], None] | None = None,
    lookahead_samples: int = 0,
) -> dict[str, Any]:
    """The event simulator on one setting: every static split one-step-off without and with the
    per-phase barrier and synchronous, the stage-balance policy moving devices inside a step
    (``dynamic``: the configured planner, "window" by default; ``dynamic_lookahead``: the
    look-ahead planner), the within-step oracle and colocated time sharing, all on the same
    lengths; with a ``summary``
    (the three-part report) and the checks against published figures. ``scenario`` names a preset
    of :data:`PIPELINE_SCENARIOS`; explicit arguments override its fields.

    ``lookahead_samples`` > 0 adds ``references``: the oracle paying the measured switch costs
    (``oracle_within_step_paid``) and its search on lengths drawn from what the run has seen,
    ``lookahead_samples`` draws per decision, by GRPO group (``lookahead_sampled``) or each alone
    (``lookahead_sampled_independent``). They are references, not dra's result, and slow: minutes
    per run at 200 steps (docs/results/rl/issue24/README.md)."""
    if isinstance(lookahead_samples, bool) or not isinstance(lookahead_samples, int) or lookahead_samples < 0:
        raise ValueError(
            f"lookahead_samples: must be an integer >= 0 (0: no look-ahead references), got {lookahead_samples!r}"
        )
    if lookahead_samples > MAX_LOOKAHEAD_SAMPLES:
        raise ValueError(f"lookahead_samples: {lookahead_samples} is above the bound {MAX_LOOKAHEAD_SAMPLES}; give at "
                         f"most {MAX_LOOKAHEAD_SAMPLES}")
    for name, value in (("devices", devices), ("initial_rollout", initial_rollout), ("oracle_lookahead", oracle_lookahead)):
        _check_int(name, value)
    _check_bounds(devices, (workload or {}).get("steps", steps), MAX_EVENT_DEVICES, "event model")
    _not_set_by_the_run(policy)
    preset: dict[str, Any] = {}
    if scenario is not None:
        if scenario not in PIPELINE_SCENARIOS:
            raise ValueError(f"scenario: unknown scenario '{scenario}'; use one of: {', '.join(PIPELINE_SCENARIOS)}")
        preset = PIPELINE_SCENARIOS[scenario]
    trace = trace if trace is not None else preset.get("trace")
    w = {**(preset.get("workload") or {}), "steps": steps, "seed": seed, **(workload or {})}
    if isinstance(preset.get("workload", {}).get("reasoning"), dict) and isinstance((workload or {}).get("reasoning"), dict):
        w["reasoning"] = {**preset["workload"]["reasoning"], **workload["reasoning"]}  # type: ignore[index]
    reasoning = w.get("lengths") == "reasoning"
    if reasoning and trace is not None:
        raise ValueError("trace/workload: a trace and the reasoning length model exclude each other; give one")
    lengths: list[float] = [] if reasoning else trace_lengths(trace or "conv")
    source = "reasoning lengths (data/rl-lengths)" if reasoning else f"{TRACES.get(trace or 'conv', trace)}:GeneratedTokens"
    c = {**(preset.get("costs") or {}), **(costs or {})}
    p = {**(preset.get("policy") or {}), **(policy or {})}
    wl, cm, pc = _workload(w), _typed(_core.RlCostModel, c, "costs"), _typed(_core.StageBalanceConfig, p, "policy")
    doc = _core.rl_sim_events(
        lengths, source, devices, wl, cm, pc, initial_rollout, oracle_lookahead, progress, lookahead_samples
    )
    doc["settings"] = {
        "scenario": scenario,
        "label": "simulated",
        "length_source": source,
        "devices": devices,
        "workload": _settings(wl),
        "costs": _settings(cm),
        "policy": p,
        "initial_rollout": initial_rollout,
        "oracle_lookahead": oracle_lookahead,
        "lookahead_samples": lookahead_samples,
    }
    doc["summary"] = pipeline_summary(doc)
    return doc


def pipeline_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The three-part report of an event-simulator result (simulated figures):

    1. ``barrier``: removing the per-phase barrier at a fixed split (not dra's gain): the best
       split with the barrier against the same split without it, and best against best;
    2. ``resizing``: the stage-balance policy against the best static split of the same pipeline
       (one-step-off, no barrier): dra's gain;
    3. ``oracle_share``: the part of the within-step oracle's gain the policy captured (None when
       the oracle gains nothing);
    4. ``lookahead_planner``: the same two figures for the look-ahead planner (None for a result
       without its run).
    Times are total times to the same number of steps; ``*_time_vs_*`` is a ratio (< 1: faster)."""
    bf, br, sy = doc["barrier_free"], doc["barrier"], doc["synchronous"]
    best_bf, best_br, best_sy = bf[doc["best_barrier_free"]], br[doc["best_barrier"]], sy[doc["best_synchronous"]]
    same_split = bf[doc["best_barrier"]]
    dyn, oracle, colo = doc["dynamic"], doc["oracle_within_step"], doc["colocated"]
    la = doc.get("dynamic_lookahead")
    gain_oracle = best_bf["total_s"] - oracle["total_s"]
    gain_dyn = best_bf["total_s"] - dyn["total_s"]
    lookahead = None
    if la is not None:
        lookahead = {
            "dynamic_s": la["total_s"],
            "dynamic_time_vs_best_static": la["total_s"] / best_bf["total_s"],
            "oracle_share": (best_bf["total_s"] - la["total_s"]) / gain_oracle if gain_oracle > 0 else None,
            "switches": la["switches"],
            "hidden_fraction": la["hidden_fraction"],
            "mean_rollout": la["mean_rollout_devices"],
            "live": True,  # the live leader runs it too: LiveConfig(policy={"planner": "lookahead"})
        }
    return {
        "label": "simulated",
        "barrier": {
            "best_barrier_rollout": best_br["rollout"],
            "best_barrier_s": best_br["total_s"],
            "same_split_barrier_free_s": same_split["total_s"],
            "fixed_split_time_ratio": same_split["total_s"] / best_br["total_s"],
            "best_barrier_free_rollout": best_bf["rollout"],
            "best_vs_best_time_ratio": best_bf["total_s"] / best_br["total_s"],
        },
        "resizing": {
            "best_static_rollout": best_bf["rollout"],
            "best_static_s": best_bf["total_s"],
            "dynamic_s": dyn["total_s"],
            "dynamic_time_vs_best_static": dyn["total_s"] / best_bf["total_s"],
            "dynamic_switches": dyn["switches"],
            "dynamic_hidden_fraction": dyn["hidden_fraction"],
            "dynamic_mean_rollout": dyn["mean_rollout_devices"],
            "goal_time_ratio": 0.67,
        },
        "oracle": {
            "oracle_s": oracle["total_s"],
            "oracle_time_vs_best_static": oracle["total_s"] / best_bf["total_s"],
            "oracle_share": gain_dyn / gain_oracle if gain_oracle > 0 else None,
            "goal_share": 0.6,
        },
        "lookahead_planner": lookahead,
        "others": {
            "best_synchronous_rollout": best_sy["rollout"],
            "best_synchronous_time_vs_best_static": best_sy["total_s"] / best_bf["total_s"],
            "colocated_time_vs_best_static": colo["total_s"] / best_bf["total_s"],
            "dynamic_time_vs_colocated": dyn["total_s"] / colo["total_s"],
        },
        "bubble": {"best_static": best_bf["bubble_fraction"], "dynamic": dyn["bubble_fraction"], "oracle": oracle["bubble_fraction"],
                   "best_barrier": best_br["bubble_fraction"]},
        "checks": {
            # Published: rollout 63-84 % of a synchronous iteration (Seer), ~70 % (RollPacker); the
            # last 10 % of requests up to ~50 % of the rollout (Seer). data/rl-lengths/README.md.
            "colocated_rollout_share": colo["rollout_share"],
            "colocated_tail_share": colo["tail_share"],
        },
        "exactly_once": all(r["exactly_once"] for r in [*bf, *br, *sy, dyn, oracle, colo, *([la] if la else [])]),
    }


def pipeline_markdown(doc: dict[str, Any]) -> str:
    """A readable table and the three-part report of one `simulate_pipeline` result (simulated)."""
    s, st = doc["summary"], doc["settings"]
    w = st["workload"]
    lines = [
        f"### RL pipeline, event model, simulated: {st['scenario'] or 'custom'} ({st['length_source']}, "
        f"growth x{w['drift_final_scale']:g}, {st['devices']} devices, {w['steps']} steps, {w['updates_per_step']} updates per step)",
        "",
        "| split (rollout / train) | one-step-off, no barrier (s) | with the per-phase barrier (s) | synchronous (s) |",
        "|---|---|---|---|",
    ]
    for a, b, c in zip(doc["barrier_free"], doc["barrier"], doc["synchronous"]):
        def cell(r: dict[str, Any], best: bool) -> str:
            return f"**{r['total_s']:.0f}**" if best else f"{r['total_s']:.0f}"

        lines.append(f"| {a['rollout']} / {st['devices'] - a['rollout']} | {cell(a, a is doc['barrier_free'][doc['best_barrier_free']])} | "
                     f"{cell(b, b is doc['barrier'][doc['best_barrier']])} | {cell(c, c is doc['synchronous'][doc['best_synchronous']])} |")
    dyn, orc, colo = doc["dynamic"], doc["oracle_within_step"], doc["colocated"]
    lines += [
        "",
        f"Stage-balance policy (in-step moves): {dyn['total_s']:.0f} s, {dyn['switches']} switches, mean rollout devices "
        f"{dyn['mean_rollout_devices']:.2f}; oracle_within_step: {orc['total_s']:.0f} s; colocated: {colo['total_s']:.0f} s.",
        "",
    ]
    b, r, o = s["barrier"], s["resizing"], s["oracle"]
    share = o["oracle_share"]
    lines += [
        f"1. Removing the barrier (not dra's): at the best barrier split ({b['best_barrier_rollout']} rollout) time x{b['fixed_split_time_ratio']:.3f}; "
        f"best against best x{b['best_vs_best_time_ratio']:.3f}.",
        f"2. Resizing (dra's): dynamic / best static one-step-off split ({r['best_static_rollout']} rollout): time x{r['dynamic_time_vs_best_static']:.3f} "
        f"(goal <= {r['goal_time_ratio']}).",
        f"3. Oracle: x{o['oracle_time_vs_best_static']:.3f} of the best static time; share of its gain captured: "
        + (f"{100 * share:.0f} %" if share is not None else "n/a (the oracle gains nothing)") + f" (goal >= {100 * o['goal_share']:.0f} %).",
    ]
    la = s.get("lookahead_planner")
    if la:
        lines.append(
            f"4. The look-ahead planner (planner='lookahead'; the live leader runs it with policy={{'planner': 'lookahead'}}): "
            f"time x{la['dynamic_time_vs_best_static']:.3f} of the best static split, "
            + (f"{100 * la['oracle_share']:.0f} % of the oracle's gain" if la["oracle_share"] is not None else "the oracle gains nothing")
            + f", {la['switches']} switches."
        )
    lines += [
        "",
        f"Checks (colocated): rollout {100 * s['checks']['colocated_rollout_share']:.0f} % of the step time, the last 10 % of sequences "
        f"{100 * s['checks']['colocated_tail_share']:.0f} % of the rollout.",
    ]
    refs = doc.get("references") or {}
    if refs:
        best_s = doc["barrier_free"][doc["best_barrier_free"]]["total_s"]
        gain = best_s - orc["total_s"]
        lines += ["", f"References (not dra's result; {st.get('lookahead_samples', 0)} draws per decision):"]
        for name, run in refs.items():
            part = f", {100 * (best_s - run['total_s']) / gain:.0f} % of the oracle's gain" if gain > 0 else ""
            lines.append(f"- {name}: x{run['total_s'] / best_s:.3f} of the best static time{part}, {run['switches']} switches.")
    return "\n".join(lines) + "\n"
