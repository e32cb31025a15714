"""``dra-sim rl``: the RL pipeline simulators. The phase model (every static split, the
stage-balance policy, the per-phase oracle and colocated time sharing, on lengths from the Azure
trace), or with ``--pipeline-scenario`` the event model (no per-phase barrier, devices moved
inside a step: the three-part report).

    dra-sim rl --scenario long_tail --json out.json --plots plots/
    dra-sim rl --trace conv --drift 4 --steps 300 --pipeline synchronous
    dra-sim rl --all-scenarios --markdown rl.md
    dra-sim rl --pipeline-scenario longgen --steps 200 --json longgen.json --plots plots/

Progress goes to stderr; the markdown table to stdout (and ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The bounds of how much one run simulates are dra.rl's (docs/guide/rl.md, "Bounds").
from dra.rl import (
    EVENT_S_PER_WORK,
    MAX_DEVICES,
    MAX_EVENT_DEVICES,
    MAX_EVENT_WORK,
    MAX_LOOKAHEAD_SAMPLES,
    MAX_SEQUENCE_WORK,
    MAX_STEPS,
    MAX_WORK,
    PHASE_S_PER_WORK,
    SEQUENCE_S,
)
from dra.sim._args import check_csv, check_output_paths, decimal_arg, integer_arg, seed_arg


def _assignments(items: list[str] | None, flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag}: expected NAME=VALUE, got '{item}'")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _progress(label: str, quiet: bool) -> Callable[[int, int], None]:
    """Progress on stderr after each schedule: how many and the time so far. (No estimate of the
    rest: the last schedules, the policy's, the planner's and the oracle's, can take most of the run.)"""
    start = time.monotonic()

    def report(done: int, total: int) -> None:
        if not quiet:
            spent = _duration(time.monotonic() - start)
            print(f"[dra-sim rl] {label}: {done}/{total} schedules, {spent}", file=sys.stderr, flush=True)

    return report


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers the ``rl`` subcommand on a ``dra-sim`` subparsers object."""
    import dra.rl as rl

    p = sub.add_parser("rl", help="RL post-training: static splits vs stage balance vs colocated (simulated)")
    p.add_argument("--scenario", choices=list(rl.SCENARIOS), help="a named setting (docs/guide/rl.md); other options override it")
    p.add_argument("--all-scenarios", action="store_true", help="run every named scenario")
    p.add_argument("--pipeline-scenario", choices=list(rl.PIPELINE_SCENARIOS),
                   help="the event model on a named setting (no per-phase barrier, devices moved inside a step)")
    p.add_argument("--trace", help=f"length trace: {', '.join(rl.TRACES)} or a CSV path with a GeneratedTokens column")
    p.add_argument("--constant-length", type=decimal_arg("tokens", low=1.0), help="every generation this many tokens (no tail)")
    p.add_argument("--drift", type=decimal_arg(low=0.0, low_open=True),
                   help="lengths grow to this multiple over the run (default 1: none)")
    p.add_argument("--devices", type=integer_arg(low=2, high=MAX_DEVICES), default=8,
                   help=f"devices split between rollout and training, 2-{MAX_DEVICES} (default 8)")
    p.add_argument("--pipeline", choices=["one_step_off", "synchronous"],
                   help="phase model: one_step_off (default) or synchronous")
    p.add_argument("--steps", type=integer_arg(low=1, high=MAX_STEPS),
                   help=f"RL steps, at most {MAX_STEPS:,} (default 200); steps x devices x (devices + 48) at most "
                        f"{MAX_WORK:,}, with --pipeline-scenario steps x (devices + 16) x (1 + lookahead samples / 8) "
                        f"at most {MAX_EVENT_WORK:,} (each about 10 minutes)")
    p.add_argument("--seed", type=seed_arg, help="seed of the lengths drawn (default 1); not with constant lengths")
    p.add_argument("--initial-rollout", type=integer_arg(low=0), default=0,
                   help="rollout devices the dynamic run starts with (0: half)")
    p.add_argument("--lookahead-samples", type=integer_arg(low=0, high=MAX_LOOKAHEAD_SAMPLES), default=0, metavar="N",
                   help="with --pipeline-scenario: also the references (the oracle paying switches, its search on N "
                        "draws of the lengths by group and alone); slow: minutes per run at 200 steps")
    p.add_argument("--workload", action="append", metavar="NAME=VALUE", help="RlWorkload field (repeatable)")
    p.add_argument("--cost", action="append", metavar="NAME=VALUE", help="RlCostModel field (repeatable)")
    p.add_argument("--policy", action="append", metavar="NAME=VALUE", help="StageBalanceConfig field (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the markdown table to PATH")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (role sizes and throughput over time) into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress and no 'wrote' lines on stderr (errors still)")
    return p


def run_pipeline(args: argparse.Namespace) -> int:
    """The event model: one named setting, the three-part report."""
    import dra.rl as rl

    progress = _progress(args.pipeline_scenario, args.quiet)

    try:
        doc = rl.simulate_pipeline(args.pipeline_scenario, devices=args.devices, steps=args.steps, seed=args.seed,
                                   workload=_assignments(args.workload, "--workload"), costs=_assignments(args.cost, "--cost"),
                                   policy=_assignments(args.policy, "--policy"), initial_rollout=args.initial_rollout,
                                   progress=progress, lookahead_samples=args.lookahead_samples)
    except (ValueError, FileNotFoundError, TypeError, OverflowError) as exc:  # TypeError: a NAME=VALUE of the wrong type
        print(f"dra-sim rl: error: {exc}", file=sys.stderr)
        return 2
    text = rl.pipeline_markdown(doc)
    if args.json:
        from dra._jsonio import write_json

        write_json(doc, args.json)
        _wrote(args.json, args.quiet)
    if args.plots:
        from dra.rl.plots import plot_pipeline

        for path in plot_pipeline(doc, args.plots):
            _wrote(path, args.quiet)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
        _wrote(args.markdown, args.quiet)
    return 0


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options together, or None: an option another one makes useless (it
    would be silently ignored), a trace file the reader would misread, a run above the bounds.
    Sets ``args.steps`` and ``args.seed`` to their defaults where not given."""
    import dra.rl as rl

    try:
        workload = _assignments(args.workload, "--workload")
    except ValueError as exc:
        return str(exc)
    # --workload NAME=VALUE overrides the flag of the same setting: both given, the flag is ignored.
    for flag, field, value in (("--steps", "steps", args.steps), ("--seed", "seed", args.seed),
                               ("--drift", "drift_final_scale", args.drift)):
        if value is not None and field in workload:
            return (f"{flag} {value} and --workload {field}={workload[field]} set the same thing (the --workload value "
                    f"would win, {flag} would be ignored); give one")
    try:
        check_output_paths(args.json, args.markdown, args.plots)
    except ValueError as exc:
        return str(exc)
    if args.scenario and args.all_scenarios:
        return (f"--scenario {args.scenario}: not used with --all-scenarios, which runs every scenario; "
                "drop one of them")
    if not args.pipeline_scenario:
        scenarios = list(rl.SCENARIOS) if args.all_scenarios else [args.scenario]
        constant = [n for n in scenarios if args.constant_length is not None
                    or (args.trace is None and rl.SCENARIOS.get(n or "", {}).get("constant_length") is not None)]
        if (args.seed is not None or "seed" in workload) and len(constant) == len(scenarios):
            return ("--seed: not used here, every generation has the same length "
                    f"({'--constant-length' if args.constant_length is not None else 'scenario ' + str(constant[0])}), "
                    "so nothing is drawn; drop --seed or give lengths from a trace (--trace)")
    if args.trace and args.trace not in rl.TRACES and Path(args.trace).exists():
        try:
            check_csv(args.trace, {"GeneratedTokens": "decimal"}, utf8=True)
        except ValueError as exc:
            return f"--trace: {exc}"
    steps = workload.get("steps", args.steps if args.steps is not None else 200)
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > MAX_STEPS:
        return f"--workload steps={steps}: above the bound {MAX_STEPS:,}; give at most {MAX_STEPS:,}"
    prompts, group = workload.get("prompts_per_step", 64), workload.get("group_size", 8)
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (steps, prompts, group)):
        runs = len(rl.SCENARIOS) if args.all_scenarios and not args.pipeline_scenario else 1
        if steps * prompts * group * runs > MAX_SEQUENCE_WORK:  # (rl_workload bounds one step's sequences)
            return (f"--workload prompts_per_step={prompts} x group_size={group} sequences per step for {steps} steps"
                    f"{' x ' + str(runs) + ' scenarios' if runs > 1 else ''}: about "
                    f"{SEQUENCE_S * steps * prompts * group * runs / 60:.0f} minutes of drawing sequences alone, above "
                    f"the bound steps x prompts_per_step x group_size <= {MAX_SEQUENCE_WORK:,} (about 10 minutes); give "
                    "fewer steps, prompts or a smaller group")
    if isinstance(steps, int) and not isinstance(steps, bool) and args.pipeline_scenario:
        if args.devices > MAX_EVENT_DEVICES:
            return (f"--devices {args.devices}: above the event model's bound {MAX_EVENT_DEVICES} (--pipeline-scenario: "
                    f"its planner and oracle grow faster than the devices); give at most {MAX_EVENT_DEVICES}")
        factor = 1 + args.lookahead_samples / 8
        work = steps * (args.devices + 16) * factor
        if work > MAX_EVENT_WORK:
            most = int(MAX_EVENT_WORK / ((args.devices + 16) * factor))
            extra = f" x (1 + --lookahead-samples {args.lookahead_samples} / 8)" if args.lookahead_samples else ""
            return (f"--steps {steps} at --devices {args.devices}{extra}: about {EVENT_S_PER_WORK * work / 60:.0f} minutes "
                    f"of simulation on a 2-core machine in the event model, above the bound steps x (devices + 16) x "
                    f"(1 + lookahead samples / 8) <= {MAX_EVENT_WORK:,} (about 10 minutes); give at most --steps {most} "
                    "at this size")
    elif isinstance(steps, int) and not isinstance(steps, bool):
        runs = len(rl.SCENARIOS) if args.all_scenarios else 1
        work = steps * args.devices * (args.devices + 48) * runs
        if work > MAX_WORK:
            most = MAX_WORK // (args.devices * (args.devices + 48) * runs)
            return (f"--steps {steps} at --devices {args.devices}{' x ' + str(runs) + ' scenarios' if runs > 1 else ''}: "
                    f"about {PHASE_S_PER_WORK * work / 60:.0f} minutes of simulation on a 2-core machine, above the "
                    f"bound steps x devices x (devices + 48) <= {MAX_WORK:,} (about 10 minutes); give at most "
                    f"--steps {most} at this size, or fewer --devices")
    if args.steps is None:
        args.steps = 200
    if args.seed is None:
        args.seed = 1
    return None


