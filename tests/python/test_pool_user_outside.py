"""The pool used as an ordinary user would (an outside review, 2026-12-07): a user's own queue of
jobs of several classes, a drained pool stopped, the CLI's cost, a job's last words on an
operator's terminal. Real pools, real launchers and processes, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool._spawner import last_line
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService


def _events(state: Path) -> list[dict]:
    return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]


def _wait_event(state: Path, event: str, job: str, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if any(e["event"] == event and e.get("job") == job for e in _events(state)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no {event} event for {job}: {[(e['event'], e.get('job')) for e in _events(state)]}")


@pytest.mark.timeout(150)
def test_a_higher_class_arriving_later_takes_a_lower_jobs_warm_launcher_and_runs_first(tmp_path: Path) -> None:
    """The warm launchers went to a user's first arrivals: two normal jobs and a low one were
    admitted before two high ones that arrived a fraction of a second later. The lower job's
    launcher is given up to the higher one, which is admitted first."""
    state = tmp_path / "state"
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], state, heartbeat_timeout_s=5.0,
                      warm_launchers=1)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    try:
        client.submit({"name": "hold", "cwd": str(tmp_path), "command": ["sleep", "6"]})
        _wait_event(state, "grant", "hold")
        client.submit({"name": "lo", "cwd": str(tmp_path), "priority": "low", "command": ["true"]})
        _wait_event(state, "launch", "lo")
        client.submit({"name": "hi", "cwd": str(tmp_path), "priority": "high", "command": ["true"]})
        assert client.wait(["hold", "lo", "hi"], timeout_s=100) == {n: "finished" for n in ("hold", "lo", "hi")}
    finally:
        server.close()
    events = _events(state)
    grants = [e["job"] for e in events if e["event"] == "grant"]
    assert grants.index("hi") < grants.index("lo"), grants
    assert [e["job"] for e in events if e["event"] == "launcher_stopped"] == ["lo"]


@pytest.mark.timeout(120)
def test_stopping_a_pool_stops_its_waiting_jobs_launchers(tmp_path: Path) -> None:
    """Drain, let the running job end, stop: the daemon said 'no job running, the pool's cgroups
    removed' while a waiting job's warm launcher (230 MB, torch imported) ran on for ever outside
    every cgroup."""
    state = tmp_path / "state"
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], state, heartbeat_timeout_s=5.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    try:
        client.submit({"name": "hold", "cwd": str(tmp_path), "command": ["sleep", "60"]})
        _wait_event(state, "grant", "hold")
        client.submit({"name": "w", "cwd": str(tmp_path), "command": ["true"]})
        _wait_event(state, "launch", "w")
        pid = svc.launchers["w"].pid
        client.cancel("hold")
        assert client.wait(["hold"], timeout_s=30) == {"hold": "cancelled"}
        svc.stop()
        assert svc.stop_waiting_launchers() == ["w"]
        deadline = time.time() + 10
        while time.time() < deadline and _alive(pid):
            time.sleep(0.1)
        assert not _alive(pid)
    finally:
        server.close()
    assert [e["job"] for e in _events(state) if e["event"] == "launcher_stopped"] == ["w"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_the_pool_cli_does_not_import_torch() -> None:
    """Every dra pool submit/status/cancel imported torch through dra.pool.server: 3.6 s and 234 MB
    a command, 9-11 s each on a loaded host (ten submits from a shell loop took 110 s)."""
    code = ("import sys\nfrom dra.cli import main\n"
            "main(['pool', 'status', '--pool', 'unix:/nonexistent/pool.sock'])\n"
            "print('torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DRA_POOL": ""})
    assert r.stdout.strip().splitlines()[-1] == "False", (r.stdout, r.stderr)
    assert "unreachable" in r.stderr, r.stderr


def test_a_jobs_last_words_reach_the_operator_escaped(tmp_path: Path) -> None:
    """A failed job's reason ends with its log's last line, which `dra pool status` printed raw: a
    job erased the line on an operator's terminal and printed a green 'all fine' in its place."""
    log = tmp_path / "job.log"
    log.write_bytes(b"working\n\x1b[2K\x1b[32mall fine\x1b[0m\x07\n")
    assert last_line(log) == "\\x1b[2K\\x1b[32mall fine\\x1b[0m\\x07"
