"""The pool service: jobs, leases, the scheduling loop, events and metrics (docs/design/pool.md).

Decisions are the C++ core's (``dra._core.pool``: request validation, the scheduler, the lease
book, the replica autoscaler, the scaler on the cluster arbiter the simulator evaluates); this
class keeps the state (SQLite, one daemon per state directory), takes clients' requests and says
who may do what. Its scheduling loop (``dra.pool._loop``: carries plans out, starts each job's
launcher as the job's owner) and its answers to the launchers (``dra.pool._launcher_api``), which
start and stop the workers, are mixins over the same state. One lock guards everything; ``tick()``
runs every ``tick_s`` and after every change.

Modes: ``dynamic`` (inference whose SLO is at risk first, then admission with priority, aging and
preemption; every ``scale_every_s`` the arbiter re-plans training jobs from their live reports),
``static`` (the operator's baseline, as a batch scheduler runs it: each job at its request,
``max_size``, for its whole life, by priority then arrival with first-fit backfilling; a job
still blocked after ``aging_s`` holds the free devices it could use until it starts; no scaling,
no preemption) and ``static_naive`` (the same, priorities and aging off: first come first served,
no reservation, so a wide job can starve behind small ones).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra import _core
from dra._core import pool as _p
from dra.pool import _auth, _cgroup, _clock, _events, _launchers, _quota, _state
from dra.pool._auth import Caller, Forbidden, Owner
from dra.pool._launcher_api import REPORT_LIMIT, LauncherAPI, Superseded, check_report
from dra.pool._loop import SchedulingLoop
from dra.pool._nodes import NodeMembership
from dra.pool._records import ENDED, JobRecords
from dra.pool._spawner import log_dir_problem, preload_problem
from dra.pool._spec import DEFAULT_CAPACITY_NOTE, REQUEST_FIELDS, make_request, speedup_curve, validate_spec
from dra.pool._state import StateDB, StateLock
from dra.pool._views import PoolViews

__all__ = ["MODES", "NoSuchJob", "PoolService", "Superseded", "speedup_curve"]

MODES = ("dynamic", "static", "static_naive")


class NoSuchJob(ValueError):
    """No job of that name (HTTP 404)."""


def _check_seconds(key: str, value: Any, positive: bool = False, optional: bool = False) -> None:
    """A duration option: a finite number of seconds, > 0 when ``positive`` else >= 0 (None when
    ``optional``); ValueError naming it otherwise (NaN passes every comparison, so it is named too)."""
    if value is None and optional:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0 or (positive and value == 0)):
        raise ValueError(f"{key}: must be a finite number of seconds {'> 0' if positive else '>= 0'}"
                         f"{' (or None)' if optional else ''}, got {value!r}")


class PoolService(SchedulingLoop, LauncherAPI, NodeMembership, JobRecords, PoolViews):
    """The pool. ``devices``: dra._core.pool.Device list; ``slots``: the cgroup slots behind them
    (None for GPUs or declared devices: leases are then enforced by the launcher's environment).
    ``orphan_limit_s``: how long a job's launcher keeps its workers running while this daemon is
    away (None: until it is back). ``restart_backoff_s``: how long a failed job with restarts left
    waits before its first restart (doubling with each, at most 300 s). ``silence_limit_s``: how long a lease past its heartbeat timeout
    stays with a job whose launcher process is still alive (None: the larger of 30 s and ten
    heartbeat timeouts); then the launcher counts as hung, is killed and the lease reclaimed. ``ray_address``: the Ray cluster the devices are on (every job
    then runs through Ray). ``warm_launchers``: how many of one user's waiting jobs that hold no
    lease have their launcher started ahead of their devices (each is some 450 MB with torch
    imported, outside every lease)."""

    def __init__(self, devices: list[Any], state_dir: str | Path, *, mode: str = "dynamic",
                 slots: _cgroup.Slots | None = None, tick_s: float = 0.05, scale_every_s: float = 2.0,
                 heartbeat_timeout_s: float = 3.0, start_grace_s: float = 60.0, aging_s: float = 120.0, name: str = "pool",
                 launch_jobs: bool = True, on_event: Callable[[dict[str, Any]], None] | None = None,
                 orphan_limit_s: float | None = None, ray_address: str | None = None,
                 state_lock: StateLock | None = None, completion_aware: bool = False,
                 silence_limit_s: float | None = None, warm_launchers: int = 4,
                 user_limits: _quota.UserLimits | None = None, events_max_mb: float = _events.EVENTS_MB,
                 restart_backoff_s: float = 10.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got '{mode}'")
        for key, value in (("tick_s", tick_s), ("heartbeat_timeout_s", heartbeat_timeout_s),
                           ("orphan_limit_s", orphan_limit_s), ("silence_limit_s", silence_limit_s)):
            _check_seconds(key, value, positive=True, optional=key in ("orphan_limit_s", "silence_limit_s"))
        for key, value in (("scale_every_s", scale_every_s), ("start_grace_s", start_grace_s), ("aging_s", aging_s),
                           ("restart_backoff_s", restart_backoff_s)):
            _check_seconds(key, value)  # scale_every_s 0: a re-plan at every tick
        if isinstance(warm_launchers, bool) or not isinstance(warm_launchers, int) or warm_launchers < 1:
            raise ValueError(f"warm_launchers: must be an integer >= 1, got {warm_launchers!r}")
        if silence_limit_s is not None and not silence_limit_s >= heartbeat_timeout_s:
            raise ValueError(f"silence_limit_s: must be >= heartbeat_timeout_s ({heartbeat_timeout_s:g} s), got "
                             f"{silence_limit_s} (None: the larger of 30 s and 10 heartbeat timeouts)")
        self.name = name
        self.mode = mode
        self.inventory = _p.Inventory(devices)
        self.slots = slots
        self.state_dir = _state.state_dir(state_dir)
        os.chmod(self.state_dir, 0o711)  # others may reach the socket in it, not list or read it
        self._state_lock = state_lock or StateLock(self.state_dir)
        try:
            self.db = StateDB(self.state_dir / "pool.sqlite")
        except Exception:
            self._state_lock.release()
            raise
        self.tick_s = tick_s
        self.scale_every_s = scale_every_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # A lease past its heartbeat timeout whose job's launcher is alive is late, not lost, for
        # this long (a loaded host or a stalled daemon); then the launcher counts as hung.
        self.silence_limit_s = silence_limit_s if silence_limit_s is not None else max(30.0, 10 * heartbeat_timeout_s)
        self._late: set[int] = set()  # leases reported late once (event heartbeat_late)
        self.start_grace_s = start_grace_s  # a new lease's worker may take this long to check in first
        self.launch_jobs = launch_jobs
        self.warm_launchers = warm_launchers
        self.user_limits = user_limits or _quota.UserLimits()  # what one user's submissions may keep here
        self.on_event = on_event
        self.orphan_limit_s = orphan_limit_s
        self.restart_backoff_s = restart_backoff_s  # a failed job's wait before restart n: this x 2^(n-1), <= 300 s
        self.ray_address = ray_address
        self.scheduler = _p.Scheduler(_p.SchedulerConfig(aging_s=aging_s if mode != "static_naive" else 0.0,
                                                          preemption=mode == "dynamic",
                                                          admit_to_request=mode == "dynamic"))
        self.arbiter = _p.ClusterArbiter()
        # Remaining work (the simulator's estimator and, with completion_aware, convergence_aware's
        # tilt of the arbiter): each training job's declared budget, steps and loss curve from its
        # reports, and the jobs of its class that finished here, one estimator per user (uid).
        self.remaining: dict[int, Any] = {}
        self.completion = _p.CompletionConfig() if completion_aware else None
        self._curves: dict[str, list[tuple[float, float]]] = {}
        self._speedups: dict[str, list[float]] = {}  # each training job's last measured speedup curve
        self.book = _p.LeaseBook()
        self.events_path = self.state_dir / "events.jsonl"
        self._events = _events.EventFile(self.events_path, events_max_mb)
        self.logs_dir = self.state_dir / "logs"
        self.logs_dir.mkdir(exist_ok=True)
        os.chmod(self.logs_dir, 0o711)  # a job's launcher log inside is its owner's (0600)
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.jobs: dict[str, dict[str, Any]] = {}
        self._requests: dict[str, Any] = {}  # the scheduler's request per job (its spec is fixed)
        self.reports: dict[str, dict[str, Any]] = {}
        self.autoscalers: dict[str, Any] = {}
        self.replicas_wanted: dict[str, int] = {}  # inference: the autoscaler's latest answer
        self._load_at: dict[str, float] = {}  # when a job last reported its load (rate_rps or queue)
        self._stale: dict[str, float] = {}  # inference whose load report went stale (event said once)
        self.draining = bool(self.db.get_meta("draining", False))
        self.counters = {"grants": 0, "releases": 0, "preemptions": 0, "reclaims": 0, "moves": 0}
        self.launchers: dict[str, _launchers.LauncherRef] = {}
        self._exiting: list[subprocess.Popen[bytes]] = []  # launchers of ended jobs, not yet reaped
        self.url: str | None = None  # the API launchers call (set by the server)
        # Ray: why a node is gone (None while it is there), asked when a worker on it ended.
        self.node_check: Callable[[str], str | None] | None = None
        self.ray_head_lost_at: float | None = None  # Ray: since when the cluster's head is unreachable
        self.away: dict[str, Any] = {}  # Ray: devices of nodes gone with the head, whose leases are kept
        self._last_scale = 0.0
        self._last_check = 0.0
        self._planned: dict[str, tuple[int, int]] = {}  # last plan event per job (no repeats)
        self._resized_at: dict[str, float] = {}  # when the scaler last grew or shrank a job
        self._recent_peak: dict[str, tuple[float, int]] = {}  # (when, size): a job's largest recent size
        self._running: dict[int, float] = {}  # lease -> when its worker first checked in
        self._errors: dict[str, list[float]] = {}  # an internal error's text -> [last event time, repeats]
        self._runs_python: set[int] = set()  # owners known to be able to run this interpreter
        try:
            self._restore()
        except Exception:
            self.db.close()
            self._state_lock.release()
            raise

    # ------------------------------------------------------------------------------------------
    # durable state
    # ------------------------------------------------------------------------------------------
    def _restore(self) -> None:
        now = _clock.now()
        for j in self.db.jobs():
            self.jobs[j["name"]] = j
            self._requests[j["name"]] = make_request({**j["spec"], "name": j["name"]})
        restored = 0
        gone: list[Any] = []
        for row in self.db.leases():
            l = _p.Lease()
            for k in ("id", "job", "device", "share", "granted_at"):
                setattr(l, k, row[k])
            l.heartbeat_at = now  # a restarted pool gives every worker a fresh timeout to check in
            l.state = row["state"]
            if not self.inventory.contains(l.device):
                # On a Ray pool its node is not in the cluster now: the lease goes (below). A local
                # pool's device may be missing for a while (NVML failing after an upgrade): kept.
                if self.ray_address is not None:
                    gone.append(l)
                continue
            self.book.restore(l)
            if self.slots is not None:
                self.slots.make_lease(l.device, l.id, l.share, self._owner(l.job).uid)
            restored += 1
        self.book.set_next_id(int(self.db.get_meta("next_lease", 1)))
        self.counters.update(self.db.get_meta("counters", {}) or {})
        for l in gone:  # fenced, so that a worker still running there is stopped; kept, it came back with the node
            why = f"its node is not in the Ray cluster of the restarted pool (device '{l.device}')"
            self._fence(l, why)
            self.counters["releases"] += 1
            self._event({"event": "release", "job": l.job, "lease": l.id, "device": l.device, "reason": why,
                         "held_s": now - l.granted_at})
        dropped = [l.id for l in gone]
        adopted = []
        for name, j in self.jobs.items():
            if j["state"] in ENDED:
                continue
            # Workers that had checked in before (their worker_start said once, not again).
            self._running.update((lid, now) for lid in j["info"].get("running", []) if self.book.contains(lid))
            ref = _launchers.adopt(j["info"].get("launcher"))
            if ref is not None:  # still running its job: adopted, never a second one
                self.launchers[name] = ref
                adopted.append(name)
        if self.jobs or restored or dropped:
            self._event({"event": "restore", "jobs": len(self.jobs), "leases": restored, "adopted": adopted,
                         **({"dropped": dropped} if dropped else {})})
        removed: list[int] = list(dropped)
        for name, j in self.jobs.items():
            rec = j["info"].get("launcher")
            if not rec or not rec.get("pid") or name in self.launchers:
                continue
            if j["state"] == "running":  # its launcher ended while no daemon was there: its workers went with it
                self._end(name, "failed", f"its launcher (pid {rec.get('pid')}) ended while the pool daemon was away",
                          removed, now)
            elif j["state"] == "waiting":  # nothing of it ran yet: it gets a launcher again
                for l in self.book.of_job(name):
                    self._release(l.id, "its launcher is gone", removed)
                del j["info"]["launcher"]
                j["info"].pop("ready_at", None)  # the next launcher must check in again
                self._save_job(name)
        if removed:
            self._save_leases([], removed)

    def _save_job(self, name: str) -> None:
        self.db.put_job(self.jobs[name])

    def _save_leases(self, changed: list[Any], removed: list[int] = ()) -> None:  # type: ignore[assignment]
        self.db.put_leases(changed, removed)
        self.db.set_meta("next_lease", self.book.next_id)
        self.db.set_meta("counters", self.counters)

    def _event(self, ev: dict[str, Any]) -> None:
        ev = {"time": _clock.now(), **ev}
        self._events.append(ev)
        if self.on_event is not None:
            self.on_event(ev)

    def internal_error(self, where: str, e: BaseException) -> None:
        """An error of the daemon itself: one event, then at most one a minute for the same error
        (with how often it repeated), so a recurring fault never floods the log."""
        text = f"{where}: {type(e).__name__}: {e}"
        now = _clock.now()
        seen = self._errors.setdefault(text, [0.0, 0])
        seen[1] += 1
        if now - seen[0] >= 60.0:
            self._event({"event": "error", "error": text, "repeats": seen[1]})
            print(f"[dra pool] {text} (x{seen[1]})", file=sys.stderr, flush=True)
            seen[0], seen[1] = now, 0

    # ------------------------------------------------------------------------------------------
    # who may do what
    # ------------------------------------------------------------------------------------------
    def _owner(self, name: str) -> Owner:
        info = self.jobs.get(name, {}).get("info", {})
        return Owner.from_json(info["owner"]) if "owner" in info else _auth.owner_of(os.geteuid())

    def _may(self, name: str, caller: Caller | None) -> bool:
        caller = caller or _auth.local_caller()
        return caller.operator or self._owner(name).uid == caller.uid

    def _authorize(self, name: str, caller: Caller | None, what: str) -> None:
        if not self._may(name, caller):
            who = (caller or _auth.local_caller()).name()
            raise Forbidden(f"job: '{name}' belongs to {self._owner(name).user}; {who} may not {what} it "
                            "(only its owner or an operator may)")

    def _operator(self, caller: Caller | None, what: str) -> None:
        caller = caller or _auth.local_caller()
        if not caller.operator:
            raise Forbidden(f"pool: only an operator ({_auth.operators()}) may {what}; {caller.name()} is not one")

    # ------------------------------------------------------------------------------------------
    # requests from clients and launchers
    # ------------------------------------------------------------------------------------------
    def submit(self, spec: Any, caller: Caller | None = None) -> dict[str, Any]:
        caller = caller or _auth.local_caller()
        spec = validate_spec(spec)
        if "user" in spec:
            if not caller.operator:
                raise Forbidden("user: only an operator may submit a job as another user; drop 'user'")
            owner = _auth.owner_named(spec.pop("user"))
        else:
            owner = _auth.owner_of(caller.uid, caller.gid)
        if owner.uid != os.geteuid() and os.geteuid() != 0:
            raise Forbidden(f"user: this pool runs as {_auth.user_name(os.geteuid())} and can run jobs of that user "
                            f"only, not of {owner.user}; ask its operator, or serve a pool of your own")
        req = make_request(spec)
        if not caller.operator and (why := _quota.priority_problem(req.priority, self.user_limits)):
            raise Forbidden(why)
        req.validate(self.counted_inventory())
        self._check_lease_limits(req)
        if self.mode != "dynamic":  # the baselines: the request, rigid, for life
            req.min_size = req.max_size
            req.elastic = False
            if self.mode == "static_naive":
                req.priority = "normal"
        if "options" in spec:
            try:
                _core.Options(**spec["options"])
            except (ValueError, TypeError) as e:
                raise ValueError(f"options: {e}") from None
        if req.kind == "inference":  # kept and never read, as autoscale on training (below)
            for field, what in (("options", "the training controller's options (DRA_OPTIONS)"),
                                ("declared_steps", "a training job's declared length")):
                if field in spec:
                    raise ValueError(f"{field}: {what}; an inference service's replicas get none: drop {field}, "
                                     "or give kind: training")
        if "autoscale" in spec or req.kind == "inference":
            try:
                _p.ReplicaAutoscaler(_p.AutoscalerConfig(**spec.get("autoscale", {}), min_replicas=req.min_size,
                                                         max_replicas=req.max_size))
            except (ValueError, TypeError) as e:
                raise ValueError(f"autoscale.{e}") from None
            if req.kind != "inference":  # it would be kept and never read
                raise ValueError(f"autoscale: only an inference service has a replica autoscaler; this job's kind is "
                                 f"'{req.kind}': drop autoscale, or give kind: inference")
        if self.ray_address is not None:
            if spec.get("ray") is False or (isinstance(spec.get("ray"), str) and spec["ray"] != self.ray_address):
                raise ValueError(f"ray: this pool's devices are the Ray cluster's at {self.ray_address}; its jobs run "
                                 "there: drop 'ray' or give true")
            spec["ray"] = self.ray_address
        elif spec.get("ray"):
            raise ValueError("ray: this pool's devices are not a Ray cluster's; drop 'ray', or serve a pool on Ray "
                             "(dra pool serve --inventory ray:ADDRESS)")
        if spec.get("network") == "private" and (self.ray_address is not None or os.geteuid() != 0):
            raise ValueError("network: a private network needs a local pool run by root (a Ray job's workers talk "
                             "across machines); drop 'network'")
        spec.setdefault("network", "private" if self.ray_address is None and os.geteuid() == 0 else "host")
        if self.launch_jobs:
            if not spec.get("command"):
                raise ValueError('command: a job needs a command (a list of strings, e.g. ["python", "train.py"])')
            if why := preload_problem(spec):
                raise ValueError(why)
            spec.setdefault("cwd", owner.home if Path(owner.home).is_dir() else "/")
            why = _auth.can_enter(spec["cwd"], owner)
            if why:
                raise ValueError(f"cwd: {why}; give a directory the job's user ({owner.user}) can enter")
            self._check_interpreter(req.job, owner)
            # The launcher makes the log folder as the job's user, and refuses one not its own: said now.
            logs = Path(spec["cwd"], spec.get("log") or "dra-logs")
            why = log_dir_problem(logs, owner.uid)
            if why and not _auth.can_see(str(logs), owner):  # one its user cannot reach (in /root, say): nothing
                why = None  # about it is told (what a folder the user may not read holds); the launcher fails on it
            if why:
                raise ValueError(f"log: {logs} is {why}; give the job a log folder of its own ('log', dra pool "
                                 "submit --log) or remove that one")
            if "log" not in spec and (blocked := _auth.can_make(str(logs), owner)):  # a cwd it may enter, not write
                raise ValueError(f"log: {owner.user} cannot make the job's log folder {logs} ({blocked} is not a "
                                 f"folder {owner.user} may write to); give a 'log' folder (dra pool submit --log) or "
                                 "a cwd it may write to")
        with self._lock:
            if self.draining:
                raise ValueError(f"pool: draining (an operator's dra pool drain); job '{req.job}' was not accepted: "
                                 "submit it again once an operator runs dra pool drain --undo")
            old = self.jobs.get(req.job)
            if old is not None and old["state"] not in ENDED:
                raise ValueError(f"name: a job '{req.job}' is already {old['state']}; choose another name (a name is "
                                 "free again once its job has ended)")
            if old is not None and self.book.count(req.job) > 0:
                # A cancelled job's leases stay until its workers have stopped: leases are the
                # name's, so a new job of the name would take them over, and their silence (the old
                # launcher gone) would be blamed on the new job's launcher, killed as hung.
                raise ValueError(f"name: job '{req.job}' has ended but still holds "
                                 f"{self.book.count(req.job)} lease(s) while its workers stop; submit again in a "
                                 "moment, or choose another name")
            if old is not None and not self._may(req.job, caller):
                # Another user's ended job: replacing it would erase its record (its state, its
                # reason) under its owner's eyes and hand its name to this caller's job.
                raise Forbidden(f"name: '{req.job}' is the name of {self._owner(req.job).user}'s ended job; only its "
                                "owner or an operator may reuse it; choose another name")
            stored = dict(spec)
            for k in REQUEST_FIELDS:
                stored[k] = getattr(req, k)
            owned = None  # an operator's jobs are not bounded per user
            if not caller.operator:  # one user cannot fill the state folder for everyone
                owned = [j for j in self.jobs.values() if (j.get("info") or {}).get("owner", {}).get("uid") == owner.uid]
                why = _quota.spec_problem(stored, self.user_limits) or _quota.count_problem(
                    owned, ENDED, old is not None, owner.user, self.user_limits)
                if why:
                    raise Forbidden(why)
            if old is not None:
                self._forget(req.job, old)
            self._retain(req.job, owned)
            order = int(self.db.get_meta("order", 0)) + 1
            self.db.set_meta("order", order)
            job = {"name": req.job, "order": order, "spec": stored, "state": "waiting", "submitted_at": _clock.now(),
                   "started_at": None, "finished_at": None, "info": {"owner": owner.to_json()}}
            self.jobs[req.job] = job
            self._requests[req.job] = make_request(stored)
            self._save_job(req.job)
            self._event({"event": "submit", "job": req.job, "user": owner.user, "by": caller.by(),
                         "request": {k: stored[k] for k in REQUEST_FIELDS}})
        self._wake.set()
        answer = {"job": req.job, "state": "waiting"}
        if req.kind == "inference" and "replica_rps" not in spec.get("autoscale", {}):
            answer["note"] = DEFAULT_CAPACITY_NOTE
        return answer

    def _check_lease_limits(self, req: Any) -> None:
        """On CPU slots a lease's share is its cgroup's CPU quota and memory limit: a fraction that
        gives a worker less than it can run in (a quota under the kernel's 1 ms, a memory limit the
        OOM killer would stop it at, or less memory than its memory_gb) is refused, naming the
        least fraction that works, on every slot the job could be placed on."""
        if self.slots is None:
            return
        for d in self.inventory.devices:
            if (req.device_type in ("any", d.type) and d.memory_gb + 1e-9 >= req.memory_gb
                    and self.slots.has(d.id)):
                problem = self.slots.lease_limits_problem(d.id, req.fraction, req.memory_gb)
                if problem:
                    raise ValueError(problem)

    def _check_interpreter(self, job: str, owner: Owner) -> None:
        """The job's launcher runs this daemon's interpreter as the job's user: a user who cannot
        run it is refused at submission, with one event naming the interpreter and the fix (its
        job would otherwise fail in its launcher with an exec error). A user that passed once is
        not probed again."""
        if owner.uid in self._runs_python:
            return
        why = _auth.can_run_python(owner, sys.executable)
        if why is None:
            self._runs_python.add(owner.uid)
            return
        error = (f"user: {owner.user} cannot run this pool's Python ({sys.executable}): {why}; the operator must serve "
                 "the pool from an interpreter and virtual environment its job users can execute (not one under a "
                 "private home such as a 0700 /root), see docs/guide/pool.md, 'Who may do what'")
        self._event({"event": "refused", "job": job, "user": owner.user, "error": error})
        raise ValueError(error)

    def cancel(self, name: str, caller: Caller | None = None) -> dict[str, Any]:
        with self._lock:
            job = self._job(name)
            self._authorize(name, caller, "cancel")
            if job["state"] in ENDED:
                return {"job": name, "state": job["state"]}
            job["state"] = "cancelled"
            job["finished_at"] = _clock.now()
            self._save_job(name)
            changed = []
            for l in self.book.of_job(name):
                self.book.mark_releasing(l.id)
                changed.append(self.book.at(l.id))
            self._save_leases(changed)
            self._event({"event": "cancel", "job": name, "by": (caller or _auth.local_caller()).by()})
        self._wake.set()
        return {"job": name, "state": "cancelled"}

    def drain(self, caller: Caller | None = None) -> dict[str, Any]:
        self._operator(caller, "drain the pool")
        with self._lock:
            self.draining = True
            self.db.set_meta("draining", True)
            waiting = [n for n, j in self.jobs.items() if j["state"] == "waiting"]
            self._event({"event": "drain", "waiting": waiting, "by": (caller or _auth.local_caller()).by()})
            return {"draining": True, "running": [n for n, j in self.jobs.items() if j["state"] == "running"],
                    "waiting": waiting}

    def undrain(self, caller: Caller | None = None) -> dict[str, Any]:
        """Undoes a drain: new jobs are accepted and waiting ones admitted again."""
        self._operator(caller, "undo a drain")
        with self._lock:
            self.draining = False
            self.db.set_meta("draining", False)
            self._event({"event": "undrain", "by": (caller or _auth.local_caller()).by()})
        self._wake.set()
        return {"draining": False}

    def set_report(self, name: str, report: Any, caller: Caller | None = None) -> dict[str, Any]:
        """A report from outside the job's store (an inference frontend's rate and queue)."""
        report = check_report(report)
        with self._lock:
            self._job(name)
            self._authorize(name, caller, "report for")
            self._keep_report(name, report, _clock.now())
        return {"job": name}

    def _keep_report(self, name: str, report: dict[str, Any], now: float) -> None:
        """Merges a checked report into the job's; one with the load (rate_rps, queue) refreshes it.
        What is kept stays within one report's bound: past it, the new report replaces the old (new
        keys in every report grew the daemon by 450 MB in 2,300 reports, and every status with it)."""
        merged = {**self.reports.get(name, {}), **report}
        self.reports[name] = merged if len(json.dumps(merged)) <= REPORT_LIMIT else dict(report)
        if "rate_rps" in report or "queue" in report:
            self._load_at[name] = now
            self._stale.pop(name, None)

    def job_spec(self, name: str, caller: Caller | None = None) -> dict[str, Any]:
        with self._lock:
            spec = dict(self._job(name)["spec"])
            self._authorize(name, caller, "read")
            return spec

    def _job(self, name: str) -> dict[str, Any]:
        if name not in self.jobs:
            raise NoSuchJob(f"job: no job '{name}' in the pool")
        return self.jobs[name]

    def _set_state(self, lid: int, state: str) -> None:
        l = self.book.release(lid)
        l.state = state
        self.book.restore(l)

    def _fence(self, lease: Any, reason: str) -> None:
        """A lease taken back while its worker may still run: its job's launcher is told to stop
        that worker (the sync's ``fence``: lease id -> why), as the device may be granted again."""
        j = self.jobs.get(lease.job)
        if j is not None and j["state"] not in ENDED:
            j["info"].setdefault("fence", {})[str(lease.id)] = reason
            self._save_job(lease.job)

    def _release(self, lid: int, reason: str, removed: list[int], exit_code: int | None = None) -> None:
        l = self.book.release(lid)
        removed.append(lid)
        self._running.pop(lid, None)
        self.counters["releases"] += 1
        cpu = None
        extra: dict[str, Any] = {} if exit_code is None else {"exit_code": exit_code}  # a replica that crashed
        if self.slots is not None and self.slots.has(l.device):
            cpu = self.slots.lease_usage_s(l.device, l.id)  # what the job used of the slot (accounting)
            memory = self.slots.lease_memory(l.device, l.id)
            if memory and memory["oom_kills"]:  # the kernel's OOM killer stopped processes at the lease's limit
                extra.update(oom_kills=memory["oom_kills"], memory_limit_mb=round(memory["limit"] / 2**20))
            # No compute without a lease: whatever is still in its cgroup (a child the worker
            # left behind, a worker whose launcher stopped checking in) is stopped.
            if not self.slots.remove_lease(l.device, l.id, kill=True):
                # A process outlived SIGKILL (an uninterruptible sleep): it stays in the lease's
                # cgroups, held to their limits, until it is gone (the loop reaps it).
                extra["lingering"] = self.slots.paths(l.device, l.id)[0]
        self._event({"event": "release", "job": l.job, "lease": lid, "device": l.device, "reason": reason,
                     "held_s": _clock.now() - l.granted_at, **({} if cpu is None else {"cpu_s": cpu}), **extra})

    def _end(self, name: str, state: str, reason: str | None, removed: list[int], now: float) -> None:
        """A job ends: its leases go back, one ``finish`` event says how and why. A failed job with
        restarts left (its spec's ``max_restarts``) waits to start again instead (_records.py)."""
        j = self.jobs[name]
        if state == "failed" and not reason:  # a failed job always says why, if only where to look
            reason = (f"its launcher reported a failure without a reason; see its launcher log "
                      f"({self.logs_dir / (name + '.launcher.log')}) and its workers' logs")
        if state == "failed" and j["info"].get("restarts", 0) < int(j["spec"].get("max_restarts", 0)):
            if not self.draining:
                self._requeue(name, str(reason), removed, now)
                return
            reason = f"{reason} (not started again: the pool is draining)"
        j["state"] = state
        j["finished_at"] = j["finished_at"] or now
        if reason:
            j["info"]["reason"] = reason
        self._let_go(name, "job ended", removed)
        self._save_job(name)
        self._event({"event": "finish", "job": name, "state": state, "jct_s": now - j["submitted_at"],
                     **({"reason": reason} if reason else {})})

    # ------------------------------------------------------------------------------------------
    # the loop (dra.pool._loop) and the launchers' calls (dra.pool._launcher_api)
    # ------------------------------------------------------------------------------------------
    def wait_exiting(self, timeout_s: float = 10.0) -> None:
        """Waits (at most timeout_s in all) for the launchers of ended jobs (cancelled, adopted
        ones too) to exit. Called while the API answers: a launcher learns of a cancel only at its
        next call (a daemon that stopped serving first left it running the job's workers)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:  # a cancelled job's launcher is in self.launchers until its next call
            running = [lambda p=p: p.poll() is None for p in self._exiting]
            running += [ref.alive for name, ref in self.launchers.items()
                        if self.jobs.get(name, {}).get("state") in ENDED]
        while any(alive() for alive in running) and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self, remove_slots: bool = True, wait_s: float = 10.0) -> None:
        """Stops the loop and lets the state go. Launchers of running jobs are not waited for:
        they keep their jobs running, and a daemon started on this state adopts them; those of
        ended jobs, for up to wait_s (PoolServer.close waited already, while it answered)."""
        self.stop()
        self.wait_exiting(wait_s)  # launchers of ended jobs exit within moments
        self.db.close()
        self._state_lock.release()
        if remove_slots and self.slots is not None:
            self.slots.close()
        elif self.slots is not None:
            self.slots.leave_control()  # the slots stay for the next daemon; this process is no daemon now
