"""What `dra pool serve` says when it stops: with a job still running, one line naming it, that it
goes on and that a daemon started again on the same state adopts it; with nothing running, that
the pool stopped, a job cancelled just before the stop included. Both through the real CLI, a real launcher and a real job (`sleep`), on a
declared inventory (no cgroups needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch_harness import running

from dra.pool.server import PoolClient

pytestmark = pytest.mark.timeout(180)  # a daemon that never says "serving" fails the test, not the suite


def _serve(inv: Path, state: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dra", "pool", "serve", "--inventory", str(inv), "--state", str(state),
                             "--heartbeat-timeout-s", "120", "--orphan-limit-s", "60"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _stop(serve: subprocess.Popen) -> str:
    serve.terminate()
    out, _ = serve.communicate(timeout=30)
    return out


def _until(what: str, ok, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = ok()
        if got or time.monotonic() > deadline:
            assert got, f"{what}: not after {timeout_s} s"
            return got
        time.sleep(0.2)


def test_the_daemon_says_whether_it_leaves_jobs_running_and_the_next_one_adopts_them(tmp_path: Path) -> None:
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"devices": [{"id": "g0", "type": "gpu-80gb", "memory_gb": 80,
                                            "enforcement": "cuda_visible_devices"}]}))
    state = tmp_path / "state"
    client = PoolClient(f"unix:{state / 'pool.sock'}")
    serve = _serve(inv, state)
    try:
        assert "serving" in serve.stdout.readline()
        client.submit({"name": "sleeper", "command": ["sleep", "600"]})
        _until("sleeper running", lambda: any(j["name"] == "sleeper" and j["state"] == "running"
                                              for j in client.status()["jobs"]))
    except BaseException:
        _stop(serve)
        raise
    out = _stop(serve)
    assert "stopping with 1 job(s) still running (sleeper)" in out, out
    assert f"--state {state} adopts them" in out and "stopped: no job running" not in out, out

    serve = _serve(inv, state)
    try:
        assert "serving" in serve.stdout.readline()
        job = next(j for j in client.status()["jobs"] if j["name"] == "sleeper")
        assert job["state"] == "running", job  # adopted, not started again
        # Cancelled, and the daemon stopped at once: the adopted launcher hears of the cancel only
        # at its next call, which the stopping daemon still answers (it is held still, SIGSTOP,
        # until the stop began, so that it cannot call in before). Before, the daemon said the job
        # still ran, kept its cgroups, and the launcher kept the job's worker for want of a daemon.
        launcher = next(json.loads(x)["pid"] for x in (state / "events.jsonl").read_text().splitlines()
                        if json.loads(x)["event"] == "launch")
        os.kill(launcher, signal.SIGSTOP)
        try:
            client.cancel("sleeper")
            serve.terminate()
            time.sleep(1.5)
        finally:
            os.kill(launcher, signal.SIGCONT)
    finally:
        out = _stop(serve)
    assert "[dra pool] stopped: no job running" in out, out
    assert "still running" not in out, out
    _until("the cancelled job's launcher gone", lambda: not running(launcher), 15.0)

