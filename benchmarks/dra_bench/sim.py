"""``python -m dra.bench sim``: the simulator's speed and dra's policy against Pollux (simulated).

Every figure is simulated (replayed Pollux workloads on the measured profiles, or generated study
runs). Rows:

- ``replay.workload-W.cost30.<policy>.{wall,avg_jct}`` (load 1.0): each policy next to Pollux run
  side by side in the same simulator under the same rules;
- ``sim_jct_vs_pollux`` (one per load): geometric mean over the workloads of dra's
  ``convergence_aware`` average JCT, baseline Pollux's, 30 s per reallocation for both, every job
  declaring its epoch budget exactly; ``sim_p99_vs_pollux`` the same for the p99 JCT;
  ``sim_worst_case_vs_pollux`` the case with the largest ratio; ``sim_budget_sigma05_vs_pollux``
  with budgets declared with log-normal error sigma 0.5 (``--full``: also ``sim_budget_sigma10_vs_pollux``
  and the oracle's ``sim_oracle_jct_vs_pollux``, an upper bound);
- the issue's realistic declarations, one row per load: ``sim_mixed_vs_pollux`` (and
  ``sim_mixed_p99_vs_pollux``): sigma 0.5, a quarter declaring nothing, 30 % stopping early on a
  plateau (the truth changes, so Pollux reruns on the same jobs); ``sim_no_declaration_vs_pollux``:
  no job declares anything (the estimator has only loss curves and finished jobs of the same kind);
  every ratio row holds the per-workload ratios (``ratios``);
- ``sim_fidelity_pollux`` (unless ``--no-fidelity``): Pollux in dra's simulator against Pollux's
  published average JCT, geometric mean over every workload x load with a published figure, with
  ``sim_fidelity_pollux.workload-W@Lx`` per case, ``sim_fidelity_pollux@Lx`` per load,
  ``_worst`` and ``_geomean``; ``sim_process_wall.workload-6.pollux`` (a whole ``dra-sim``
  process); ``--reference PATH`` runs Pollux's own reference simulator side by side on a prefix of
  workload 6;
- ``estimator_error_p50``: median relative error of the remaining-work estimate at 50 % of a job's
  life in the mixed replays at load 1 (every load when 1 is not run), baseline the declaration
  alone; ``calibration`` holds the median and p90 at 10, 50 and 90 % of a job's life;
- ``study_time_vs_request``, ``study_time_vs_best_hindsight``, ``study_gpu_hours_vs_request``: the
  generated study (each run alone, at dra's measured in-place resize cost), ``convergence_aware``
  against the static baselines (``--full``: seeds 1-5, and the shared-cluster utilisation);
  ``study_time_vs_request_old_rule``: the same policy judged by the earlier target rule (the
  metric of the epoch-weighted geometric-mean batch), to show what the rule change did.

The default run is short (workloads 1 and 2 at every load, 200 study runs of seed 1); ``--full``
runs the eight workloads and 1,500 study runs per seed; ``--only declarations`` runs only the
exact, mixed and nothing-declared replays (``sim_jct_vs_pollux``, ``sim_mixed_*``,
``sim_no_declaration_vs_pollux``, ``estimator_error_p50``); ``--out DIR`` also writes each replay's and
study's JSON, a markdown summary and a PNG of the JCT ratios.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dra.sim as sim
from dra._argtypes import count_arg, nonnegative_int_arg
from dra._jsonio import write_json
from dra_bench._report import result, write_report

LOADS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}


def fidelity_rows(workloads: list[int] | None = None, loads: list[str] | None = None) -> list[dict]:
    """Pollux in dra's simulator against Pollux's published average JCT on every workload x load
    that has a published figure (30 s per reallocation; default: workloads 1-8 at every load): one
    row per case and per load (mean of the workloads), the worst case, and ``sim_fidelity_pollux``,
    the geometric mean over the cases of ours / published. Simulated."""
    rows, by_load = [], {}
    for load in loads or list(LOADS):
        folder = LOADS[load]
        for w in workloads or range(1, 9):
            path = sim.default_data_dir() / folder / f"workload-{w}.csv"
            doc = sim.replay(path, policies=["pollux"], quiet=True, jobs_detail=False, resamples=10)
            published = doc["published_avg_jct_s"].get("pollux")
            ours = doc["policies"]["pollux"]["avg_jct_s"]
            if not published or ours is None:
                continue
            rows.append(result(f"sim_fidelity_pollux.workload-{w}@{load}x", ours, "s", ("published", published)))
            by_load.setdefault(load, []).append((ours, published))
    for load, pairs in by_load.items():
        ours = sum(o for o, _ in pairs) / len(pairs)
        pub = sum(p for _, p in pairs) / len(pairs)
        rows.append(result(f"sim_fidelity_pollux@{load}x", ours, "s", ("published", pub), cases=len(pairs)))
    ratios = [r["ratio"] for r in rows if "@" in r["name"] and "workload-" in r["name"]]
    if ratios:
        worst = max(ratios, key=lambda x: abs(x - 1.0))
        rows.append(result("sim_fidelity_pollux_worst", 100.0 * (worst - 1.0), "%", cases=len(ratios)))
        pairs = [p for ps in by_load.values() for p in ps]
        rows.append(result("sim_fidelity_pollux", _gmean([o for o, _ in pairs]), "s",
                           ("published", _gmean([p for _, p in pairs])), cases=len(pairs),
                           within_2_percent=sum(abs(x - 1.0) <= 0.02 for x in ratios), worst_ratio=worst))
        rows.append(result("sim_fidelity_pollux_geomean", math.exp(sum(math.log(x) for x in ratios) / len(ratios)), "x"))
    return rows


def reference_rows(simulator: str, python: str, jobs: int, seed: int) -> list[dict]:
    """Pollux's reference simulator (a local copy, its own Python) and dra-sim on the same prefix of
    workload-6, side by side: whole-process wall time of each and average JCT of each."""
    src = sim.default_data_dir() / "workloads" / "workload-6.csv"
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / f"workload-6-first{jobs}.csv"
        prefix.write_text("".join(src.read_text().splitlines(keepends=True)[: jobs + 1]))
        out = Path(tmp) / "reference.csv"
        driver = Path(__file__).with_name("pollux_reference.py")
        start = time.perf_counter()
        subprocess.run(
            [python, str(driver), "--simulator", simulator, "--workload", str(prefix), "--seed", str(seed), "--csv", str(out)],
            check=True,
        )
        ref_wall = time.perf_counter() - start
        ref = list(csv.DictReader(out.open()))
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dra.sim.cli", "replay", "--workload", str(prefix), "--policy", "pollux", "--quiet",
             "--no-jobs", "--json", str(Path(tmp) / "dra.json")],
            check=True, stdout=subprocess.DEVNULL,
        )
        dra_wall = time.perf_counter() - start
        doc = sim.replay(prefix, policies=["pollux"], quiet=True, resamples=10)
    ref_avg = sum(float(r["jct_s"]) for r in ref) / len(ref)
    ours = {j["name"]: j["jct_s"] for j in doc["jobs"]}
    worst = max(abs(ours[r["name"]] / float(r["jct_s"]) - 1.0) for r in ref)
    return [
        result(f"sim_reference_pollux.workload-6.first{jobs}.avg_jct", doc["policies"]["pollux"]["avg_jct_s"], "s",
               ("pollux reference simulator", ref_avg), seed=seed, worst_job_change=worst),
        result(f"sim_speed_vs_reference.workload-6.first{jobs}", ref_wall / dra_wall, "x",
               note=f"whole process: reference {ref_wall:.1f} s, dra-sim {dra_wall:.2f} s, measured side by side"),
    ]
POLICY = "convergence_aware"
ORACLE = "oracle_convergence_aware"
MIXED = {"declared_sigma": 0.5, "declared_none_share": 0.25, "early_stop_share": 0.3}
NO_DECLARATION = {"declared_none_share": 1.0}
RESIZE_REPORT = Path(__file__).resolve().parents[2] / "docs" / "results" / "sim" / "resize-100MB.json"


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _replays(workloads: list[int], loads: list[str], policies: list[str], out: Path | None, tag: str,
             **kw: Any) -> dict[str, dict]:
    docs = {}
    for load in loads:
        for w in workloads:
            path = sim.default_data_dir() / LOADS[load] / f"workload-{w}.csv"
            docs[f"{load}/{w}"] = sim.replay(path, policies=policies, reallocation_cost=sim.POLLUX_REALLOCATION_COST_S,
                                             quiet=True, jobs_detail=False, resamples=200, **kw)
    if out is not None:
        write_json({"workloads": {f"workload-{k.split('/')[1]}@{k.split('/')[0]}x": d for k, d in docs.items()}},
                   out / f"replay-{tag}.json")
    return docs


def _ratio_rows(docs: dict[str, dict], pollux: dict[str, dict], loads: list[str], name: str, key: str,
                policy: str = POLICY) -> list[dict]:
    rows = []
    for load in loads:
        keys = [k for k in docs if k.startswith(load + "/")]
        mine = [docs[k]["policies"][policy][key] for k in keys]
        theirs = [pollux[k]["policies"]["pollux"][key] for k in keys]
        ratios = [a / b for a, b in zip(mine, theirs)]
        rows.append(result(name, _gmean(mine), "s", ("pollux", _gmean(theirs)), load=float(load), cases=len(keys),
                           worse=sum(r > 1.0 for r in ratios), worst_ratio=max(ratios),
                           ratios={f"workload-{k.split('/')[1]}": r for k, r in zip(keys, ratios)}))
    return rows


def _calibration(docs: dict[str, dict]) -> dict[str, Any]:
    """Job-weighted calibration of the estimator over replays, at 10/50/90 % of a job's life."""
    out = {}
    for f in ("0.1", "0.5", "0.9"):
        cells = [d["policies"][POLICY]["remaining_work_calibration"][f] for d in docs.values()]
        n = sum(c["jobs"] for c in cells)
        avg = lambda key: sum((c[key] or 0.0) * c["jobs"] for c in cells) / n if n else None  # noqa: E731
        out[f] = {"jobs": n, "median_rel_error": avg("median_rel_error"), "p90_rel_error": avg("p90_rel_error"),
                  "tail_coverage": avg("tail_coverage"), "declared_only_median_rel_error": avg("declared_only_median_rel_error")}
    return out


