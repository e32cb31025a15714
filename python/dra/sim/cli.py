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
import errno
import os
import re
import sys
from pathlib import Path
from typing import Any

from dra import _console
from dra._console import console
from dra._jsonio import write_json
from dra.sim._args import check_output_paths, decimal_arg, integer_arg, seed_arg
from dra.sim._inputs import data_folder

ALL_LOADS = ("workloads-0.5", "workloads", "workloads-1.5", "workloads-2.0")  # the published loads' folders

#: Bounds of the options that set how much is simulated (docs/guide/simulator.md, "Inputs and
#: bounds"), measured on the project's 2-core machine: a study run takes about 0.09 s of CPU (1,500:
#: about 2 minutes), a bootstrap resample about 24 us per run (2,000 x 1,500: about 70 s).
MAX_RUNS = 10_000  # about 15 minutes
MAX_JOBS_PER_CLUSTER = 640  # twice the largest shipped workload (2.0x: 320 jobs) on the 64-device cluster
MAX_RESAMPLES = 100_000
MAX_BOOTSTRAP = 20_000_000  # runs x resamples: about 8 minutes of bootstrap
MIN_INTERVAL_S = 1.0  # one decision per simulated second at most (workload-1 under Pollux: 10 s of CPU)
MAX_INTERVAL_S = 86_400.0  # one decision a day: a job waits up to an interval to start, and a run stops after 30 days


