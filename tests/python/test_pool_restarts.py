"""A job's restarts (its spec's ``max_restarts``), on a real pool with real launchers: a failed
job with restarts left waits and starts again from its command, as a new launcher and new
workers that see the attempt in DRA_RESTART_COUNT, and keeps its place in the queue; without
restarts left (the default: none) it fails as before. A job's one launcher is its single point
of failure (its store, its workers' parent): a launcher killed by the OOM killer or by hand
failed the job for good, whatever the job's own checkpoints, where TorchElastic's max_restarts,
Kubernetes' backoffLimit and Slurm's requeue start it again."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool.cli import main as cli
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService


def _events(state: Path) -> list[dict]:
    return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]


def _pool(tmp_path: Path) -> tuple[PoolServer, PoolClient]:
    devices = [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(2)]
    server = PoolServer(PoolService(devices, tmp_path / "state", heartbeat_timeout_s=5.0)).start()
    return server, PoolClient(server.url)


def _attempts(marker: Path) -> str:
    """A worker that appends its DRA_RESTART_COUNT to ``marker``, then: the first attempt runs for
    a minute (its launcher is killed meanwhile), a later one exits 0."""
    code = (f"import os, time\n"
            f"n = os.environ['DRA_RESTART_COUNT']\n"
            f"open({str(marker)!r}, 'a').write(f'{{n}} {{os.getpid()}}\\n')\n"
            f"time.sleep(60 if n == '0' else 0)\n")
    return code


@pytest.mark.timeout(120)
def test_a_job_whose_launcher_was_killed_starts_again_and_finishes(tmp_path: Path) -> None:
    marker = tmp_path / "attempts.txt"
    server, client = _pool(tmp_path)
    try:
        client.submit({"name": "r", "min_size": 1, "max_size": 1, "max_restarts": 2, "cwd": str(tmp_path),
                       "log": str(tmp_path / "logs"), "command": [sys.executable, "-c", _attempts(marker)]})
        deadline = time.time() + 60
        while time.time() < deadline and not marker.exists():
            time.sleep(0.2)
        assert marker.read_text().split()[0] == "0"
        first = next(e for e in _events(tmp_path / "state") if e["event"] == "launch")
        os.kill(first["pid"], signal.SIGKILL)
        assert client.wait(["r"], timeout_s=60) == {"r": "finished"}
        job = next(j for j in client.status()["jobs"] if j["name"] == "r")
    finally:
        server.close()
    attempts = [line.split() for line in marker.read_text().splitlines()]
    assert [n for n, _ in attempts] == ["0", "1"]  # the second attempt ran once, and saw its count
    with pytest.raises(ProcessLookupError):  # the first attempt's worker went with its launcher
        os.kill(int(attempts[0][1]), 0)
    events = _events(tmp_path / "state")
    requeues = [e for e in events if e["event"] == "requeue"]
    assert len(requeues) == 1 and requeues[0]["restart"] == 1 and requeues[0]["of"] == 2, requeues
    assert "its launcher exited (code -9) before the job ended" in requeues[0]["reason"], requeues
    launches = [e for e in events if e["event"] == "launch" and e["job"] == "r"]
    assert len(launches) == 2 and launches[1]["pid"] != launches[0]["pid"]
    assert not [e for e in events if e["event"] == "finish" and e["state"] == "failed"]
    assert job["restarts"] == 1 and job["max_restarts"] == 2 and "code -9" in job["last_failure"], job


@pytest.mark.timeout(120)
def test_a_job_failing_every_time_fails_after_its_last_restart_and_one_without_fails_at_once(tmp_path: Path) -> None:
    server, client = _pool(tmp_path)
    try:
        fail = [sys.executable, "-c", "import os, sys; print('attempt', os.environ['DRA_RESTART_COUNT']); sys.exit(3)"]
        common = {"min_size": 1, "max_size": 1, "cwd": str(tmp_path), "log": str(tmp_path / "logs"), "command": fail}
        client.submit({"name": "twice", "max_restarts": 2, **common})
        client.submit({"name": "once", **common})
        assert client.wait(["twice", "once"], timeout_s=90) == {"twice": "failed", "once": "failed"}
        jobs = {j["name"]: j for j in client.status()["jobs"]}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli(["pool", "status", "--pool", server.url]) == 0
    finally:
        server.close()
    events = _events(tmp_path / "state")
    assert [e["restart"] for e in events if e["event"] == "requeue" and e["job"] == "twice"] == [1, 2]
    assert not [e for e in events if e["event"] == "requeue" and e["job"] == "once"]
    assert len([e for e in events if e["event"] == "launch" and e["job"] == "twice"]) == 3
    assert [e["state"] for e in events if e["event"] == "finish"] == ["failed", "failed"]
    assert jobs["twice"]["restarts"] == 2 and "exit code 3" in jobs["twice"]["reason"], jobs["twice"]
    assert jobs["once"]["restarts"] == 0
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("twice.*.log"))
    assert sorted(line for line in logs.splitlines() if line.startswith("attempt")) == ["attempt 0", "attempt 1",
                                                                                        "attempt 2"]
    line = next(x for x in out.getvalue().splitlines() if "job twice" in x)
    assert "[restart 2 of 2; last failure: " in line, line


def test_max_restarts_is_checked_like_every_field(tmp_path: Path) -> None:
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", launch_jobs=False)
    try:
        for bad, message in ((-1, "max_restarts: "), ("2", "max_restarts: must be an integer"), (1001, "max_restarts: ")):
            with pytest.raises(ValueError, match=f"^{message}"):
                svc.submit({"name": "x", "max_restarts": bad})
        assert not svc.jobs
    finally:
        svc.close()
