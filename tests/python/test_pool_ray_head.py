"""The pool on Ray when the cluster's head goes away. Seen on a real cluster (a head and a worker
node on this machine, the head's processes killed): the pool went on listing the head's devices
and its jobs' leases for 60 s, said nothing, and was then ended by Ray itself ("Failed to connect to
GCS within 60 seconds ... The program will terminate"). The watcher now knocks at the head's
GCS port first, every look: three looks without an answer and every node is gone with it (leases
released, devices removed, nothing granted on a cluster without a head), with one
``ray_head_lost`` event; when it answers again, ``ray_head_back`` and the nodes join again.

Killing a real head here would end this test process too (Ray ends every process connected to a
cluster whose head stays away), so Ray's API is a stand-in that answers as Ray does; the head and
the raylets are real listening sockets that the watcher knocks at, and the pool is real."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dra.pool import ray_cluster
from dra.pool.service import PoolService


def _listener(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    return s


class _Ray:
    """Ray's API as the watcher uses it. With the head down its node table cannot be read (a real
    ray.nodes() blocks, then fails)."""

    def __init__(self, gcs: str, nodes: list[dict[str, Any]]) -> None:
        self.gcs, self._nodes, self.head_up = gcs, nodes, True

    def is_initialized(self) -> bool:
        return True

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(gcs_address=self.gcs)

    def nodes(self) -> list[dict[str, Any]]:
        if not self.head_up:
            raise ConnectionError("the GCS is unreachable")
        return self._nodes


def _node(i: int, port: int, tag: str) -> dict[str, Any]:
    return {"Alive": True, "NodeID": f"{i:02d}" * 14, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port,
            "Resources": {"CPU": 2.0, "dra_slot": 1.0, f"dra_node_{tag}": 1.0}}


def _wait_for(what: Any, timeout_s: float = 15.0) -> Any:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s:g} s")


@pytest.mark.timeout(60)
def test_the_pool_takes_every_node_as_gone_with_the_head_and_back_with_it(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    gcs, raylet_a, raylet_b = _listener(), _listener(), _listener()
    gcs_port = gcs.getsockname()[1]
    fake = _Ray(f"127.0.0.1:{gcs_port}", [_node(1, raylet_a.getsockname()[1], "a"),
                                          _node(2, raylet_b.getsockname()[1], "b")])
    monkeypatch.setattr(ray_cluster, "_ray", lambda: fake)
    cluster = ray_cluster.RayCluster(fake.gcs)
    svc = PoolService(cluster.devices(), tmp_path / "state", launch_jobs=False, heartbeat_timeout_s=60.0)
    stop = cluster.watch(svc.remove_node, svc.add_node, every_s=0.1, on_head=svc.ray_head)
    events = tmp_path / "state" / "events.jsonl"

    def seen(kind: str) -> list[dict[str, Any]]:
        return [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == kind]

    try:
        svc.submit({"name": "j", "min_size": 2, "max_size": 2, "command": ["true"]})
        svc.tick()
        assert sorted(l.device for l in svc.book.all()) == ["a/slot0", "b/slot0"]
        gcs.close()  # the head goes: its port refuses connections, its node table cannot be read
        fake.head_up = False
        t0 = time.time()
        (lost,) = _wait_for(lambda: seen("ray_head_lost"))
        took = time.time() - t0
        assert took < 5.0, took
        assert lost["reason"] == f"the Ray cluster's head (GCS at 127.0.0.1:{gcs_port}) is unreachable (connection refused)"
        removed = _wait_for(lambda: len(seen("node_removed")) == 2 and seen("node_removed"))
        assert sorted(e["node"] for e in removed) == ["a", "b"] and all(e["reason"] == lost["reason"] for e in removed)
        assert not svc.inventory.devices and len(svc.book) == 0 and svc.ray_head_lost_at is not None
        # Not fenced: the head's loss says nothing of the nodes, so the job's launcher leaves its
        # workers running (a node's own loss fences its leases: test_pool_lease_taken_outside.py).
        assert not svc.jobs["j"]["info"].get("fence"), svc.jobs["j"]["info"]
        svc.tick()
        assert len(svc.book) == 0  # nothing is granted on a cluster without a head
        gcs = _listener(gcs_port)  # the head is back at its address (a GCS restarted with its state)
        fake.head_up = True
        (back,) = _wait_for(lambda: seen("ray_head_back"))
        assert back["lost_s"] > 0 and svc.ray_head_lost_at is None
        _wait_for(lambda: len(seen("node_added")) == 2)
        svc.tick()
        assert sorted(l.device for l in svc.book.all()) == ["a/slot0", "b/slot0"]  # the waiting job runs again
    finally:
        stop.set()
        svc.close()
        for s in (gcs, raylet_a, raylet_b):
            s.close()


def test_the_daemon_stops_before_ray_would_end_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray ends a process whose cluster head stays away longer than its
    gcs_rpc_server_reconnect_timeout_s; `dra pool serve` stops by itself 15 s before (state saved,
    socket removed) and says how to start it again."""
    from dra.pool.cli import ray_head_grace_s

    monkeypatch.delenv("RAY_gcs_rpc_server_reconnect_timeout_s", raising=False)
    assert ray_head_grace_s() == 45.0
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "300")
    assert ray_head_grace_s() == 285.0
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "10")
    assert ray_head_grace_s() == 5.0
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "soon")
    assert ray_head_grace_s() == 45.0