def _parser(with_rl: bool = True) -> argparse.ArgumentParser:
    import dra.sim as sim
    from dra.sim._replay import MAX_NODES

    parser = argparse.ArgumentParser(prog="dra-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, default_cost: str | None, default_cost_text: str) -> None:
        p.add_argument("--traces", help="profile folder (default: the copy dra ships, data/pollux/traces)")
        p.add_argument(
            "--plugin",
            action="append",
            metavar="FILE.py",
            help="a Python file, run before anything else, that registers cluster policies of its own with "
            "dra.sim.add_cluster_policy; their names become --policy choices (repeatable; docs/guide/simulator.md, "
            "'Your own cluster policy')",
        )
        p.add_argument(
            "--policy",
            action="append",
            choices=list(sim.sim_policy_names()),  # the built-ins and what --plugin files added
            help="policy to run (repeatable; default: all for replay; convergence/goodput/convergence_aware for the study, "
            "tiresias/pollux/arbiter/convergence_aware for the shared-cluster study; the static baselines always run)",
        )
        p.add_argument(
            "--reallocation-cost",
            default=default_cost,
            help=f"seconds of no progress per reallocation; 'pollux' = 30, 'inplace' = {sim.IN_PLACE_RESIZE_COST_S:g} "
            "(stand-in for the measured in-place resize cost), or the JSON report of `python -m dra.bench resize` "
            f"(its measured shrink/grow time) (default: {default_cost_text})",
        )
        p.add_argument("--interval", type=decimal_arg("seconds", low=MIN_INTERVAL_S, high=MAX_INTERVAL_S,
                                                      why_high=" (one decision a day; a job waits up to an interval for "
                                                      "its first devices and a simulation stops 30 days after the first "
                                                      "arrival)"),
                       default=60.0,
                       help=f"seconds between allocation decisions, {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:,.0f} (default 60)")
        p.add_argument("--json", metavar="PATH", help="write results as JSON")
        p.add_argument("--markdown", metavar="PATH", help="also write the markdown table to PATH")
        p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
        p.add_argument("--quiet", action="store_true", help="no progress and no 'wrote' lines on stderr (errors and warnings still)")
        p.add_argument("--no-jobs", action="store_true", help="aggregates only: leave per-job records and timelines out of the JSON (no plots)")

    rp = sub.add_parser("replay", help="replay workload CSVs under each policy")
    rp.add_argument("--workload", action="append", metavar="CSV", help="workload CSV (repeatable)")
    rp.add_argument(
        "--all-loads",
        action="store_true",
        help="every shipped workload (1-8) at every relative load (0.5, 1.0, 1.5, 2.0x): 32 replays",
    )
    rp.add_argument("--nodes", type=integer_arg(low=1, high=MAX_NODES), default=16,
                    help=f"nodes of the simulated cluster, at most {MAX_NODES} (default 16)")
    rp.add_argument("--devices-per-node", type=integer_arg(low=1, high=9), default=4,
                    help="devices per node, 1-9 (default 4); no job may request more than nodes x devices-per-node")
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
        "(default: the measured report dra ships, docs/results/sim/resize-100MB.json in a checkout)",
    )
    rp.add_argument(
        "--restart-cost",
        help="system view: seconds per checkpoint-restart, 'pollux' (30), or a `dra.bench resize` JSON "
        "(its measured torchrun restart) (default: 30)",
    )
    rp.add_argument("--declared-sigma", type=decimal_arg(), default=0.0,
                    help="jobs declare their epoch budget x exp(sigma z) (default 0: exactly; refused with a workload "
                         "that has a declared_epochs column, which is kept)")
    rp.add_argument("--declared-none", type=decimal_arg(high=1.0), default=0.0, metavar="SHARE",
                    help="share of jobs that declare nothing (default 0)")
    rp.add_argument("--early-stop", type=decimal_arg(high=1.0), default=0.0, metavar="SHARE",
                    help="share of jobs that stop early on a plateau (the truth; default 0)")
    rp.add_argument("--declaration-seed", type=seed_arg,
                    help="seed of the declarations and early stopping (default 1); only with --declared-sigma, "
                         "--declared-none or --early-stop above 0")
    common(rp, None, "pollux with --cost-mode same")

    st = sub.add_parser("study", help="the generated static-vs-dynamic study")
    st.add_argument("--runs", type=integer_arg(low=1, high=MAX_RUNS), default=1500,
                    help=f"generated runs, at most {MAX_RUNS:,} (default 1500)")
    st.add_argument("--seed", type=seed_arg, default=1)
    st.add_argument(
        "--quota-scale", type=decimal_arg(low=0.0, low_open=True), default=1.0,
        help="dynamic jobs may hold up to this x their request (default 1: the same budget)"
    )
    st.add_argument("--no-noise", action="store_true", help="no throughput/efficiency noise")
    st.add_argument("--perturb", action="store_true", help="untuned requests: batch and devices x 2^{-1,0,1} (default: as made)")
    st.add_argument("--shared-cluster", action="store_true", help="runs contend for one cluster in groups (default: each alone)")
    st.add_argument("--jobs-per-cluster", type=integer_arg(low=1, high=MAX_JOBS_PER_CLUSTER),
                    help=f"with --shared-cluster: runs per shared cluster, at most {MAX_JOBS_PER_CLUSTER:,} (default 160)")
    st.add_argument(
        "--price-floor",
        type=decimal_arg(high=1.0),
        help="convergence_aware per job (not with --shared-cluster): price floor per device in single-device goodputs, "
        "0-1 (default 0.1; 0 minimises time)",
    )
    st.add_argument(
        "--reference-limits",
        action="store_true",
        help="apply the reference's per-application limits (ncf: one device); default: what the profiles measure",
    )
    st.add_argument("--workloads", action="append", metavar="CSV", help="request pool (default: the shipped workloads)")
    st.add_argument("--declared-sigma", type=decimal_arg(),
                    help="runs declare their epoch budget x exp(sigma z) (default 0); needs a dynamic policy")
    st.add_argument("--gns-estimate-sigma", type=decimal_arg(),
                    help="log-normal spread of each run's own noise-scale estimate per epoch (default 0.2); needs a dynamic policy")
    st.add_argument("--old-target-rule", action="store_true",
                    help="judge the target by the metric of the geometric-mean batch (the earlier rule) instead of the work done")
    st.add_argument("--resamples", type=integer_arg(low=1, high=MAX_RESAMPLES), default=2000,
                    help=f"bootstrap resamples for the CIs, at most {MAX_RESAMPLES:,} (default 2000)")
    common(st, "inplace", "inplace")

    sub.add_parser("profiles", help="list the shipped profiles and their measured noise levels")
    if with_rl:
        from dra.rl.cli import add_parser as add_rl_parser  # issue 12: dra-sim rl

        add_rl_parser(sub)
    else:  # listed without importing dra.rl, which loads torch (the cluster commands never need it)
        sub.add_parser("rl", help="RL post-training: static splits vs stage balance vs colocated (simulated)")
    return parser


