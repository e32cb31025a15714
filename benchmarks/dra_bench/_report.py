"""The common JSON report of every benchmark suite, and a readable table on stdout."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import dra

        info["dra"] = dra.build_info()
    except Exception as exc:  # a report is still worth writing without build info
        info["dra"] = f"unavailable: {exc}"
    return info


def result(name: str, value: float, unit: str, baseline: tuple[str, float] | None = None, **extra: Any) -> dict[str, Any]:
    """One result row; ratio = value / baseline value (both measured in the same run)."""
    row: dict[str, Any] = {"name": name, "value": float(value), "unit": unit, "baseline": None, "ratio": None}
    if baseline is not None:
        base_name, base_value = baseline
        row["baseline"] = {"name": base_name, "value": float(base_value)}
        row["ratio"] = float(value) / float(base_value) if base_value else None
    row.update(extra)
    return row


def write_report(suite: str, results: list[dict[str, Any]], json_path: str | None) -> dict[str, Any]:
    """Prints a table of `results` and writes the JSON report to `json_path` (when given)."""
    report = {"suite": suite, "machine": machine_info(), "results": results}
    print(f"== dra.bench {suite} ==")
    width = max((len(r["name"]) for r in results), default=10)
    for r in results:
        base = r.get("baseline")
        tail = ""
        if base:
            ratio = r.get("ratio")
            tail = f"   vs {base['name']} {base['value']:.4g}" + (f"  (ratio {ratio:.3g})" if ratio is not None else "")
        print(f"  {r['name']:<{width}}  {r['value']:>12.4g} {r['unit']:<8}{tail}")
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"  json: {json_path}")
    sys.stdout.flush()
    return report


def median_time(fn: Callable[[], Any], *, repeats: int = 7, number: int = 1) -> float:
    """Median seconds per call of `fn` over `repeats` timings of `number` calls each."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)
