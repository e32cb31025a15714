"""The cluster simulator: replay job workloads and the generated static-vs-dynamic study.

The simulation itself is C++ (``include/dra/sim/``, bound as ``dra._core.sim_*``); this package
finds the shipped profiles, turns results into the JSON/markdown/plots users read, and computes
confidence intervals. Command line: ``dra-sim`` (see :mod:`dra.sim.cli`).

    import dra.sim
    out = dra.sim.replay("data/pollux/workloads/workload-1.csv", policies=["static", "arbiter"])
    print(out["policies"]["arbiter"]["avg_jct_s"])
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from dra import _core

POLICIES: tuple[str, ...] = tuple(_core.sim_policy_names)
#: Dynamic policies `dra-sim study` compares by default with the static baselines: the DRA
#: framework's rule, the Pollux size rule per job, and dra's convergence-aware policy.
STUDY_POLICIES: tuple[str, ...] = ("convergence", "goodput", "convergence_aware")
#: Policies of the shared-cluster study (runs contend for one cluster).
SHARED_POLICIES: tuple[str, ...] = ("tiresias", "pollux", "arbiter", "convergence_aware")
#: The static baselines of a study: the request as made, the best fixed size in hindsight at the
#: user's batch, and the best fixed size and batch in hindsight (all within the same budget).
STUDY_BASELINES: tuple[str, ...] = tuple(_core.sim_study_baselines)
#: Stand-in for the measured in-place resize cost (seconds); `--reallocation-cost inplace`.
IN_PLACE_RESIZE_COST_S: float = float(_core.sim_in_place_resize_cost_stand_in_s)
#: The reference simulator's cost of one reallocation (checkpoint-restart), seconds.
POLLUX_REALLOCATION_COST_S: float = 30.0

__all__ = [
    "IN_PLACE_RESIZE_COST_S",
    "POLICIES",
    "POLLUX_REALLOCATION_COST_S",
    "SHARED_POLICIES",
    "STUDY_BASELINES",
    "STUDY_POLICIES",
    "bootstrap_ci",
    "cost_from_resize_report",
    "default_data_dir",
    "load_profiles",
    "markdown_replay",
    "markdown_study",
    "parse_cost",
    "published_for",
    "published_jct",
    "read_workload",
    "replay",
    "study",
    "summarize",
]


def default_data_dir() -> Path:
    """The profiles and workloads dra ships (``data/pollux``), or ``$DRA_SIM_DATA`` when set.

    The editable install in ``.venv`` resolves it relative to the repository
    (``python/dra/sim/`` -> ``data/pollux``)."""
    env = os.environ.get("DRA_SIM_DATA")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parent / "data" / "pollux", here.parents[3] / "data" / "pollux"]
    for c in candidates:
        if (c / "traces").is_dir():
            return c
    raise FileNotFoundError(
        "dra.sim: no profiles found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); set DRA_SIM_DATA to a folder holding traces/ and workloads/, or pass --traces DIR"
    )


@functools.lru_cache(maxsize=8)
def _profiles_cached(traces: str) -> Any:
    return _core.SimProfiles(traces)


def load_profiles(traces: str | os.PathLike[str] | None = None) -> Any:
    """The measured profiles under ``traces`` (default: the shipped copy), loaded once per path."""
    path = Path(traces) if traces is not None else default_data_dir() / "traces"
    return _profiles_cached(str(Path(path).resolve()))


def read_workload(path: str | os.PathLike[str], profiles: Any = None) -> list[dict[str, Any]]:
    """Jobs of a workload CSV; a malformed row raises ValueError naming file, line and column."""
    return list(_core.sim_read_workload(str(path), profiles))


def published_jct(data_dir: Path | None = None) -> dict[str, Any]:
    """The Pollux artifact's published average JCTs: ``{"loads": {load: {"avg_jct_s": {scheduler:
    {workload: s}}}}, "workload_sha256": {sha256: {"workload", "load"}}}``, {} when absent."""
    try:
        path = (data_dir or default_data_dir()) / "published_jct.json"
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def published_for(workload: str | os.PathLike[str], data_dir: Path | None = None) -> dict[str, Any]:
    """Published figures for a workload CSV, matched by the SHA-256 of its bytes (never by file
    name: the 0.5x and 2.0x variants share names with the 1.0x ones). ``{}`` for any other CSV;
    otherwise ``{"workload", "load", "avg_jct_s": {scheduler: s}}``."""
    import hashlib

    doc = published_jct(data_dir)
    digest = hashlib.sha256(Path(workload).read_bytes()).hexdigest()
    match = doc.get("workload_sha256", {}).get(digest)
    if not match:
        return {}
    figures = doc["loads"][match["load"]]["avg_jct_s"]
    return {
        "workload": match["workload"],
        "load": match["load"],
        "avg_jct_s": {k: v[match["workload"]] for k, v in figures.items() if match["workload"] in v},
    }


def cost_from_resize_report(path: str | os.PathLike[str]) -> float:
    """The in-place resize cost measured by ``python -m dra.bench resize --json PATH``: the slower of
    dra's shrink (4->2) and grow (2->4), at the largest model state the report measured."""
    import re

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"reallocation cost: cannot read resize report {path}: {exc}") from None
    by_size: dict[float, list[float]] = {}
    for r in doc.get("results", []) if isinstance(doc, dict) else []:
        m = re.fullmatch(r"(shrink_4to2|grow_2to4)_([0-9.]+)MB", str(r.get("name", "")))
        if m and isinstance(r.get("value"), (int, float)) and math.isfinite(r["value"]):
            by_size.setdefault(float(m.group(2)), []).append(float(r["value"]))
    if not by_size:
        raise ValueError(
            f"reallocation cost: {path} has no shrink_4to2_<N>MB / grow_2to4_<N>MB results; "
            "expected the JSON of `python -m dra.bench resize --json PATH`"
        )
    return max(by_size[max(by_size)])


