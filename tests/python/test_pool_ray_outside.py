"""The pool on Ray as a Ray user meets it (an outside review): a local cluster of two raylets
(ray.cluster_utils.Cluster), node a with one dra_slot, node b with one GPU (Ray's logical GPU: no
GPU is needed) and no slot.

- Fractional leases: two halves of one slot run at once (each placement group asks Ray for its
  share of a dra_slot, not a whole one, which left the second waiting for the first to end).
- GPU leases: placed by Ray's GPU resource (a GPU node need not offer dra_slot) with the GPU Ray
  reserved in CUDA_VISIBLE_DEVICES.
- A worker that cannot start on its node is said as such (exit 127 and why), not as a lost node.
- Workers run as the job's owner, not as the raylet's user (root here).
- Placement groups are all removed once the jobs ended.
- A cluster that offers no devices, or two nodes of one name, is refused with the fix (Ray's node
  table stubbed: no cluster needed).
- The pool's node watcher stops when its process leaves the cluster.

Skipped when Ray is not installed (pip install -r requirements-ray.txt)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -r requirements-ray.txt")

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Any:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, connect=False,
                head_node_args={"num_cpus": 1, "resources": {"dra_slot": 1, "dra_node_a": 1},
                                "include_dashboard": False})
    try:
        c.add_node(num_cpus=1, num_gpus=1, resources={"dra_node_b": 1})
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _pool(cluster: Any, state: Path) -> Any:
    from dra.pool.factory import make_service
    from dra.pool.server import PoolClient, PoolServer

    svc = make_service(f"ray:{cluster.address}", state, scale_every_s=0.5, heartbeat_timeout_s=5.0)
    server = PoolServer(svc).start()
    return server, PoolClient(server.url)


def _job(name: str, command: list[str], tmp: Path, **spec: Any) -> dict[str, Any]:
    return {"name": name, "min_size": 1, "max_size": 1, "cwd": str(tmp), "log": str(tmp / "logs"),
            "command": command, **spec}


def _pgs_left(timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Placement groups not removed, once Ray had time to remove those of ended launchers."""
    deadline = time.time() + timeout_s
    while True:
        left = [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]
        if not left or time.time() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.timeout(240)  # a loaded host: Ray removed the placement groups more than 20 s after the jobs ended
def test_ray_fraction_gpu_and_start_failure(cluster: Any, tmp_path: Path) -> None:
    server, client = _pool(cluster, tmp_path / "state")
    try:
        devices = {d["id"]: d["type"] for d in client.status()["devices"]}
        assert devices == {"a/slot0": "ray-slot", "b/gpu0": "gpu"}, devices
        # Two halves of one slot, both running at once (then cancelled).
        halves = tmp_path / "halves"
        halves.mkdir()
        client.submit(_job("halves", ["sh", "-c", f'echo "$DRA_DEVICE $(id -u)" > {halves}/$DRA_LEASE_ID; sleep 120'],
                           tmp_path, fraction=0.5, min_size=2, max_size=2, device_type="ray-slot"))
        client.submit(_job("gpu", ["sh", "-c", f'echo "$DRA_DEVICE $CUDA_VISIBLE_DEVICES" > {tmp_path}/gpu.txt'],
                           tmp_path, device_type="gpu"))
        client.submit(_job("missing", ["/nonexistent/dra-worker"], tmp_path, device_type="gpu"))
        deadline = time.time() + 60
        while len(list(halves.iterdir())) < 2 and time.time() < deadline:
            time.sleep(0.3)
        running = [p.read_text().split()[0] for p in halves.iterdir()]
        assert running == ["a/slot0", "a/slot0"], running
        client.cancel("halves")
        states = client.wait(["halves", "gpu", "missing"], timeout_s=60)
        jobs = {j["name"]: j for j in client.status()["jobs"]}
        assert states == {"halves": "cancelled", "gpu": "finished", "missing": "failed"}, (states, jobs)
        assert (tmp_path / "gpu.txt").read_text().split() == ["b/gpu0", "0"]  # the GPU Ray reserved
        reason = jobs["missing"]["reason"]
        assert "exit code 127" in reason and "cannot start /nonexistent/dra-worker" in reason, reason
        assert "No such file" in reason, reason
    finally:
        server.close()
    assert _pgs_left() == []


