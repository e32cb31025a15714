"""Job specs as the pool reads them: the request fields, and the speedup curve a job's reports
give the arbiter."""

from __future__ import annotations

from typing import Any

from dra import _core
from dra._core import pool as _p

REQUEST_FIELDS = ("kind", "device_type", "memory_gb", "fraction", "min_size", "max_size", "priority", "elastic", "gang")
AUTOSCALE_FIELDS = ("replica_rps", "up_utilisation", "target_utilisation", "down_utilisation", "down_delay_s",
                    "queue_per_replica")


def request_from_spec(spec: dict[str, Any]) -> Any:
    unknown = set(spec) - set(REQUEST_FIELDS) - {"name", "command", "env", "cwd", "autoscale", "resize_cost_s",
                                                  "zygote", "preload", "shrink_grace_s", "log", "resize_cooldown_s", "ray",
                                                  "options", "declared_steps", "job_class"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown job field; valid: name, command, env, cwd, "
                         f"{', '.join(REQUEST_FIELDS)}, autoscale, options, resize_cost_s, resize_cooldown_s, declared_steps, "
                         "job_class, zygote, "
                         "preload, shrink_grace_s, log, ray")
    if not isinstance(spec.get("name"), str):
        raise ValueError("name: a job needs a name (a string)")
    declared = spec.get("declared_steps")
    if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int) or declared < 1):
        raise ValueError(f"declared_steps: the job's budget in optimizer steps, an integer >= 1 (or leave it out), got {declared!r}")
    if "job_class" in spec and not (isinstance(spec["job_class"], str) and spec["job_class"]):
        raise ValueError(f"job_class: a non-empty string naming the kind of job (jobs of a class share history), got {spec['job_class']!r}")
    r = _p.Request()
    r.job = spec["name"]
    for k in REQUEST_FIELDS:
        if k in spec:
            setattr(r, k, spec[k])
    return r


#: A size's measured samples/s counts once the job ran at that size this long (seconds, ``rate_s``):
#: a second's measurement at a size the job just reached (or soon left) is mostly noise.
MIN_RATE_S = 3.0


def fit_speedup(report: dict[str, Any] | None, max_size: int, sigma0: float = 0.1) -> tuple[list[float], str]:
    """Speedup over one worker for k = 0..max_size from a training job's report (the elastic
    controller's, docs/guide/elastic.md), and where it came from:

    - ``"rates"``: the samples/s the job measured at two or more sizes (``rates``: {size: samples/s},
      each measured for at least ``MIN_RATE_S`` according to ``rate_s``, when the report has it),
      fitted to k / (1 + sigma (k - 1)) (Amdahl-like; least squares of k/rate = a + b (k - 1));
    - ``"throughput"``: else the controller's step-time fit (``throughput``: compute time per step
      a + b * per-rank batch, all-reduce time c + d * (k - 2) from two workers on), at the job's
      ``global_batch``;
    - ``"prior"``: else sigma = ``sigma0`` (an estimate).

    A job whose own policy wants fewer workers (``desired_size``, unless its policy is ``none``:
    the pool alone decides its size) gains nothing past that size."""
    report = report or {}
    rates = {}
    seconds = report.get("rate_s")
    for k, v in (report.get("rates") or {}).items():
        if float(v) > 0 and (seconds is None or float(seconds.get(k, 0.0)) >= MIN_RATE_S):
            rates[int(k)] = float(v)
    curve: list[float] | None = None
    source = "prior"
    if len(rates) >= 2:
        sigma = _amdahl_sigma(rates)
        if sigma is not None:
            curve, source = [0.0] + [k / (1.0 + sigma * (k - 1)) for k in range(1, max_size + 1)], "rates"
    tp = report.get("throughput") or {}
    batch = float(report.get("global_batch") or 0)
    if curve is None and int(tp.get("observations") or 0) >= 10 and batch > 0:
        def step(k: int) -> float:
            sync = float(tp["sync_fixed_s"]) + float(tp["sync_per_rank_s"]) * (k - 2) if k >= 2 else 0.0
            return float(tp["compute_fixed_s"]) + float(tp["compute_per_sample_s"]) * batch / k + max(0.0, sync)

        if step(1) > 0 and all(step(k) > 0 for k in range(2, max_size + 1)):
            curve, source = [0.0] + [step(1) / step(k) for k in range(1, max_size + 1)], "throughput"
    if curve is None:
        curve = [0.0] + [k / (1.0 + sigma0 * (k - 1)) for k in range(1, max_size + 1)]
    desired = report.get("desired_size")
    if report.get("policy") != "none" and isinstance(desired, int) and 1 <= desired < max_size:
        for k in range(desired + 1, max_size + 1):
            curve[k] = curve[desired]
    return curve, source


def remaining_size_s(estimate: Any, report: dict[str, Any] | None, speedup: list[float], current: int) -> float:
    """Remaining work in seconds on one worker: the estimate's Gittins size (steps) times the seconds
    one worker needs per step (global batch / samples per second at the current size, scaled by the
    speedup there). -1 when the job has not reported a rate yet."""
    report = report or {}
    rate = float(report.get("samples_per_s") or 0.0)
    batch = float(report.get("global_batch") or 0.0)
    k = max(1, current)
    if rate <= 0 or batch <= 0 or k >= len(speedup) or speedup[k] <= 0:
        return -1.0
    one_worker_s_per_step = batch / (rate / speedup[k])
    return float(_core.gittins_size(estimate, float(report.get("step", 0)))) * one_worker_s_per_step


def speedup_curve(report: dict[str, Any] | None, max_size: int, sigma0: float = 0.1) -> list[float]:
    """``fit_speedup``'s curve alone."""
    return fit_speedup(report, max_size, sigma0)[0]


def _amdahl_sigma(rates: dict[int, float]) -> float | None:
    xs = [k - 1.0 for k in rates]
    ys = [k / v for k, v in rates.items()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    return min(max(b / a, 0.0), 1.0) if a > 0 else None
