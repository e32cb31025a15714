"""End-to-end: the single-process digits example trains on real data through dra.step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_digits_single_trains_and_reports_signals() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "digits_single.py"), "--epochs", "8", "--print-every", "20"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    final = re.search(r"final: steps (\d+), test accuracy ([0-9.]+), phase (\w+)", proc.stdout)
    assert final, proc.stdout
    assert int(final.group(1)) == 8 * (1347 // 32)
    assert float(final.group(2)) > 0.9
    phases = set(re.findall(r"phase (\w+)", proc.stdout))
    # The estimator must have left warm-up and recognised fast early learning on real data.
    assert "warmup" in phases and "fast" in phases, phases


def test_digits_single_rejects_bad_arguments() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "digits_single.py"), "--epochs", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "--epochs must be >= 1 (got 0)" in proc.stderr