def _plot(exact: dict[str, dict], noisy: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(exact, key=lambda k: (float(k.split("/")[0]), int(k.split("/")[1])))
    x = range(len(keys))
    fig, ax = plt.subplots(figsize=(11, 4))
    for docs, label, marker in ((exact, "budgets declared exactly", "o"), (noisy, "declared with sigma 0.5", "s")):
        ax.plot(x, [docs[k]["policies"][POLICY]["avg_jct_s"] / exact[k]["policies"]["pollux"]["avg_jct_s"] for k in keys],
                marker, label=f"avg JCT, {label}")
    ax.plot(x, [exact[k]["policies"][POLICY]["p99_jct_s"] / exact[k]["policies"]["pollux"]["p99_jct_s"] for k in keys],
            "^", label="p99 JCT, budgets declared exactly")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.92, color="grey", lw=0.8, ls="--")
    ax.set_xticks(list(x), [f"w{k.split('/')[1]}@{k.split('/')[0]}x" for k in keys], rotation=90, fontsize=7)
    ax.set_ylabel("convergence_aware / pollux")
    ax.set_title("dra's convergence_aware against Pollux in the same simulator (simulated, 30 s per change)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _replay_rows(args: argparse.Namespace, workloads: list[int], loads: list[str], out: Path | None) -> list[dict]:
    results: list[dict] = []
    start = time.perf_counter()
    everything = args.only != "declarations"
    exact = _replays(workloads, loads, ["pollux", POLICY] + ([ORACLE] if args.full else []), out, "exact")
    if "1.0" in loads and everything:
        for w in workloads:
            doc = exact[f"1.0/{w}"]
            pollux = doc["policies"]["pollux"]["avg_jct_s"]
            for p, agg in doc["policies"].items():
                results.append(result(f"replay.workload-{w}.cost30.{p}.wall", agg["wall_s"], "s"))
                results.append(result(f"replay.workload-{w}.cost30.{p}.avg_jct", agg["avg_jct_s"], "s",
                                      ("pollux in the same simulator", pollux) if p != "pollux" else None))
    results += _ratio_rows(exact, exact, loads, "sim_jct_vs_pollux", "avg_jct_s")
    noisy: dict[str, dict] = {}
    if everything:
        results += _ratio_rows(exact, exact, loads, "sim_p99_vs_pollux", "p99_jct_s")
        worst = max(exact, key=lambda k: exact[k]["policies"][POLICY]["avg_jct_s"] / exact[k]["policies"]["pollux"]["avg_jct_s"])
        results.append(result("sim_worst_case_vs_pollux", exact[worst]["policies"][POLICY]["avg_jct_s"], "s",
                              ("pollux", exact[worst]["policies"]["pollux"]["avg_jct_s"]),
                              case=f"workload-{worst.split('/')[1]}@{worst.split('/')[0]}x"))
        # Declarations do not change Pollux (it never reads them): the same Pollux runs are the baseline.
        noisy = _replays(workloads, loads, [POLICY], out, "sigma0.5", declared_sigma=0.5)
        results += _ratio_rows(noisy, exact, loads, "sim_budget_sigma05_vs_pollux", "avg_jct_s")
    if args.full and everything:
        results += _ratio_rows(exact, exact, loads, "sim_oracle_jct_vs_pollux", "avg_jct_s", ORACLE)
        wrong = _replays(workloads, loads, [POLICY], out, "sigma1.0", declared_sigma=1.0)
        results += _ratio_rows(wrong, exact, loads, "sim_budget_sigma10_vs_pollux", "avg_jct_s")
    # The realistic mix. Early stopping changes the truth, so Pollux reruns on the same jobs.
    mixed = _replays(workloads, loads, ["pollux", POLICY] + ([ORACLE] if args.full else []), out, "mixed", **MIXED)
    results += _ratio_rows(mixed, mixed, loads, "sim_mixed_vs_pollux", "avg_jct_s")
    results += _ratio_rows(mixed, mixed, loads, "sim_mixed_p99_vs_pollux", "p99_jct_s")
    # Nothing declared and no early stop: the truth is exact's, so are Pollux's runs.
    none = _replays(workloads, loads, [POLICY], out, "no-declaration", **NO_DECLARATION)
    results += _ratio_rows(none, exact, loads, "sim_no_declaration_vs_pollux", "avg_jct_s")
    cal = _calibration({k: d for k, d in mixed.items() if k.startswith("1.0/")} or mixed)
    results.append(result("estimator_error_p50", cal["0.5"]["median_rel_error"], "relative",
                          ("the declaration alone", cal["0.5"]["declared_only_median_rel_error"]),
                          jobs=cal["0.5"]["jobs"], tail_coverage=cal["0.5"]["tail_coverage"], calibration=cal))
    results.append(result("sim.replays.wall", time.perf_counter() - start, "s"))
    if out and noisy:
        _plot(exact, noisy, out / "jct-vs-pollux.png")
    return results


def _study_rows(args: argparse.Namespace, runs: int, out: Path | None) -> list[dict]:
    results: list[dict] = []
    cost = sim.parse_cost(str(RESIZE_REPORT)) if RESIZE_REPORT.is_file() else sim.IN_PLACE_RESIZE_COST_S
    seeds = [1, 2, 3, 4, 5] if args.full else [1]
    by_seed: dict[str, list[dict]] = {"study_time_vs_request": [], "study_time_vs_best_hindsight": [],
                                      "study_gpu_hours_vs_request": [], "study_shared_utilization_vs_static": []}
    first: dict[str, Any] = {}
    start = time.perf_counter()
    for seed in seeds:
        doc = sim.study(runs, seed=seed, quiet=True, jobs_detail=False, policies=[POLICY], reallocation_cost=cost)
        if out:
            write_json(doc, out / f"study-{runs}-seed{seed}.json")
        mine = doc["policies"][POLICY]
        for name, base, key in (("study_time_vs_request", "static_request", "training_time_change"),
                                ("study_time_vs_best_hindsight", "static_best_hindsight", "training_time_change"),
                                ("study_gpu_hours_vs_request", "static_request", "gpu_hours_change")):
            vs = mine["vs"][base]
            by_seed[name].append({"seed": seed, "change": vs[key]["estimate"], "ci95": vs[key]["ci95"],
                                  "per_run_median": vs["median_training_time_change_per_run"]["estimate"]})
        if seed == 1:
            first = doc
        if args.full:
            shared = sim.study(runs, seed=seed, quiet=True, jobs_detail=False, policies=["pollux", POLICY],
                               reallocation_cost=cost, shared_cluster=True)
            if out:
                write_json(shared, out / f"study-{runs}-seed{seed}-shared.json")
            by_seed["study_shared_utilization_vs_static"].append(
                {"seed": seed, "utilization": shared["policies"][POLICY]["utilization"],
                 "static": shared["policies"]["static_request"]["utilization"],
                 "by_cluster": shared["policies"][POLICY]["vs"]["static_request"]["utilization_change_by_cluster"]})
    results.append(result(f"study.{runs}.wall", time.perf_counter() - start, "s", seeds=seeds))
    agg = first["policies"]
    for name, base, key, unit in (("study_time_vs_request", "static_request", "mean_training_time_s", "s"),
                                  ("study_time_vs_best_hindsight", "static_best_hindsight", "mean_training_time_s", "s"),
                                  ("study_gpu_hours_vs_request", "static_request", "gpu_hours", "GPU-h")):
        results.append(result(name, agg[POLICY][key], unit, (base, agg[base][key]), runs=runs, seed=1,
                              reallocation_cost_s=cost, by_seed=by_seed[name]))
    old_rule = f"{POLICY}@geometric_batch"  # the earlier target rule, run beside the current one
    if old_rule in agg:
        results.append(result("study_time_vs_request_old_rule", agg[old_rule]["mean_training_time_s"], "s",
                              ("static_request", agg["static_request"]["mean_training_time_s"]), runs=runs, seed=1,
                              current_rule_ratio=agg[POLICY]["mean_training_time_s"] / agg["static_request"]["mean_training_time_s"],
                              note="target judged by the metric of the epoch-weighted geometric-mean batch"))
    if args.full:
        s = by_seed["study_shared_utilization_vs_static"]
        results.append(result("study_shared_utilization_vs_static", s[0]["utilization"], "fraction",
                              ("static_request", s[0]["static"]), by_seed=s))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench sim")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--workloads", type=count_arg, nargs="*", default=None, help="workloads (default 1 2; --full: 1-8)")
    parser.add_argument("--loads", nargs="*", default=list(LOADS), choices=list(LOADS))
    parser.add_argument("--runs", type=nonnegative_int_arg, default=None, help="study runs per seed (default 200; --full 1500; 0: skip)")
    parser.add_argument("--full", action="store_true", help="the eight workloads, every declaration sweep, study seeds 1-5")
    parser.add_argument("--out", metavar="DIR", help="also write each replay's and study's JSON, a summary and a PNG here")
    parser.add_argument("--only", choices=["replays", "study", "declarations"],
                        help="run only one half (e.g. two processes in parallel), or only the exact, mixed and "
                             "nothing-declared replays")
    parser.add_argument("--no-fidelity", action="store_true", help="skip Pollux against its published figures (32 replays)")
    parser.add_argument("--reference", metavar="PATH", help="a local copy of Pollux's reference simulator/ folder: run it side by side")
    parser.add_argument("--reference-python", default=os.environ.get("POLLUX_PYTHON", "python3.8"),
                        help="the Python of the reference's own environment (default: $POLLUX_PYTHON or python3.8)")
    parser.add_argument("--reference-jobs", type=count_arg, default=8, help="jobs of workload-6's prefix for the side-by-side run")
    args = parser.parse_args(argv)
    for w in args.workloads or []:
        missing = [load for load in args.loads if not (sim.default_data_dir() / LOADS[load] / f"workload-{w}.csv").is_file()]
        if missing:
            parser.error(f"--workloads: there is no workload {w} (at load {', '.join(missing)}); give workloads 1-8")
    workloads = args.workloads or (list(range(1, 9)) if args.full else [1, 2])
    runs = args.runs if args.runs is not None else (1500 if args.full else 200)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    loads = args.loads

    results: list[dict] = []
    if args.only != "study":
        results += _replay_rows(args, workloads, loads, out)
    if args.only is None or args.only == "replays":
        if not args.no_fidelity:
            results += fidelity_rows()
        # Whole process: dra-sim replay of a 160-job workload under Pollux, without torch.
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dra.sim.cli", "replay", "--workload", str(sim.default_data_dir() / "workloads" / "workload-6.csv"),
             "--policy", "pollux", "--quiet", "--no-jobs"],
            check=True, stdout=subprocess.DEVNULL,
        )
        results.append(result("sim_process_wall.workload-6.pollux", time.perf_counter() - start, "s"))
        if args.reference:
            results += reference_rows(args.reference, args.reference_python, args.reference_jobs, seed=1)
    if runs > 0 and args.only in (None, "study"):
        results += _study_rows(args, runs, out)
    report = write_report("sim", results, args.json)
    if out:
        write_json(report, out / f"bench-sim{'-' + args.only if args.only else ''}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