def parse_cost(text: str | float) -> float:
    """A reallocation cost in seconds; ``inplace`` means the in-place resize cost, ``pollux`` 30 s,
    a path to a ``dra.bench resize`` JSON report the cost it measured (``cost_from_resize_report``)."""
    if isinstance(text, (int, float)):
        value = float(text)
    elif text.strip().lower().endswith(".json"):
        value = cost_from_resize_report(text.strip())
    elif text.strip().lower() in ("inplace", "in-place", "in_place"):
        value = IN_PLACE_RESIZE_COST_S
    elif text.strip().lower() == "pollux":
        value = POLLUX_REALLOCATION_COST_S
    else:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"reallocation cost: '{text}' is not a number of seconds, 'inplace' or 'pollux'") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"reallocation cost: must be a finite number of seconds >= 0, got {text}")
    return value


# ---- statistics ------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def bootstrap_ci(
    statistic: Callable[[Any], float], n: int, *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(estimate, low, high): percentile bootstrap over n paired runs; ``statistic(idx)`` gets an
    index array (all runs for the estimate, resampled ones for the interval)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    estimate = float(statistic(np.arange(n)))
    draws = np.array([statistic(rng.integers(0, n, n)) for _ in range(resamples)], dtype=float)
    alpha = (1.0 - level) / 2.0
    return estimate, float(np.quantile(draws, alpha)), float(np.quantile(draws, 1.0 - alpha))


# ---- replay ----------------------------------------------------------------------------------


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
    span = max(result["makespan_s"] - result["first_submit_s"], 1e-9)
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
        "reallocations": sum(j["reallocations"] for j in jobs),
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
        "training_time_change": ci(lambda i: float(np.mean(tt_a[i]) / np.mean(tt_b[i]) - 1.0), 2),
        "gpu_hours_change": ci(lambda i: float(np.sum(gpu_a[i]) / np.sum(gpu_b[i]) - 1.0), 3),
        "utilization_change": ci(
            lambda i: float(np.sum(busy_a[i]) / np.sum(gpu_a[i]) - np.sum(busy_b[i]) / np.sum(gpu_b[i])), 4
        ),
        "jobs": int(len(ok)),
    }


def _stderr_progress(label: str, quiet: bool) -> Callable[[float, int, int], bool]:
    import sys

    last = [0.0]

    def report(now: float, done: int, total: int) -> bool:
        if not quiet and (time.monotonic() - last[0] > 0.5 or done == total):
            last[0] = time.monotonic()
            sys.stderr.write(f"\r[dra-sim] {label}: t={now / 3600:7.2f} h, {done}/{total} jobs done ")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        return True

    return report


