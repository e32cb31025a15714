"""``python -m dra.bench sim``: simulator speed and the headline results (simulated).

Measures the wall time of one 160-job workload replay per policy (the reference Python simulator
takes up to 30 minutes for one), records each policy's average JCT next to Pollux run side by side
in the same simulator under the same rules (baseline), and the study's changes against the static
request.
"""

from __future__ import annotations

import argparse
import time

import dra.sim as sim
from dra_bench._report import result, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench sim")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--workloads", type=int, nargs="*", default=[1, 2, 3, 4])
    parser.add_argument("--runs", type=int, default=1500, help="study runs (0: skip the study)")
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
