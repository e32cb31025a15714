"""The pool's scaling loop in-process (no launchers: the test plays them through ``sync``)."""

from __future__ import annotations

import time
from pathlib import Path

from dra._core import pool as P
from dra.pool.service import PoolService


def _devices(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def test_a_job_that_gave_a_device_back_takes_it_again_as_soon_as_one_is_free(tmp_path: Path) -> None:
    # The resize cooldown stops growth past what a job has run at recently (its curve above is
    # not measured yet); a device it lost to another job comes back at the next re-plan.
    svc = PoolService(_devices(2), tmp_path, launch_jobs=False, scale_every_s=1000.0)
    try:
        report = {"step": 100, "samples_per_s": 190.0, "global_batch": 64, "rates": {"1": 100.0, "2": 190.0},
                  "rate_s": {"1": 10.0, "2": 10.0}}
        svc.submit({"name": "a", "min_size": 1, "max_size": 2, "resize_cooldown_s": 60})
        svc.tick()
        assert svc.book.count("a", False) == 2  # admitted to its request
        svc.sync("a", [lease.id for lease in svc.book.of_job("a")], [], report)
        t = time.time()
        svc.submit({"name": "b", "min_size": 1, "max_size": 1})
        svc._scale(t)  # fairness: a gives one device to b
        leaving = [lease.id for lease in svc.book.of_job("a") if lease.state == "releasing"]
        assert len(leaving) == 1
        svc.sync("a", [lease.id for lease in svc.book.of_job("a") if lease.id not in leaving], leaving, report)
        svc.tick()
        assert svc.book.count("b", False) == 1 and svc.book.count("a", False) == 1
        svc.sync("b", [lease.id for lease in svc.book.of_job("b")], [], None, done=True)
        svc._scale(t + 5.0)  # 5 s into a's 60 s cooldown: back to the size it ran at
        assert svc.book.count("a", False) == 2
    finally:
        svc.close()
