"""``python -m dra.bench sim``: simulator speed and the headline results (simulated).

Measures the wall time of one 160-job workload replay per policy (the reference Python simulator
takes up to 30 minutes for one), records each policy's average JCT next to Pollux run side by side
in the same simulator under the same rules (baseline), and the study's changes against the static
request.
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

import dra.sim as sim
from dra_bench._report import result, write_report

LOADS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}


def fidelity_rows() -> list[dict]:
    """Pollux in dra's simulator against Pollux's published average JCT on every workload x load
    that has a published figure (30 s per reallocation): one row per case and per load (mean of
    the 8 workloads), and the worst case. Simulated."""
    rows, by_load = [], {}
    for load, folder in LOADS.items():
        for w in range(1, 9):
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench sim")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--workloads", type=int, nargs="*", default=[1, 2, 3, 4])
    parser.add_argument("--runs", type=int, default=1500, help="study runs (0: skip the study)")
    parser.add_argument("--no-fidelity", action="store_true", help="skip Pollux against its published figures (32 replays)")
    parser.add_argument("--reference", metavar="PATH", help="a local copy of Pollux's reference simulator/ folder: run it side by side")
    parser.add_argument("--reference-python", default=os.environ.get("POLLUX_PYTHON", "python3.8"),
                        help="the Python of the reference's own environment (default: $POLLUX_PYTHON or python3.8)")
    parser.add_argument("--reference-jobs", type=int, default=8, help="jobs of workload-6's prefix for the side-by-side run")
    args = parser.parse_args(argv)

    results = []
    for w in args.workloads:
        path = sim.default_data_dir() / "workloads" / f"workload-{w}.csv"
        doc = sim.replay(path, reallocation_cost=sim.POLLUX_REALLOCATION_COST_S, quiet=True, jobs_detail=False, resamples=200)
        pollux = doc["policies"].get("pollux", {}).get("avg_jct_s")
        for p, agg in doc["policies"].items():
            results.append(result(f"replay.workload-{w}.cost30.{p}.wall", agg["wall_s"], "s"))
            results.append(
                result(
                    f"replay.workload-{w}.cost30.{p}.avg_jct",
                    agg["avg_jct_s"],
                    "s",
                    ("pollux in the same simulator", pollux) if pollux and p != "pollux" else None,
                )
            )
        published = doc["published_avg_jct_s"].get("pollux")
        if published and pollux:
            results.append(result(f"replay.workload-{w}.cost30.pollux.vs_published", pollux, "s", ("pollux published", published)))
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
    if args.runs > 0:
        start = time.perf_counter()
        doc = sim.study(args.runs, seed=1, quiet=True, jobs_detail=False)
        results.append(result(f"study.{args.runs}.wall", time.perf_counter() - start, "s"))
        for p, agg in doc["policies"].items():
            for base, changes in agg["vs"].items():
                results.append(result(f"study.{p}.vs_{base}.training_time_change", 100.0 * changes["training_time_change"]["estimate"], "%"))
                results.append(result(f"study.{p}.vs_{base}.gpu_hours_change", 100.0 * changes["gpu_hours_change"]["estimate"], "%"))
    write_report("sim", results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
