"""``python -m dra.bench nccl``: the NCCL suite runs end to end on the emulated library (tiny
settings, real processes) and writes the common report with every row labelled. Speed is the
benchmark's business, not asserted here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import dra

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not dra.build_info()["backends"].get("nccl"), reason="dra was built without the NCCL backend"),
]


def _bench(tmp_path, *args: str) -> subprocess.CompletedProcess:
    shm = tmp_path / "shm"
    shm.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", DRA_NCCL_EMULATION="1", DRA_NCCL_EMULATION_DIR=str(shm))
    proc = subprocess.run([sys.executable, "-m", "dra.bench", "nccl", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=220)
    assert not list(shm.iterdir()), f"shared segments left behind: {list(shm.iterdir())}"
    return proc


def test_emulated_suite_writes_labelled_rows(tmp_path):
    path = tmp_path / "nccl.json"
    proc = _bench(tmp_path, "--mode", "emulated", "--quick", "--max-bytes", "4096", "--json", str(path))
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = json.loads(path.read_text())
    assert report["suite"] == "nccl"
    rows = {r["name"]: r for r in report["results"]}
    for r in report["results"]:
        assert set(r) >= {"name", "value", "unit", "baseline", "ratio", "label", "mode"}
        assert r["label"] == "emulated" and r["mode"] == "emulated"
        if math.isnan(r["value"]):
            assert r.get("note"), f"{r['name']}: NaN without a reason"
    # Bandwidth through dra and its Gloo baseline at both sizes (1 KiB, 4 KiB): positive figures.
    for size in ("1KiB", "4KiB"):
        row = rows[f"allreduce_busbw_{size}"]
        assert row["value"] > 0 and row["baseline"]["name"] == "torch.distributed Gloo all_reduce"
        assert row["baseline"]["value"] > 0
    assert rows["comm_init_s"]["nccl"].endswith("(emulated)")
    # The handoff against both plain send/recv baselines (its bytes were checked by the receiver).
    handoff = [r for name, r in rows.items() if name.startswith("handoff_")]
    assert len(handoff) == 2 and all(r["value"] > 0 and r["ratio"] > 0 for r in handoff)
    # An elastic world through backend="nccl" shrank 2 -> 1 and grew back, beside Gloo.
    for name in ("shrink_2to1_s", "grow_1to2_s"):
        assert rows[name]["value"] > 0 and rows[name]["baseline"]["name"] == "the same elastic world on Gloo"
    assert rows["device_blocking_waits_per_step"]["steps"] > 0
    # The hung peer: the caller learns it after the timeout; the survivors shrink abortively.
    wd = rows["watchdog_detect_s"]
    assert wd["value"] >= wd["timeout_s"] * 0.9 and "Timeout" in wd["error"]
    assert rows["abortive_shrink_3to2_s"]["path"] == "shrink"
    assert rows["dra_step_0d_cpu_tensor_ns"]["ratio"] > 0
    assert math.isnan(rows["dra_step_0d_cuda_tensor_ns"]["value"])
    assert rows["train_step_ms_with_dra_step"]["value"] > 0
    assert (tmp_path / "nccl.png").stat().st_size > 0


def test_bad_options_are_refused(tmp_path):
    proc = _bench(tmp_path, "--parts", "bandwidth,nonsense")
    assert proc.returncode == 2 and "--parts: unknown nonsense" in proc.stdout
    proc = _bench(tmp_path, "--watchdog-timeout-s", "0")
    assert proc.returncode == 2 and "--watchdog-timeout-s" in proc.stdout
