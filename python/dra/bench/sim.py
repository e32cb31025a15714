"""``python -m dra.bench sim``: simulator speed and the headline results.

Measures the wall time of one 160-job workload replay per policy (the reference Python simulator
takes up to 30 minutes for one), the 1,500-run study, and records the average JCT of each
policy next to the published Pollux figure (baseline) so the ratio reads as "vs Pollux".
"""

from __future__ import annotations

import argparse
import time

import dra.sim as sim
from dra.bench._report import result, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench sim")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--workloads", type=int, nargs="*", default=[1, 2, 3, 4])
    parser.add_argument("--runs", type=int, default=1500, help="study runs (0: skip the study)")
    args = parser.parse_args(argv)

    results = []
    published = sim.published_jct()
    for w in args.workloads:
        path = sim.default_data_dir() / "workloads" / f"workload-{w}.csv"
        for cost_name, cost in (("cost30", 30.0), ("inplace", sim.IN_PLACE_RESIZE_COST_S)):
            doc = sim.replay(path, reallocation_cost=cost, quiet=True)
            for p, agg in doc["policies"].items():
                results.append(result(f"replay.workload-{w}.{cost_name}.{p}.wall", agg["wall_s"], "s"))
                base = published.get("pollux", {}).get(f"workload-{w}")
                results.append(
                    result(
                        f"replay.workload-{w}.{cost_name}.{p}.avg_jct",
                        agg["avg_jct_s"],
                        "s",
                        ("pollux published", base) if base else None,
                    )
                )
    if args.runs > 0:
        start = time.perf_counter()
        doc = sim.study(args.runs, seed=1, quiet=True)
        results.append(result(f"study.{args.runs}.wall", time.perf_counter() - start, "s"))
        for p, agg in doc["policies"].items():
            if p == "static":
                continue
            results.append(result(f"study.{p}.training_time_change", 100.0 * agg["training_time_reduction"]["estimate"], "%"))
            results.append(result(f"study.{p}.utilization_change", 100.0 * agg["utilization_change"]["estimate"], "%"))
    write_report("sim", results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
