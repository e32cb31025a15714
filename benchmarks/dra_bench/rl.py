"""``python -m dra.bench rl``: RL post-training, rollout vs training devices (docs/guide/rl.md).

Simulated rows (every schedule on the same generation lengths, drawn from the Azure trace):
- ``rl_sim_throughput``: the stage-balance policy's samples/s against ``best_static_split`` (the
  best of every static split, found by running each), at the DynaResize setting (scenario
  ``long_tail``: 8 devices, long-tailed lengths, one-step-off); ``rl_sim_time``: its time to the
  same number of steps; ``rl_sim_throughput_vs_colocated``: against ``colocated_time_sharing``.
  ``rl_sim_oracle``: the per-phase best split with free switches (a bound on any stage-balance
  policy) against the same baseline. The other scenarios get the same rows with a
  ``.<scenario>`` suffix. ``rl_sim_sweep.<trace>.drift<d>``: the same comparison over a grid of
  traces and length drifts (``oracle_ratio`` is the bound).
Event-model rows (the rollout-bound regime: reasoning-length generations, no per-phase barrier,
devices moved inside a step; ``dra.rl.simulate_pipeline``), simulated:
- ``rl_sim_time_longgen``: the stage-balance policy's total time against ``best_static_split``
  (the best split of the same one-step-off pipeline without a barrier): dra's part;
- ``rl_sim_time_longgen_barrier_free``: the best split with the per-phase barrier, that same split
  without it against it (``best_static_split`` with the barrier): the barrier's part, not dra's;
- ``rl_sim_time_longgen_lookahead`` and ``rl_sim_oracle_share_longgen_lookahead``: the same two
  figures for the policy with the look-ahead planner (event simulator only).
- ``rl_sim_oracle_share_longgen``: the fraction of the within-step oracle's time saving the policy
  captured; ``rl_sim_oracle_longgen``: the oracle against the best static split;
- the same rows with a ``.<scenario>`` suffix for the other event scenarios, and
  ``rl_sim_tail_sweep.w<weight>``: the longgen rows over the weight of the tail.
Measured rows (``--live``): see ``dra.rl.live`` (docs/guide/rl.md) and ``dra_bench._rl_live``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dra._argtypes import count_arg, nonnegative_int_arg, positive_arg, probability_arg
from dra_bench._report import result, write_report

#: The scenario the un-suffixed rows report: the DynaResize setting (8 devices, long tail).
HEADLINE = "long_tail"


def sim_rows(doc: dict[str, Any], suffix: str) -> list[dict[str, Any]]:
    best = doc["statics"][doc["best_static"]]
    dyn, oracle, colo = doc["dynamic"], doc["oracle"], doc["colocated"]
    st = doc["settings"]
    common = {
        "label": "simulated",
        "scenario": st["scenario"],
        "length_source": st["length_source"],
        "drift": st["workload"]["drift_final_scale"],
        "devices": st["devices"],
        "pipeline": st["pipeline"],
        "steps": st["workload"]["steps"],
        "best_static_rollout": best["rollout"],
        "static_samples_per_s": {str(r["rollout"]): r["samples_per_s"] for r in doc["statics"]},
        "dynamic_switches": dyn["switches"],
        "dynamic_hidden_fraction": dyn["hidden_fraction"],
        "bubble": {"dynamic": dyn["bubble_fraction"], "best_static": best["bubble_fraction"], "colocated": colo["bubble_fraction"]},
        "prediction_error_median": doc["summary"]["prediction_error"],
        "prediction_bias": doc["summary"]["prediction_bias"],
    }
    return [
        result(f"rl_sim_throughput{suffix}", dyn["samples_per_s"], "samples/s", ("best_static_split", best["samples_per_s"]),
               goal_ratio=">= 1.665 (DynaResize)", **common),
        result(f"rl_sim_time{suffix}", dyn["total_s"], "s", ("best_static_split", best["total_s"]),
               goal_ratio="<= 0.67 (DynaResize)", **common),
        result(f"rl_sim_throughput_vs_colocated{suffix}", dyn["samples_per_s"], "samples/s",
               ("colocated_time_sharing", colo["samples_per_s"]), **common),
        result(f"rl_sim_oracle{suffix}", oracle["samples_per_s"], "samples/s", ("best_static_split", best["samples_per_s"]),
               note="per-phase best split with free switches: the most any stage-balance policy can gain", **common),
    ]


def pipeline_rows(doc: dict[str, Any], suffix: str) -> list[dict[str, Any]]:
    """The three-part report of one event-model result as rows (simulated)."""
    s, st = doc["summary"], doc["settings"]
    best = doc["barrier_free"][doc["best_barrier_free"]]
    barrier = doc["barrier"][doc["best_barrier"]]
    same = doc["barrier_free"][doc["best_barrier"]]
    common = {
        "label": "simulated",
        "scenario": st["scenario"],
        "length_source": st["length_source"],
        "devices": st["devices"],
        "steps": st["workload"]["steps"],
        "updates_per_step": st["workload"]["updates_per_step"],
        "growth": st["workload"]["drift_final_scale"],
        "best_static_rollout": best["rollout"],
        "static_barrier_free_s": {str(r["rollout"]): r["total_s"] for r in doc["barrier_free"]},
        "static_barrier_s": {str(r["rollout"]): r["total_s"] for r in doc["barrier"]},
        "static_synchronous_s": {str(r["rollout"]): r["total_s"] for r in doc["synchronous"]},
        "colocated_s": doc["colocated"]["total_s"],
        "oracle_within_step_s": doc["oracle_within_step"]["total_s"],
        "dynamic_switches": doc["dynamic"]["switches"],
        "dynamic_hidden_fraction": doc["dynamic"]["hidden_fraction"],
        "bubble": s["bubble"],
        "checks": s["checks"],
        "exactly_once": s["exactly_once"],
    }
    share = s["oracle"]["oracle_share"]
    rows = [
        result(f"rl_sim_time_longgen{suffix}", doc["dynamic"]["total_s"], "s", ("best_static_split", best["total_s"]),
               goal_ratio="<= 0.67 (DynaResize: -33 %)", part="resizing (dra's)", **common),
        result(f"rl_sim_time_longgen_barrier_free{suffix}", same["total_s"], "s", ("best_static_split", barrier["total_s"]),
               part="removing the per-phase barrier at a fixed split (not dra's)", split_rollout=barrier["rollout"],
               best_barrier_free_s=best["total_s"], **common),
        result(f"rl_sim_oracle_share_longgen{suffix}", share if share is not None else float("nan"), "fraction",
               goal=">= 0.6", note="share of the within-step oracle's time saving over the best static split (nan: the oracle saves nothing)",
               **common),
        result(f"rl_sim_oracle_longgen{suffix}", doc["oracle_within_step"]["total_s"], "s", ("best_static_split", best["total_s"]),
               note="oracle_within_step: clairvoyant greedy with free switches, a reference, not a proof of optimality", **common),
    ]
    la = s.get("lookahead_planner")
    if la:
        note = "the stage-balance policy with planner='lookahead' (not the default, 'window'; the live leader runs it too with policy={'planner': 'lookahead'})"
        rows += [
            result(f"rl_sim_time_longgen_lookahead{suffix}", la["dynamic_s"], "s", ("best_static_split", best["total_s"]),
                   goal_ratio="<= 0.67 (DynaResize: -33 %)", part="resizing (dra's)", note=note,
                   lookahead_switches=la["switches"], **common),
            result(f"rl_sim_oracle_share_longgen_lookahead{suffix}", la["oracle_share"] if la["oracle_share"] is not None else float("nan"),
                   "fraction", goal=">= 0.6", note=note, **common),
        ]
    return rows


def _json_object(parser: argparse.ArgumentParser, flag: str, text: str, what: str, example: str) -> dict[str, Any]:
    """A command-line JSON object, or the parser's error naming the flag, the value and an example."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        parser.error(f"{flag}: not JSON ({e}); expected an object such as '{example}'")
    if not isinstance(value, dict):
        parser.error(f"{flag}: expected a JSON object of {what}, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    import dra.rl as rl

    parser = argparse.ArgumentParser(prog="python -m dra.bench rl")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--steps", type=count_arg, default=200, help="simulated training steps per run (default 200)")
    parser.add_argument("--scenarios", nargs="*", default=list(rl.SCENARIOS), choices=list(rl.SCENARIOS))
    parser.add_argument("--sweep-traces", nargs="*", default=["conv", "code"], help="traces of the drift sweep (none: skip it)")
    parser.add_argument("--sweep-drifts", nargs="*", type=positive_arg, default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--plots", metavar="DIR", help="write the role/throughput plots of each scenario into DIR")
    parser.add_argument("--pipeline-scenarios", nargs="*", default=list(rl.PIPELINE_SCENARIOS), choices=list(rl.PIPELINE_SCENARIOS),
                        help="event-model scenarios (the three-part report; longgen is the headline)")
    parser.add_argument("--pipeline-steps", type=count_arg, default=200, help="steps of an event-model run (default 200)")
    parser.add_argument("--tail-weights", nargs="*", type=probability_arg, default=[0.0, 0.05, 0.1, 0.2, 0.3],
                        help="tail weights of the longgen sensitivity sweep (none: skip it)")
    parser.add_argument("--tail-steps", type=count_arg, default=60, help="steps of each tail-sweep run (default 60)")
    parser.add_argument("--live", action="store_true", help="also run the live GRPO benchmark (measured; minutes)")
    parser.add_argument("--live-steps", type=count_arg, default=12, help="training steps per live run (default 12)")
    parser.add_argument("--live-rounds", type=count_arg, default=3, help="rounds of every live schedule, order rotating (default 3)")
    parser.add_argument("--live-seeds", type=count_arg, default=1, help="runs of the best split under other seeds, for the reward noise (default 1: none)")
    parser.add_argument("--live-reward-steps", type=nonnegative_int_arg, default=0, help="one longer run of the best split: does the reward rise? (default 0: none)")
    parser.add_argument("--live-policy", metavar="JSON", default="{}",
                        help="StageBalanceConfig options of the live dynamic run, e.g. '{\"expected_max\": false}' (the "
                             "objective before 2026-12-01)")
    parser.add_argument("--live-longgen", action="store_true",
                        help="run the live pipeline without a per-phase barrier on the long-generation task (measured; with --live)")
    parser.add_argument("--live-only-longgen", action="store_true", help="with --live: skip the phase-model live rows")
    parser.add_argument("--live-slots", type=count_arg, default=8, help="device slots of the live runs (default 8)")
    parser.add_argument("--live-cpus-per-slot", type=positive_arg, default=0.2, help="CPU quota of a live slot (default 0.2)")
    parser.add_argument("--live-pretrain-steps", type=nonnegative_int_arg, default=400, help="supervised warm-up steps of the live policy (default 400)")
    parser.add_argument("--live-model", metavar="JSON", default="{}",
                        help="ModelConfig fields of the live policy, e.g. '{\"d_model\": 64, \"layers\": 2}' (a smaller model for a "
                             "loaded machine; default: ModelConfig's)")
    parser.add_argument("--live-switch-runs", type=nonnegative_int_arg, default=2,
                        help="runs of the best split with a scheduled switch away and back, to measure both directions' "
                             "switch costs even when the policy does not switch (default 2)")
    args = parser.parse_args(argv)
    if args.live_slots < 2:
        parser.error(f"--live-slots: {args.live_slots} is not >= 2; give 2 or more slots (one per role)")
    policy = _json_object(parser, "--live-policy", args.live_policy, "StageBalanceConfig options", '{"expected_max": false}')
    model = _json_object(parser, "--live-model", args.live_model, "ModelConfig fields", '{"d_model": 64}')

    results: list[dict[str, Any]] = []
    for name in args.scenarios:
        print(f"[bench rl] simulating {name}", file=sys.stderr, flush=True)
        doc = rl.simulate(name, steps=args.steps)
        results += sim_rows(doc, "" if name == HEADLINE else f".{name}")
        if args.plots:
            from dra.rl.plots import plot_simulation

            for path in plot_simulation(doc, args.plots):
                print(f"[bench rl] wrote {path}", file=sys.stderr)
    for trace in args.sweep_traces:
        for drift in args.sweep_drifts:
            print(f"[bench rl] sweep {trace} drift x{drift:g}", file=sys.stderr, flush=True)
            doc = rl.simulate(trace=trace, drift=drift, steps=args.steps)
            best = doc["statics"][doc["best_static"]]
            results.append(
                result(f"rl_sim_sweep.{trace}.drift{drift:g}", doc["dynamic"]["samples_per_s"], "samples/s",
                       ("best_static_split", best["samples_per_s"]), label="simulated", trace=trace, drift=drift,
                       best_static_rollout=best["rollout"], oracle_ratio=doc["oracle"]["samples_per_s"] / best["samples_per_s"],
                       colocated_ratio=doc["dynamic"]["samples_per_s"] / doc["colocated"]["samples_per_s"],
                       dynamic_switches=doc["dynamic"]["switches"])
            )
    for name in args.pipeline_scenarios:
        print(f"[bench rl] event model {name} ({args.pipeline_steps} steps)", file=sys.stderr, flush=True)
        doc = rl.simulate_pipeline(name, steps=args.pipeline_steps)
        results += pipeline_rows(doc, "" if name == "longgen" else f".{name}")
        print(rl.pipeline_markdown(doc), file=sys.stderr)
        if args.plots:
            from dra.rl.plots import plot_pipeline

            for path in plot_pipeline(doc, args.plots):
                print(f"[bench rl] wrote {path}", file=sys.stderr)
    for weight in args.tail_weights:
        print(f"[bench rl] tail sweep: weight {weight:g} ({args.tail_steps} steps)", file=sys.stderr, flush=True)
        doc = rl.simulate_pipeline("longgen", steps=args.tail_steps, workload={"reasoning": {"tail_weight": weight}})
        s = doc["summary"]
        best = doc["barrier_free"][doc["best_barrier_free"]]
        results.append(result(f"rl_sim_tail_sweep.w{weight:g}", doc["dynamic"]["total_s"], "s", ("best_static_split", best["total_s"]),
                              label="simulated", tail_weight=weight, steps=args.tail_steps, best_static_rollout=best["rollout"],
                              barrier_fixed_split_time_ratio=s["barrier"]["fixed_split_time_ratio"],
                              oracle_time_ratio=s["oracle"]["oracle_time_vs_best_static"], oracle_share=s["oracle"]["oracle_share"],
                              colocated_time_ratio=s["others"]["colocated_time_vs_best_static"], checks=s["checks"]))
    if args.live:
        from dra.rl.live.config import LiveConfig
        from dra.rl.live.model import ModelConfig
        from dra_bench._rl_live import live_rows

        try:
            model_config = ModelConfig(**model)
        except TypeError as e:
            parser.error(f"--live-model: {e}; the fields are {sorted(ModelConfig.__dataclass_fields__)}")
        machine = {"slots": args.live_slots, "cpus_per_slot": args.live_cpus_per_slot, "pretrain_steps": args.live_pretrain_steps,
                   "model": model_config}

        if not args.live_only_longgen:
            results += live_rows(steps=args.live_steps, rounds=args.live_rounds, seeds=args.live_seeds, plots=args.plots,
                                 reward_steps=args.live_reward_steps, switch_runs=args.live_switch_runs,
                                 config=LiveConfig(steps=args.live_steps, policy=policy, **machine))
        if args.live_longgen or args.live_only_longgen:
            from dra_bench._rl_live import live_pipeline_rows

            results += live_pipeline_rows(steps=args.live_steps, rounds=args.live_rounds, plots=args.plots,
                                          config=LiveConfig(steps=args.live_steps, trace="reasoning", drift=2.0, policy=policy, **machine))
    write_report("rl", results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
