"""``python -m dra.bench step``: the per-step overhead suite runs end to end (tiny settings) and
writes the common report format. Speed is the benchmark's business, not asserted here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(240)

TIME_ROWS = ("step_time_plain_ddp", "step_time_dra", "step_time_bare", "step_time_local", "dra_step_call", "allreduce_flat", "step_cpu_dra")
PCT_ROWS = ("step_overhead", "step_overhead_vs_bare", "step_noise_aa")


def _bench(*args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dra.bench", "step", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def test_step_suite_writes_the_report(tmp_path):
    path = tmp_path / "step.json"
    proc = _bench("--sizes", "2", "--models", "digits", "--repeats", "1", "--rounds", "2", "--steps", "6",
                  "--warmup", "2", "--discard", "1", "--json", str(path))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "== dra.bench step ==" in proc.stdout
    report = json.loads(path.read_text())
    assert report["suite"] == "step"
    assert report["machine"]["cpus"] >= 1
    rows = {r["name"]: r for r in report["results"]}
    for r in report["results"]:
        assert set(r) >= {"name", "value", "unit", "baseline", "ratio"}
        assert r["baseline"] is None or (set(r["baseline"]) == {"name", "value"} and r["ratio"] is not None)
    for stem in TIME_ROWS:
        row = rows[f"{stem}_digits_n2"]
        assert row["unit"] == "s"
        assert math.isfinite(row["value"]) and row["value"] > 0, row
    # The gradient reduction's cost is a difference of two medians: finite, of either sign.
    assert math.isfinite(rows["grad_sync_dra_digits_n2"]["value"])
    assert rows["step_time_dra_digits_n2"]["baseline"]["name"] == "plain_ddp"
    for stem in PCT_ROWS:
        row = rows[f"{stem}_digits_n2"]
        assert row["unit"] == "%" and math.isfinite(row["value"]), row
        assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
        lo, hi = row["ratio_ci95_rounds"]
        assert 0 < lo <= hi
        assert len(row["per_launch_ratios"]) == 1 and len(row["per_rank_ratios"][0]) == 2
        assert row["world_size"] == 2 and row["model"] == "digits" and row["global_batch"] == 32
        # 1 launch x 2 rounds x (6 steps - 1 discarded)
        assert row["steps_per_variant"] == 10
        for key in ("p10_pct", "paired_pct", "mean_based_pct", "cpu_time_pct"):
            assert math.isfinite(row[key])
    overhead = rows["step_overhead_digits_n2"]
    assert overhead["value"] == pytest.approx(100.0 * (overhead["ratio_median"] - 1.0))
    assert overhead["goal_pct"] == 1.0
    breakdown = overhead["breakdown_median_s"]
    assert set(breakdown) == {"plain", "dra", "bare", "local", "plain2"}
    for variant, phases in breakdown.items():
        assert set(phases) == {"data", "forward", "backward", "optimizer", "dra_step"}
        assert all(v >= 0 for v in phases.values())
        # Only dra has a dra.step call.
        assert (phases["dra_step"] > 0) == (variant == "dra")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "1"], "--sizes"),
        (["--models", "resnet"], "--models"),
        (["--steps", "3", "--discard", "3"], "--steps"),
    ],
)
def test_step_suite_rejects_bad_options(args, message, capsys):
    from dra_bench import step_overhead

    with pytest.raises(SystemExit) as exc:
        step_overhead.main(args)  # refused before anything is launched
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
