"""The LibTorch example examples/cpp/elastic_train.cpp under torchrun: a grow and a shrink happen
in place and every final member holds bit-identical parameters.

The binary is not built here: it comes from the C++ build (`cmake -S . -B build/cpp` with
DRA_BUILD_EXAMPLES on, then `cmake --build build/cpp --target dra_elastic_train`).
DRA_CPP_EXAMPLE_DIR points at another build's examples/cpp folder.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = Path(os.environ.get("DRA_CPP_EXAMPLE_DIR", ROOT / "build" / "cpp" / "examples" / "cpp"))
BINARY = EXAMPLE_DIR / "dra_elastic_train"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--no-python", "--nproc-per-node=3", "--max-restarts=0",
           "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(BINARY), *args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=170)


@pytest.mark.skipif(not BINARY.exists(), reason=f"C++ example not built: {BINARY} is missing "
                    "(cmake --build build/cpp --target dra_elastic_train)")
@pytest.mark.timeout(180)
def test_cpp_example_grows_and_shrinks_with_identical_final_parameters():
    proc = _run("--steps", "60", "--start-size", "2", "--decide-every", "10", "--schedule", "20:3,40:2",
                "--timeout-ms", "20000")
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    resizes = re.findall(r"resize after step (\d+): world (\d+) -> (\d+) members \[([\d,]*)\]", out)
    assert resizes == [("20", "2", "3", "0,1,2"), ("40", "3", "2", "0,1")], out[-4000:]
    assert "uid 2 joined after step 20 as rank 2" in out
    assert "uid 2 released after step 40, standing by" in out
    # The world size is reported as it changes: 2, then 3, then 2 again.
    worlds = [int(w) for _, w in re.findall(r"step (\d+) world (\d+) loss", out)]
    assert worlds == [2, 2, 3, 3, 2, 2], out[-4000:]
    finals = re.findall(r"final uid (\d+) rank (\d+) world (\d+) steps 60 resizes 2 hash ([0-9a-f]{16})", out)
    assert sorted((uid, rank, world) for uid, rank, world, _ in finals) == [("0", "0", "2"), ("1", "1", "2")], out[-4000:]
    assert len({h for *_, h in finals}) == 1, finals
    assert "final uid 2 standby steps 60 resizes 2" in out


@pytest.mark.skipif(not BINARY.exists(), reason=f"C++ example not built: {BINARY} is missing")
@pytest.mark.timeout(120)
def test_cpp_example_rejects_a_schedule_off_the_decision_points():
    proc = subprocess.run([str(BINARY), "--schedule", "15:3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=100, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    assert proc.returncode == 1
    assert "--schedule: 15 is not a decision point" in proc.stdout
