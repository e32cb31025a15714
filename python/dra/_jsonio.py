"""Strict JSON files for reports: non-finite floats become null, so any JSON parser reads them."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
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
    indenting them made writing the JSON a large part of a replay's run time). Atomically: the
    file appears whole (written beside it, then renamed) or not at all, so a full disk or an
    interrupted run never leaves a truncated report where an earlier one stood."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(finite(doc), separators=(",", ":"), allow_nan=False) + "\n"
    if not target.parent.is_dir() or (target.exists() and not target.is_file()):
        # A device or a FIFO (/dev/stdout): written in place, as before.
        with open(target, "w") as f:
            f.write(text)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for a moment, in every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
