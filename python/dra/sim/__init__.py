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
#: Policies `dra-sim study` compares by default: the static request, the two per-job policies, and
#: the arbiter (alone on the cluster it co-adapts one job's size and batch, as Pollux does).
STUDY_POLICIES: tuple[str, ...] = ("static", "convergence", "goodput", "arbiter")
#: Stand-in for the measured in-place resize cost (seconds); `--reallocation-cost inplace`.
IN_PLACE_RESIZE_COST_S: float = float(_core.sim_in_place_resize_cost_stand_in_s)
#: The reference simulator's cost of one reallocation (checkpoint-restart), seconds.
POLLUX_REALLOCATION_COST_S: float = 30.0

__all__ = [
    "IN_PLACE_RESIZE_COST_S",
    "POLICIES",
    "POLLUX_REALLOCATION_COST_S",
    "STUDY_POLICIES",
    "bootstrap_ci",
    "cost_from_resize_report",
    "default_data_dir",
    "load_profiles",
    "markdown_replay",
    "markdown_study",
    "parse_cost",
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


def published_jct(data_dir: Path | None = None) -> dict[str, dict[str, float]]:
    """Published average JCT per scheduler and workload (Pollux artifact), {} when absent."""
    try:
        path = (data_dir or default_data_dir()) / "published_jct.json"
        return json.loads(path.read_text())["avg_jct_s"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return {}


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

    - ``utilization``: devices allocated over devices existing, integrated from the first arrival to
      the last completion (cluster level).
    - ``compute_utilization``: device time spent computing gradients over device time allocated
      (excludes synchronisation, resize/restart time).
    - ``final_metric``: mean metric attainment (see ``_metric_attainment``)."""
    jobs = result["jobs"]
    done = [j for j in jobs if j["jct_s"] is not None]
    jcts = [j["jct_s"] for j in done]
    gpu_s = sum(j["gpu_seconds"] for j in jobs)
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
        "utilization": gpu_s / (result["capacity"] * span),
        "compute_utilization": compute_s / gpu_s if gpu_s else None,
        "final_metric": sum(attain) / len(attain) if attain else None,
        "final_metric_by_application": {k: sum(v) / len(v) for k, v in sorted(by_app.items())},
        "completed": len(done),
        "jobs": len(jobs),
        "reallocations": sum(j["reallocations"] for j in jobs),
        "reallocation_cost_s": result["reallocation_cost_s"],
        "wall_s": result["wall_s"],
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
    exploration_limit: bool = False,
    quiet: bool = True,
) -> dict[str, Any]:
    """Replays one workload under each policy. ``exploration_limit`` applies Pollux's rule to the
    arbiter (a job gets at most twice the most devices it has held). Returns the ``--json`` document:
    ``{"workload", "policies": {name: aggregates}, "jobs": [...], "timelines": {...}, "published_avg_jct_s"}``."""
    profiles = load_profiles(traces)
    cost = parse_cost(reallocation_cost)
    jobs = read_workload(workload, profiles)
    names = list(policies) if policies else list(POLICIES)
    for p in names:
        if p not in POLICIES:
            raise ValueError(f"policy: unknown '{p}'; use one of {', '.join(POLICIES)}")
    name = Path(workload).stem
    out: dict[str, Any] = {
        "workload": name,
        "reallocation_cost_s": cost,
        "cluster": {"nodes": nodes, "devices_per_node": devices_per_node},
        "interval_s": interval_s,
        "exploration_limit": exploration_limit,
        "policies": {},
        "jobs": [],
        "timelines": {},
    }
    for p in names:
        result = _core.sim_run(
            profiles, jobs, p, cost, interval_s, nodes, devices_per_node, 0.0, True, exploration_limit,
            _stderr_progress(f"{name} {p}", quiet),
        )
        out["policies"][p] = summarize(result, profiles)
        out["timelines"][p] = result["timeline"]
        out["jobs"] += [dict(j, policy=p) for j in result["jobs"]]
    published = published_jct()
    out["published_avg_jct_s"] = {k: v[name] for k, v in published.items() if name in v}
    return out


# ---- study -----------------------------------------------------------------------------------


def _default_pool(profiles: Any) -> list[dict[str, Any]]:
    folder = default_data_dir() / "workloads"
    pool: list[dict[str, Any]] = []
    for path in sorted(folder.glob("workload-*.csv")):
        pool += read_workload(path, profiles)
    if not pool:
        raise FileNotFoundError(f"dra.sim: no workload-*.csv in {folder} to draw study requests from")
    return pool


def study(
    runs: int = 1500,
    seed: int = 1,
    *,
    policies: Iterable[str] | None = None,
    reallocation_cost: float | str = "inplace",
    quota_scale: float = 2.0,
    interval_s: float = 60.0,
    noise: bool = True,
    reference_limits: bool = False,
    traces: str | os.PathLike[str] | None = None,
    workloads: Iterable[str | os.PathLike[str]] | None = None,
    quiet: bool = True,
    resamples: int = 2000,
) -> dict[str, Any]:
    """The generated static-vs-dynamic study: ``runs`` jobs, each simulated alone under every policy.

    Per run: training time (first allocation to completion), GPU-hours, utilisation (device time
    computing over device time allocated), final metric, efficiency (statistical progress per
    GPU-hour). Aggregates carry 95 % bootstrap CIs of each dynamic policy against static, paired by run.
    ``reference_limits`` applies the reference's per-application limit (ncf: one device) to the runs;
    off, every application may use what its profile measures."""
    import sys

    import numpy as np

    if runs < 1:
        raise ValueError(f"runs: must be >= 1, got {runs}")
    profiles = load_profiles(traces)
    cost = parse_cost(reallocation_cost)
    names = list(policies) if policies else list(STUDY_POLICIES)
    for p in names:
        if p not in POLICIES:
            raise ValueError(f"policy: unknown '{p}'; use one of {', '.join(POLICIES)}")
    if "static" not in names:
        names.insert(0, "static")
    pool = [j for w in workloads for j in read_workload(w, profiles)] if workloads else _default_pool(profiles)

    def progress(done: int, total: int) -> None:
        if not quiet and (done % 50 == 0 or done == total):
            sys.stderr.write(f"\r[dra-sim] study: {done}/{total} runs ")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    start = time.perf_counter()
    rows = _core.sim_study(profiles, pool, runs, seed, names, cost, quota_scale, interval_s, noise, reference_limits, progress)
    wall = time.perf_counter() - start

    def column(policy: str, key: str) -> np.ndarray:
        return np.array([r["results"][policy][key] if r["results"][policy][key] is not None else np.nan for r in rows], dtype=float)

    metrics: dict[str, dict[str, np.ndarray]] = {}
    for p in names:
        start_s, end_s = column(p, "start_s"), column(p, "completion_s")
        gpu_s, compute_s, progress_ = column(p, "gpu_seconds"), column(p, "compute_gpu_seconds"), column(p, "progress")
        attain = np.array(
            [_metric_attainment(profiles, dict(r["results"][p], requested_batch=r["spec"]["batch"])) or np.nan for r in rows]
        )
        metrics[p] = {
            "time": end_s - start_s,
            "gpu_s": gpu_s,
            "compute_s": compute_s,
            "progress": progress_,
            "metric": attain,
            "final_metric": column(p, "final_metric"),
            "done": np.isfinite(end_s),
        }

    aggregates: dict[str, Any] = {}
    base = metrics["static"]
    for i, p in enumerate(names):
        m = metrics[p]
        agg: dict[str, Any] = {
            "avg_jct_s": float(np.nanmean(m["time"])),
            "avg_training_time_s": float(np.nanmean(m["time"])),
            "p99_jct_s": float(np.nanpercentile(m["time"], 99)),
            "makespan_s": float(np.nanmax(m["time"])),
            "gpu_hours": float(np.sum(m["gpu_s"]) / 3600.0),
            "gpu_hours_per_run": float(np.mean(m["gpu_s"]) / 3600.0),
            "utilization": float(np.sum(m["compute_s"]) / np.sum(m["gpu_s"])),
            "final_metric": float(np.nanmean(m["metric"])),
            "efficiency": float(np.sum(m["progress"]) / (np.sum(m["gpu_s"]) / 3600.0)),
            "completed": int(np.sum(m["done"])),
            "runs": runs,
            "wall_s": wall,
        }
        if p != "static":
            ok = np.isfinite(m["time"]) & np.isfinite(base["time"])
            idx_ok = np.flatnonzero(ok)

            def paired(f: Callable[[np.ndarray], float], salt: int) -> dict[str, float]:
                est, lo, hi = bootstrap_ci(lambda idx: f(idx_ok[idx]), len(idx_ok), resamples=resamples, seed=seed * 7919 + i * 31 + salt)
                return {"estimate": est, "ci95": [lo, hi]}

            agg["training_time_reduction"] = paired(lambda ix: float(np.mean(m["time"][ix] / base["time"][ix]) - 1.0), 1)
            agg["training_time_reduction_total"] = paired(lambda ix: float(np.sum(m["time"][ix]) / np.sum(base["time"][ix]) - 1.0), 2)
            agg["gpu_hours_change"] = paired(lambda ix: float(np.sum(m["gpu_s"][ix]) / np.sum(base["gpu_s"][ix]) - 1.0), 3)
            agg["utilization_change"] = paired(
                lambda ix: float(
                    (np.sum(m["compute_s"][ix]) / np.sum(m["gpu_s"][ix])) / (np.sum(base["compute_s"][ix]) / np.sum(base["gpu_s"][ix])) - 1.0
                ),
                4,
            )
            agg["utilization_change_pp"] = paired(
                lambda ix: float(
                    100.0 * (np.sum(m["compute_s"][ix]) / np.sum(m["gpu_s"][ix]) - np.sum(base["compute_s"][ix]) / np.sum(base["gpu_s"][ix]))
                ),
                5,
            )
            agg["efficiency_change"] = paired(
                lambda ix: float(np.mean((m["progress"][ix] / m["gpu_s"][ix]) / (base["progress"][ix] / base["gpu_s"][ix])) - 1.0), 6
            )
            agg["final_metric_change"] = paired(lambda ix: float(np.nanmean(m["metric"][ix]) - np.nanmean(base["metric"][ix])), 7)
            apps = np.array([r["spec"]["application"] for r in rows])
            agg["by_application"] = {
                app: {
                    "runs": int(np.sum(ok & (apps == app))),
                    "training_time_change": float(np.mean(m["time"][ok & (apps == app)] / base["time"][ok & (apps == app)]) - 1.0),
                    "gpu_hours_change": float(np.sum(m["gpu_s"][ok & (apps == app)]) / np.sum(base["gpu_s"][ok & (apps == app)]) - 1.0),
                    "final_metric_change": float(np.nanmean(m["metric"][ok & (apps == app)]) - np.nanmean(base["metric"][ok & (apps == app)])),
                }
                for app in sorted(set(apps.tolist()))
                if np.any(ok & (apps == app))
            }
        aggregates[p] = agg

    jobs = []
    for r in rows:
        for p in names:
            j = dict(r["results"][p])
            j["policy"] = p
            j["run"] = r["index"]
            j["training_time_s"] = (
                j["completion_s"] - j["start_s"] if j["completion_s"] is not None and j["start_s"] is not None else None
            )
            jobs.append(j)
    return {
        "runs": runs,
        "seed": seed,
        "reallocation_cost_s": cost,
        "quota_scale": quota_scale,
        "interval_s": interval_s,
        "noise": noise,
        "reference_limits": reference_limits,
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


def markdown_replay(doc: dict[str, Any]) -> str:
    published = doc.get("published_avg_jct_s", {})
    lines = [
        f"### {doc['workload']} (reallocation cost {doc['reallocation_cost_s']:g} s)",
        "",
        "| policy | avg JCT (s) | p99 JCT (s) | makespan (s) | GPU-hours | utilisation | compute util. | final metric | reallocations | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, a in doc["policies"].items():
        lines.append(
            f"| {p} | {_fmt(a['avg_jct_s'])} | {_fmt(a['p99_jct_s'])} | {_fmt(a['makespan_s'])} | {_fmt(a['gpu_hours'], '.1f')} | "
            f"{_fmt(a['utilization'], '.3f')} | {_fmt(a['compute_utilization'], '.3f')} | {_fmt(a['final_metric'], '.4f')} | "
            f"{a['reallocations']} | {_fmt(a['wall_s'], '.2f')} |"
        )
    for p, v in published.items():
        lines.append(f"| {p} (published) | {_fmt(v)} | | | | | | | | |")
    return "\n".join(lines) + "\n"


def markdown_study(doc: dict[str, Any]) -> str:
    lines = [
        f"### Study: {doc['runs']} runs, seed {doc['seed']}, resize cost {doc['reallocation_cost_s']:g} s, "
        f"quota {doc['quota_scale']:g}x request, {'reference' if doc.get('reference_limits') else 'profile'} application limits "
        f"(wall {doc['wall_s']:.1f} s)",
        "",
        "| policy | mean training time (s) | GPU-hours | utilisation | final metric | efficiency (progress/GPU-h) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p, a in doc["policies"].items():
        lines.append(
            f"| {p} | {_fmt(a['avg_training_time_s'])} | {_fmt(a['gpu_hours'], '.0f')} | {_fmt(a['utilization'], '.3f')} | "
            f"{_fmt(a['final_metric'], '.4f')} | {_fmt(a['efficiency'], '.4g')} |"
        )
    lines += [
        "",
        "| policy vs static | training time (mean of ratios) | training time (total) | GPU-hours | utilisation (relative) | utilisation (pp) | efficiency | final metric |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ci(d: dict[str, Any], pct: bool = True) -> str:
        k = 100.0 if pct else 1.0
        unit = " %" if pct else ""
        return f"{d['estimate'] * k:+.1f}{unit} [{d['ci95'][0] * k:+.1f}, {d['ci95'][1] * k:+.1f}]"

    for p, a in doc["policies"].items():
        if p == "static":
            continue
        lines.append(
            f"| {p} | {ci(a['training_time_reduction'])} | {ci(a['training_time_reduction_total'])} | {ci(a['gpu_hours_change'])} | "
            f"{ci(a['utilization_change'])} | {ci(a['utilization_change_pp'], pct=False)} | {ci(a['efficiency_change'])} | "
            f"{a['final_metric_change']['estimate']:+.4f} [{a['final_metric_change']['ci95'][0]:+.4f}, {a['final_metric_change']['ci95'][1]:+.4f}] |"
        )
    apps = sorted({a for agg in doc["policies"].values() for a in agg.get("by_application", {})})
    dyn = [p for p in doc["policies"] if p != "static"]
    if apps and dyn:
        lines += ["", "| training time vs static (mean of ratios) | runs | " + " | ".join(dyn) + " |", "|---|---:|" + "---:|" * len(dyn)]
        for app in apps:
            runs = doc["policies"][dyn[0]]["by_application"].get(app, {}).get("runs", 0)
            cells = [f"{100.0 * doc['policies'][p]['by_application'][app]['training_time_change']:+.1f} %" for p in dyn]
            lines.append(f"| {app} | {runs} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
