"""The torchft baseline of ``python -m dra.bench resize`` (dra/bench/torchft_baseline.py).

Without torchft: the suite still writes its report, with one NaN ``torchft_reconfigure`` row whose
note says why and how to install it. With torchft (``pip install -r requirements-bench.txt``): a
real, small run (4 replica processes, a Lighthouse, Gloo over loopback) whose figures are finite,
whose phases add up, and whose replicas ended with identical parameters (checked by the run)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dra_bench import torchft_baseline as tb


def _run(code: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)


def test_without_torchft_a_nan_row_says_why_and_how_to_install(tmp_path: Path) -> None:
    # sys.modules[name] = None makes `import torchft` raise ImportError, as on a machine without it
    out = tmp_path / "r.json"
    code = ("import sys; sys.modules['torchft'] = None\n"
            "from dra_bench.torchft_baseline import main\n"
            f"raise SystemExit(main(['--sizes-mb', '1', '--json', {str(out)!r}]))\n")
    proc = _run(code, timeout=120)
    assert proc.returncode == 0, proc.stdout
    report = json.loads(out.read_text())
    assert report["suite"] == "torchft_baseline"
    (row,) = report["results"]
    assert row["name"] == "torchft_reconfigure"
    assert math.isnan(row["value"])
    assert "import torchft failed (ModuleNotFoundError" in row["note"]
    assert "pip install -r requirements-bench.txt" in row["note"]
    assert "torchft_reconfigure" in proc.stdout  # the table on stdout


def test_bad_sizes_are_rejected_naming_the_field() -> None:
    with pytest.raises(ValueError, match="mb must be > 0"):
        tb.measure(0.0)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        tb.measure_median(1.0, 0)
    with pytest.raises(ValueError, match="--sizes-mb"):
        tb.main(["--sizes-mb", "1,-2"])


def test_requirements_bench_keeps_torch_pinned() -> None:
    root = Path(__file__).resolve().parents[2]
    lines = [ln.split("#")[0].strip() for ln in (root / "requirements-bench.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    assert "-r requirements-dev.txt" in lines
    assert "torch==2.13.0" in (root / "requirements-dev.txt").read_text().splitlines()
    assert any(ln.startswith("torchft==") for ln in lines)
    assert not any(ln.startswith("torch") and not ln.startswith("torchft") for ln in lines)


@pytest.mark.skipif(importlib.util.find_spec("torchft") is None,
                    reason="torchft is not installed (optional: .venv/bin/pip install -r requirements-bench.txt)")
@pytest.mark.timeout(240)
def test_real_torchft_run_and_comparison_rows(tmp_path: Path) -> None:
    # A real run (1 MB state, 1 repetition) through the same function dra.bench resize calls,
    # with dra's rows standing in as given figures so that the comparison rows can be checked.
    out = tmp_path / "rows.json"
    code = ("import json\n"
            "from dra_bench._report import result\n"
            "from dra_bench.torchft_baseline import torchft_rows\n"
            "dra = [result('shrink_4to2_1MB', 0.05, 's'), result('grow_2to4_1MB', 0.2, 's')]\n"
            "rows = torchft_rows([1.0], dra, repeats=1, timeout=150)\n"
            f"open({str(out)!r}, 'w').write(json.dumps(rows))\n")
    proc = _run(code, timeout=200)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert "torchft_reconfigure_1MB" not in rows, rows.get("torchft_reconfigure_1MB", {}).get("note")
    for kind, phases in (("shrink_4to2", ("quorum", "configure", "first_allreduce")),
                         ("grow_2to4", ("quorum", "configure", "state_transfer", "first_allreduce"))):
        total = rows[f"torchft_reconfigure_{kind}_1MB"]
        assert math.isfinite(total["value"]) and total["value"] > 0
        parts = [rows[f"torchft_reconfigure_{kind}_1MB_{p}"]["value"] for p in phases]
        assert all(p >= 0 for p in parts)
        assert sum(parts) == pytest.approx(total["value"], rel=0.05, abs=0.02)
        vs = rows[f"{kind}_1MB_vs_torchft"]
        assert vs["baseline"] == {"name": "torchft_reconfigure", "value": total["value"]}
        assert vs["ratio"] == pytest.approx(vs["value"] / total["value"])
    # shrink: torchft only drops the leavers once their heartbeats expired (1000 ms here)
    assert rows["torchft_reconfigure_shrink_4to2_1MB_quorum"]["value"] >= 0.9
    assert "heartbeat_timeout_ms=1000" in rows["torchft_reconfigure_shrink_4to2_1MB"]["note"]
    assert rows["torchft_state_transfer_1MB"]["unit"] == "GB/s"
