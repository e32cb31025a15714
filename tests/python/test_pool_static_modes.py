"""The pool's operator baselines (``mode="static"`` and ``"static_naive"``), on declared devices
with no launchers: each job rigid at its request for its whole life; by priority then arrival
(static) or by arrival alone (static_naive); first-fit backfilling past a blocked job; and, in
static (and in dra's dynamic pool) the reservation a job blocked for aging_s takes, so a stream
of small jobs cannot keep a wide one waiting for ever."""

from __future__ import annotations

from pathlib import Path

from dra._core import pool as P
from dra.pool import _clock
from dra.pool.service import PoolService

NEVER = 1e6  # heartbeat timeout: the tests move the pool's clock ahead by minutes


def declared(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def pool(tmp_path: Path, n: int, mode: str, **kw: float) -> PoolService:
    return PoolService(declared(n), tmp_path / mode, mode=mode, launch_jobs=False, heartbeat_timeout_s=NEVER, **kw)


def finish(svc: PoolService, name: str) -> None:
    """The job's launcher says its workers are done and gives its leases back."""
    ids = [l["id"] for l in svc.sync(name, [], [], None)["leases"]]
    svc.sync(name, ids, ids, None, done=True)
    assert svc.jobs[name]["state"] == "finished" and svc.book.count(name) == 0


def held(svc: PoolService, *names: str) -> dict[str, int]:
    return {n: svc.book.count(n) for n in names}


def test_static_runs_each_job_rigid_at_its_request(tmp_path: Path) -> None:
    """min_size becomes max_size: a job asking for 1..3 on a pool with 2 free devices waits for 3
    (dynamic admits it on the 2), gets all 3 at once, and is never resized."""
    for mode in ("static", "static_naive"):
        svc = pool(tmp_path, 4, mode, scale_every_s=0.0)
        try:
            svc.submit({"name": "r", "min_size": 2, "max_size": 2})
            svc.submit({"name": "e", "min_size": 1, "max_size": 3})
            req = svc._requests["e"]
            assert (req.min_size, req.max_size, req.elastic) == (3, 3, False)
            svc.tick()
            assert held(svc, "r", "e") == {"r": 2, "e": 0}, mode
            assert svc.jobs["e"]["state"] == "waiting"
            finish(svc, "r")
            svc.tick()
            assert held(svc, "e") == {"e": 3}, mode
            svc.sync("e", [], [], {"step": 10, "loss": 1.0})
            svc.tick(_clock.now() + 10.0)  # past scale_every_s: still its request
            assert held(svc, "e") == {"e": 3}, mode
        finally:
            svc.close()
    dyn = pool(tmp_path, 4, "dynamic")
    try:
        dyn.submit({"name": "r", "min_size": 2, "max_size": 2})
        dyn.submit({"name": "e", "min_size": 1, "max_size": 3})
        dyn.tick()
        assert held(dyn, "r", "e") == {"r": 2, "e": 2}  # the contrast: dynamic admits at min_size
    finally:
        dyn.close()


def test_static_serves_a_later_high_priority_job_first_static_naive_by_arrival(tmp_path: Path) -> None:
    first = {}
    for mode in ("static", "static_naive"):
        svc = pool(tmp_path, 1, mode)
        try:
            svc.submit({"name": "running"})
            svc.tick()
            svc.submit({"name": "normal"})
            svc.submit({"name": "urgent", "priority": "high"})
            svc.tick()
            assert held(svc, "running", "normal", "urgent") == {"running": 1, "normal": 0, "urgent": 0}
            finish(svc, "running")
            svc.tick()
            first[mode] = [n for n in ("normal", "urgent") if svc.book.count(n)]
        finally:
            svc.close()
    assert first == {"static": ["urgent"], "static_naive": ["normal"]}


def test_a_small_job_backfills_past_a_blocked_wide_one(tmp_path: Path) -> None:
    for mode in ("static", "static_naive"):
        svc = pool(tmp_path, 4, mode)
        try:
            svc.submit({"name": "r", "max_size": 2})
            svc.tick()
            svc.submit({"name": "wide", "max_size": 3})
            svc.submit({"name": "small", "max_size": 1})
            svc.tick()
            assert held(svc, "r", "wide", "small") == {"r": 2, "wide": 0, "small": 1}, mode
        finally:
            svc.close()


def _stream(svc: PoolService, minutes: int, min_size: int = 1) -> list[tuple[float, dict[str, int]]]:
    """Four 1-device jobs fill a 4-device pool, a 3-device job arrives, then every 30 s the oldest
    small job ends and a new one arrives. Returns what the wide job and the small ones held."""
    for i in range(4):
        svc.submit({"name": f"s{i}", "max_size": 1})
    svc.tick()
    svc.submit({"name": "wide", "min_size": min_size, "max_size": 3})
    t0 = _clock.now()
    running, seen, k = [f"s{i}" for i in range(4)], [], 4
    for step in range(1, 2 * minutes + 1):
        finish(svc, running.pop(0))
        svc.submit({"name": f"s{k}", "max_size": 1})
        k += 1
        svc.tick(t0 + 30.0 * step)
        running = [n for n, j in svc.jobs.items() if n != "wide" and j["state"] != "finished" and svc.book.count(n)]
        running.sort(key=lambda n: int(n[1:]))
        seen.append((30.0 * step, {"wide": svc.book.count("wide"), "small": len(running)}))
        if svc.book.count("wide"):
            break
    return seen


def test_static_reserves_for_a_wide_job_blocked_for_aging_s(tmp_path: Path) -> None:
    """First-fit backfilling alone starves it (static_naive, no aging: still waiting after 10
    minutes); static backfills until it has waited aging_s (60 s here), then holds the devices that
    come free for it, and it starts once the jobs on them end."""
    naive = pool(tmp_path, 4, "static_naive")
    try:
        seen = _stream(naive, 10)
        assert all(s["wide"] == 0 and s["small"] == 4 for _, s in seen), seen
    finally:
        naive.close()
    static = pool(tmp_path, 4, "static", aging_s=60.0)
    try:
        seen = _stream(static, 10)
        small = dict((t, s["small"]) for t, s in seen)
        assert small[30.0] == 4  # before aging_s: the new small job backfills
        assert small[60.0] == 3 and small[90.0] == 2  # blocked for 60 s: free devices held for it
        assert seen[-1] == (120.0, {"wide": 3, "small": 1}), seen
    finally:
        static.close()


def test_dynamic_reserves_for_a_rigid_wide_job_blocked_for_aging_s(tmp_path: Path) -> None:
    """The same stream under dra's pool, the wide job rigid (min_size 3: a gang it cannot start
    without) and the small ones 1-device jobs (nothing to shrink): aging raises its priority but
    reserved nothing, and it waited for ever (an outside review: no device after 360 s). Blocked
    for aging_s, it holds the devices that come free, as in static."""
    dynamic = pool(tmp_path, 4, "dynamic", aging_s=60.0)
    try:
        seen = _stream(dynamic, 10, min_size=3)
        small = dict((t, s["small"]) for t, s in seen)
        assert small[30.0] == 4 and small[60.0] == 3 and small[90.0] == 2, seen
        assert seen[-1] == (120.0, {"wide": 3, "small": 1}), seen
    finally:
        dynamic.close()


def test_a_job_the_pool_can_no_longer_hold_reserves_nothing(tmp_path: Path) -> None:
    """A node left after the wide job was submitted: 3 devices can never be free at once again.
    Blocked past aging_s, it holds nothing (it would hold the pool's devices for ever), and a small
    job behind it starts."""
    devices = [P.Device(id=f"{n}{i}", type="cpu-slot", memory_gb=2.0, node=n) for n in ("a", "b") for i in range(2)]
    svc = PoolService(devices, tmp_path, mode="static", launch_jobs=False, heartbeat_timeout_s=NEVER, aging_s=60.0)
    try:
        svc.submit({"name": "r", "max_size": 2})
        svc.tick()
        node = svc.inventory.at(svc.book.of_job("r")[0].device).node
        svc.submit({"name": "wide", "max_size": 3})
        t0 = _clock.now()
        svc.remove_node("b" if node == "a" else "a")
        svc.submit({"name": "small"})
        svc.tick(t0 + 30.0)
        assert held(svc, "r", "wide", "small") == {"r": 2, "wide": 0, "small": 0}
        finish(svc, "r")
        svc.tick(t0 + 120.0)
        assert held(svc, "wide", "small") == {"wide": 0, "small": 1}
    finally:
        svc.close()