@pytest.mark.timeout(90)
def test_ray_worker_runs_as_its_owner(cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's user (the job's owner) is whom its workers run as on every node; here a
    spawner whose owner is nobody, on a cluster whose raylets run as root. And at the raylet's
    priority: Ray starts its worker processes at nice +15, which the job's worker inherited (a
    world not formed in 150 s on a node with three busy loops)."""
    import os

    from dra.pool.ray_cluster import RaySpawner

    spawner = RaySpawner(cluster.address)
    spawner.owner = {"uid": 65534, "gid": 65534, "groups": []}
    log = tmp_path / "w.log"
    spawner.spawn("w", ["sh", "-c", "id -u; id -g; cut -d' ' -f19 /proc/$$/stat"], {"DRA_NODE": "a", "DRA_DEVICE": "a/slot0",
                                                      "DRA_DEVICE_SHARE": "1", "PATH": "/usr/bin:/bin"},
                  [], log, "/")
    deadline = time.time() + 40
    ended: list[tuple[str, int]] = []
    while not ended and time.time() < deadline:
        ended = spawner.poll()
        time.sleep(0.2)
    spawner.close()
    assert ended == [("w", 0)], (ended, log.read_text() if log.exists() else None)
    assert log.read_text().split() == ["65534", "65534", str(os.getpriority(os.PRIO_PROCESS, 0))]  # nice: the raylets'
    assert log.stat().st_uid == 65534  # its owner reads and cuts it
    assert _pgs_left() == []
    # The operator's choice (DRA_RAY_WORKER_NICENESS in the daemon's environment, which launchers
    # inherit): Ray's own +15, say; a bad value is refused before anything runs.
    monkeypatch.setenv("DRA_RAY_WORKER_NICENESS", "15")
    spawner = RaySpawner(cluster.address)
    log = tmp_path / "w15.log"
    spawner.spawn("w15", ["sh", "-c", "cut -d' ' -f19 /proc/$$/stat"], {"DRA_NODE": "a", "DRA_DEVICE": "a/slot0",
                                                                      "DRA_DEVICE_SHARE": "1", "PATH": "/usr/bin:/bin"},
                  [], log, "/")
    deadline = time.time() + 40
    ended = []
    while not ended and time.time() < deadline:
        ended = spawner.poll()
        time.sleep(0.2)
    spawner.close()
    assert ended == [("w15", 0)] and log.read_text().split() == [str(min(19, os.getpriority(os.PRIO_PROCESS, 0) + 15))]
    for bad in ("-5", "20", "high"):
        monkeypatch.setenv("DRA_RAY_WORKER_NICENESS", bad)
        with pytest.raises(ValueError, match=r"^DRA_RAY_WORKER_NICENESS: must be a whole number in \[0, 19\], got"):
            RaySpawner(cluster.address)


@pytest.mark.timeout(60)
def test_ray_watcher_stops_with_the_connection(cluster: Any, tmp_path: Path) -> None:
    from dra.pool.ray_cluster import RayCluster

    def watching() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "dra-ray-watch" and t.is_alive()]

    RayCluster(cluster.address)
    stop = RayCluster(cluster.address).watch(lambda *a: None, every_s=0.1)
    try:
        time.sleep(0.5)
        assert watching()
        ray.shutdown()
        # It ends at its next look: within a look's wait for Ray's node table (TABLE_WAIT_S, 2 s)
        # and its knock at the head, stretched on a loaded host (was: gone 1.0 s after, which a look
        # waiting for the table outlasts on any host). One that does not stop never ends.
        for thread in watching():
            thread.join(20)
        assert not watching()
    finally:
        stop.set()


class _FakeRay:
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self._nodes = nodes

    def is_initialized(self) -> bool:
        return True

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes


def _node(i: int, **res: float) -> dict[str, Any]:
    return {"Alive": True, "NodeID": f"{i:02d}" * 14, "NodeManagerAddress": f"10.0.0.{i}", "NodeManagerPort": 7000,
            "Resources": {"CPU": 2.0, **res}}


@pytest.mark.timeout(30)
def test_ray_cluster_without_pool_devices_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from dra.pool import ray_cluster

    def cluster_of(*nodes: dict[str, Any]) -> Any:
        monkeypatch.setattr(ray_cluster, "_ray", lambda: _FakeRay(list(nodes)))
        return ray_cluster.RayCluster("10.0.0.1:6379")

    with pytest.raises(ValueError, match=r"^ray: the Ray cluster at 10\.0\.0\.1:6379 offers the pool no devices "
                                         r"\(no alive node has a dra_node_<name> resource\): start each node .*"
                                         r"ray start --resources '\{\"dra_slot\": 2, \"dra_node_a\": 1\}'"):
        cluster_of(_node(1), _node(2, GPU=4.0))  # CPUs only, and a GPU node that is not the pool's
    with pytest.raises(ValueError, match=r"offers the pool no devices \(node 010101010101 at 10\.0\.0\.1 has "
                                         r"dra_slot but no dra_node_<name> resource: left out\)"):
        cluster_of(_node(1, dra_slot=2.0))
    with pytest.raises(ValueError, match=r"no devices \(its alive nodes dra_node_a have no dra_slot and no GPU\)"):
        cluster_of(_node(1, dra_node_a=1.0))
    with pytest.raises(ValueError, match=r"^ray: the Ray cluster at 10\.0\.0\.1:6379: node 020202020202 at 10\.0\.0\.2 "
                                         r"has the name dra_node_a of node 010101010101 at 10\.0\.0\.1: left out; give "
                                         r"each node a name of its own$"):
        cluster_of(_node(1, dra_slot=1.0, dra_node_a=1.0), _node(2, dra_slot=1.0, dra_node_a=1.0))
    # A slot node without a name next to a named one: the pool starts, and says what it left out.
    c = cluster_of(_node(1, dra_slot=1.0, dra_node_a=1.0), _node(2, dra_slot=3.0))
    assert [d.id for d in c.devices()] == ["a/slot0"]
    assert "node 020202020202 at 10.0.0.2 has dra_slot but no dra_node_<name> resource: left out" in capsys.readouterr().err