def _plugin_files(argv: list[str]) -> list[str]:
    """The --plugin values, read before the parser is built (their policies are --policy choices)."""
    files = []
    for i, a in enumerate(argv):
        if a == "--plugin" and i + 1 < len(argv):
            files.append(argv[i + 1])
        elif a.startswith("--plugin="):
            files.append(a[len("--plugin="):])
    return files


def _refuse_plugin(why: str) -> None:
    """As argparse refuses a value: one line, exit status 2."""
    print(f"dra-sim: error: argument --plugin: {why}", file=sys.stderr)
    raise SystemExit(2)


#: The policies each --plugin file registered (name -> file), to name the file when one fails at run time.
_PLUGIN_POLICIES: dict[str, str] = {}


def _load_plugins(files: list[str]) -> None:
    """Runs each --plugin file (the user's own code, as `python FILE` would); each must register at
    least one cluster policy."""
    import runpy

    import dra.sim as sim

    for path in files:
        if not os.path.isfile(path):
            _refuse_plugin(f"{path!r} is not a file; give a Python file that calls dra.sim.add_cluster_policy")
        before = set(sim.sim_policy_names())
        try:
            runpy.run_path(path, run_name="__dra_sim_plugin__")
        except Exception as e:  # noqa: BLE001 - the user's file: said with its name, not a traceback
            _refuse_plugin(f"{path} failed: {type(e).__name__}: {e}")
        added = set(sim.sim_policy_names()) - before
        if not added:
            _refuse_plugin(f"{path} registered no policy; call dra.sim.add_cluster_policy(name, decide) in it")
        _PLUGIN_POLICIES.update(dict.fromkeys(added, path))


@console("dra-sim")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("replay", "study"):
        _load_plugins(_plugin_files(argv))
    args = _parser(with_rl=bool(argv) and argv[0] == "rl").parse_args(argv)
    if args.command == "rl":
        from dra.rl.cli import run as run_rl

        return run_rl(args)
    import dra.sim as sim
    from dra.sim._inputs import check_policies
    from dra.sim._replay import check_workload

    try:
        if args.command == "profiles":
            profiles = sim.load_profiles()
            print(f"profiles in {sim.default_data_dir() / 'traces'}:")
            for name in profiles.names():
                print(f"  {name}: {profiles.info(name)}")
            print("(max_replicas: the application's limit under --reference-limits, 0 for none; the devices a job "
                  "may use are the cluster's, --nodes x --devices-per-node)")
            return 0
        check_policies(args.policy)
        _check_outputs(args)
        if getattr(args, "plots", None) and getattr(args, "no_jobs", False):
            raise ValueError("--plots needs the per-job records and timelines; drop --no-jobs")
        _check_together(args)
        if args.command == "replay":
            workloads = [_workload(w, args.quiet) for w in args.workload or []]
            if args.all_loads:
                for folder in ALL_LOADS:
                    workloads += [str(data_folder(folder, "--all-loads") / f"workload-{i}.csv") for i in range(1, 9)]
            if not workloads:
                raise ValueError("replay: give --workload CSV (repeatable) or --all-loads")
            # Every input checked before anything is simulated: a bad second workload must not cost
            # the first one's simulation first.
            sim.costs_by_policy(args.policy or [p for p in sim.sim_policy_names() if not p.startswith("oracle_")],
                                args.cost_mode,
                                cost=args.reallocation_cost,
                                in_place_cost=args.in_place_cost, restart_cost=args.restart_cost)
            profiles = sim.load_profiles(args.traces)
            for w in workloads:
                check_workload(w, profiles, nodes=args.nodes, devices_per_node=args.devices_per_node,
                               declared_sigma=args.declared_sigma, declared_none_share=args.declared_none,
                               early_stop_share=args.early_stop)
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
                    declaration_seed=1 if args.declaration_seed is None else args.declaration_seed,
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
            if args.plots:  # first: a plot that cannot be written leaves nothing of this command behind
                from dra.sim.plots import plot_replay

                labels = _unique([f"{d['workload']}-load{d['load']}" if d.get("load") else d["workload"] for d in docs])
                _all_or_none(lambda tmp: [p for d, label in zip(docs, labels) for p in plot_replay(d, tmp, label=label)],
                             args.plots, args.quiet)
            if args.json:
                write_json(docs[0] if len(docs) == 1 else {"workloads": dict(zip(keys, docs))}, args.json)
                _wrote(args.json, args.quiet)
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
                jobs_per_cluster=160 if args.jobs_per_cluster is None else args.jobs_per_cluster,
                traces=args.traces,
                workloads=args.workloads,
                quiet=args.quiet,
                resamples=args.resamples,
                jobs_detail=not args.no_jobs,
                price_floor=args.price_floor,
                declared_sigma=args.declared_sigma or 0.0,
                gns_estimate_sigma=args.gns_estimate_sigma,
                target_by_work=not args.old_target_rule,
            )
            text = sim.markdown_study(doc)
            note = sim.unfinished_note(doc)
            if note:
                print(f"[dra-sim] study: {note}", file=sys.stderr)
            if args.plots:
                from dra.sim.plots import plot_study

                _all_or_none(lambda tmp: plot_study(doc, tmp), args.plots, args.quiet)
            if args.json:
                write_json(doc, args.json)
                _wrote(args.json, args.quiet)
        print(text)
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(text)
            _wrote(args.markdown, args.quiet)
    except ValueError as exc:
        _console.error("dra-sim", str(exc))
        return 2
    except RuntimeError as exc:  # a --plugin policy that raised while it ran: the user's code, said in one line
        failed = re.match(r"cluster policy '([^']*)' at t = ", str(exc))
        if not failed or failed.group(1) not in _PLUGIN_POLICIES:
            raise
        name = failed.group(1)
        said = str(exc).strip().splitlines()[0]  # pybind11 adds the Python frames ("At: ...") below
        _console.error("dra-sim", f"--policy {name} (from --plugin {_PLUGIN_POLICIES[name]}) failed: {said}; fix its "
                       f"decide function, or drop --policy {name}")
        return 2
    except BrokenPipeError:
        raise  # stdout's reader went away (dra-sim ... | head): @console ends quietly; no output path is at fault
    except FileNotFoundError as exc:
        outputs = {getattr(args, k, None) for k in ("json", "markdown", "plots")} - {None}
        if exc.filename is None or not any(str(exc.filename).startswith(str(o)) for o in outputs):
            _console.error("dra-sim", str(exc))  # a message of ours (no profiles found, ...) or an input
            return 2
        _console.error("dra-sim", f"cannot write {exc.filename}: {exc.strerror or exc}; give a writable path")
        return 2
    except OSError as exc:  # an output path that cannot be written
        _console.error("dra-sim", f"cannot write {exc.filename or ''}: {exc.strerror or exc}; give a writable path")
        return 2
    return 0