def replay(
    workload: str | os.PathLike[str],
    *,
    policies: Iterable[str] | None = None,
    reallocation_cost: float | str = POLLUX_REALLOCATION_COST_S,
    traces: str | os.PathLike[str] | None = None,
    interval_s: float = 60.0,
    nodes: int = 16,
    devices_per_node: int = 4,
    remaining_work_from_budget: bool = True,
    price_floor: float | None = None,
    quiet: bool = True,
    resamples: int = 1000,
    jobs_detail: bool = True,
) -> dict[str, Any]:
    """Replays one workload under each policy. Every dynamic policy runs under the same rules as
    Pollux (online-fitted throughput model from a linear-speedup prior, exploration limit, one
    distributed job per node, batch cap, the reallocation cost on every change). Returns the
    ``--json`` document: ``{"workload", "load", "policies": {name: aggregates + "vs": {baseline:
    changes}}, "baselines", "jobs": [...], "timelines": {...}, "published_avg_jct_s"}``."""
    profiles = load_profiles(traces)
    cost = parse_cost(reallocation_cost)
    jobs = read_workload(workload, profiles)
    names = list(policies) if policies else list(POLICIES)
    for p in names:
        if p not in POLICIES:
            raise ValueError(f"policy: unknown '{p}'; use one of {', '.join(POLICIES)}")
    floor = float(_core.sim_default_price_floor) if price_floor is None else float(price_floor)
    published = published_for(workload)
    name = published.get("workload", Path(workload).stem)
    out: dict[str, Any] = {
        "workload": name,
        "file": str(workload),
        "load": published.get("load"),
        "reallocation_cost_s": cost,
        "cluster": {"nodes": nodes, "devices_per_node": devices_per_node},
        "interval_s": interval_s,
        "rules": "pollux: online-fitted model, exploration limit, one distributed job per node, batch cap",
        "remaining_work": "epoch budget" if remaining_work_from_budget else "loss-curve fit",
        "cluster_price_floor": floor,
        "policies": {},
        "jobs": [],
        "timelines": {},
    }
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for p in names:
        result = _core.sim_run(
            profiles, jobs, p, cost, interval_s, nodes, devices_per_node, 0.0, jobs_detail, remaining_work_from_budget, floor,
            _stderr_progress(f"{name} {p}", quiet),
        )
        out["policies"][p] = summarize(result, profiles)
        by_policy[p] = sorted(result["jobs"], key=lambda j: j["name"])
        if jobs_detail:
            out["timelines"][p] = result["timeline"]
            out["jobs"] += [dict(j, policy=p) for j in result["jobs"]]
    baselines = [b for b in ("static", "pollux") if b in by_policy]
    out["baselines"] = baselines
    for p in names:
        out["policies"][p]["vs"] = {
            b: _paired_changes(by_policy, p, b, resamples=resamples, seed=17) for b in baselines if b != p
        }
    out["published_avg_jct_s"] = published.get("avg_jct_s", {})
    return out


# ---- study -----------------------------------------------------------------------------------


