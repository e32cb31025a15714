"""The pool on Ray when the cluster's head goes away. Seen on a real cluster (a head and a worker
node on this machine, the head's processes killed): the pool went on listing the head's devices
and its jobs' leases for 60 s, said nothing, and was then ended by Ray itself ("Failed to connect to
GCS within 60 seconds ... The program will terminate"). The watcher now knocks at the head's
GCS port first, every look: three looks without an answer and every node is away with it (its
devices removed, nothing granted on a cluster without a head, its leases kept), with one
``ray_head_lost`` event; when it answers again, ``ray_head_back`` and each node is back as it was
or found lost.

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

from dra._core import pool as P
from dra.pool import cli, ray_cluster
from dra.pool.server import PoolServer
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
@pytest.mark.parametrize("b_after", ["back", "dead", "restarted"])
def test_the_pool_keeps_the_leases_of_nodes_away_with_the_head_and_grants_no_device_twice(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], b_after: str) -> None:
    """The head goes while a job holds a device on each node and another job waits: nothing is
    granted, nothing released. When it is back, node a is back as it was and node b is back
    (its leases go on: the waiting job still waits), dead or restarted with a new node id (its
    lease is fenced and released, and only then its device granted again). Before, the leases
    were released at the loss, and on the head's return the waiting job was granted the devices
    the first job's workers still ran on."""
    gcs, raylet_a, raylet_b = _listener(), _listener(), _listener()
    gcs_port = gcs.getsockname()[1]
    fake = _Ray(f"127.0.0.1:{gcs_port}", [_node(1, raylet_a.getsockname()[1], "a"),
                                          _node(2, raylet_b.getsockname()[1], "b")])
    monkeypatch.setattr(ray_cluster, "_ray", lambda: fake)
    cluster = ray_cluster.RayCluster(fake.gcs)
    svc = PoolService(cluster.devices(), tmp_path / "state", launch_jobs=False, heartbeat_timeout_s=60.0)
    stop = cluster.watch(svc.remove_node, svc.add_node, every_s=0.1, on_head=svc.ray_head)
    events = tmp_path / "state" / "events.jsonl"
    server: PoolServer | None = None

    def seen(kind: str) -> list[dict[str, Any]]:
        return [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == kind]

    try:
        svc.submit({"name": "j", "min_size": 2, "max_size": 2, "command": ["true"]})
        svc.tick()
        svc.submit({"name": "w", "min_size": 1, "max_size": 1, "command": ["true"]})  # waits for a device
        svc.tick()
        held = {l.device: l.id for l in svc.book.all()}
        assert sorted(held) == ["a/slot0", "b/slot0"] and {l.job for l in svc.book.all()} == {"j"}
        gcs.close()  # the head goes: its port refuses connections, its node table cannot be read
        fake.head_up = False
        t0 = time.time()
        (lost,) = _wait_for(lambda: seen("ray_head_lost"))
        took = time.time() - t0
        assert took < 5.0, took
        assert lost["reason"] == f"the Ray cluster's head (GCS at 127.0.0.1:{gcs_port}) is unreachable (connection refused)"
        away = _wait_for(lambda: len(seen("node_removed")) == 2 and seen("node_removed"))
        assert sorted((e["node"], e["leases"], e["leases_kept"]) for e in away) == [
            ("a", [], [held["a/slot0"]]), ("b", [], [held["b/slot0"]])]
        assert all(e["reason"] == lost["reason"] for e in away)
        assert not svc.inventory.devices and svc.ray_head_lost_at is not None
        # Kept, not fenced: the head's loss says nothing of the nodes, whose workers run on.
        assert {l.device: l.id for l in svc.book.all()} == held
        assert not svc.jobs["j"]["info"].get("fence"), svc.jobs["j"]["info"]
        # What an operator sees: the head lost, the devices away with their leases.
        st = svc.status()
        assert st["ray_head_lost_s"] >= 0 and sorted((d["id"], d["free"]) for d in st["away"]) == [
            ("a/slot0", 0.0), ("b/slot0", 0.0)], st
        metrics = svc.metrics()
        assert 'dra_pool_devices_away{pool="' in metrics and "} 2\n" in metrics.split("dra_pool_devices_away{")[1][:60]
        server = PoolServer(svc).start()  # the operator's `dra pool status` (the server is closed with the pool)
        assert cli.main(["pool", "status", "--pool", server.url]) == 0
        text = capsys.readouterr().out
        assert "head has been unreachable" in text and "2 device(s) away" in text, text
        for device, lid in held.items():
            assert any(line.split()[:1] == [device] and "away" in line and f"j#{lid}" in line
                       for line in text.splitlines()), text
        # A job submitted meanwhile is checked against the nodes away too: it waits, not refused as never fitting.
        svc.submit({"name": "x", "min_size": 2, "max_size": 2, "command": ["true"]})
        svc.tick()
        assert {l.device: l.id for l in svc.book.all()} == held  # nothing granted on a cluster without a head
        if b_after == "dead":
            fake._nodes[1] = {**fake._nodes[1], "Alive": False}
            raylet_b.close()
        elif b_after == "restarted":
            fake._nodes[1] = {**fake._nodes[1], "NodeID": "09" * 14}
        gcs = _listener(gcs_port)  # the head is back at its address (a GCS restarted with its state)
        fake.head_up = True
        (back,) = _wait_for(lambda: seen("ray_head_back"))
        assert back["lost_s"] > 0 and svc.ray_head_lost_at is None
        _wait_for(lambda: len(seen("node_added")) == (1 if b_after == "dead" else 2))
        added = {e["node"]: e for e in seen("node_added")}
        assert svc.status()["ray_head_lost_s"] is None and not svc.status()["away"]
        assert added["a"]["leases_kept"] == [held["a/slot0"]]
        svc.tick()
        book = {l.device: (l.job, l.id) for l in svc.book.all()}
        if b_after == "back":
            assert added["b"]["leases_kept"] == [held["b/slot0"]]
            assert book == {"a/slot0": ("j", held["a/slot0"]), "b/slot0": ("j", held["b/slot0"])}  # w still waits
            assert not svc.jobs["j"]["info"].get("fence")
        else:
            (gone,) = [e for e in seen("node_removed") if e["reason"] != lost["reason"]]
            why = "Ray reports it dead" if b_after == "dead" else "it restarted (a new node id)"
            assert gone["node"] == "b" and gone["leases"] == [held["b/slot0"]] and why in gone["reason"], gone
            assert svc.jobs["j"]["info"]["fence"] == {str(held["b/slot0"]): gone["reason"]}
            if b_after == "dead":
                assert book == {"a/slot0": ("j", held["a/slot0"])}
            else:  # its device is new again, granted once its old lease was fenced and released
                assert "leases_kept" not in added["b"] and book["a/slot0"] == ("j", held["a/slot0"])
                assert book["b/slot0"][1] not in held.values(), book
    finally:
        stop.set()
        if server is not None:
            server.close(wait_s=0.0)  # and the pool
        else:
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


