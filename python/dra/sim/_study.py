"""The generated static-vs-dynamic study: runs drawn from tuned requests, each simulated under the
static baselines and the dynamic policies, compared with paired bootstrap intervals."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from dra import _console, _sim
from dra.sim._inputs import (
    SHARED_POLICIES,
    STUDY_BASELINES,
    STUDY_POLICIES,
    check_measured,
    check_policies,
    check_requests,
    data_folder,
    load_profiles,
    parse_cost,
    read_workload,
    read_workload_rows,
    sim_policy_names,
)
from dra.sim._replay import HORIZON_S, check_horizon
from dra.sim._stats import bootstrap_ci

#: The study's cluster: 16 nodes x 4 devices (``dra::sim::study_config``'s default, as the artifact's).
STUDY_CLUSTER_DEVICES = 16 * 4


def _request_pool(workloads: Iterable[str | os.PathLike[str]], profiles: Any, shared: bool) -> list[dict[str, Any]]:
    """The rows of the given workload CSVs, refusing any request the study would cut: more devices
    than its cluster, or than the profiles can represent (``check_measured``, as ``replay`` does);
    on a shared cluster (``shared``), whose runs arrive at the rows' times, also a row at or after
    the horizon (``check_horizon``, as ``replay`` does)."""
    pool: list[dict[str, Any]] = []
    for w in workloads:
        jobs, lines = read_workload_rows(w, profiles)
        if jobs and jobs[0].get("declared_from_file"):
            raise ValueError(
                f"{w}: its declared_epochs column is not used by the study, whose runs declare their budget as "
                "--declared-sigma draws it (it would be silently ignored); drop the column, or replay the workload "
                "(dra-sim replay keeps it)"
            )
        check_requests(w, jobs, lines, STUDY_CLUSTER_DEVICES,
                       f"the study's cluster is fixed at {STUDY_CLUSTER_DEVICES} devices (16 nodes x 4)")
        check_measured(w, jobs, lines, profiles)
        if shared:
            check_horizon(w, jobs, lines)
        pool += jobs
    return pool


def _default_pool(profiles: Any) -> list[dict[str, Any]]:
    """The study's request pool: workloads 1-4 at load 1.0 (640 tuned requests), in order."""
    folder = data_folder("workloads", "the study's request pool (give --workloads DIR otherwise)")
    pool: list[dict[str, Any]] = []
    for i in range(1, 5):
        path = folder / f"workload-{i}.csv"
        if path.is_file():
            pool += read_workload(path, profiles)
    if not pool:
        raise FileNotFoundError(f"dra.sim: no workload-1..4.csv in {folder} to draw study requests from")
    return pool


