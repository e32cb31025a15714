"""Replays of a workload under each policy, with aggregates and paired changes against baselines."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dra import _console, _sim
from dra.sim._inputs import (
    check_measured,
    check_policies,
    check_requests,
    costs_by_policy,
    launch_cost,
    load_profiles,
    published_for,
    read_workload_rows,
    sim_policy_names,
    workload_path,
)
from dra.sim._stats import _percentile, bootstrap_ci

#: The largest cluster a replay takes (--nodes): 4,096 nodes of up to 9 devices; the simulator's
#: work per decision grows with the devices, and no workload fills more.
MAX_NODES = 4096
#: A simulation stops this long after the first arrival (``dra::sim::sim_config::max_time_s``); jobs
#: not done by then are reported unfinished.
HORIZON_S = 30 * 86400.0


def _metric_attainment(profiles: Any, job: dict[str, Any]) -> float | None:
    """Final metric relative to what the trace reaches at the requested batch after its last epoch:
    1.0 is the same quality, below 1 is worse (inverted for falling metrics such as WER)."""
    final = job.get("final_metric")
    if final is None:
        return None
    info = profiles.info(job["application"])
    ref = profiles.best_metric(job["application"], job["requested_batch"], info["max_epochs"])
    if info["metric_increases"]:
        return final / ref if ref else None
    return ref / final if final else None


def estimator_calibration(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """How good the remaining-work estimates were (simulated): at 10, 50 and 90 % of each job's life
    (its epochs), the median and p90 of |estimated median - true| / true remaining epochs, the share
    of jobs whose true remaining work was at most the estimate's tail (p90), and the same error for
    the declaration alone (declared - done, jobs that declared), over all jobs and per application."""
    import numpy as np

    def summary(rows: list[tuple[float, float, float, float]]) -> dict[str, Any]:
        err = np.array([abs(m - t) / t for t, m, _, _ in rows], dtype=float)
        naive = np.array([abs(max(d, 0.0) - t) / t for t, _, _, d in rows if math.isfinite(d)], dtype=float)
        return {
            "jobs": len(rows),
            "median_rel_error": float(np.median(err)) if len(err) else None,
            "p90_rel_error": float(np.percentile(err, 90)) if len(err) else None,
            "tail_coverage": float(np.mean([t <= tail for t, _, tail, _ in rows])) if rows else None,
            "declared_only_median_rel_error": float(np.median(naive)) if len(naive) else None,
        }

    out: dict[str, Any] = {}
    for f in (0.1, 0.5, 0.9):
        by_app: dict[str, list[tuple[float, float, float, float]]] = {}
        for j in jobs:
            declared = j.get("declared_epochs")
            for ff, done, t, m, tail in j.get("estimate_checks", ()):
                if ff == f and t > 0:
                    left = (declared - done) if declared is not None else float("nan")
                    by_app.setdefault(j["application"], []).append((t, m, tail, left))
        rows = [r for rs in by_app.values() for r in rs]
        out[f"{f:g}"] = dict(summary(rows), by_application={a: summary(r) for a, r in sorted(by_app.items())})
    return out


def summarize(result: dict[str, Any], profiles: Any) -> dict[str, Any]:
    """Aggregates of one simulation (one workload, one policy).

    - ``utilization``: busy device time over held device time, summed over jobs. Busy: running
      training steps (gradient computation and synchronisation); held but not busy: waiting out a
      reallocation (restart or resize).
    - ``cluster_utilization``: busy device time over the devices that exist, from the first arrival to
      the last completion; ``allocated_fraction``: held device time over the same.
    - ``compute_utilization``: device time computing gradients over device time held.
    - ``final_metric``: mean metric attainment (see ``_metric_attainment``)."""
    jobs = result["jobs"]
    done = [j for j in jobs if j["jct_s"] is not None]
    jcts = [j["jct_s"] for j in done]
    gpu_s = sum(j["gpu_seconds"] for j in jobs)
    busy_s = sum(j["busy_gpu_seconds"] for j in jobs)
    compute_s = sum(j["compute_gpu_seconds"] for j in jobs)
    # Over the time the simulation ran: to the last completion, or to the horizon when jobs were
    # still running there (their device time counts up to it).
    end = result["makespan_s"] if len(done) == len(jobs) else max(result["end_s"], result["makespan_s"])
    span = max(end - result["first_submit_s"], 1e-9)
    attain = [a for a in (_metric_attainment(profiles, j) for j in done) if a is not None]
    by_app: dict[str, list[float]] = {}
    for j in done:
        if j["final_metric"] is not None:
            by_app.setdefault(j["application"], []).append(j["final_metric"])
    return {
        "avg_jct_s": sum(jcts) / len(jcts) if jcts else None,
        "p99_jct_s": _percentile(jcts, 99) if jcts else None,
        "median_jct_s": _percentile(jcts, 50) if jcts else None,
        "makespan_s": result["makespan_s"],
        "gpu_hours": gpu_s / 3600.0,
        "utilization": busy_s / gpu_s if gpu_s else None,
        "cluster_utilization": busy_s / (result["capacity"] * span),
        "allocated_fraction": gpu_s / (result["capacity"] * span),
        "compute_utilization": compute_s / gpu_s if gpu_s else None,
        "final_metric": sum(attain) / len(attain) if attain else None,
        "final_metric_by_application": {k: sum(v) / len(v) for k, v in sorted(by_app.items())},
        "completed": len(done),
        "jobs": len(jobs),
        "unfinished": len(jobs) - len(done),
        "end_s": result["end_s"],
        "reallocations": sum(j["reallocations"] for j in jobs),
        "stopped_early": sum(bool(j.get("stopped_early")) for j in jobs),
        "reallocation_cost_s": result["reallocation_cost_s"],
        "wall_s": result["wall_s"],
    }


def _paired_changes(
    jobs: dict[str, list[dict[str, Any]]], policy: str, baseline: str, *, resamples: int, seed: int
) -> dict[str, Any]:
    """Changes of `policy` against `baseline` over the same jobs, paired by job, with 95 % bootstrap
    CIs: mean JCT, mean training time, GPU-hours (relative, negative is less) and utilisation
    (busy / held, in points of fraction, negative is less)."""
    import numpy as np

    a, b = jobs[policy], jobs[baseline]

    def col(rows: list[dict[str, Any]], key: str) -> Any:
        return np.array([r[key] if r[key] is not None else np.nan for r in rows], dtype=float)

    jct_a, jct_b = col(a, "jct_s"), col(b, "jct_s")
    tt_a = col(a, "completion_s") - col(a, "start_s")
    tt_b = col(b, "completion_s") - col(b, "start_s")
    gpu_a, gpu_b = col(a, "gpu_seconds"), col(b, "gpu_seconds")
    busy_a, busy_b = col(a, "busy_gpu_seconds"), col(b, "busy_gpu_seconds")
    ok = np.flatnonzero(np.isfinite(jct_a) & np.isfinite(jct_b))

    def ci(f: Callable[[Any], float], salt: int) -> dict[str, Any]:
        est, lo, hi = bootstrap_ci(lambda idx: f(ok[idx]), len(ok), resamples=resamples, seed=seed + salt)
        return {"estimate": est, "ci95": [lo, hi]}

    return {
        "jct_change": ci(lambda i: float(np.mean(jct_a[i]) / np.mean(jct_b[i]) - 1.0), 1),
        "p99_jct_change": ci(lambda i: float(np.percentile(jct_a[i], 99) / np.percentile(jct_b[i], 99) - 1.0), 5),
        "training_time_change": ci(lambda i: float(np.mean(tt_a[i]) / np.mean(tt_b[i]) - 1.0), 2),
        "gpu_hours_change": ci(lambda i: float(np.sum(gpu_a[i]) / np.sum(gpu_b[i]) - 1.0), 3),
        "utilization_change": ci(
            lambda i: float(np.sum(busy_a[i]) / np.sum(gpu_a[i]) - np.sum(busy_b[i]) / np.sum(gpu_b[i])), 4
        ),
        "jobs": int(len(ok)),
    }


def _stderr_progress(label: str, quiet: bool) -> Callable[[float, int, int], bool]:
    last = [0.0]

    def report(now: float, done: int, total: int) -> bool:
        if not quiet and (time.monotonic() - last[0] > 0.5 or done == total):
            last[0] = time.monotonic()
            _console.progress(f"[dra-sim] {label}: t={now / 3600:7.2f} h, {done}/{total} jobs done ", done == total)
        return True

    return report


def check_horizon(workload: str | os.PathLike[str], jobs: list[dict[str, Any]], lines: list[int]) -> None:
    """Refuses jobs that arrive at or after the horizon (``HORIZON_S`` after the first arrival):
    the simulation stops there, so they could never run. Names file, line, job and time."""
    if not jobs:
        return
    first = min(j["submit_s"] for j in jobs)
    late = [(line, j) for line, j in zip(lines, jobs) if j["submit_s"] - first >= HORIZON_S]
    if late:
        named = "; ".join(f"line {line} job '{j['name']}' at {j['submit_s']:g} s (day {(j['submit_s'] - first) / 86400:.1f})"
                          for line, j in late[:5])
        more = f" (and {len(late) - 5} more)" if len(late) > 5 else ""
        raise ValueError(
            f"{workload}: {len(late)} job(s) arrive {HORIZON_S / 86400:g} days or more after the first arrival "
            f"({first:g} s), when the simulation stops, so they could never run: {named}{more}; split the workload "
            f"into spans of under {HORIZON_S / 86400:g} days (are the times in seconds?)"
        )


def check_workload(
    workload: str | os.PathLike[str],
    profiles: Any,
    *,
    nodes: int = 16,
    devices_per_node: int = 4,
    declared_sigma: float = 0.0,
    declared_none_share: float = 0.0,
    early_stop_share: float = 0.0,
) -> list[dict[str, Any]]:
    """The jobs of a workload once every input of its replay is checked (nothing simulated yet):
    the cluster, the declaration settings, the CSV, that no job requests more devices than the
    cluster has or than its profile can represent (``check_measured``, as the study checks its
    pool), and that none arrives at or after the horizon. ``dra-sim replay`` checks every workload
    so before simulating any."""
    for name, value, top in (("nodes", nodes, MAX_NODES), ("devices_per_node", devices_per_node, 9)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"{name} (--{name.replace('_', '-')}): must be a whole number in [1, {top}], got {value!r}")
    for name, value, top in (("declared_sigma", declared_sigma, 5.0), ("declared_none_share", declared_none_share, 1.0),
                             ("early_stop_share", early_stop_share, 1.0)):
        if not value >= 0 or not math.isfinite(value) or value > top:
            raise ValueError(f"{name}: must lie in [0, {top:g}], got {value}")
    jobs, lines = read_workload_rows(workload, profiles)
    if not jobs:
        raise ValueError(f"workload {workload}: no jobs (a header row only); give at least one job row")
    check_requests(workload, jobs, lines, nodes * devices_per_node,
                   f"give a bigger cluster (--nodes {nodes} x --devices-per-node {devices_per_node} now)")
    check_measured(workload, jobs, lines, profiles)
    check_horizon(workload, jobs, lines)
    if jobs[0].get("declared_from_file"):
        unused = [f for f, v in (("declared_sigma (--declared-sigma)", declared_sigma),
                                 ("declared_none_share (--declared-none)", declared_none_share)) if v > 0]
        if unused:
            raise ValueError(
                f"{' and '.join(unused)}: {workload} has a declared_epochs column, whose declarations are kept as "
                "they are, so it would change nothing; drop it, or drop the column to let jobs declare their budget"
            )
    elif declared_none_share >= 1.0 and declared_sigma > 0:
        raise ValueError(
            f"declared_sigma (--declared-sigma) {declared_sigma}: with declared_none_share 1 no job declares anything, "
            "so it would change nothing; drop one of them"
        )
    return jobs


def replay(
    workload: str | os.PathLike[str],
    *,
    policies: Iterable[str] | None = None,
    reallocation_cost: float | str | None = None,
    traces: str | os.PathLike[str] | None = None,
    interval_s: float = 60.0,
    nodes: int = 16,
    devices_per_node: int = 4,
    declared_sigma: float = 0.0,
    declared_none_share: float = 0.0,
    early_stop_share: float = 0.0,
    declaration_seed: int = 1,
    quiet: bool = True,
    resamples: int = 1000,
    jobs_detail: bool = True,
    cost_mode: str = "same",
    in_place_cost: float | str | None = None,
    restart_cost: float | str | None = None,
) -> dict[str, Any]:
    """Replays one workload under each policy. Every dynamic policy runs under the same rules as
    Pollux (online-fitted throughput model from a linear-speedup prior, exploration limit, one
    distributed job per node, batch cap, the reallocation cost on every change). Jobs declare their
    epoch budget with log-normal error ``declared_sigma`` (a ``declared_epochs`` column of the CSV is
    kept as is), ``declared_none_share`` of them declare nothing and ``early_stop_share`` stop early
    on a plateau (the truth, the same for every policy; ``oracle_*`` policies read it and are upper
    bounds, never dra's result). Returns the
    ``--json`` document: ``{"workload", "load", "policies": {name: aggregates + "vs": {baseline:
    changes}}, "baselines", "jobs": [...], "timelines": {...}, "published_avg_jct_s"}``.

    ``cost_mode="same"`` charges every policy ``reallocation_cost`` (default: Pollux's 30 s) per
    change (policy quality);
    ``"system"`` charges each its system's mechanism (``costs_by_policy``: dra's in-place resize
    or a checkpoint-restart), listed per policy in ``reallocation_cost_s_by_policy``."""
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples: must be an integer >= 1, got {resamples!r}")
    known = sim_policy_names()  # POLICIES and any added with add_cluster_policy
    names = list(policies) if policies else [p for p in known if not p.startswith("oracle_")]
    check_policies(names)
    for p in names:
        if p not in known:
            raise ValueError(f"policy: unknown '{p}'; use one of {', '.join(known)}")
    costs = costs_by_policy(
        names, cost_mode, cost=reallocation_cost, in_place_cost=in_place_cost, restart_cost=restart_cost
    )
    cost = costs[names[0]] if cost_mode == "same" else None
    launch = launch_cost(cost_mode, costs, restart_cost)
    profiles = load_profiles(traces)
    workload = workload_path(workload)  # data/pollux/... from any folder: the copy dra ships
    jobs = check_workload(workload, profiles, nodes=nodes, devices_per_node=devices_per_node,
                          declared_sigma=declared_sigma, declared_none_share=declared_none_share,
                          early_stop_share=early_stop_share)
    published = published_for(workload)
    name = published.get("workload", Path(workload).stem)
    out: dict[str, Any] = {
        "workload": name,
        "file": str(workload),
        "load": published.get("load"),
        "reallocation_cost_s": cost,
        "cost_mode": cost_mode,
        "reallocation_cost_s_by_policy": costs,
        "launch_cost_s": launch,
        "cluster": {"nodes": nodes, "devices_per_node": devices_per_node},
        "interval_s": interval_s,
        "rules": "pollux: online-fitted model, exploration limit, one distributed job per node, batch cap",
        "declarations": {
            "sigma": declared_sigma,
            "none_share": declared_none_share,
            "early_stop_share": early_stop_share,
            "seed": declaration_seed,
            "from_file": bool(jobs and jobs[0].get("declared_from_file")),
            "note": "declared = epoch budget x exp(sigma z); the remaining-work estimator sees declarations, progress, "
            "loss curves and finished jobs, never the truth",
        },
        "upper_bounds": [p for p in names if p.startswith("oracle_")],
        "policies": {},
        "jobs": [],
        "timelines": {},
    }
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for p in names:
        result = _sim.sim_run(
            profiles, jobs, p, costs[p], interval_s, nodes, devices_per_node, 0.0, jobs_detail, declared_sigma,
            declared_none_share, early_stop_share, declaration_seed, _stderr_progress(f"{name} {p}", quiet),
            launch_cost_s=launch,
        )
        out["policies"][p] = summarize(result, profiles)
        if p == "convergence_aware":
            out["policies"][p]["remaining_work_calibration"] = estimator_calibration(result["jobs"])
        by_policy[p] = sorted(result["jobs"], key=lambda j: j["name"])
        if jobs_detail:
            out["timelines"][p] = result["timeline"]
            # A replay sets no target metric: reached_target is null (it read false for every job).
            out["jobs"] += [dict(j, policy=p, reached_target=None) for j in result["jobs"]]
    baselines = [b for b in ("static", "pollux") if b in by_policy]
    out["baselines"] = baselines
    for p in names:
        out["policies"][p]["vs"] = {
            b: _paired_changes(by_policy, p, b, resamples=resamples, seed=17) for b in baselines if b != p
        }
    out["published_avg_jct_s"] = published.get("avg_jct_s", {})
    return out