def test_a_restarted_pool_fences_the_leases_of_nodes_no_longer_there(tmp_path: Path) -> None:
    """A Ray pool's daemon restarted on a cluster without one of its nodes (a node that did not come
    back): the leases on that node are released (one event each), fenced (a worker still running
    there is stopped by its launcher) and deleted from the state. Before, they were skipped but kept in the state, and came
    back with the node at a later restart, granted to a job that had moved on."""
    def devices(*nodes: str) -> list[Any]:
        return [P.Device(id=f"{n}/slot0", type="ray-slot", node=n, enforcement="soft") for n in nodes]

    state = tmp_path / "state"
    ray = {"ray_address": "127.0.0.1:6379"}  # a Ray pool's (no Ray is called here)
    svc = PoolService(devices("a", "b"), state, launch_jobs=False, heartbeat_timeout_s=600.0, **ray)
    svc.submit({"name": "j", "min_size": 1, "max_size": 2, "command": ["true"]})
    svc.tick()
    held = {l.device: l.id for l in svc.book.all()}
    assert sorted(held) == ["a/slot0", "b/slot0"]
    svc.close()
    svc = PoolService(devices("a"), state, launch_jobs=False, heartbeat_timeout_s=600.0, **ray)  # node b is gone
    try:
        events = [e for e in map(json.loads, (state / "events.jsonl").read_text().splitlines())]
        (restore,) = [e for e in events if e["event"] == "restore"]
        assert restore["dropped"] == [held["b/slot0"]] and restore["leases"] == 1, restore
        (release,) = [e for e in events if e["event"] == "release"]  # the Gantt plot and the counters see it go
        assert (release["lease"], release["device"]) == (held["b/slot0"], "b/slot0") and svc.counters["releases"] == 1
        assert {l.device: l.id for l in svc.book.all()} == {"a/slot0": held["a/slot0"]}
        assert list(svc.jobs["j"]["info"]["fence"]) == [str(held["b/slot0"])]
        assert "not in the Ray cluster of the restarted pool" in svc.jobs["j"]["info"]["fence"][str(held["b/slot0"])]
    finally:
        svc.close()
    svc = PoolService(devices("a", "b"), state, launch_jobs=False, heartbeat_timeout_s=600.0, scale_every_s=1e9, **ray)
    try:  # node b is back: the dropped lease stays gone
        assert {l.device: l.id for l in svc.book.all()} == {"a/slot0": held["a/slot0"]}
    finally:
        svc.close()


def test_a_restarted_local_pool_keeps_a_lease_whose_device_it_does_not_list_now(tmp_path: Path) -> None:
    """A local pool restarted without one of its devices (NVML failing after a driver upgrade, say)
    keeps the lease: not fenced, not deleted, restored when the device is listed again."""
    def devices(*ids: str) -> list[Any]:
        return [P.Device(id=i, type="gpu", enforcement="soft") for i in ids]

    state = tmp_path / "state"
    svc = PoolService(devices("gpu0", "gpu1"), state, launch_jobs=False, heartbeat_timeout_s=600.0)
    svc.submit({"name": "j", "min_size": 2, "max_size": 2, "command": ["true"]})
    svc.tick()
    held = {l.device: l.id for l in svc.book.all()}
    svc.close()
    svc = PoolService(devices("gpu0"), state, launch_jobs=False, heartbeat_timeout_s=600.0)
    try:
        assert not svc.jobs["j"]["info"].get("fence") and svc.counters["releases"] == 0
    finally:
        svc.close()
    svc = PoolService(devices("gpu0", "gpu1"), state, launch_jobs=False, heartbeat_timeout_s=600.0)
    try:
        assert {l.device: l.id for l in svc.book.all()} == held
    finally:
        svc.close()
