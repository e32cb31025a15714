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
    server = PoolServer(PoolService(devices, tmp_path / "state", heartbeat_timeout_s=5.0,
                                    restart_backoff_s=0.5)).start()
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
        fail = [sys.executable, "-c", "import os, sys; e = os.environ; print('attempt', e['DRA_RESTART_COUNT'], "
                "e['TORCHELASTIC_RESTART_COUNT'], e['TORCHELASTIC_MAX_RESTARTS']); sys.exit(3)"]
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
    requeues = [e for e in events if e["event"] == "requeue" and e["job"] == "twice"]
    assert [(e["restart"], e["delay_s"]) for e in requeues] == [(1, 0.5), (2, 1.0)]  # backed off, doubling
    launches = [e["time"] for e in events if e["event"] == "launch" and e["job"] == "twice"]
    assert launches[1] - requeues[0]["time"] >= 0.5 and launches[2] - requeues[1]["time"] >= 1.0
    assert not [e for e in events if e["event"] == "requeue" and e["job"] == "once"]
    assert len([e for e in events if e["event"] == "launch" and e["job"] == "twice"]) == 3
    assert [e["state"] for e in events if e["event"] == "finish"] == ["failed", "failed"]
    assert jobs["twice"]["restarts"] == 2 and "exit code 3" in jobs["twice"]["reason"], jobs["twice"]
    assert jobs["once"]["restarts"] == 0
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("twice.*.log"))
    attempts = sorted(line for line in logs.splitlines() if line.startswith("attempt"))
    assert attempts == ["attempt 0 0 2", "attempt 1 1 2", "attempt 2 2 2"], attempts  # torchrun's names too
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


def test_a_restart_waits_its_backoff_is_not_counted_twice_and_not_made_while_draining(tmp_path: Path) -> None:
    """In-process (the pool's calls as a launcher makes them): a failed job with restarts left is
    given nothing until its backoff ends; the same failure said again by a caller without a launch
    id (a launcher started by hand) does not use up a second restart; while the pool drains, a
    failure ends the job (a drain lets running jobs end, it starts nothing new)."""
    devices = [P.Device(id="d0", type="cpu-slot", memory_gb=2.0)]
    svc = PoolService(devices, tmp_path / "state", launch_jobs=False, restart_backoff_s=3600.0)
    try:
        svc.submit({"name": "r", "min_size": 1, "max_size": 1, "max_restarts": 3})
        svc.tick()
        held = [lease.id for lease in svc.book.of_job("r")]
        assert len(held) == 1
        svc.sync("r", held, [], None, failed=True, reason="boom")
        assert svc.jobs["r"]["state"] == "waiting" and svc.jobs["r"]["info"]["restarts"] == 1
        svc.sync("r", [], [], None, failed=True, reason="boom")  # the same failure, said again
        assert svc.jobs["r"]["state"] == "waiting" and svc.jobs["r"]["info"]["restarts"] == 1
        for _ in range(3):
            svc.tick()
        assert svc.book.count("r") == 0  # backing off (3600 s, at most 300): nothing granted
        st = next(j for j in svc.status()["jobs"] if j["name"] == "r")
        assert st["restarts"] == 1 and 290 < st["restart_in_s"] <= 300 and st["last_failure"] == "boom", st
        svc.jobs["r"]["info"]["not_before"] = 0.0  # the backoff over
        svc.tick()
        held = [lease.id for lease in svc.book.of_job("r")]
        assert len(held) == 1
        svc.sync("r", held, [], None)  # it runs again
        assert svc.jobs["r"]["state"] == "running"
        svc.drain()
        svc.sync("r", held, [], None, failed=True, reason="boom again")
        assert svc.jobs["r"]["state"] == "failed" and svc.jobs["r"]["info"]["restarts"] == 1
        assert svc.jobs["r"]["info"]["reason"] == "boom again (not started again: the pool is draining)"
    finally:
        svc.close()