def _all_or_none(render: Any, folder: str, quiet: bool) -> None:
    """Draws the plots into a fresh folder inside ``folder``, then moves them into place once every one
    was drawn and each name is free for a file: a plot that could not be written left the ones before
    it (and the JSON) behind."""
    import shutil
    import tempfile

    Path(folder).mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".drawing-", dir=folder)
    try:
        drawn = render(tmp)
        for path in drawn:
            target = Path(folder) / Path(path).name
            if target.is_dir() or target.is_symlink():
                raise OSError(errno.EISDIR, "a folder or link holds that name", str(target))
        for path in drawn:
            target = Path(folder) / Path(path).name
            if target.exists():  # said even with --quiet: a plot of other options has the same name
                print(f"[dra-sim] replaced {target} (a plot of the same name was there)", file=sys.stderr)
            os.replace(path, target)
            _wrote(target, quiet)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _wrote(path: object, quiet: bool) -> None:
    """Names a file written, on stderr with the progress (--quiet silences both; errors and the
    results' warnings still show)."""
    if not quiet:
        print(f"[dra-sim] wrote {path}", file=sys.stderr)


def _workload(given: str, quiet: bool) -> str:
    """A --workload: the file as given, else the copy dra ships under that name (``sim.workload_path``,
    said on stderr); a file found in neither place is refused naming both."""
    import dra.sim as sim

    found = sim.workload_path(given)
    if not found.exists():
        raise ValueError(
            f"--workload {given}: no such file in {Path.cwd()}; the workloads dra ships are "
            f"{sim.default_data_dir()}/workloads*/workload-1..8.csv, found by those paths or as the docs write them "
            "(data/pollux/workloads/workload-1.csv); --all-loads replays all 32"
        )
    if str(found) != given and not quiet:
        print(f"[dra-sim] {given}: not in {Path.cwd()}; using the copy dra ships, {found}", file=sys.stderr)
    return str(found)


