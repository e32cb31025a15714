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
from pathlib import Path
from typing import Any

from dra._argtypes import seed_arg


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


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers the ``rl`` subcommand on a ``dra-sim`` subparsers object."""
    import dra.rl as rl

    p = sub.add_parser("rl", help="RL post-training: static splits vs stage balance vs colocated (simulated)")
    p.add_argument("--scenario", choices=list(rl.SCENARIOS), help="a named setting (docs/guide/rl.md); other options override it")
    p.add_argument("--all-scenarios", action="store_true", help="run every named scenario")
    p.add_argument("--pipeline-scenario", choices=list(rl.PIPELINE_SCENARIOS),
                   help="the event model on a named setting (no per-phase barrier, devices moved inside a step)")
    p.add_argument("--trace", help=f"length trace: {', '.join(rl.TRACES)} or a CSV path with a GeneratedTokens column")
    p.add_argument("--constant-length", type=float, help="every generation this many tokens (no tail)")
    p.add_argument("--drift", type=float, help="lengths grow to this multiple over the run (default 1: none)")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--pipeline", choices=["one_step_off", "synchronous"], default="one_step_off")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=seed_arg, default=1)
    p.add_argument("--initial-rollout", type=int, default=0, help="rollout devices the dynamic run starts with (0: half)")
    p.add_argument("--lookahead-samples", type=int, default=0, metavar="N",
                   help="with --pipeline-scenario: also the references (the oracle paying switches, its search on N "
                        "draws of the lengths by group and alone); slow: minutes per run at 200 steps")
    p.add_argument("--workload", action="append", metavar="NAME=VALUE", help="RlWorkload field (repeatable)")
    p.add_argument("--cost", action="append", metavar="NAME=VALUE", help="RlCostModel field (repeatable)")
    p.add_argument("--policy", action="append", metavar="NAME=VALUE", help="StageBalanceConfig field (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the markdown table to PATH")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (role sizes and throughput over time) into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def run_pipeline(args: argparse.Namespace) -> int:
    """The event model: one named setting, the three-part report."""
    import dra.rl as rl

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"[dra-sim rl] {args.pipeline_scenario}: {done}/{total} schedules", file=sys.stderr, flush=True)

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
    if args.plots:
        from dra.rl.plots import plot_pipeline

        for path in plot_pipeline(doc, args.plots):
            print(f"[dra-sim rl] wrote {path}", file=sys.stderr)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
    return 0


def run(args: argparse.Namespace) -> int:
    import dra.rl as rl

    if args.pipeline_scenario:
        # The event model's setting comes from its scenario and --workload/--cost/--policy; the
        # phase model's own options would be silently ignored there.
        ignored = [flag for flag, given in (("--scenario", args.scenario), ("--all-scenarios", args.all_scenarios),
                                            ("--trace", args.trace), ("--constant-length", args.constant_length is not None),
                                            ("--drift", args.drift is not None),
                                            ("--pipeline", args.pipeline != "one_step_off")) if given]
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

            def progress(done: int, total: int, name: str | None = name) -> None:
                if not args.quiet:
                    print(f"[dra-sim rl] {name or 'custom'}: {done}/{total} schedules", file=sys.stderr, flush=True)

            docs.append(
                rl.simulate(
                    name,
                    trace=args.trace,
                    constant_length=args.constant_length,
                    drift=args.drift,
                    devices=args.devices,
                    pipeline=args.pipeline,
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
    if args.plots:
        from dra.rl.plots import plot_simulation

        for d in docs:
            for path in plot_simulation(d, args.plots):
                print(f"[dra-sim rl] wrote {path}", file=sys.stderr)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dra-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return run(parser.parse_args(["rl", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
