"""A lease the pool takes back while its worker still runs: the pool declared the worker's node
lost (its raylet refused connections, say) but the process lives on. A real pool and launcher with
real workers, three devices on three nodes, no cgroups (as on a Ray cluster, where nothing of the
pool's empties the lease's cgroup).

Before: the launcher lowered the job's size to the leases it still held and named no one, so the
leader shrank the world by a healthy member of its choosing while the process on the lost lease
(here the leader itself) kept training on a device the pool could grant again. Now the launcher
stops that worker (the world loses it as a fault, exactly it) and keeps it counted in the job's
size until it exited."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from _launch_harness import running

from dra._core import pool as P
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pool" / "train.py"


def _lines(path: Path, prefix: str) -> list[dict]:
    return [json.loads(x[len(prefix):]) for x in path.read_text(errors="replace").splitlines()
            if x.startswith(prefix + "{")]



@pytest.mark.timeout(480)
@pytest.mark.parametrize("head", [False, True], ids=["node_lost", "head_lost"])
def test_a_worker_whose_lease_the_pool_took_back_is_stopped_and_no_healthy_one_leaves(tmp_path: Path, head: bool) -> None:
    """head_lost: the node is away with a Ray cluster's head, which says nothing of the node: its
    lease is kept (neither fenced nor released), the worker runs on, and the world keeps its three."""
    devices = [P.Device(id=f"{n}/slot0", type="cpu-slot", memory_gb=2.0, node=n) for n in ("a", "b", "c")]
    state = tmp_path / "state"
    # The pool sizes the job only at admission here (scale_every_s): the one world change after the
    # loss is the job's own.
    svc = PoolService(devices, state, heartbeat_timeout_s=10.0, scale_every_s=1000.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    logs = tmp_path / "logs"
    launcher_log = state / "logs" / "j.launcher.log"
    try:
        client.submit({"name": "j", "min_size": 1, "max_size": 3, "cwd": str(ROOT), "log": str(logs),
                       "command": [sys.executable, str(TRAIN), "--model", "mlp", "--data", "digits", "--epochs", "100",
                                   "--global-batch", "128", "--out", str(tmp_path / "out")]})
        deadline = time.time() + 180
        report: dict = {}
        while time.time() < deadline and report.get("world") != 3:
            report = next(j for j in client.status()["jobs"] if j["name"] == "j")["report"] or {}
            time.sleep(0.2)
        assert report.get("world") == 3, report
        starts = [e for e in _lines(launcher_log, "[dra run] ") if e.get("event") == "worker_start"]
        leader = next(e for e in starts if e["uid"] == report["members"][0])
        node = svc.inventory.at(leader["device"]).node
        taken_at = time.time()
        svc.remove_node(node, "its raylet is gone (a test)", head=head)  # the process on it lives on
        stopped = None
        while time.time() < taken_at + (3 if head else 30) and stopped is None:
            if not running(leader["pid"]):
                stopped = time.time() - taken_at
            time.sleep(0.1)
        if head:
            assert stopped is None, f"the worker of a lease gone with the head was stopped after {stopped:.1f} s"
        else:
            assert stopped is not None, "the worker on the lease the pool took back still runs 30 s later"
        states = client.wait(["j"], timeout_s=240)
    finally:
        if next(j for j in client.status()["jobs"] if j["name"] == "j")["state"] == "running":
            client.cancel("j")  # a failed check leaves no training behind on a shared machine
        server.close()
    launcher = _lines(launcher_log, "[dra run] ")
    assert states == {"j": "finished"}, launcher[-20:]
    # The world lost exactly the member on the lost lease (a fault), and no healthy one was asked to go.
    changes = {e["epoch"]: e for f in logs.glob("j.*.log") for e in _lines(f, "[dra] ")
               if e.get("event") in ("start", "admit", "resize", "fault")}
    after = [(changes[k]["event"], changes[k]["before"], changes[k]["after"], changes[k]["left"])
             for k in sorted(changes) if changes[k]["event"] != "start"]
    assert not [e for e in launcher if e.get("event") == "leave"], launcher
    taken = [e for e in launcher if e.get("event") == "lease_gone"]
    assert [(e["uid"], e["device"], e["fenced"]) for e in taken] == ([] if head else [(leader["uid"], leader["device"], True)]), taken
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    if head:
        assert after == [], after
        assert result["final_world"] == 3 and result["accuracy"] > 0.9, result
    else:
        assert after and after[0] == ("fault", 3, 2, [leader["uid"]]), after
        assert "its raylet is gone (a test)" in taken[0]["why"]
        assert result["final_world"] == 2 and result["accuracy"] > 0.9, result
