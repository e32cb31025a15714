"""The inference side of the pool, as an operator drives it (an outside review): the replica
autoscaler at the edges of its inputs and configs, and a service whose load reports stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool import _clock
from dra.pool.service import PoolService


def _devices(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def _play(svc: PoolService, now: float) -> None:
    """One tick, then every job's launcher heartbeats and hands back what the pool asked back."""
    svc.tick(now)
    for name, j in list(svc.jobs.items()):
        if j["state"] in ("waiting", "running"):
            leaving = [l.id for l in svc.book.of_job(name) if l.state == "releasing"]
            staying = [l.id for l in svc.book.of_job(name) if l.id not in leaving]
            asked = svc.sync(name, staying, leaving, None).get("release") or []
            if asked:
                svc.sync(name, [], asked, None)


@pytest.mark.parametrize("rate, queue, replica_rps", [(3e9, 0.0, 1.0), (1e300, 0.0, 1.0), (0.0, 1e10, 1.0),
                                                      (1.0, 0.0, 1e-300)])
def test_a_burst_past_an_int_asks_for_every_replica_not_none(rate: float, queue: float, replica_rps: float) -> None:
    # The replicas wanted were computed in int: 3e9 requests/s overflowed it and the service
    # asked for no more replicas than it had.
    a = P.ReplicaAutoscaler(P.AutoscalerConfig(replica_rps=replica_rps, min_replicas=1, max_replicas=4))
    assert a.update(0.0, rate, queue, 1) == 4
    assert a.update(0.05, 0.0, 0.0, 4) == 4  # and it holds them for down_delay_s


def test_a_huge_burst_takes_the_devices_training_holds(tmp_path: Path) -> None:
    svc = PoolService(_devices(4), tmp_path, launch_jobs=False, scale_every_s=0.0, heartbeat_timeout_s=1e6)
    try:
        svc.submit({"name": "serve", "kind": "inference", "min_size": 1, "max_size": 4,
                    "autoscale": {"replica_rps": 1.0}})
        svc.submit({"name": "train", "min_size": 1, "max_size": 4})
        t0 = _clock.now()  # the pool's clock (a report is stamped by it), not the wall's
        for k in range(3):
            _play(svc, t0 + 0.05 * k)
        assert svc.book.count("serve", False) == 1
        svc.set_report("serve", {"rate_rps": 1e12})
        for k in range(3, 8):
            _play(svc, t0 + 0.05 * k)
        assert svc.book.count("serve", False) == 3 and svc.book.count("train", False) == 1
    finally:
        svc.close()


def test_a_band_out_of_order_is_refused_with_its_values(tmp_path: Path) -> None:
    svc = PoolService(_devices(2), tmp_path, launch_jobs=False)
    try:
        with pytest.raises(ValueError, match=r"^autoscale\.down_utilisation: .*got 0\.35 < 0\.6 <= 0\.3; reorder"):
            svc.submit({"name": "s", "kind": "inference", "autoscale": {"up_utilisation": 0.3}})
        with pytest.raises(ValueError, match=r"^autoscale\.replica_rps: must be > 0, got 0$"):
            svc.submit({"name": "s", "kind": "inference", "autoscale": {"replica_rps": 0}})
        assert not svc.jobs
    finally:
        svc.close()


def test_autoscale_on_a_training_job_is_refused_not_ignored(tmp_path: Path) -> None:
    svc = PoolService(_devices(2), tmp_path, launch_jobs=False)
    try:
        with pytest.raises(ValueError, match=r"^autoscale: only an inference service .* give kind: inference"):
            svc.submit({"name": "t", "min_size": 1, "max_size": 2, "autoscale": {"replica_rps": 5.0}})
        assert not svc.jobs
        assert svc.submit({"name": "t", "kind": "inference", "autoscale": {"replica_rps": 5.0}})["state"] == "waiting"
    finally:
        svc.close()


