"""Strict JSON files for reports: non-finite floats become null, so any JSON parser reads them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite(obj: Any) -> Any:
    """`obj` with every NaN/inf float replaced by None (strict parsers reject them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_json(doc: Any, path: str | Path) -> None:
    """Writes `doc` compactly (a replay's per-job records and timelines are most of its bytes, and
    indenting them made writing the JSON a large part of a replay's run time)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(finite(doc), f, separators=(",", ":"), allow_nan=False)
        f.write("\n")
