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


def test_a_job_kept_out_by_a_service_holds_nothing(tmp_path: Path, monkeypatch) -> None:
    """A service that never ends holds 2 of 4 devices; a 3-device job can never start. Blocked past
    aging_s it held the other two for ever, and neither a later critical job nor small ones started
    (an outside review). Only leases that end (training) count as coming back."""
    now = [_clock.now()]
    monkeypatch.setattr(_clock, "now", lambda: now[0])
    for mode in ("static", "dynamic"):
        svc = pool(tmp_path, 4, mode, aging_s=60.0)
        try:
            svc.submit({"name": "svc", "kind": "inference", "priority": "high", "min_size": 2, "max_size": 2})
            svc.tick()
            svc.submit({"name": "wide", "min_size": 3, "max_size": 3})
            t0 = now[0]
            for t in (30.0, 90.0, 150.0):
                now[0] = t0 + t
                svc.tick(now[0])
            now[0] = t0 + 190.0  # long past aging_s for the wide job, which has outranked everyone since
            svc.submit({"name": "crit", "priority": "critical", "max_size": 1})
            svc.submit({"name": "small", "max_size": 1})
            now[0] = t0 + 200.0
            svc.tick(now[0])
            assert held(svc, "svc", "wide", "crit", "small") == {"svc": 2, "wide": 0, "crit": 1, "small": 1}, mode
        finally:
            svc.close()


def test_starving_jobs_of_two_device_types_each_hold_their_own(tmp_path: Path) -> None:
    """One reservation per round: a job of type a blocked for good (a long job in its way) took it,
    and a job of type b starved behind a stream of small b jobs. Each now holds its own type."""
    devices = [P.Device(id=f"{t}{i}", type=t, memory_gb=2.0) for t in ("a", "b") for i in range(2)]
    svc = PoolService(devices, tmp_path, mode="static", launch_jobs=False, heartbeat_timeout_s=NEVER, aging_s=60.0)
    try:
        for name, kind in (("long", "a"), ("s0", "b"), ("s1", "b")):
            svc.submit({"name": name, "device_type": kind, "max_size": 1})
        svc.tick()
        svc.submit({"name": "wide_a", "device_type": "a", "min_size": 2, "max_size": 2})
        svc.submit({"name": "wide_b", "device_type": "b", "min_size": 2, "max_size": 2})
        t0 = _clock.now()
        running, k = ["s0", "s1"], 2
        for step in range(1, 11):
            if running:
                finish(svc, running.pop(0))
            svc.submit({"name": f"s{k}", "device_type": "b", "max_size": 1})
            k += 1
            svc.tick(t0 + 30.0 * step)
            running = sorted((n for n in svc.jobs if n[0] == "s" and n[1:].isdigit() and svc.book.count(n)),
                             key=lambda n: int(n[1:]))
        assert held(svc, "long", "wide_a", "wide_b") == {"long": 1, "wide_a": 0, "wide_b": 2}
    finally:
        svc.close()


def test_dynamic_growth_leaves_a_starving_rigid_job_its_devices(tmp_path: Path) -> None:
    """A rigid wide job (elastic false) is not one the arbiter sizes: the resize pass grew an
    elastic job onto the devices its reservation held, and it never started. Waiting jobs now take
    part in the resize pass, and a starving one's devices are not grown onto."""
    svc = pool(tmp_path, 4, "dynamic", aging_s=60.0, scale_every_s=0.0)
    try:
        svc.submit({"name": "E", "min_size": 1, "max_size": 4})
        for i in range(3):
            svc.submit({"name": f"s{i}", "max_size": 1})
        svc.tick()

        def beat() -> None:  # launchers' heartbeats, and E's report (its world formed)
            for n in ("E", "s0", "s1", "s2", "W"):
                if svc.jobs.get(n, {}).get("state") in ("waiting", "running") and svc.book.count(n):
                    ids = [l.id for l in svc.book.of_job(n)]
                    gone = [l.id for l in svc.book.of_job(n) if l.state == "releasing"]
                    svc.sync(n, ids, gone, {"step": 10, "loss": 1.0} if n == "E" else None,
                             world=True if n == "E" else None)

        beat()
        svc.submit({"name": "W", "min_size": 3, "max_size": 3, "elastic": False})
        t0 = _clock.now()
        for step, small in enumerate(("s0", "s1", "s2"), 1):
            finish(svc, small)
            for dt in (0.0, 5.0, 15.0):
                svc.tick(t0 + 60.0 * step + dt)
                beat()
        assert held(svc, "E", "W") == {"E": 1, "W": 3}
    finally:
        svc.close()