def _default_pool(profiles: Any) -> list[dict[str, Any]]:
    """The study's request pool: workloads 1-4 at load 1.0 (640 tuned requests), in order."""
    folder = default_data_dir() / "workloads"
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
) -> dict[str, Any]:
    """The generated static-vs-dynamic study: ``runs`` jobs from tuned requests, each simulated under
    the static baselines (``static_request``, ``static_best_size``, ``static_best_hindsight``) and
    every dynamic policy, alone on the cluster or (``shared_cluster``) contending in groups.

    Per run: training time (first allocation to completion), JCT (submission to completion),
    GPU-hours, utilisation (busy device time over held device time), final metric against the
    application's fixed target. Each policy's ``vs`` holds, per baseline, ``training_time_change``
    (mean training time, relative), ``gpu_hours_change`` (relative), ``utilization_change`` (points
    of busy/held) and ``final_metric_change``, each ``{"estimate", "ci95"}`` from a paired bootstrap
    over runs (negative is less)."""
    import sys

    import numpy as np

    if runs < 1:
        raise ValueError(f"runs: must be >= 1, got {runs}")
    profiles = load_profiles(traces)
    cost = parse_cost(reallocation_cost)
    names = list(policies) if policies else list(SHARED_POLICIES if shared_cluster else STUDY_POLICIES)
    for p in names:
        if p not in POLICIES:
            raise ValueError(f"policy: unknown '{p}'; use one of {', '.join(POLICIES)}")
    names = [p for p in names if p != "static"]
    pool = [j for w in workloads for j in read_workload(w, profiles)] if workloads else _default_pool(profiles)
    floor = float(_core.sim_default_job_price_floor) if price_floor is None else float(price_floor)

    def progress(done: int, total: int) -> None:
        if not quiet and (done % 50 == 0 or done == total or shared_cluster):
            sys.stderr.write(f"\r[dra-sim] study: {done}/{total} {'clusters' if shared_cluster else 'runs'} ")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    start = time.perf_counter()
    rows = _core.sim_study(
        profiles, pool, runs, seed, names, cost, quota_scale, interval_s, noise, reference_limits, perturb,
        shared_cluster, jobs_per_cluster, True, floor, progress,
    )
    wall = time.perf_counter() - start
    baselines = [b for b in STUDY_BASELINES if b in rows[0]["results"]]
    everyone = baselines + names

    def column(policy: str, key: str) -> np.ndarray:
        return np.array([r["results"][policy][key] if r["results"][policy][key] is not None else np.nan for r in rows], dtype=float)

    metrics: dict[str, dict[str, np.ndarray]] = {}
    for p in everyone:
        start_s, end_s = column(p, "start_s"), column(p, "completion_s")
        metrics[p] = {
            "time": end_s - start_s,
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
    aggregates: dict[str, Any] = {}
    for i, p in enumerate(everyone):
        m = metrics[p]
        agg: dict[str, Any] = {
            "mean_training_time_s": float(np.nanmean(m["time"])),
            "mean_jct_s": float(np.nanmean(m["jct"])),
            "p99_training_time_s": float(np.nanpercentile(m["time"], 99)),
            "gpu_hours": float(np.nansum(m["gpu_s"]) / 3600.0),
            "utilization": float(np.nansum(m["busy_s"]) / np.nansum(m["gpu_s"])),
            "compute_utilization": float(np.nansum(m["compute_s"]) / np.nansum(m["gpu_s"])),
            "final_metric_attainment": float(np.nanmean(m["attain"])),
            "reached_target": float(np.mean(m["reached"])),
            "completed": int(np.sum(m["done"])),
            "runs": runs,
        }
        if shared_cluster:
            # Cluster utilisation: busy device time over capacity x (last completion - first arrival),
            # per cluster, averaged over clusters.
            cap = 16 * 4
            utils = []
            for g in sorted(set(clusters.tolist())):
                sel = clusters == g
                arrive = np.array([r["spec"]["submit_s"] for r in rows])[sel]
                end = (np.array([r["results"][p]["completion_s"] or np.nan for r in rows], dtype=float))[sel]
                span = float(np.nanmax(end) - np.min(arrive))
                utils.append(float(np.nansum(m["busy_s"][sel]) / (cap * span)))
            agg["cluster_utilization"] = float(np.mean(utils))
            agg["cluster_utilization_by_cluster"] = utils
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
                "jct_change": paired(lambda ix: float(np.mean(m["jct"][ix]) / np.mean(base["jct"][ix]) - 1.0), 3),
                "gpu_hours_change": paired(lambda ix: float(np.sum(m["gpu_s"][ix]) / np.sum(base["gpu_s"][ix]) - 1.0), 4),
                "utilization_change": paired(
                    lambda ix: float(
                        np.sum(m["busy_s"][ix]) / np.sum(m["gpu_s"][ix]) - np.sum(base["busy_s"][ix]) / np.sum(base["gpu_s"][ix])
                    ),
                    5,
                ),
                "final_metric_change": paired(lambda ix: float(np.nanmean(m["attain"][ix]) - np.nanmean(base["attain"][ix])), 6),
                "runs": int(len(ok)),
            }
            if shared_cluster and "cluster_utilization" in aggregates.get(b, {}):
                entry["cluster_utilization_change"] = {
                    "estimate": agg["cluster_utilization"] - aggregates[b]["cluster_utilization"],
                    "ci95": None,
                }
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
            # The headline baseline's changes at the top level (the issue's JSON shape).
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
            "utilization": "busy (computing and synchronising) device time / held device time",
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