def _unique(names: list[str]) -> list[str]:
    """The names with a #2, #3... suffix on repeats, so no result overwrites another."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def _check_together(args: argparse.Namespace) -> None:
    """Refuses what the options given are together: one that the others make useless (it would be
    silently ignored), or a study above the bootstrap's bound. (The cost options of replay are
    checked by ``costs_by_policy``; a workload's declared_epochs column against --declared-sigma /
    --declared-none by ``check_workload``.)"""
    import dra.sim as sim

    unused: list[tuple[str, str]] = []
    if args.command == "replay":
        if args.declaration_seed is not None and not (args.declared_sigma or args.declared_none or args.early_stop):
            unused.append(("--declaration-seed", "draws nothing while --declared-sigma, --declared-none and --early-stop "
                           "are 0 (jobs declare their budget exactly, none stops early); drop it or set one of them"))
    elif args.command == "study":
        if args.runs * args.resamples > MAX_BOOTSTRAP:
            raise ValueError(
                f"--runs {args.runs} x --resamples {args.resamples}: above the bound runs x resamples <= {MAX_BOOTSTRAP:,} "
                f"(the bootstrap alone would take about {args.runs * args.resamples * 24e-6 / 60:.0f} minutes); give at most "
                f"--resamples {MAX_BOOTSTRAP // args.runs} at {args.runs} runs"
            )
        dynamic = [p for p in (args.policy or (sim.SHARED_POLICIES if args.shared_cluster else sim.STUDY_POLICIES))
                   if p != "static"]
        if args.jobs_per_cluster is not None and not args.shared_cluster:
            unused.append(("--jobs-per-cluster", "groups runs on a shared cluster; each run is alone without "
                           "--shared-cluster: add it or drop --jobs-per-cluster"))
        if args.price_floor is not None and args.shared_cluster:
            unused.append(("--price-floor", "is convergence_aware's per-job price; on a shared cluster it is "
                           "arbitrated by the cluster objective: drop --price-floor or --shared-cluster"))
        elif args.price_floor is not None and "convergence_aware" not in dynamic:
            unused.append(("--price-floor", f"is convergence_aware's, which is not run (policies: {', '.join(dynamic) or 'static only'}); "
                           "add --policy convergence_aware or drop --price-floor"))
        if not dynamic:
            for flag, given in (("--declared-sigma", args.declared_sigma is not None),
                                ("--gns-estimate-sigma", args.gns_estimate_sigma is not None),
                                ("--old-target-rule", args.old_target_rule)):
                if given:
                    unused.append((flag, "is seen by the dynamic policies only, and only the static baselines run; "
                                   "add a dynamic --policy or drop it"))
    if unused:
        raise ValueError("; ".join(f"{flag}: not used here, it {why}" for flag, why in unused))


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuses output paths that cannot be written, or that name an input or another output,
    before any simulation runs."""
    import dra.sim as sim

    inputs = [("--workload", str(sim.workload_path(w))) for w in getattr(args, "workload", None) or []]
    inputs += [("--workloads", w) for w in getattr(args, "workloads", None) or []]
    inputs += [("--plugin", f) for f in getattr(args, "plugin", None) or []]
    if getattr(args, "traces", None):
        inputs.append(("--traces", args.traces))
    for flag in ("reallocation_cost", "in_place_cost", "restart_cost"):  # a `dra.bench resize` JSON report
        given = getattr(args, flag, None)
        if isinstance(given, str) and given.strip().lower().endswith(".json"):
            inputs.append((f"--{flag.replace('_', '-')}", given.strip()))
    if getattr(args, "all_loads", False):
        inputs += [("--all-loads", str(data_folder(folder, "--all-loads") / f"workload-{i}.csv"))
                   for folder in ALL_LOADS for i in range(1, 9)]
    check_output_paths(getattr(args, "json", None), getattr(args, "markdown", None), getattr(args, "plots", None),
                       inputs=inputs)


if __name__ == "__main__":
    sys.exit(main())
