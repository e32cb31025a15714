"""Inference services as a user writes and runs them (an outside review, review-pool-inference-1):
two services of one class bursting at once, a new service's cold start, fields a service cannot
use, and what an operator sees of the autoscaler. The pool runs its real scheduling loop on a
pool clock; the launchers' part (heartbeats, leases handed back) is played by the test."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool import _clock
from dra.pool.server import PoolServer
from dra.pool.service import PoolService


def _devices(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def _play(svc: PoolService, now: float, started: bool = True) -> None:
    """One tick, then every job's launcher hands back what the pool asked back and (``started``)
    says its workers run."""
    svc.tick(now)
    for name, j in list(svc.jobs.items()):
        if j["state"] in ("waiting", "running"):
            leaving = [l.id for l in svc.book.of_job(name) if l.state == "releasing"]
            staying = [l.id for l in svc.book.of_job(name) if l.id not in leaving] if started else []
            asked = svc.sync(name, staying, leaving, None).get("release") or []
            if asked:
                svc.sync(name, [], asked, None)


def test_two_services_of_one_class_bursting_at_once_share_the_pool(tmp_path: Path) -> None:
    """Both want 3 replicas of a 4-slot pool: each gets 2 (the first submitted took 3 and the
    other stayed at 1 until the first's load fell: SLO attainment 99.6 % against 5.8 %)."""
    svc = PoolService(_devices(4), tmp_path, launch_jobs=False, scale_every_s=0.0, heartbeat_timeout_s=1e6)
    try:
        for name in ("a", "b"):
            svc.submit({"name": name, "kind": "inference", "priority": "high", "min_size": 1, "max_size": 3,
                        "autoscale": {"replica_rps": 10.0}})
        t0 = _clock.now()
        for k in range(3):
            _play(svc, t0 + 0.05 * k)
        assert svc.book.count("a") == 1 and svc.book.count("b") == 1
        for name in ("a", "b"):
            svc.set_report(name, {"rate_rps": 25.0, "queue": 0})
        for k in range(3, 12):
            _play(svc, t0 + 0.05 * k)
        assert (svc.book.count("a", False), svc.book.count("b", False)) == (2, 2)
        # What each wants and holds is shown to the operator (status line and metrics).
        jobs = {j["name"]: j for j in svc.status()["jobs"]}
        assert jobs["a"]["replicas_wanted"] == 3 and jobs["a"]["load_rps"] == 25.0, jobs["a"]
        metrics = svc.metrics()
        assert 'dra_pool_inference_replicas_wanted{pool="pool",job="b"} 3' in metrics, metrics
        assert 'dra_pool_inference_load_rps{pool="pool",job="a"} 25' in metrics
        server = PoolServer(svc).start()
        try:
            out = subprocess.run([sys.executable, "-m", "dra", "pool", "status", "--pool", server.url],
                                 capture_output=True, text=True, timeout=60)
        finally:
            server.close()
        assert out.returncode == 0, out.stderr
        line = next(x for x in out.stdout.splitlines() if "job a " in x)
        assert re.search(r"workers 2 \[1\.\.3\] elastic  \[wants 3 \(load 25 requests/s, queue 0, report \d+ s old\)\]",
                         line), line
    finally:
        svc.close()


def test_a_new_services_queue_while_its_replicas_start_does_not_take_max_size(tmp_path: Path) -> None:
    """A service at 1.5 requests/s (one replica serves 10) with its first replica granted but not
    yet running: the requests queue meanwhile. That queue took the service to max_size within
    3 s (preempting training) and its peak held the replicas for a minute; once the replica runs,
    a queue still asks for more."""
    svc = PoolService(_devices(4), tmp_path, launch_jobs=False, scale_every_s=0.0, heartbeat_timeout_s=1e6)
    try:
        svc.submit({"name": "train", "min_size": 1, "max_size": 4, "resize_cooldown_s": 0})
        svc.submit({"name": "serve", "kind": "inference", "priority": "high", "min_size": 1, "max_size": 3,
                    "autoscale": {"replica_rps": 10.0}})
        t0 = _clock.now()
        t = t0
        for _ in range(4):
            t += 0.05
            _play(svc, t, started=False)
        assert svc.book.count("serve") == 1
        for queue in (3, 5, 6, 7):  # cold start (1.5 requests/s for 5 s): the replica is not running yet
            svc._keep_report("serve", {"rate_rps": 1.5, "queue": queue}, t)
            t += 0.05
            _play(svc, t, started=False)
        assert svc.book.count("serve") == 1, "a queue while the replica starts took more"
        assert svc.book.count("train", False) == 3
        # Running now, and the queue does not drain: one more replica.
        for _ in range(3):
            svc._keep_report("serve", {"rate_rps": 1.5, "queue": 12}, t)
            t += 0.05
            _play(svc, t)
        assert svc.book.count("serve") >= 2
    finally:
        svc.close()


@pytest.mark.parametrize("extra, message", [
    ({"options": {"fault_timeout_s": 5}}, "options: the training controller's options"),
    ({"declared_steps": 100}, "declared_steps: a training job's declared length"),
])
def test_fields_a_service_never_reads_are_refused(tmp_path: Path, extra: dict, message: str) -> None:
    svc = PoolService(_devices(2), tmp_path, launch_jobs=False)
    try:
        with pytest.raises(ValueError, match=message):
            svc.submit({"name": "s", "kind": "inference", "min_size": 1, "max_size": 2, **extra})
        assert svc.jobs == {} and svc.book.all() == []
    finally:
        svc.close()


@pytest.mark.parametrize("command, zygote, message", [
    (["sh", "-c", "python3 serve.py"], None, r"preload: only a command of the form \[python, script.py"),
    ([sys.executable, "-c", "print(1)"], None, r"preload: only a command of the form"),
    ([sys.executable, "work.py"], False, "zygote: false turns the fork server off"),
])
def test_a_preload_the_fork_server_would_never_import_is_refused(tmp_path: Path, command: list, zygote: bool | None,
                                                                 message: str) -> None:
    """A preload of a module that does not import fails the job at its first worker, but only when
    the fork server runs: behind ``sh -c``, ``python -c`` or ``zygote: false`` it was never tried."""
    (tmp_path / "work").mkdir()
    svc = PoolService(_devices(2), tmp_path / "state")
    try:
        spec = {"name": "p", "cwd": str(tmp_path / "work"), "preload": ["no_such_module_here"], "command": command}
        if zygote is not None:
            spec["zygote"] = zygote
        with pytest.raises(ValueError, match=message):
            svc.submit(spec)
        assert svc.jobs == {} and svc.launchers == {}
    finally:
        svc.close()


def test_a_replicas_exit_code_is_in_its_release_event(tmp_path: Path) -> None:
    """A replica that crashed showed in the events as "worker exited" only; the job then ended
    "finished" with no word of it."""
    svc = PoolService(_devices(2), tmp_path, launch_jobs=False, scale_every_s=0.0, heartbeat_timeout_s=1e6)
    try:
        svc.submit({"name": "s", "kind": "inference", "min_size": 1, "max_size": 2})
        t0 = _clock.now()
        _play(svc, t0)
        (lease,) = [l.id for l in svc.book.of_job("s")]
        for bad in ({"x": 1}, {"²": 1}, {"١٢": 1}, {str(lease): True}, {str(lease): "7"}, [lease]):
            with pytest.raises(ValueError, match="exits: must map lease ids"):
                svc.sync_request("s", {"heartbeats": [lease], "exits": bad})
        svc.sync_request("s", {"heartbeats": [], "released": [lease], "exits": {str(lease): 7}})
        events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
        (release,) = [e for e in events if e["event"] == "release" and e["lease"] == lease]
        assert release.get("exit_code") == 7, release
    finally:
        svc.close()


def test_a_service_without_its_replica_rate_is_told_the_default(tmp_path: Path) -> None:
    """The default capacity of a replica (1 request/s) is a guess: a service that serves 10 a
    replica and reported 1.5 requests/s asked for 3 replicas. Its submission now says so."""
    svc = PoolService(_devices(2), tmp_path, launch_jobs=False)
    try:
        told = svc.submit({"name": "s", "kind": "inference", "min_size": 1, "max_size": 2})
        assert "autoscale.replica_rps is not set" in told["note"], told
        quiet = svc.submit({"name": "r", "kind": "inference", "min_size": 1, "max_size": 2,
                            "autoscale": {"replica_rps": 10.0}})
        assert "note" not in quiet and "note" not in svc.submit({"name": "t", "min_size": 1, "max_size": 2})
    finally:
        svc.close()