# ---- tables ----------------------------------------------------------------------------------


def _fmt(v: Any, spec: str = ".0f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


def _pct(d: dict[str, Any] | None, pct: bool = True) -> str:
    if not d:
        return "-"
    k = 100.0
    unit = " %" if pct else " pt"
    est = d["estimate"]
    if d.get("ci95") is None:
        return f"{est * k:+.1f}{unit}"
    return f"{est * k:+.1f}{unit} [{d['ci95'][0] * k:+.1f}, {d['ci95'][1] * k:+.1f}]"


def markdown_replay(doc: dict[str, Any]) -> str:
    published = doc.get("published_avg_jct_s", {})
    load = f", load {doc['load']}x" if doc.get("load") else ""
    lines = [
        f"### {doc['workload']}{load} (reallocation cost {doc['reallocation_cost_s']:g} s; simulated)",
        "",
        "| policy | avg JCT (s) | p99 JCT (s) | makespan (s) | GPU-hours | utilisation (busy/held) | cluster util. | final metric | reallocations | JCT vs pollux | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, a in doc["policies"].items():
        vs = a.get("vs", {}).get("pollux", {}).get("jct_change")
        lines.append(
            f"| {p} | {_fmt(a['avg_jct_s'])} | {_fmt(a['p99_jct_s'])} | {_fmt(a['makespan_s'])} | {_fmt(a['gpu_hours'], '.1f')} | "
            f"{_fmt(a['utilization'], '.3f')} | {_fmt(a['cluster_utilization'], '.3f')} | {_fmt(a['final_metric'], '.4f')} | "
            f"{a['reallocations']} | {_pct(vs)} | {_fmt(a['wall_s'], '.2f')} |"
        )
    for p, v in published.items():
        lines.append(f"| {p} (published) | {_fmt(v)} | | | | | | | | | |")
    return "\n".join(lines) + "\n"


def markdown_study(doc: dict[str, Any]) -> str:
    c = doc["conditions"]
    lines = [
        f"### Study: {doc['runs']} runs, seed {doc['seed']} (simulated): {c['requests']} requests, quota {c['quota_scale']:g}x "
        f"request, resize cost {c['reallocation_cost_s']:g} s, {c['cluster']}, target {c['target']} (wall {doc['wall_s']:.1f} s)",
        "",
        "| policy | mean training time (s) | mean JCT (s) | GPU-hours | utilisation (busy/held) | "
        + ("cluster util. | " if doc.get("shared_cluster") else "")
        + "target reached | final metric (attainment) |",
        "|---|---:|---:|---:|---:|" + ("---:|" if doc.get("shared_cluster") else "") + "---:|---:|",
    ]
    for p, a in doc["policies"].items():
        cu = f"{_fmt(a.get('cluster_utilization'), '.3f')} | " if doc.get("shared_cluster") else ""
        lines.append(
            f"| {p} | {_fmt(a['mean_training_time_s'])} | {_fmt(a['mean_jct_s'])} | {_fmt(a['gpu_hours'], '.0f')} | "
            f"{_fmt(a['utilization'], '.3f')} | {cu}{_fmt(a['reached_target'], '.3f')} | {_fmt(a['final_metric_attainment'], '.4f')} |"
        )
    for b in doc["baselines"]:
        rows = [(p, a["vs"][b]) for p, a in doc["policies"].items() if b in a.get("vs", {})]
        if not rows:
            continue
        lines += [
            "",
            f"| vs {b} | training time (mean) | training time (mean of per-run ratios) | JCT (mean) | GPU-hours | utilisation (points) | final metric |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p, v in rows:
            lines.append(
                f"| {p} | {_pct(v['training_time_change'])} | {_pct(v['training_time_change_per_run'])} | {_pct(v['jct_change'])} | "
                f"{_pct(v['gpu_hours_change'])} | {_pct(v['utilization_change'], pct=False)} | "
                f"{v['final_metric_change']['estimate']:+.4f} |"
            )
    return "\n".join(lines) + "\n"
