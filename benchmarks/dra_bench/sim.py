"""``python -m dra.bench sim``: the simulator's speed and dra's policy against Pollux (simulated).

Every figure is simulated (replayed Pollux workloads on the measured profiles, or generated study
runs). Rows:

- ``replay.workload-W.cost30.<policy>.{wall,avg_jct}`` (load 1.0): each policy next to Pollux run
  side by side in the same simulator under the same rules;
- ``sim_jct_vs_pollux`` (one per load): geometric mean over the workloads of dra's
  ``convergence_aware`` average JCT, baseline Pollux's, 30 s per reallocation for both, jobs
  declaring their epoch budget exactly; ``sim_p99_vs_pollux`` the same for the p99 JCT;
  ``sim_worst_case_vs_pollux`` the case with the largest ratio; ``sim_budget_sigma05_vs_pollux``
  with budgets declared with log-normal error sigma 0.5;
- ``estimator_error_p50``: median relative error of the remaining-work estimate at 50 % of a job's
  life (sigma 0.5 declarations, a quarter declaring nothing, 30 % stopping early), baseline the
  declaration alone;
- ``study_time_vs_request``, ``study_time_vs_best_hindsight``, ``study_gpu_hours_vs_request``: the
  generated study (each run alone, in-place resize cost), ``convergence_aware`` against the
  static baselines.

The default run is short (workloads 1 and 2 at every load, 200 study runs); ``--full`` runs the
eight workloads and 1,500 study runs (``docs/results/sim/`` holds its output and command).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import dra.sim as sim
from dra_bench._report import result, write_report

LOADS = {"0.5": "workloads-0.5", "1.0": "workloads", "1.5": "workloads-1.5", "2.0": "workloads-2.0"}
POLICY = "convergence_aware"


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _replays(workloads: list[int], loads: list[str], sigma: float, policies: list[str], **kw: Any) -> dict[str, dict]:
    docs = {}
    for load in loads:
        for w in workloads:
            path = sim.default_data_dir() / LOADS[load] / f"workload-{w}.csv"
            docs[f"{load}/{w}"] = sim.replay(
                path, policies=policies, reallocation_cost=sim.POLLUX_REALLOCATION_COST_S, quiet=True,
                jobs_detail=False, resamples=200, declared_sigma=sigma, **kw,
            )
    return docs


def _vs_pollux_rows(docs: dict[str, dict], loads: list[str], name: str, key: str, unit: str = "s") -> list[dict]:
    rows = []
    for load in loads:
        cases = [d for k, d in docs.items() if k.startswith(load + "/")]
        mine = [d["policies"][POLICY][key] for d in cases]
        theirs = [d["policies"]["pollux"][key] for d in cases]
        ratios = [a / b for a, b in zip(mine, theirs)]
        rows.append(result(name, _gmean(mine), unit, ("pollux", _gmean(theirs)), load=float(load), cases=len(cases),
                           worse=sum(r > 1.0 for r in ratios), worst_ratio=max(ratios)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench sim")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--workloads", type=int, nargs="*", default=None, help="workloads (default 1 2; --full: 1-8)")
    parser.add_argument("--loads", nargs="*", default=list(LOADS), choices=list(LOADS))
    parser.add_argument("--runs", type=int, default=None, help="study runs (default 200; --full 1500; 0: skip)")
    parser.add_argument("--full", action="store_true", help="the eight workloads and 1,500 study runs")
    args = parser.parse_args(argv)
    workloads = args.workloads or (list(range(1, 9)) if args.full else [1, 2])
    runs = args.runs if args.runs is not None else (1500 if args.full else 200)

    results: list[dict] = []
    start = time.perf_counter()
    exact = _replays(workloads, args.loads, 0.0, ["pollux", POLICY])
    if "1.0" in args.loads:
        for w in workloads:
            doc = exact[f"1.0/{w}"]
            pollux = doc["policies"]["pollux"]["avg_jct_s"]
            for p, agg in doc["policies"].items():
                results.append(result(f"replay.workload-{w}.cost30.{p}.wall", agg["wall_s"], "s"))
                results.append(result(f"replay.workload-{w}.cost30.{p}.avg_jct", agg["avg_jct_s"], "s",
                                      ("pollux in the same simulator", pollux) if p != "pollux" else None))
    results += _vs_pollux_rows(exact, args.loads, "sim_jct_vs_pollux", "avg_jct_s")
    results += _vs_pollux_rows(exact, args.loads, "sim_p99_vs_pollux", "p99_jct_s")
    worst = max(exact.items(), key=lambda kv: kv[1]["policies"][POLICY]["avg_jct_s"] / kv[1]["policies"]["pollux"]["avg_jct_s"])
    results.append(result("sim_worst_case_vs_pollux", worst[1]["policies"][POLICY]["avg_jct_s"], "s",
                          ("pollux", worst[1]["policies"]["pollux"]["avg_jct_s"]), case=f"workload-{worst[0].split('/')[1]}"
                          f"@{worst[0].split('/')[0]}x"))
    noisy = _replays(workloads, args.loads, 0.5, ["pollux", POLICY])
    results += _vs_pollux_rows(noisy, args.loads, "sim_budget_sigma05_vs_pollux", "avg_jct_s")

    # The estimator, where declarations are wrong or missing and jobs stop early.
    mixed = _replays(workloads, ["1.0"], 0.5, ["pollux", POLICY], declared_none_share=0.25, early_stop_share=0.3)
    errors, naive = [], []
    for doc in mixed.values():
        cal = doc["policies"][POLICY]["remaining_work_calibration"]["0.5"]
        errors.append((cal["median_rel_error"], cal["jobs"]))
        naive.append((cal["declared_only_median_rel_error"], cal["jobs"]))
    total = sum(n for _, n in errors)
    results.append(result("estimator_error_p50", sum(e * n for e, n in errors) / total, "relative",
                          ("the declaration alone", sum(e * n for e, n in naive if e is not None) / total),
                          jobs=total, tail_coverage=[doc["policies"][POLICY]["remaining_work_calibration"]["0.5"]["tail_coverage"]
                                                     for doc in mixed.values()]))
    results.append(result("sim.replays.wall", time.perf_counter() - start, "s"))

    if runs > 0:
        start = time.perf_counter()
        doc = sim.study(runs, seed=1, quiet=True, jobs_detail=False, policies=[POLICY])
        results.append(result(f"study.{runs}.wall", time.perf_counter() - start, "s"))
        agg = doc["policies"]
        mine = agg[POLICY]
        for name, base, key in (("study_time_vs_request", "static_request", "mean_training_time_s"),
                                ("study_time_vs_best_hindsight", "static_best_hindsight", "mean_training_time_s"),
                                ("study_gpu_hours_vs_request", "static_request", "gpu_hours")):
            vs = mine["vs"][base]
            change = vs["gpu_hours_change"] if key == "gpu_hours" else vs["training_time_change"]
            results.append(result(name, mine[key], "GPU-h" if key == "gpu_hours" else "s", (base, agg[base][key]),
                                  ci95=change["ci95"], runs=runs, seed=1,
                                  per_run_median=vs["median_training_time_change_per_run"]["estimate"]))
    write_report("sim", results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
