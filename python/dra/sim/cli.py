"""``dra-sim``: replay job workloads on a simulated cluster, and run the static-vs-dynamic study.

    dra-sim replay --workload data/pollux/workloads/workload-1.csv --json out.json
    dra-sim replay --workload W1.csv --workload W2.csv --reallocation-cost inplace --plots plots/
    dra-sim replay --all-loads --policy static --policy pollux --policy convergence_aware --json all.json
    dra-sim study --runs 1500 --seed 1 --json study.json
    dra-sim study --runs 1500 --seed 1 --shared-cluster --json shared.json
    dra-sim profiles
    dra-sim rl --scenario long_tail --json out.json --plots plots/   (RL pipeline: docs/guide/rl.md)

Progress goes to stderr; the markdown table to stdout (and ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dra._argtypes import finite_arg, seed_arg
from dra._jsonio import write_json


def _parser(with_rl: bool = True) -> argparse.ArgumentParser:
    import dra.sim as sim

    parser = argparse.ArgumentParser(prog="dra-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, default_cost: str) -> None:
        p.add_argument("--traces", help="profile folder (default: the copy dra ships, data/pollux/traces)")
        p.add_argument(
            "--policy",
            action="append",
            choices=list(sim.POLICIES),
            help="policy to run (repeatable; default: all for replay; convergence/goodput/convergence_aware for the study, "
            "tiresias/pollux/arbiter/convergence_aware for the shared-cluster study; the static baselines always run)",
        )
        p.add_argument(
            "--reallocation-cost",
            default=default_cost,
            help=f"seconds of no progress per reallocation; 'pollux' = 30, 'inplace' = {sim.IN_PLACE_RESIZE_COST_S:g} "
            "(stand-in for the measured in-place resize cost), or the JSON report of `python -m dra.bench resize` "
            f"(its measured shrink/grow time) (default: {default_cost})",
        )
        p.add_argument("--interval", type=float, default=60.0, help="seconds between allocation decisions (default 60)")
        p.add_argument("--json", metavar="PATH", help="write results as JSON")
        p.add_argument("--markdown", metavar="PATH", help="also write the markdown table to PATH")
        p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
        p.add_argument("--quiet", action="store_true", help="no progress on stderr")
        p.add_argument("--no-jobs", action="store_true", help="aggregates only: leave per-job records and timelines out of the JSON (no plots)")

    rp = sub.add_parser("replay", help="replay workload CSVs under each policy")
    rp.add_argument("--workload", action="append", metavar="CSV", help="workload CSV (repeatable)")
    rp.add_argument(
        "--all-loads",
        action="store_true",
        help="every shipped workload (1-8) at every relative load (0.5, 1.0, 1.5, 2.0x): 32 replays",
    )
    rp.add_argument("--nodes", type=int, default=16)
    rp.add_argument("--devices-per-node", type=int, default=4)
    rp.add_argument(
        "--cost-mode",
        choices=list(sim.COST_MODES),
        default="same",
        help="same: every policy pays --reallocation-cost per change (policy quality, like for like); system: each "
        "policy pays its own system's mechanism, dra's in-place resize (--in-place-cost) or checkpoint-restart "
        "(--restart-cost) (default: same)",
    )
    rp.add_argument(
        "--in-place-cost",
        help="system view: seconds per in-place resize, 'inplace', or a `dra.bench resize` JSON "
        "(default: docs/results/sim/resize-100MB.json, measured)",
    )
    rp.add_argument(
        "--restart-cost",
        help="system view: seconds per checkpoint-restart, 'pollux' (30), or a `dra.bench resize` JSON "
        "(its measured torchrun restart) (default: 30)",
    )
    rp.add_argument("--declared-sigma", type=float, default=0.0,
                    help="jobs declare their epoch budget x exp(sigma z) (default 0: exactly; a declared_epochs column is kept)")
    rp.add_argument("--declared-none", type=float, default=0.0, metavar="SHARE", help="share of jobs that declare nothing (default 0)")
    rp.add_argument("--early-stop", type=float, default=0.0, metavar="SHARE",
                    help="share of jobs that stop early on a plateau (the truth; default 0)")
    rp.add_argument("--declaration-seed", type=seed_arg, default=1, help="seed of the declarations and early stopping (default 1)")
    common(rp, "pollux")

    st = sub.add_parser("study", help="the generated static-vs-dynamic study")
    st.add_argument("--runs", type=int, default=1500)
    st.add_argument("--seed", type=seed_arg, default=1)
    st.add_argument(
        "--quota-scale", type=finite_arg, default=1.0, help="dynamic jobs may hold up to this x their request (default 1: the same budget)"
    )
    st.add_argument("--no-noise", action="store_true", help="no throughput/efficiency noise")
    st.add_argument("--perturb", action="store_true", help="untuned requests: batch and devices x 2^{-1,0,1} (default: as made)")
    st.add_argument("--shared-cluster", action="store_true", help="runs contend for one cluster in groups (default: each alone)")
    st.add_argument("--jobs-per-cluster", type=int, default=160, help="runs per shared cluster (default 160)")
    st.add_argument(
        "--price-floor",
        type=float,
        help="convergence_aware per job: price floor per device in single-device goodputs (default 0.1; 0 minimises time)",
    )
    st.add_argument(
        "--reference-limits",
        action="store_true",
        help="apply the reference's per-application limits (ncf: one device); default: what the profiles measure",
    )
    st.add_argument("--workloads", action="append", metavar="CSV", help="request pool (default: the shipped workloads)")
    st.add_argument("--declared-sigma", type=float, default=0.0, help="runs declare their epoch budget x exp(sigma z) (default 0)")
    st.add_argument("--gns-estimate-sigma", type=float, default=None,
                    help="log-normal spread of each run's own noise-scale estimate per epoch (default 0.2)")
    st.add_argument("--old-target-rule", action="store_true",
                    help="judge the target by the metric of the geometric-mean batch (the earlier rule) instead of the work done")
    st.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples for the CIs (default 2000)")
    common(st, "inplace")

    sub.add_parser("profiles", help="list the shipped profiles and their measured noise levels")
    if with_rl:
        from dra.rl.cli import add_parser as add_rl_parser  # issue 12: dra-sim rl

        add_rl_parser(sub)
    else:  # listed without importing dra.rl, which loads torch (the cluster commands never need it)
        sub.add_parser("rl", help="RL post-training: static splits vs stage balance vs colocated (simulated)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(with_rl=bool(argv) and argv[0] == "rl").parse_args(argv)
    if args.command == "rl":
        from dra.rl.cli import run as run_rl

        return run_rl(args)
    import dra.sim as sim

    try:
        if args.command == "profiles":
            profiles = sim.load_profiles()
            print(f"profiles in {sim.default_data_dir() / 'traces'}:")
            for name in profiles.names():
                print(f"  {name}: {profiles.info(name)}")
            return 0
        _check_outputs(args)
        if getattr(args, "plots", None) and getattr(args, "no_jobs", False):
            raise ValueError("--plots needs the per-job records and timelines; drop --no-jobs")
        if args.command == "replay":
            workloads = list(args.workload or [])
            if args.all_loads:
                root = sim.default_data_dir()
                for folder in ("workloads-0.5", "workloads", "workloads-1.5", "workloads-2.0"):
                    workloads += [str(root / folder / f"workload-{i}.csv") for i in range(1, 9)]
            if not workloads:
                raise ValueError("replay: give --workload CSV (repeatable) or --all-loads")
            docs = []
            for w in workloads:
                doc = sim.replay(
                    w,
                    policies=args.policy,
                    reallocation_cost=args.reallocation_cost,
                    traces=args.traces,
                    interval_s=args.interval,
                    nodes=args.nodes,
                    devices_per_node=args.devices_per_node,
                    declared_sigma=args.declared_sigma,
                    declared_none_share=args.declared_none,
                    early_stop_share=args.early_stop,
                    declaration_seed=args.declaration_seed,
                    quiet=args.quiet,
                    jobs_detail=not args.no_jobs,
                    cost_mode=args.cost_mode,
                    in_place_cost=args.in_place_cost,
                    restart_cost=args.restart_cost,
                )
                docs.append(doc)
            text = "\n".join(sim.markdown_replay(d) for d in docs)
            for d in docs:
                note = sim.unfinished_note(d)
                if note:
                    print(f"[dra-sim] {d['workload']}: {note}", file=sys.stderr)
            keys = _unique([f"{d['workload']}@{d['load']}x" if d.get("load") else d["file"] for d in docs])
            if args.json:
                write_json(docs[0] if len(docs) == 1 else {"workloads": dict(zip(keys, docs))}, args.json)
            if args.plots:
                from dra.sim.plots import plot_replay

                labels = _unique([f"{d['workload']}-load{d['load']}" if d.get("load") else d["workload"] for d in docs])
                for d, label in zip(docs, labels):
                    for path in plot_replay(d, args.plots, label=label):
                        print(f"[dra-sim] wrote {path}", file=sys.stderr)
        else:
            doc = sim.study(
                args.runs,
                args.seed,
                policies=args.policy,
                reallocation_cost=args.reallocation_cost,
                quota_scale=args.quota_scale,
                interval_s=args.interval,
                noise=not args.no_noise,
                reference_limits=args.reference_limits,
                perturb=args.perturb,
                shared_cluster=args.shared_cluster,
                jobs_per_cluster=args.jobs_per_cluster,
                traces=args.traces,
                workloads=args.workloads,
                quiet=args.quiet,
                resamples=args.resamples,
                jobs_detail=not args.no_jobs,
                price_floor=args.price_floor,
                declared_sigma=args.declared_sigma,
                gns_estimate_sigma=args.gns_estimate_sigma,
                target_by_work=not args.old_target_rule,
            )
            text = sim.markdown_study(doc)
            if args.json:
                write_json(doc, args.json)
            if args.plots:
                from dra.sim.plots import plot_study

                for path in plot_study(doc, args.plots):
                    print(f"[dra-sim] wrote {path}", file=sys.stderr)
        print(text)
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(text)
    except (ValueError, FileNotFoundError) as exc:
        print(f"dra-sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output path that cannot be written
        print(f"dra-sim: error: cannot write {exc.filename or ''}: {exc.strerror or exc}; give a writable path",
              file=sys.stderr)
        return 2
    return 0


def _unique(names: list[str]) -> list[str]:
    """The names with a #2, #3... suffix on repeats, so no result overwrites another."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuses output paths that cannot be written before any simulation runs."""
    for flag in ("json", "markdown"):
        path = getattr(args, flag, None)
        if path and Path(path).is_dir():
            raise ValueError(f"--{flag}: {path} is a directory; give a file path")
    plots = getattr(args, "plots", None)
    if plots and Path(plots).exists() and not Path(plots).is_dir():
        raise ValueError(f"--plots: {plots} is a file; give a directory")


if __name__ == "__main__":
    sys.exit(main())
