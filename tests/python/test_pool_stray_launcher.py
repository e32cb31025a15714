"""A launcher outlives its daemon by design (a restarted daemon adopts it). One that outlived a pool
whose state directory was then removed kept calling the same address; a new pool started there
with a job of the same name took it as a launcher "started by hand" and let it run the new job
(found by hand: event ``launcher`` with ``by_hand``). A launcher a daemon started carries a launch
id the daemon made (``pool-...``); a pool that has no record of it refuses it, and it stops. A
launcher really started by hand (``dra run --pool ... --job NAME``) makes its own id and is still
the job's."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService, Superseded


def declared(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def _events(state: Path) -> list[dict]:
    return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]


def test_a_launcher_left_by_a_removed_pool_is_not_taken_by_a_new_pool_at_the_same_address(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "pool.sock"  # the address both pools serve, outside either state directory
    sock.parent.mkdir()
    first = tmp_path / "state-a"
    svc = PoolService(declared(1), first, heartbeat_timeout_s=5.0)
    server = PoolServer(svc, socket_path=sock).start()
    client = PoolClient(server.url)
    marker = tmp_path / "starts"
    job = {"name": "j", "cwd": str(tmp_path), "log": str(tmp_path / "logs"),
           "command": [sys.executable, "-c", f"import time; open({str(marker)!r}, 'a').write('start\\n'); time.sleep(120)"]}
    client.submit(job)
    deadline = time.time() + 60
    while not (marker.exists() and svc.launchers.get("j")) and time.time() < deadline:
        time.sleep(0.2)
    assert marker.exists(), "the first pool's job never started"
    stray = svc.launchers["j"]
    assert stray.id.startswith("pool-"), stray.id  # a daemon's launch id
    server.close()  # the daemon goes; its launcher keeps its job running, by design
    moved = first.rename(tmp_path / "state-a-old")  # and its state goes (kept aside for the launcher's log)
    second = tmp_path / "state-b"
    # The new pool starts no launcher of its own (launch_jobs=False), so the stray launcher's next
    # call is the first any launcher makes for its job "j": the case that was taken as "by hand".
    svc2 = PoolService(declared(1), second, heartbeat_timeout_s=5.0, launch_jobs=False)
    svc2.submit({"name": "j"})  # before it listens: the stray launcher's first call finds the job
    server2 = PoolServer(svc2, socket_path=sock).start()
    try:
        client2 = PoolClient(server2.url)
        # The launcher retries about every second while the pool is away; refused, it stops (code 4).
        assert stray.popen is not None
        assert stray.popen.wait(timeout=45) == 4
        events = _events(second)
        assert not [e for e in events if e["event"] == "launcher"], events
        assert svc2.jobs["j"]["info"].get("launcher") is None
        said = (moved / "logs" / "j.launcher.log").read_text(errors="replace")
        assert "was started by another pool, not this one" in said, said[-2000:]
        # A launcher started by hand makes its own id (no prefix): it is still the job's.
        answer = client2.sync("j", [], [], None, launcher="0123456789abcdef")
        assert answer["state"] in ("waiting", "running")
        assert [e for e in _events(second) if e["event"] == "launcher" and e.get("by_hand")]
        with pytest.raises(Superseded, match="run by another launcher"):
            client2.sync("j", [], [], None, launcher="pool-0123456789abcdef")
    finally:
        server2.close()
        if stray.popen is not None and stray.popen.poll() is None:
            os.killpg(stray.pid, 9)
            stray.popen.wait()