def study(
    runs: int = 1500,
    seed: int = 1,
    *,
    policies: Iterable[str] | None = None,
    reallocation_cost: float | str = "inplace",
    quota_scale: float = 1.0,
    interval_s: float = 60.0,
    noise: bool = True,
    reference_limits: bool = False,
    perturb: bool = False,
    shared_cluster: bool = False,
    jobs_per_cluster: int = 160,
    traces: str | os.PathLike[str] | None = None,
    workloads: Iterable[str | os.PathLike[str]] | None = None,
    quiet: bool = True,
    resamples: int = 2000,
    jobs_detail: bool = True,
    price_floor: float | None = None,
    declared_sigma: float = 0.0,
    gns_estimate_sigma: float | None = None,
    target_by_work: bool = True,
    compare_target_rules: bool = True,
) -> dict[str, Any]:
    """The generated static-vs-dynamic study: ``runs`` jobs from tuned requests, each simulated under
    the static baselines (``static_request``, ``static_best_size``, ``static_best_hindsight``) and
    every dynamic policy, alone on the cluster or (``shared_cluster``) contending in groups.

    Per run: training time (first allocation to completion), JCT (submission to completion),
    GPU-hours, utilisation, final metric against the application's fixed target. A run reaches its
    target when the work it did at each batch adds up to the work the trace needs at that batch
    (``target_by_work``); with ``compare_target_rules`` every dynamic policy is also run under the
    earlier rule (the metric of the geometric-mean batch), reported as ``<policy>@geometric_batch``.
    The policies see what a live run measures: its declared epoch budget (log-normal error
    ``declared_sigma``), a noisy noise-scale estimate (``gns_estimate_sigma`` per epoch, default 0.2),
    the remaining-work estimator; never the trace's exact statistics or remaining steps.

    Utilisation is defined once for every policy: busy (computing and synchronising) device time
    over available device time, the capacity (the run's device budget alone, the cluster when shared)
    times the span from the first arrival to the last completion of that policy's run (to the
    horizon, 30 days after the first arrival, when runs were unfinished there);
    ``busy_fraction_of_held`` is busy over held device time.

    Each policy's ``vs`` holds, per baseline, ``training_time_change`` (pooled: mean over mean,
    relative), ``training_time_change_per_run`` (mean of per-run ratios) and
    ``median_training_time_change_per_run`` (median of per-run ratios), ``jct_change``,
    ``gpu_hours_change`` (relative), ``utilization_change`` (points) and ``final_metric_change``, each
    ``{"estimate", "ci95"}`` from a paired bootstrap over runs (negative is less)."""
    import numpy as np

    if runs < 1:
        raise ValueError(f"runs: must be >= 1, got {runs}")
    profiles = load_profiles(traces)
    cost = parse_cost(reallocation_cost)
    names = list(policies) if policies else list(SHARED_POLICIES if shared_cluster else STUDY_POLICIES)
    check_policies(names)
    for p in names:
        if p not in sim_policy_names():
            raise ValueError(f"policy: unknown '{p}'; use one of {', '.join(sim_policy_names())}")
    names = [p for p in names if p != "static"]
    pool = _request_pool(workloads, profiles, shared_cluster) if workloads else _default_pool(profiles)
    if reference_limits:
        limited = sorted(a for a in {j["application"] for j in pool} if profiles.info(a)["max_replicas"] > 0)
        if not limited:
            have = ", ".join(f"{a}: {profiles.info(a)['max_replicas']}" for a in profiles.names() if profiles.info(a)["max_replicas"] > 0)
            raise ValueError(
                f"reference_limits (--reference-limits): no application of the request pool has a reference limit "
                f"(limits: {have or 'none'}), so it would change nothing; drop it or add such rows"
            )
    floor = float(_sim.sim_default_job_price_floor) if price_floor is None else float(price_floor)
    gns_sigma = 0.2 if gns_estimate_sigma is None else float(gns_estimate_sigma)
    if not (0 <= declared_sigma <= 5 and 0 <= gns_sigma <= 5):
        raise ValueError(f"declared_sigma and gns_estimate_sigma: must lie in [0, 5] (0.5 and 1, 0.2 are realistic), "
                         f"got {declared_sigma} and {gns_sigma}")

    def progress(done: int, total: int) -> None:
        if not quiet and (done % 50 == 0 or done == total or shared_cluster):
            _console.progress(f"[dra-sim] study: {done}/{total} {'clusters' if shared_cluster else 'runs'} ", done == total)

    start = time.perf_counter()
    rows = _sim.sim_study(
        profiles, pool, runs, seed, names, cost, quota_scale, interval_s, noise, reference_limits, perturb,
        shared_cluster, jobs_per_cluster, True, floor, declared_sigma, 0.0, gns_sigma, target_by_work,
        compare_target_rules and not shared_cluster, progress,
    )
    wall = time.perf_counter() - start
    baselines = [b for b in STUDY_BASELINES if b in rows[0]["results"]]
    other_rule = [f"{p}@{'geometric_batch' if target_by_work else 'work'}" for p in names]
    everyone = baselines + names + [p for p in other_rule if p in rows[0]["results"]]

    def column(policy: str, key: str) -> np.ndarray:
        return np.array([r["results"][policy][key] if r["results"][policy][key] is not None else np.nan for r in rows], dtype=float)

    metrics: dict[str, dict[str, np.ndarray]] = {}
    for p in everyone:
        start_s, end_s = column(p, "start_s"), column(p, "completion_s")
        metrics[p] = {
            "time": end_s - start_s,
            "end": end_s,
            "jct": column(p, "jct_s"),
            "gpu_s": column(p, "gpu_seconds"),
            "busy_s": column(p, "busy_gpu_seconds"),
            "compute_s": column(p, "compute_gpu_seconds"),
            "final_metric": column(p, "final_metric"),
            "reached": np.array([bool(r["results"][p]["reached_target"]) for r in rows]),
            "done": np.isfinite(end_s),
        }
    apps = np.array([r["spec"]["application"] for r in rows])
    increases = {a: bool(profiles.info(a)["metric_increases"]) for a in set(apps.tolist())}
    # Final metric as attainment of the application's fixed target (1.0 = reached exactly; higher is
    # better for every application).
    target = np.array([r["spec"]["target_metric"] for r in rows], dtype=float)
    sign = np.array([1.0 if increases[a] else -1.0 for a in apps])
    for p in everyone:
        fm = metrics[p]["final_metric"]
        metrics[p]["attain"] = np.where(sign > 0, fm / target, target / fm)

    clusters = np.array([r["cluster"] for r in rows])
    submit = np.array([r["spec"]["submit_s"] for r in rows], dtype=float)
    budget = np.array([max(1, int(quota_scale * r["spec"]["replicas"] + 1e-9)) for r in rows], dtype=float)

    # Each simulation's first arrival: a shared cluster's earliest run, a lone run's own submission.
    first_of = {g: float(np.min(submit[clusters == g])) for g in set(clusters.tolist())} if shared_cluster else {}
    starts = np.array([first_of[c] for c in clusters]) if shared_cluster else submit

    def utilization(p: str, sel: np.ndarray) -> float:
        """Busy device time / (capacity x span) of policy p's runs in sel (a mask, or run indices,
        repeats allowed): per shared cluster, or per lone run (capacity: its device budget), pooled.
        The span runs from the first arrival to the last completion, or to the horizon when runs
        were unfinished there (their busy time counts up to it); busy time is clipped to capacity x
        span (the last tick may end past the horizon), so it never exceeds 1."""
        m = metrics[p]
        if not shared_cluster:
            ix = np.flatnonzero(sel) if sel.dtype == bool else sel
            cap = budget[ix] * np.where(m["done"][ix], m["end"][ix] - submit[ix], HORIZON_S)
            avail = float(np.sum(cap))
            busy = float(np.sum(np.minimum(np.nan_to_num(m["busy_s"][ix]), cap)))
            return busy / avail if avail > 0 else float("nan")
        busy = avail = 0.0
        for g in sorted(set(clusters[sel].tolist())):
            part = sel & (clusters == g)
            end = float(np.max(m["end"][part], initial=first_of[g])) if np.all(m["done"][part]) else max(
                first_of[g] + HORIZON_S, float(np.max(m["end"][part & m["done"]], initial=first_of[g])))
            cap = STUDY_CLUSTER_DEVICES * (end - first_of[g])
            avail += cap
            busy += min(float(np.nansum(m["busy_s"][part])), cap)
        return busy / avail if avail > 0 else float("nan")

    def span_end(p: str, g: Any) -> float:
        """Where policy p's span of shared cluster g ends (see utilization)."""
        m, part = metrics[p], clusters == g
        if np.all(m["done"][part]):
            return float(np.max(m["end"][part], initial=first_of[g]))
        return max(first_of[g] + HORIZON_S, float(np.max(m["end"][part & m["done"]], initial=first_of[g])))

    def utilization_common(p: str) -> float:
        """The issue's definition: busy device time / available device time over the same horizon
        for every policy (per shared cluster, from its first arrival to the latest end of any
        policy), pooled. Doing the same work in fewer device-hours lowers it."""
        busy = avail = 0.0
        for g in sorted(set(clusters.tolist())):
            cap = STUDY_CLUSTER_DEVICES * (max(span_end(q, g) for q in everyone) - first_of[g])
            avail += cap
            busy += min(float(np.nansum(metrics[p]["busy_s"][clusters == g])), cap)
        return busy / avail if avail > 0 else float("nan")

    everyone_sel = np.ones(len(rows), dtype=bool)
    aggregates: dict[str, Any] = {}
    for i, p in enumerate(everyone):
        m = metrics[p]
        agg: dict[str, Any] = {
            "mean_training_time_s": float(np.nanmean(m["time"])),
            "median_training_time_s": float(np.nanmedian(m["time"])),
            "mean_jct_s": float(np.nanmean(m["jct"])),
            "p99_training_time_s": float(np.nanpercentile(m["time"], 99)),
            "gpu_hours": float(np.nansum(m["gpu_s"]) / 3600.0),
            "utilization": utilization(p, everyone_sel),
            "busy_fraction_of_held": float(np.nansum(m["busy_s"]) / np.nansum(m["gpu_s"])),
            "compute_utilization": float(np.nansum(m["compute_s"]) / np.nansum(m["gpu_s"])),
            "final_metric_attainment": float(np.nanmean(m["attain"])),
            "reached_target": float(np.mean(m["reached"])),
            "completed": int(np.sum(m["done"])),
            "unfinished": int(np.sum(~m["done"])),
            "runs": runs,
            # When the simulation of the unfinished runs stopped (for unfinished_note); None when all finished.
            "end_s": float(np.max(starts[~m["done"]]) + HORIZON_S) if not np.all(m["done"]) else None,
        }
        if shared_cluster:
            agg["utilization_common_horizon"] = utilization_common(p)
            agg["cluster_utilization_by_cluster"] = [
                utilization(p, clusters == g) for g in sorted(set(clusters.tolist()))
            ]
        if p == "static_best_size":
            agg["chosen_devices_vs_request"] = float(np.mean([r["best_size_devices"] / r["spec"]["replicas"] for r in rows]))
        if p == "static_best_hindsight":
            agg["chosen_devices_vs_request"] = float(np.mean([r["hindsight_devices"] / r["spec"]["replicas"] for r in rows]))
            agg["chosen_batch_vs_request"] = float(np.mean([r["hindsight_batch"] / r["spec"]["batch"] for r in rows]))
        vs: dict[str, Any] = {}
        for bi, b in enumerate(baselines):
            if b == p:
                continue
            base = metrics[b]
            ok = np.flatnonzero(np.isfinite(m["time"]) & np.isfinite(base["time"]))

            def paired(f: Callable[[np.ndarray], float], salt: int) -> dict[str, Any]:
                est, lo, hi = bootstrap_ci(
                    lambda idx: f(ok[idx]), len(ok), resamples=resamples, seed=seed * 7919 + i * 31 + bi * 7 + salt
                )
                return {"estimate": est, "ci95": [lo, hi]}

            entry = {
                "training_time_change": paired(lambda ix: float(np.mean(m["time"][ix]) / np.mean(base["time"][ix]) - 1.0), 1),
                "training_time_change_per_run": paired(lambda ix: float(np.mean(m["time"][ix] / base["time"][ix]) - 1.0), 2),
                "median_training_time_change_per_run": paired(
                    lambda ix: float(np.median(m["time"][ix] / base["time"][ix]) - 1.0), 7
                ),
                "jct_change": paired(lambda ix: float(np.mean(m["jct"][ix]) / np.mean(base["jct"][ix]) - 1.0), 3),
                "gpu_hours_change": paired(lambda ix: float(np.sum(m["gpu_s"][ix]) / np.sum(base["gpu_s"][ix]) - 1.0), 4),
                "utilization_change": {"estimate": agg["utilization"] - utilization(b, everyone_sel), "ci95": None}
                if shared_cluster
                else paired(lambda ix: utilization(p, ix) - utilization(b, ix), 5),
                "final_metric_change": paired(lambda ix: float(np.nanmean(m["attain"][ix]) - np.nanmean(base["attain"][ix])), 6),
                "runs": int(len(ok)),
            }
            if shared_cluster:
                mine, theirs = agg["cluster_utilization_by_cluster"], [
                    utilization(b, clusters == g) for g in sorted(set(clusters.tolist()))
                ]
                entry["utilization_change_by_cluster"] = [a - c for a, c in zip(mine, theirs)]
                entry["utilization_common_horizon_change"] = agg["utilization_common_horizon"] - utilization_common(b)
            entry["by_application"] = {
                app: {
                    "runs": int(np.sum(sel)),
                    "training_time_change": float(np.mean(m["time"][sel]) / np.mean(base["time"][sel]) - 1.0),
                    "gpu_hours_change": float(np.sum(m["gpu_s"][sel]) / np.sum(base["gpu_s"][sel]) - 1.0),
                }
                for app in sorted(set(apps.tolist()))
                for sel in [np.isfinite(m["time"]) & np.isfinite(base["time"]) & (apps == app)]
                if np.any(sel)
            }
            vs[b] = entry
        agg["vs"] = vs
        if "static_request" in vs:
            # The headline baseline's changes at the top level (the JSON shape).
            agg.update({k: vs["static_request"][k] for k in ("training_time_change", "gpu_hours_change", "utilization_change")})
        aggregates[p] = agg

    jobs = []
    if jobs_detail:
        for r in rows:
            for p in everyone:
                j = dict(r["results"][p])
                j["policy"] = p
                j["run"] = r["index"]
                jobs.append(j)
    return {
        "runs": runs,
        "seed": seed,
        "conditions": {
            "requests": "perturbed x 2^{-1,0,1} (untuned)" if perturb else "tuned (workload rows as made)",
            "quota_scale": quota_scale,
            "reallocation_cost_s": cost,
            "interval_s": interval_s,
            "noise": noise,
            "reference_limits": reference_limits,
            "target": "fixed per application: the worst validated batch size's final best metric",
            "cluster": f"shared: groups of {jobs_per_cluster} runs at the workload rows' arrival times" if shared_cluster else "each run alone",
            "utilization": "busy (computing and synchronising) device time / (capacity x (last completion - first "
            "arrival, or the horizon when runs are unfinished)); capacity: the run's device budget alone, the cluster "
            "when shared",
            "target_rule": "work done at each batch / work the trace needs at that batch" if target_by_work
            else "metric of the epoch-weighted geometric-mean batch (earlier rule)",
            "declared_sigma": declared_sigma,
            "gns_estimate_sigma": gns_sigma,
            "price_floor": floor,
            "rules": "online-fitted throughput model for every dynamic policy; the cluster policies also get "
            "Pollux's exploration limit, one distributed job per node and the batch cap",
        },
        "baseline": "static_request",
        "baselines": baselines,
        "reallocation_cost_s": cost,
        "quota_scale": quota_scale,
        "shared_cluster": shared_cluster,
        "policies": aggregates,
        "specs": [r["spec"] for r in rows],
        "jobs": jobs,
        "wall_s": wall,
    }
