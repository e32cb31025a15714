"""Job specs as the pool reads them: the request fields, and the speedup curve a job's reports
give the arbiter."""

from __future__ import annotations

from typing import Any

from dra._core import pool as _p

REQUEST_FIELDS = ("kind", "device_type", "memory_gb", "fraction", "min_size", "max_size", "priority", "elastic", "gang")
AUTOSCALE_FIELDS = ("replica_rps", "up_utilisation", "target_utilisation", "down_utilisation", "down_delay_s",
                    "queue_per_replica")


def request_from_spec(spec: dict[str, Any]) -> Any:
    unknown = set(spec) - set(REQUEST_FIELDS) - {"name", "command", "env", "cwd", "autoscale", "resize_cost_s",
                                                  "zygote", "preload", "shrink_grace_s", "log", "resize_cooldown_s", "ray"}
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: unknown job field; valid: name, command, env, cwd, "
                         f"{', '.join(REQUEST_FIELDS)}, autoscale, resize_cost_s, resize_cooldown_s, zygote, preload, "
                         "shrink_grace_s, log, ray")
    if not isinstance(spec.get("name"), str):
        raise ValueError("name: a job needs a name (a string)")
    r = _p.Request()
    r.job = spec["name"]
    for k in REQUEST_FIELDS:
        if k in spec:
            setattr(r, k, spec[k])
    return r


def speedup_curve(report: dict[str, Any] | None, max_size: int, sigma0: float = 0.1) -> list[float]:
    """Speedup over one worker for k = 0..max_size, from the throughput a job reported at the sizes
    it ran (``rates``: {size: samples/s}) fitted to k / (1 + sigma (k - 1)) (Amdahl-like; least
    squares of k/rate = a + b (k - 1)); ``sigma0`` before two sizes were measured (an estimate).
    A job whose own policy wants fewer workers (``desired_size``) gains nothing past that size."""
    rates = {}
    for k, v in ((report or {}).get("rates") or {}).items():
        if float(v) > 0:
            rates[int(k)] = float(v)
    sigma = sigma0
    if len(rates) >= 2:
        xs = [k - 1.0 for k in rates]
        ys = [k / v for k, v in rates.items()]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx > 0:
            b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            a = my - b * mx
            if a > 0:
                sigma = min(max(b / a, 0.0), 1.0)
    curve = [0.0] + [k / (1.0 + sigma * (k - 1)) for k in range(1, max_size + 1)]
    desired = (report or {}).get("desired_size")
    if isinstance(desired, int) and 1 <= desired < max_size:
        for k in range(desired + 1, max_size + 1):
            curve[k] = curve[desired]
    return curve
