"""The pool service: jobs, leases, the scheduling loop, events and metrics (docs/design/pool.md).

Decisions are the C++ core's (``dra._core.pool``: request validation, the scheduler, the lease
book, the replica autoscaler, the scaler on the cluster arbiter the simulator evaluates); this
class keeps the state (SQLite), carries plans out and tells the launchers, which start and stop
the workers. One lock guards everything; ``tick()`` runs every ``tick_s`` and after every change.

Modes: ``dynamic`` (admission with priority, aging and preemption; every ``scale_every_s`` the
arbiter re-plans training jobs from their live reports and inference services follow their
load) and ``static`` (the baseline: each job gets its requested workers for its whole life, first
come first served with backfilling; no scaling).
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra import _core
from dra._core import pool as _p
from dra.pool import _cgroup, _inventory
from dra.pool._metrics import prometheus
from dra.pool._spec import (
    AUTOSCALE_FIELDS,
    REQUEST_FIELDS,
    fit_speedup,
    remaining_size_s,
    request_from_spec,
    speedup_curve,
)
from dra.pool._state import StateDB

__all__ = ["PoolService", "make_service", "request_from_spec", "speedup_curve"]

class PoolService:
    """The pool. ``devices``: dra._core.pool.Device list; ``slots``: the cgroup slots behind them
    (None for GPUs or declared devices: leases are then enforced by the launcher's environment)."""

    def __init__(self, devices: list[Any], state_dir: str | Path, *, mode: str = "dynamic",
                 slots: _cgroup.Slots | None = None, tick_s: float = 0.05, scale_every_s: float = 2.0,
                 heartbeat_timeout_s: float = 3.0, start_grace_s: float = 60.0, aging_s: float = 120.0, name: str = "pool",
                 launch_jobs: bool = True, on_event: Callable[[dict[str, Any]], None] | None = None,
                 completion_aware: bool = False) -> None:
        if mode not in ("dynamic", "static"):
            raise ValueError(f"mode: must be 'dynamic' or 'static', got '{mode}'")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s: must be > 0, got {heartbeat_timeout_s}")
        self.name = name
        self.mode = mode
        self.inventory = _p.Inventory(devices)
        self.slots = slots
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.tick_s = tick_s
        self.scale_every_s = scale_every_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.start_grace_s = start_grace_s  # a new lease's worker may take this long to check in first
        self.launch_jobs = launch_jobs
        self.on_event = on_event
        self.scheduler = _p.Scheduler(_p.SchedulerConfig(aging_s=aging_s if mode == "dynamic" else 0.0,
                                                          preemption=mode == "dynamic",
                                                          admit_to_request=mode == "dynamic"))
        self.arbiter = _p.ClusterArbiter()
        # Remaining work (the simulator's estimator and, with completion_aware, convergence_aware's
        # tilt of the arbiter): each training job's declared budget, steps and loss curve from its
        # reports, and the jobs of its class that finished here.
        self.remaining = _core.RemainingWorkEstimator()
        self.completion = _p.CompletionConfig() if completion_aware else None
        self._curves: dict[str, list[tuple[float, float]]] = {}
        self.book = _p.LeaseBook()
        self.db = StateDB(self.state_dir / "pool.sqlite")
        self.events_path = self.state_dir / "events.jsonl"
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.jobs: dict[str, dict[str, Any]] = {}
        self.reports: dict[str, dict[str, Any]] = {}
        self.autoscalers: dict[str, Any] = {}
        self.replicas_wanted: dict[str, int] = {}  # inference: the autoscaler's latest answer
        self.draining = bool(self.db.get_meta("draining", False))
        self.counters = {"grants": 0, "releases": 0, "preemptions": 0, "reclaims": 0, "moves": 0}
        self.launchers: dict[str, Any] = {}
        self._last_scale = 0.0
        self._planned: dict[str, tuple[int, int]] = {}  # last plan event per job (no repeats)
        self._resized_at: dict[str, float] = {}  # when the scaler last grew or shrank a job
        self._restore()

    # ------------------------------------------------------------------------------------------
    # durable state
    # ------------------------------------------------------------------------------------------
    def _restore(self) -> None:
        now = time.time()
        for j in self.db.jobs():
            self.jobs[j["name"]] = j
        restored = 0
        for row in self.db.leases():
            l = _p.Lease()
            for k in ("id", "job", "device", "share", "granted_at"):
                setattr(l, k, row[k])
            l.heartbeat_at = now  # a restarted pool gives every worker a fresh timeout to check in
            l.state = row["state"]
            if not self.inventory.contains(l.device):
                continue
            self.book.restore(l)
            if self.slots is not None:
                self.slots.make_lease(l.device, l.id, l.share)
            restored += 1
        self.book.set_next_id(int(self.db.get_meta("next_lease", 1)))
        self.counters.update(self.db.get_meta("counters", {}) or {})
        if self.jobs or restored:
            self._event({"event": "restore", "jobs": len(self.jobs), "leases": restored})

    def _save_job(self, name: str) -> None:
        self.db.put_job(self.jobs[name])

    def _save_leases(self, changed: list[Any], removed: list[int] = ()) -> None:  # type: ignore[assignment]
        self.db.put_leases(changed, removed)
        self.db.set_meta("next_lease", self.book.next_id)
        self.db.set_meta("counters", self.counters)

    def _event(self, ev: dict[str, Any]) -> None:
        ev = {"time": time.time(), **ev}
        with open(self.events_path, "a") as f:
            f.write(json.dumps(ev) + "\n")
        if self.on_event is not None:
            self.on_event(ev)

    # ------------------------------------------------------------------------------------------
    # requests from clients and launchers
    # ------------------------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        req = request_from_spec(spec)
        req.validate(self.inventory)
        if self.mode == "static":  # the baseline: its request, rigid, for life; first come first served
            req.min_size = req.max_size
            req.elastic = False
            req.priority = "normal"
        if "options" in spec:
            if not isinstance(spec["options"], dict):
                raise ValueError("options: must be an object of the job's controller options (dra.Options.names())")
            try:
                _core.Options(**spec["options"])
            except ValueError as e:
                raise ValueError(f"options: {e}") from None
        if "autoscale" in spec:
            bad = set(spec["autoscale"]) - set(AUTOSCALE_FIELDS)
            if bad:
                raise ValueError(f"autoscale.{sorted(bad)[0]}: unknown; valid: {', '.join(AUTOSCALE_FIELDS)}")
        with self._lock:
            if self.draining:
                raise ValueError(f"name: the pool is draining; job '{req.job}' was not accepted")
            old = self.jobs.get(req.job)
            if old is not None and old["state"] in ("waiting", "running"):
                raise ValueError(f"name: a job '{req.job}' is already {old['state']}; choose another name")
            order = int(self.db.get_meta("order", 0)) + 1
            self.db.set_meta("order", order)
            stored = dict(spec)
            for k in REQUEST_FIELDS:
                stored[k] = getattr(req, k)
            job = {"name": req.job, "order": order, "spec": stored, "state": "waiting", "submitted_at": time.time(),
                   "started_at": None, "finished_at": None, "info": {}}
            self.jobs[req.job] = job
            self._save_job(req.job)
            self._event({"event": "submit", "job": req.job, "request": {k: stored[k] for k in REQUEST_FIELDS}})
        self._wake.set()
        return {"job": req.job, "state": "waiting"}

    def cancel(self, name: str) -> dict[str, Any]:
        with self._lock:
            job = self._job(name)
            if job["state"] in ("finished", "cancelled", "failed"):
                return {"job": name, "state": job["state"]}
            job["state"] = "cancelled"
            job["finished_at"] = time.time()
            self._save_job(name)
            changed = []
            for l in self.book.of_job(name):
                self.book.mark_releasing(l.id)
                changed.append(self.book.at(l.id))
            self._save_leases(changed)
            self._event({"event": "cancel", "job": name})
        self._wake.set()
        return {"job": name, "state": "cancelled"}

    def drain(self) -> dict[str, Any]:
        with self._lock:
            self.draining = True
            self.db.set_meta("draining", True)
            waiting = [n for n, j in self.jobs.items() if j["state"] == "waiting"]
            self._event({"event": "drain", "waiting": waiting})
        return {"draining": True, "running": [n for n, j in self.jobs.items() if j["state"] == "running"],
                "waiting": waiting}

    def remove_node(self, node: str, reason: str = "node lost") -> list[str]:
        """A node left the cluster: its devices go, its leases are released (their workers went
        with the node; the jobs' other workers shrink in place)."""
        with self._lock:
            removed: list[int] = []
            for l in self.book.all():
                if self.inventory.contains(l.device) and self.inventory.at(l.device).node == node:
                    self._release(l.id, reason, removed)
            gone = self.inventory.remove_node(node)
            self._save_leases([], removed)
            self._event({"event": "node_removed", "node": node, "devices": gone, "leases": removed})
        self._wake.set()
        return gone

    def set_report(self, name: str, report: dict[str, Any]) -> dict[str, Any]:
        """A report from outside the job's store (an inference frontend's rate and queue)."""
        with self._lock:
            self._job(name)
            self.reports[name] = {**self.reports.get(name, {}), **report}
        return {"job": name}

    def job_spec(self, name: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._job(name)["spec"])

    def _job(self, name: str) -> dict[str, Any]:
        if name not in self.jobs:
            raise ValueError(f"job: no job '{name}' in the pool")
        return self.jobs[name]

    def lease_env(self, l: Any) -> dict[str, str]:
        """What a worker on this lease is told (and, where the platform can, held to)."""
        d = self.inventory.at(l.device)
        env = {"DRA_LEASE_ID": str(l.id), "DRA_DEVICE": l.device, "DRA_DEVICE_SHARE": f"{l.share:g}",
               "DRA_ENFORCEMENT": d.enforcement, "DRA_NODE": d.node}
        if d.enforcement == "cgroup" and self.slots is not None:
            env["DRA_CGROUPS"] = ":".join(self.slots.paths(l.device, l.id))
            env["OMP_NUM_THREADS"] = str(max(1, math.ceil(d.compute * l.share)))
        elif d.enforcement in ("cuda_visible_devices", "mps"):
            # The GPU's index: the trailing number of the id's last part (gpu3, node2/gpu1, g0).
            digits = re.search(r"(\d+)$", l.device.split("/")[-1]) if "/mig" not in l.device else None
            env["CUDA_VISIBLE_DEVICES"] = digits.group(1) if digits else l.device
            if l.share < 1.0:
                # Memory fraction: the worker sets torch.cuda.set_per_process_memory_fraction (soft).
                env["DRA_CUDA_MEMORY_FRACTION"] = f"{l.share:g}"
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, int(100 * l.share)))
                env["DRA_ENFORCEMENT"] = "mps" if d.enforcement == "mps" else "soft"
        return env

    def sync(self, name: str, heartbeats: list[int], released: list[int], report: dict[str, Any] | None,
             done: bool = False, failed: bool = False) -> dict[str, Any]:
        """A launcher's periodic call: its live leases, the leases its exited workers held, the
        job's report. Answers with the job's leases (new ones to start workers on) and the leases
        the pool wants back."""
        now = time.time()
        with self._lock:
            job = self._job(name)
            changed, removed = [], []
            for lid in heartbeats:
                if self.book.contains(lid) and self.book.at(lid).job == name:
                    self.book.heartbeat(lid, now)
                    changed.append(self.book.at(lid))
            for lid in released:
                if self.book.contains(lid) and self.book.at(lid).job == name:
                    was = self.book.at(lid)
                    if was.state == "active":
                        # A member left on its own (its policy shrank it, or it was the one the job
                        # chose to let go): one lease the pool asked back is no longer owed.
                        for other in self.book.of_job(name):
                            if other.state == "releasing" and other.id != lid:
                                self._set_state(other.id, "active")
                                changed.append(self.book.at(other.id))
                                break
                    self._release(lid, "worker exited", removed)
            if report:
                self.reports[name] = {**self.reports.get(name, {}), **report}
                self._observe_curve(name, report)
            if job["state"] == "waiting" and self.book.count(name) > 0:
                job["state"] = "running"
                job["started_at"] = now
                self._event({"event": "start", "job": name, "workers": self.book.count(name)})
            if (done or failed) and job["state"] in ("running", "waiting", "cancelled"):
                if job["state"] != "cancelled":
                    job["state"] = "failed" if failed else "finished"
                job["finished_at"] = job["finished_at"] or now
                for l in self.book.of_job(name):
                    self._release(l.id, "job ended", removed)
                self._event({"event": "finish", "job": name, "state": job["state"],
                             "jct_s": now - job["submitted_at"]})
                steps = float((self.reports.get(name) or {}).get("step") or 0)
                if job["state"] == "finished" and steps > 0 and job["spec"]["kind"] == "training":
                    spec = job["spec"]
                    self.remaining.record_completion(self._job_class(name), steps, float(spec.get("declared_steps") or 0),
                                                     self._curves.get(name, []))
            self._save_job(name)
            self._save_leases([c for c in changed if self.book.contains(c.id)], removed)
            leases = [{"id": l.id, "device": l.device, "share": l.share, "state": l.state, "env": self.lease_env(l)}
                      for l in self.book.of_job(name)]
            answer = {"state": job["state"], "leases": leases,
                      "release": [l.id for l in self.book.of_job(name) if l.state == "releasing"],
                      "min_size": job["spec"]["min_size"], "max_size": job["spec"]["max_size"]}
        if removed or released:
            self._wake.set()
        return answer

    def _job_class(self, name: str) -> str:
        return str(self.jobs[name]["spec"].get("job_class") or name)

    def _observe_curve(self, name: str, report: dict[str, Any]) -> None:
        """The job's smoothed loss by step, as its reports give it (thinned to 256 points)."""
        step, loss = report.get("step"), report.get("loss")
        if not isinstance(step, (int, float)) or not isinstance(loss, (int, float)) or not math.isfinite(loss) or loss <= 0:
            return
        curve = self._curves.setdefault(name, [])
        if not curve or curve[-1][0] < step:
            curve.append((float(step), float(loss)))
            if len(curve) > 256:
                del curve[::2]

    def _set_state(self, lid: int, state: str) -> None:
        l = self.book.release(lid)
        l.state = state
        self.book.restore(l)

    def _release(self, lid: int, reason: str, removed: list[int]) -> None:
        l = self.book.release(lid)
        removed.append(lid)
        self.counters["releases"] += 1
        if self.slots is not None:
            self.slots.remove_lease(l.device, l.id)
        self._event({"event": "release", "job": l.job, "lease": lid, "device": l.device, "reason": reason,
                     "held_s": time.time() - l.granted_at})

    # ------------------------------------------------------------------------------------------
    # the loop
    # ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dra-pool", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def close(self, remove_slots: bool = True) -> None:
        self.stop()
        for p in self.launchers.values():  # they end with their jobs; a live one is left running
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001
                p.returncode = p.returncode if p.returncode is not None else -1  # detached: not ours to wait for
        self.db.close()
        if remove_slots and self.slots is not None:
            self.slots.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_s)
            self._wake.clear()
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the loop must live; the error is an event
                self._event({"event": "error", "error": f"{type(e).__name__}: {e}"})

    def _entries(self, states: tuple[str, ...]) -> list[Any]:
        out = []
        for name, j in self.jobs.items():
            if j["state"] in states:
                out.append(_p.JobEntry(request_from_spec({**{k: j["spec"][k] for k in REQUEST_FIELDS}, "name": name}),
                                       j["submitted_at"], j["order"]))
        return out

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            removed: list[int] = []
            changed: list[Any] = []
            # 1. Leases whose workers stopped checking in come back.
            for lid in self.book.expired(now, self.heartbeat_timeout_s):
                self.counters["reclaims"] += 1
                job = self.book.at(lid).job
                self._release(lid, f"no heartbeat for {self.heartbeat_timeout_s:g} s", removed)
                j = self.jobs.get(job)
                if j is not None and j["state"] in ("waiting", "running") and self.book.count(job) == 0:
                    # Nothing of the job checks in any more (its launcher is gone): it is lost.
                    j["state"], j["finished_at"] = "failed", now
                    self._save_job(job)
                    self._event({"event": "finish", "job": job, "state": "failed", "reason": "lost: no heartbeat",
                                 "jct_s": now - j["submitted_at"]})
            # Leases of jobs that ended without telling us.
            for l in self.book.all():
                if self.jobs.get(l.job, {}).get("state") in ("finished", "failed", None):
                    self._release(l.id, "job gone", removed)
            # 2. Admission (waiting jobs first, then jobs below their minimum).
            live = ("running",) if self.draining else ("waiting", "running")
            plan = self.scheduler.admit(self.inventory, self._entries(live), self.book, now)
            changed += self._apply(plan, now)
            # 3. Scaling (dynamic): inference follows its load, the arbiter divides the rest.
            short = self.mode == "dynamic" and self._inference_short(now)
            if self.mode == "dynamic" and (short or now - self._last_scale >= self.scale_every_s):
                self._last_scale = now
                changed += self._scale(now)
            if changed or removed:
                self._save_leases([c for c in changed if self.book.contains(c.id)], removed)
            # A job's launcher starts at submission, so it is warm (store, fork server with torch
            # imported) by the time the job is granted devices.
            for name, j in self.jobs.items():
                if j["state"] == "waiting" and self.launch_jobs and j["spec"].get("command"):
                    self._launch(name)

    def _apply(self, plan: Any, now: float) -> list[Any]:
        changed = []
        for g in plan.grants:
            l = self.book.grant(self.inventory, g.job, g.device, g.share, now)
            self.book.heartbeat(l.id, now + max(0.0, self.start_grace_s - self.heartbeat_timeout_s))
            l = self.book.at(l.id)
            if self.slots is not None:
                self.slots.make_lease(l.device, l.id, l.share)
            changed.append(l)
            self.counters["grants"] += 1
            self._event({"event": "grant", "job": g.job, "lease": l.id, "device": g.device, "share": g.share,
                         "reason": g.reason})
        for r in plan.releases:
            if not self.book.contains(r.lease) or self.book.at(r.lease).state == "releasing":
                continue
            self.book.mark_releasing(r.lease)
            changed.append(self.book.at(r.lease))
            kind = "preempt" if r.preemption else "shrink"
            self.counters["preemptions" if r.preemption else "moves"] += 1
            self._event({"event": kind, "job": r.job, "lease": r.lease, "device": self.book.at(r.lease).device,
                         "reason": r.reason, "for_job": r.for_job})
        return changed

    def _autoscaler(self, name: str) -> Any:
        a = self.autoscalers.get(name)
        if a is None:
            spec = self.jobs[name]["spec"]
            cfg = dict(spec.get("autoscale", {}))
            cfg.update(min_replicas=spec["min_size"], max_replicas=spec["max_size"])
            a = self.autoscalers[name] = _p.ReplicaAutoscaler(_p.AutoscalerConfig(**cfg))
        return a

    def _inference_short(self, now: float) -> bool:
        """Feeds every running inference service's load to its autoscaler (once per tick) and says
        whether one needs more replicas now: it is served at once, not at the next re-plan (its
        peaks do not wait)."""
        short = False
        for name, j in self.jobs.items():
            report = self.reports.get(name)
            if j["state"] != "running" or j["spec"]["kind"] != "inference" or not report:
                continue
            current = self.book.count(name, False)
            want = self._autoscaler(name).update(now, float(report.get("rate_rps", 0.0)), float(report.get("queue", 0.0)),
                                                 current, float(report.get("replica_rps", 0.0)))
            self.replicas_wanted[name] = want
            report["replicas_wanted"] = want
            if want > current and self.book.count(name) == current:  # none on its way already
                short = True
        return short

    def _scale(self, now: float) -> list[Any]:
        running = [n for n, j in self.jobs.items() if j["state"] == "running"]
        # Elastic jobs still waiting take part too (holding nothing): the arbiter's fairness then
        # shrinks running jobs in place to make room for them (p = -1: everyone gets a device
        # before anyone gets a second). Rigid waiting jobs wait for admission (and preemption).
        waiting = [n for n, j in self.jobs.items() if j["state"] == "waiting" and j["spec"]["elastic"]
                   and not self.draining]
        if not running:
            return []
        jobs = []
        curves: dict[str, str] = {}  # where each training job's speedup curve came from
        for name in running + waiting:
            spec = self.jobs[name]["spec"]
            sj = _p.ScaleJob()
            sj.job, sj.kind, sj.priority, sj.elastic = name, spec["kind"], spec["priority"], spec["elastic"]
            sj.min_size, sj.max_size = spec["min_size"], spec["max_size"]
            sj.current = self.book.count(name, False)
            report = self.reports.get(name)
            age = now - (self.jobs[name]["started_at"] or now)
            cost = float(spec.get("resize_cost_s", 3.0))
            sj.change_penalty = min(1.0, max(0.0, age / (age + cost))) if cost > 0 and name in running else 1.0
            if spec["kind"] == "inference":
                sj.replicas_wanted = self.replicas_wanted.get(name, -1)
            else:
                sj.speedup, source = fit_speedup(report, spec["max_size"])
                curves[name] = source
                estimate = self.remaining.estimate(self._job_class(name), float((report or {}).get("step") or 0),
                                                   float(spec.get("declared_steps") or 0), self._curves.get(name, []))
                sj.remaining_size_s = remaining_size_s(estimate, report, sj.speedup, sj.current)
                # Cooldown: a training job resized in the last resize_cooldown_s is not grown again
                # (its curve is flat above its size); it can still give devices back.
                if name in running and now - self._resized_at.get(name, -1e9) < float(spec.get("resize_cooldown_s", 10.0)):
                    k = max(sj.current, 1)
                    sj.speedup = sj.speedup[: k + 1] + [sj.speedup[k]] * (len(sj.speedup) - k - 1)
            jobs.append(sj)
        capacity = len(self.inventory)
        # The arbiter divides identical devices: the whole inventory is its capacity (a pool of
        # several device types is scaled as one; placement still honours each request's type).
        targets = _p.plan_sizes(jobs, capacity, self.arbiter, self.completion)
        plan = self.scheduler.resize(self.inventory, self._entries(("running",)), targets, self.book, now)
        for name in running:
            cur = self.book.count(name, False)
            want = targets.get(name, cur)
            if want != cur and self.jobs[name]["spec"]["elastic"] and self._planned.get(name) != (cur, want):
                self._planned[name] = (cur, want)
                self._event({"event": "plan", "job": name, "from": cur, "to": want, "curve": curves.get(name),
                             "speedup": [round(x, 3) for x in jobs[(running + waiting).index(name)].speedup]})
        for g in plan.grants:
            self._resized_at[g.job] = now
        for r in plan.releases:
            self._resized_at[r.job] = now
        return self._apply(plan, now)

    # ------------------------------------------------------------------------------------------
    # launching pool-submitted jobs (one `dra run` launcher per job, detached)
    # ------------------------------------------------------------------------------------------
    url: str | None = None

    def _launch(self, name: str) -> None:
        if name in self.launchers or self.url is None:
            return
        import subprocess

        logs = self.state_dir / "logs"
        logs.mkdir(exist_ok=True)
        log = open(logs / f"{name}.launcher.log", "ab")
        cmd = [sys.executable, "-m", "dra", "run", "--pool", self.url, "--job", name]
        self.launchers[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, cwd=self.jobs[name]["spec"].get("cwd") or None)
        log.close()

    # ------------------------------------------------------------------------------------------
    # views
    # ------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            devices = []
            for d in self.inventory.devices:
                devices.append({"id": d.id, "type": d.type, "node": d.node, "group": d.group,
                                "memory_gb": d.memory_gb, "compute": d.compute, "enforcement": d.enforcement,
                                "free": self.book.free_share(d.id)})
            leases = [{"id": l.id, "job": l.job, "device": l.device, "share": l.share, "state": l.state,
                       "age_s": now - l.granted_at, "heartbeat_age_s": now - l.heartbeat_at} for l in self.book.all()]
            jobs = []
            for name, j in self.jobs.items():
                jobs.append({"name": name, "state": j["state"], "kind": j["spec"]["kind"],
                             "priority": j["spec"]["priority"], "min_size": j["spec"]["min_size"],
                             "max_size": j["spec"]["max_size"], "elastic": j["spec"]["elastic"],
                             "workers": self.book.count(name, False), "submitted_at": j["submitted_at"],
                             "started_at": j["started_at"], "finished_at": j["finished_at"],
                             "report": self.reports.get(name)})
            usage = self.slots.usage_all() if self.slots is not None else {}
            return {"pool": self.name, "mode": self.mode, "draining": self.draining, "time": now,
                    "devices": devices, "leases": leases, "jobs": jobs, "counters": dict(self.counters),
                    "cpu_usage_s": usage}

    def metrics(self) -> str:
        """Prometheus text exposition (format 0.0.4)."""
        return prometheus(self.status())


def make_service(inventory: str, state_dir: str | Path, *, mode: str = "dynamic", name: str = "pool",
                 memory_gb: float = 2.0, **options: Any) -> PoolService:
    """A pool from an inventory spec (see dra.pool._inventory.discover; ``ray`` or ``ray:ADDRESS``:
    a Ray cluster's devices, watched for nodes that leave); CPU slots get cgroups."""
    if inventory == "ray" or inventory.startswith("ray:"):
        from dra.pool.ray_cluster import RayCluster

        cluster = RayCluster(inventory.split(":", 1)[1] if ":" in inventory else "auto")
        service = PoolService(cluster.devices(), state_dir, mode=mode, name=name, **options)
        service.ray_watch = cluster.watch(service.remove_node)
        return service
    devices, specs = _inventory.discover(inventory, memory_gb=memory_gb)
    slots = _cgroup.Slots(name, specs) if specs else None
    try:
        return PoolService(devices, state_dir, mode=mode, slots=slots, name=name, **options)
    except Exception:
        if slots is not None:
            slots.close()
        raise
