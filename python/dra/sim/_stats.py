"""Statistics of the simulator's reports: percentiles and paired bootstrap confidence intervals."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def bootstrap_ci(
    statistic: Callable[[Any], float], n: int, *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(estimate, low, high): percentile bootstrap over n paired runs; ``statistic(idx)`` gets an
    index array (all runs for the estimate, resampled ones for the interval)."""
    import numpy as np

    if resamples < 1:
        raise ValueError(f"resamples: must be >= 1, got {resamples}")
    if n == 0:  # nothing to compare (no run or job finished under both)
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    estimate = float(statistic(np.arange(n)))
    draws = np.array([statistic(rng.integers(0, n, n)) for _ in range(resamples)], dtype=float)
    alpha = (1.0 - level) / 2.0
    return estimate, float(np.quantile(draws, alpha)), float(np.quantile(draws, 1.0 - alpha))