def test_a_service_whose_reports_stop_gives_its_replicas_back_to_training(tmp_path: Path) -> None:
    # The last report held forever: a frontend that died (or reports only while there is
    # traffic) after a burst kept the burst's replicas, and training never had them back.
    svc = PoolService(_devices(4), tmp_path, launch_jobs=False, scale_every_s=0.0, heartbeat_timeout_s=1e6)
    try:
        svc.submit({"name": "serve", "kind": "inference", "min_size": 1, "max_size": 4,
                    "autoscale": {"replica_rps": 1.0, "down_delay_s": 2.0}})
        svc.submit({"name": "train", "min_size": 1, "max_size": 4, "resize_cooldown_s": 0})
        t0 = _clock.now()  # the pool's clock (a report is stamped by it), not the wall's
        svc.set_report("serve", {"rate_rps": 1.6})
        for k in range(5):
            _play(svc, t0 + 0.05 * k)
        assert svc.book.count("serve", False) == 3 and svc.book.count("train", False) == 1
        # Silence: while the report is fresh the replicas stay (it is a load, not an absence) ...
        t = t0
        while t < t0 + 25.0:
            t += 0.5
            _play(svc, t)
        assert svc.book.count("serve", False) == 3
        # ... once it is older than 30 s it counts as no load: down a replica per down_delay_s.
        while t < t0 + 40.0:
            t += 0.5
            _play(svc, t)
        assert svc.book.count("serve", False) == 1 and svc.book.count("train", False) == 3
        events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
        stale = [e for e in events if e["event"] == "report_stale"]
        assert len(stale) == 1 and stale[0]["job"] == "serve" and stale[0]["limit_s"] == 30.0
        # A report again counts at once (kept at this test's clock, which runs ahead of the wall's).
        svc._keep_report("serve", {"rate_rps": 1.6}, t)
        for k in range(1, 4):
            _play(svc, t + 0.05 * k)
        assert svc.book.count("serve", False) == 3
    finally:
        svc.close()


@pytest.mark.parametrize("high, low, devices", [("high", "low", 3), ("critical", "low", 5), ("high", "normal", 3)])
def test_a_higher_priority_class_gets_more_devices_not_fewer(high: str, low: str, devices: int) -> None:
    # The priority weight multiplied each speedup; at Pollux's p = -1 (the pool's arbiter) that
    # made a higher class worth less per device: a critical job got 1 device of 5, a low one 4.
    def job(name: str, priority: str) -> P.ScaleJob:
        j = P.ScaleJob()
        j.job, j.priority, j.min_size, j.max_size, j.current = name, priority, 1, 4, 1
        j.speedup = [0.0, 1.0, 1.818, 2.5, 3.077]
        return j

    sizes = P.plan_sizes([job("lo", low), job("hi", high)], devices, P.ClusterArbiter(P.ArbiterConfig()))
    assert sizes["hi"] > sizes["lo"] >= 1 and sizes["hi"] + sizes["lo"] == devices


def test_a_low_priority_service_does_not_take_a_critical_training_jobs_devices_at_a_re_plan(tmp_path: Path) -> None:
    # Inference-first shrank training of the service's class or lower only, but the re-plan gave
    # a low-priority service's burst every device a critical training job held above its minimum.
    svc = PoolService(_devices(4), tmp_path, launch_jobs=False, scale_every_s=0.0, heartbeat_timeout_s=1e6)
    try:
        svc.submit({"name": "serve", "kind": "inference", "min_size": 1, "max_size": 4, "priority": "low"})
        svc.submit({"name": "train", "min_size": 1, "max_size": 4, "priority": "critical"})
        svc.submit({"name": "scratch", "min_size": 1, "max_size": 4, "priority": "low"})
        t0 = _clock.now()  # the pool's clock (a report is stamped by it), not the wall's
        for k in range(5):
            _play(svc, t0 + 0.05 * k)
        held = svc.book.count("train", False)
        assert svc.book.count("serve", False) == 1 and held >= 2
        svc.set_report("serve", {"rate_rps": 100.0})
        for k in range(5, 20):
            _play(svc, t0 + 0.05 * k)
        # The critical job keeps what it held (the low one is at its minimum, never taken).
        assert svc.book.count("train", False) == held
        assert svc.book.count("serve", False) == 4 - held - svc.book.count("scratch", False)
    finally:
        svc.close()


def test_a_service_of_the_training_jobs_class_or_higher_still_takes_its_devices_at_a_re_plan() -> None:
    def job(name: str, kind: str, priority: str, current: int, wanted: int = -1) -> P.ScaleJob:
        j = P.ScaleJob()
        j.job, j.kind, j.priority, j.min_size, j.max_size, j.current = name, kind, priority, 1, 4, current
        j.replicas_wanted = wanted
        return j

    arbiter = P.ClusterArbiter(P.ArbiterConfig())
    for service, served in (("critical", 3), ("high", 1), ("low", 1)):
        sizes = P.plan_sizes([job("serve", "inference", service, 1, 4), job("train", "training", "critical", 3)], 4,
                             arbiter)
        assert sizes["serve"] == served and sizes["train"] == 4 - served, (service, sizes)