def run(args: argparse.Namespace) -> int:
    import dra.rl as rl

    problem = _check(args)
    if problem:
        print(f"dra-sim rl: error: {problem}", file=sys.stderr)
        return 2
    if args.pipeline_scenario:
        # The event model's setting comes from its scenario and --workload/--cost/--policy; the
        # phase model's own options would be silently ignored there.
        ignored = [flag for flag, given in (("--scenario", args.scenario), ("--all-scenarios", args.all_scenarios),
                                            ("--trace", args.trace), ("--constant-length", args.constant_length is not None),
                                            ("--drift", args.drift is not None),
                                            ("--pipeline", args.pipeline is not None)) if given]
        if ignored:
            print(f"dra-sim rl: error: {', '.join(ignored)}: not used by --pipeline-scenario (the event model takes its "
                  "setting from the scenario and --workload NAME=VALUE); drop them or drop --pipeline-scenario",
                  file=sys.stderr)
            return 2
        return run_pipeline(args)
    if args.lookahead_samples:
        print("dra-sim rl: error: --lookahead-samples: the references run in the event model; add --pipeline-scenario NAME",
              file=sys.stderr)
        return 2

    names: list[str | None] = list(rl.SCENARIOS) if args.all_scenarios else [args.scenario]
    docs = []
    try:
        for name in names:

            progress = _progress(name or "custom", args.quiet)
            docs.append(
                rl.simulate(
                    name,
                    trace=args.trace,
                    constant_length=args.constant_length,
                    drift=args.drift,
                    devices=args.devices,
                    pipeline=args.pipeline or "one_step_off",
                    steps=args.steps,
                    seed=args.seed,
                    workload=_assignments(args.workload, "--workload"),
                    costs=_assignments(args.cost, "--cost"),
                    policy=_assignments(args.policy, "--policy"),
                    initial_rollout=args.initial_rollout,
                    progress=progress,
                )
            )
    except (ValueError, FileNotFoundError, TypeError, OverflowError) as exc:  # TypeError: a NAME=VALUE of the wrong type
        print(f"dra-sim rl: error: {exc}", file=sys.stderr)
        return 2
    text = "\n".join(rl.markdown(d) for d in docs)
    if args.json:
        from dra._jsonio import write_json

        write_json(docs[0] if len(docs) == 1 else {"scenarios": {d["settings"]["scenario"]: d for d in docs}}, args.json)
        _wrote(args.json, args.quiet)
    if args.plots:
        from dra.rl.plots import plot_simulation

        for d in docs:
            for path in plot_simulation(d, args.plots):
                _wrote(path, args.quiet)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
        _wrote(args.markdown, args.quiet)
    return 0


def _wrote(path: object, quiet: bool) -> None:
    """Names a file written on stderr, as the simulator's subcommands do (not with --quiet)."""
    if not quiet:
        print(f"[dra-sim rl] wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dra-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return run(parser.parse_args(["rl", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
