"""The pool's scheduling loop: every ``tick_s`` and after every change, leases whose workers stopped
checking in come back, launchers that ended are noticed, inference whose SLO is at risk is served,
waiting jobs are admitted, the arbiter re-plans training jobs (dynamic, every ``scale_every_s``),
and waiting jobs get their launchers. Decisions are the C++ core's (``dra._core.pool``); this
mixin of ``dra.pool.service.PoolService`` carries them out on the service's state, under its lock.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

from dra._core import pool as _p
from dra.pool import _clock, _launchers
from dra.pool._spawner import cut_log, last_line
from dra.pool._spec import capped, fit_speedup, make_request, remaining_size_s

#: A launcher log's size past which the daemon cuts it to its last lines (bytes).
LAUNCHER_LOG_LIMIT = 16 << 20

REPORT_STALE_S = 30.0  # an inference service's load report older than this counts as no load


class SchedulingLoop:
    """The loop's thread and one ``tick`` (see the module's docstring)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dra-pool", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_s)
            self._wake.clear()
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 - the loop must live; the error is an event
                self.internal_error("loop", e)

    def _entries(self, states: tuple[str, ...], urgent: dict[str, int] | None = None) -> list[Any]:
        urgent = urgent or {}
        out = []
        for name, j in self.jobs.items():
            if j["state"] not in states or not self._ready(name):
                continue
            request = self._requests[name]
            if self._held_as_is(name):
                held = self.book.count(name, False)
                if held == 0:
                    continue  # its last worker ended: the job is ending, it is given nothing more
                request = make_request({**j["spec"], "name": name})
                request.min_size, request.max_size = min(request.min_size, held), held
            out.append(_p.JobEntry(request, j["submitted_at"], j["order"], urgent.get(name, 0)))
        return out

    def _held_as_is(self, name: str) -> bool:
        """Whether a running training job keeps at most the devices its workers hold: its launcher
        says its processes have not formed a dra world (a script without dra, or one still
        starting). Such a job is not grown (a new process would run the whole script again, as a
        world of its own), the arbiter does not shrink it to rebalance (it would not leave; a
        signal would stop a rank), and a device a worker of it gave up by ending is not granted
        to it again (that part of the job is done). A higher class may still preempt it down to
        its min_size, as it may any elastic job. Once the world forms, it is resized like any
        elastic job."""
        j = self.jobs[name]
        return j["state"] == "running" and j["spec"]["kind"] == "training" and j["info"].get("world") is False

    def _ready(self, name: str) -> bool:
        """Whether a job can be given devices now. In ``dynamic``, a waiting job whose launcher has
        not checked in yet (still importing torch into its fork server, seconds on a loaded host)
        waits for it: a lease granted earlier would sit idle, or be taken from a running job that
        could have used it meanwhile. The baselines grant at once, as a batch scheduler does (its
        job's start-up then counts as cold start). A pool that starts no launchers (its caller runs
        the jobs) grants at once too."""
        j = self.jobs[name]
        if self._backing_off(name):
            return False
        return (self.mode != "dynamic" or j["state"] != "waiting" or "ready_at" in j["info"]
                or not self.launch_jobs or self.url is None)

    def _backing_off(self, name: str) -> bool:
        """A failed job waiting out its restart's delay (``_requeue``): no launcher, no device."""
        return float(self.jobs[name]["info"].get("not_before", 0.0)) > _clock.now()

    def tick(self, now: float | None = None) -> None:
        now = _clock.now() if now is None else now
        with self._lock:
            removed: list[int] = []
            changed: list[Any] = []
            # 1. Leases whose workers stopped checking in come back, unless the job's launcher is
            # still alive: then it is late (a loaded host, a stalled daemon), not lost, for up to
            # silence_limit_s, after which it counts as hung and is stopped.
            expired = self.book.expired(now, self.heartbeat_timeout_s)
            self._late &= set(expired)
            for lid in expired:
                lease = self.book.at(lid)
                job = lease.job
                if self._late_not_lost(lid, lease, now):
                    continue
                self.counters["reclaims"] += 1
                self._fence(lease, f"no heartbeat for {self.heartbeat_timeout_s:g} s")
                self._release(lid, f"no heartbeat for {self.heartbeat_timeout_s:g} s", removed)
                j = self.jobs.get(job)
                if j is not None and j["state"] in ("waiting", "running") and self.book.count(job) == 0:
                    # Nothing of the job checks in any more (its launcher is gone): it is lost.
                    self._end(job, "failed", "lost: no heartbeat from its launcher", removed, now)
            # 2. Launchers that ended without a last word; leases of jobs that ended.
            if now - self._last_check >= 0.25:
                self._last_check = now
                self._check_launchers(now, removed)
                if self.slots is not None:  # a launcher gone: what is left in its cgroup goes too
                    live = {ref.id for ref in self.launchers.values()}
                    for lid in self.slots.launcher_ids():
                        if lid not in live and self.slots.remove_launcher(lid):
                            self._event({"event": "launcher_cgroup_removed", "launch": lid})
                if getattr(self.slots, "lingering", None):
                    for rel in self.slots.reap():  # a killed lease's last process is gone at last
                        self._event({"event": "lease_cgroup_removed", "cgroup": rel})
            for l in self.book.all():
                if self.jobs.get(l.job, {}).get("state") in ("finished", "failed", None):
                    self._release(l.id, "job gone", removed)
            # 3. Inference whose SLO is at risk first, then admission (waiting jobs, jobs below
            # their minimum); a service short of replicas never waits for the next re-plan.
            live = ("running",) if self.draining else ("waiting", "running")
            urgent = self._inference_wants(now) if self.mode == "dynamic" else {}
            plan = self.scheduler.admit(self.inventory, self._entries(live, urgent), self.book, now)
            changed += self._apply(plan, now)
            # 4. Scaling (dynamic): inference follows its load, the arbiter divides the rest.
            # Not while nodes are away with a Ray cluster's head: their leases are held, their
            # devices not counted, and a re-plan on what is left would shrink every job.
            if self.mode == "dynamic" and now - self._last_scale >= self.scale_every_s and not self.away:
                self._last_scale = now
                changed += self._scale(now)
            if changed or removed:
                self._save_leases([c for c in changed if self.book.contains(c.id)], removed)
            # 5. A job's launcher starts at submission, so it is warm (store, fork server with torch
            # imported) by the time the job is granted devices. One that cannot start fails its job
            # at once, with one event, and the others are launched all the same.
            if self.launch_jobs and self.url is not None:
                for name in self._to_launch():
                    self._launch(name, now)

    def _to_launch(self) -> list[str]:
        """Waiting jobs whose launchers start now: every one that holds a lease, and of one user's
        jobs that hold none at most ``warm_launchers`` warm at once, highest class first, then in
        order of arrival. A warm launcher is some 450 MB (its fork server imported torch) and
        seconds of CPU, outside every lease: a user's sweep of a hundred queued jobs started a
        hundred of them and ran the host out of memory. The next one starts when one of those
        jobs is granted its devices or ends."""
        waiting = [n for n, j in self.jobs.items() if j["state"] == "waiting" and not self._backing_off(n)]
        self._give_warm_launchers_to_higher_classes(waiting)
        warm: dict[str, int] = {}
        for name in waiting:
            if name in self.launchers and self.book.count(name) == 0:
                user = self._owner(name).user
                warm[user] = warm.get(user, 0) + 1
        out = []
        for name in sorted((n for n in waiting if n not in self.launchers), key=self._launch_order):
            if self.book.count(name) == 0:
                user = self._owner(name).user
                if warm.get(user, 0) >= self.warm_launchers:
                    continue
                warm[user] = warm.get(user, 0) + 1
            out.append(name)
        return out

    def _give_warm_launchers_to_higher_classes(self, waiting: list[str]) -> None:
        """A user's warm launchers went to the first arrivals: a higher class arriving later waited
        for one while the lower ones, checked in, were admitted first (two normal jobs and a low one
        ran before two high ones in an outside review). Per user, the jobs holding nothing that
        should be warm are the first ``warm_launchers`` by class, then arrival; a warm one beyond
        them gives its launcher up (the last in that order first) for each of those without one."""
        by_user: dict[str, list[str]] = {}
        for name in waiting:
            if self.book.count(name) == 0:
                by_user.setdefault(self._owner(name).user, []).append(name)
        for names in by_user.values():
            names.sort(key=self._launch_order)
            first, rest = names[:self.warm_launchers], names[self.warm_launchers:]
            cold = [n for n in first if n not in self.launchers]
            spare = [n for n in reversed(rest) if n in self.launchers and not self.launchers[n].by_hand]
            for name, _ in zip(spare, cold):
                self.stop_launcher(name, "a job of a higher class of the same user needs a warm launcher")

    def _launch_order(self, name: str) -> tuple[int, int]:
        rank = {"critical": 0, "high": 1, "normal": 2, "low": 3}
        return rank.get(self.jobs[name]["spec"].get("priority"), 2), self.jobs[name]["order"]

    def stop_launcher(self, name: str, why: str) -> None:
        """Stops the launcher of a waiting job that holds nothing (it runs no worker); the job waits
        on, and gets a launcher again when its turn comes (or from the next daemon)."""
        ref = self.launchers.pop(name)
        ref.kill()
        if ref.popen is not None:
            self._exiting.append(ref.popen)
        info = self.jobs[name]["info"]
        info.pop("ready_at", None)
        if "launcher" in info:
            info["retired_launcher"] = info.pop("launcher").get("id")
        self._save_job(name)
        self._event({"event": "launcher_stopped", "job": name, "pid": ref.pid, "reason": why})

    def stop_waiting_launchers(self) -> list[str]:
        """At the daemon's stop: the launchers of waiting jobs that hold nothing (a drained pool's
        queue) were left running, 230 MB each with torch imported, outside every cgroup once the
        pool's were removed. They run no worker; a daemon started again starts them again."""
        with self._lock:
            names = [n for n, ref in self.launchers.items() if self.jobs.get(n, {}).get("state") == "waiting"
                     and self.book.count(n) == 0 and not ref.by_hand]
            for name in names:
                self.stop_launcher(name, "the pool stopped; a daemon started again on its state starts it again")
        return names

    def _late_not_lost(self, lid: int, lease: Any, now: float) -> bool:
        """Whether an expired lease is only late: its job's launcher (a process of this host) is
        alive and has been silent for less than ``silence_limit_s``. The first time, one
        ``heartbeat_late`` event; past the limit the launcher is taken as hung and killed (its
        workers go with the lease's cgroup), and the lease is reclaimed."""
        ref = self.launchers.get(lease.job)
        if ref is None or not ref.alive():
            return False
        silent = now - lease.heartbeat_at
        if silent < self.silence_limit_s:
            if lid not in self._late:
                self._late.add(lid)
                self._event({"event": "heartbeat_late", "job": lease.job, "lease": lid, "silent_s": round(silent, 3),
                             "limit_s": self.silence_limit_s})
            return True
        self._late.discard(lid)
        # Hung: its session (the launcher leads one, its workers in it) is stopped, so that no
        # second world can start on these devices beside it (one started by hand is left to the
        # lease's cgroup: its pid is only the one its caller connected from).
        ref.kill()
        return False

    def _check_launchers(self, now: float, removed: list[int]) -> None:
        self._exiting = [p for p in self._exiting if p.poll() is None]
        if now - getattr(self, "_logs_cut_at", 0.0) >= 5.0:
            # A launcher log is in the pool's state folder and its job's user writes it (through the
            # launcher's descriptors): 100 MB by hand in an outside review. Cut to its last lines
            # past LAUNCHER_LOG_LIMIT, as a worker's log is past its log_limit_mb.
            self._logs_cut_at = now
            for name in self.launchers:
                cut_log(self.logs_dir / f"{name}.launcher.log", LAUNCHER_LOG_LIMIT)
        for name, ref in list(self.launchers.items()):
            j = self.jobs.get(name)
            if j is None or ref.alive():
                continue
            self.launchers.pop(name)
            if j["state"] in ("waiting", "running"):
                code = ref.exit_code()
                log = self.logs_dir / f"{name}.launcher.log"
                why = ""
                if code is not None and code > 0:  # its last line says why (_isolate's one line, for 126)
                    last = last_line(log)
                    why = f": {last}" if last else ""
                self._end(name, "failed", f"its launcher exited{'' if code is None else f' (code {code})'} before the "
                          f"job ended{why}; see {log}", removed, now)
            elif j["state"] == "cancelled":
                for l in self.book.of_job(name):
                    self._release(l.id, "job ended", removed)

    def _launch(self, name: str, now: float) -> None:
        assert self.url is not None
        job = self.jobs[name]
        spec = job["spec"]
        env = {} if self.orphan_limit_s is None else {"DRA_POOL_ORPHAN_LIMIT_S": f"{self.orphan_limit_s:g}"}
        if spec.get("network") == "private":
            env["GLOO_SOCKET_IFNAME"] = "lo"  # the only interface the job has
        try:
            ref = _launchers.start(name, self.url, self._owner(name), spec.get("cwd") or "/",
                                   self.logs_dir / f"{name}.launcher.log", env, spec.get("network") == "private",
                                   self.slots.make_launcher if self.slots is not None else ())
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            removed: list[int] = []
            self._end(name, "failed", f"its launcher could not start: {e}", removed, now)
            self._save_leases([], removed)
            return
        self.launchers[name] = ref
        job["info"]["launcher"] = ref.to_json()
        self._save_job(name)
        self._event({"event": "launch", "job": name, "pid": ref.pid, "user": self._owner(name).user})

    def _apply(self, plan: Any, now: float) -> list[Any]:
        changed = []
        for g in plan.grants:
            l = self.book.grant(self.inventory, g.job, g.device, g.share, now)
            self.book.heartbeat(l.id, now + max(0.0, self.start_grace_s - self.heartbeat_timeout_s))
            l = self.book.at(l.id)
            if self.slots is not None and self.slots.has(l.device):
                self.slots.make_lease(l.device, l.id, l.share, self._owner(g.job).uid)
            changed.append(l)
            self.counters["grants"] += 1
            info = self.jobs[g.job]["info"]
            if "first_grant_at" not in info:
                info["first_grant_at"] = now
                self._save_job(g.job)
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

    def _inference_wants(self, now: float) -> dict[str, int]:
        """Feeds every running inference service's load to its autoscaler (once per tick) and
        returns the services that want more replicas than they have now: their SLO is at risk,
        and the scheduler serves them before any admission or growth."""
        urgent = {}
        for name, j in self.jobs.items():
            report = self.reports.get(name)
            if j["state"] != "running" or j["spec"]["kind"] != "inference" or not report:
                continue
            current = self.book.count(name, False)
            rate, queue = float(report.get("rate_rps", 0.0)), float(report.get("queue", 0.0))
            at = self._load_at.get(name)
            if at is not None and now - at > REPORT_STALE_S:
                # Its frontend stopped reporting (gone, hung, or it reports only when there is
                # traffic): its last load would hold the replicas of its last peak forever, while
                # training waits for them. No news counts as no load: down to min_size, a replica
                # per down_delay_s; the next report counts again.
                rate = queue = 0.0
                if name not in self._stale:
                    self._stale[name] = at
                    self._autoscaler(name).forget_peaks()
                    self._event({"event": "report_stale", "job": name, "silent_s": round(now - at, 3),
                                 "limit_s": REPORT_STALE_S})
            # Replicas that serve already: their worker checked in (and, where the frontend says
            # so, it reached them); a queue while others start waits for those, not for more.
            serving = sum(1 for l in self.book.of_job(name) if l.state == "active" and l.id in self._running)
            connected = report.get("replicas_connected")
            if isinstance(connected, int) and not isinstance(connected, bool) and connected >= 0:
                serving = min(serving, connected)
            want = self._autoscaler(name).update(now, rate, queue, current, float(report.get("replica_rps", 0.0)),
                                                 serving)
            self.replicas_wanted[name] = want
            report["replicas_wanted"] = want
            if want > current:
                urgent[name] = want
        return urgent

    def _scale(self, now: float) -> list[Any]:
        running = [n for n, j in self.jobs.items() if j["state"] == "running"]
        # Elastic jobs still waiting take part too (holding nothing): the arbiter's fairness then
        # shrinks running jobs in place to make room for them (p = -1: everyone gets a device
        # before anyone gets a second). Rigid waiting jobs wait for admission (and preemption).
        waiting = [n for n, j in self.jobs.items() if j["state"] == "waiting" and j["spec"]["elastic"]
                   and not self.draining and self._ready(n)]
        if not running:
            return []
        jobs = []
        curves: dict[str, str] = {}  # where each training job's speedup curve came from
        # No job can hold more than the pool has (now: a Ray pool's inventory follows its nodes), so
        # curves stop there: a max_size of 10^6 cost every decision a curve that long (a user could
        # load the daemon with a few such jobs).
        most = max(1, len(self.inventory))
        for name in running + waiting:
            spec = self.jobs[name]["spec"]
            sj = _p.ScaleJob()
            sj.job, sj.kind, sj.priority = name, spec["kind"], spec["priority"]
            sj.elastic = spec["elastic"] and not self._held_as_is(name)
            sj.min_size, sj.max_size = spec["min_size"], max(spec["min_size"], min(spec["max_size"], most))
            sj.current = self.book.count(name, False)
            report = self.reports.get(name)
            age = now - (self.jobs[name]["started_at"] or now)
            cost = float(spec.get("resize_cost_s", 3.0))
            sj.change_penalty = min(1.0, max(0.0, age / (age + cost))) if cost > 0 and name in running else 1.0
            if spec["kind"] == "inference":
                sj.replicas_wanted = self.replicas_wanted.get(name, -1)
            else:
                try:
                    raw, source = fit_speedup(report, sj.max_size, held=self._speedups.get(name), cap=False)
                    sj.speedup = capped(raw, report, sj.current)
                    if source in ("rates", "throughput"):
                        self._speedups[name] = raw
                except (TypeError, ValueError, KeyError, AttributeError):  # a report the job got wrong
                    sj.speedup, source = fit_speedup(None, sj.max_size)
                    source = "prior (report unreadable)"
                curves[name] = source
                estimate = self._history(name).estimate(self._job_class(name), float((report or {}).get("step") or 0),
                                                   float(spec.get("declared_steps") or 0), self._curves.get(name, []))
                sj.remaining_size_s = remaining_size_s(estimate, report, sj.speedup, sj.current)
                # Cooldown: a training job resized in the last resize_cooldown_s is not grown past
                # the largest size it ran at in that window (its curve is flat above it); it can
                # still give devices back. So a job that lost a device to inference or a
                # preemption takes it back as soon as one is free, not resize_cooldown_s later.
                cooldown = float(spec.get("resize_cooldown_s", 10.0))
                peak = self._recent_peak.get(name)
                if peak is None or sj.current >= peak[1] or now - peak[0] >= cooldown:
                    peak = self._recent_peak[name] = (now, sj.current)
                if name in running and now - self._resized_at.get(name, -1e9) < cooldown:
                    # The curve stops at the pool's device count, but a job of fractional leases
                    # (two half-slot workers to a slot) can hold, and have peaked at, more leases
                    # than that: indexing past the curve's end raised IndexError at every tick of
                    # the cooldown and stopped the re-plan of every job (found by the soak,
                    # tests/python/test_pool_soak_outside.py). The curve is flat past its end.
                    k = min(max(sj.current, peak[1], 1), len(sj.speedup) - 1)
                    sj.speedup = sj.speedup[: k + 1] + [sj.speedup[k]] * (len(sj.speedup) - k - 1)
            jobs.append(sj)
        capacity = len(self.inventory)
        # The arbiter divides identical devices: the whole inventory is its capacity (a pool of
        # several device types is scaled as one; placement still honours each request's type).
        targets = _p.plan_sizes(jobs, capacity, self.arbiter, self.completion)
        # Waiting jobs come along: one blocked for aging_s holds its free devices against growth.
        live = ("running",) if self.draining else ("running", "waiting")
        plan = self.scheduler.resize(self.inventory, self._entries(live), targets, self.book, now)
        for name in running:
            cur = self.book.count(name, False)
            want = targets.get(name, cur)
            if want != cur and jobs[(running + waiting).index(name)].elastic and self._planned.get(name) != (cur, want):
                self._planned[name] = (cur, want)
                self._event({"event": "plan", "job": name, "from": cur, "to": want, "curve": curves.get(name),
                             "speedup": [round(x, 3) for x in jobs[(running + waiting).index(name)].speedup]})
        for g in plan.grants:
            self._resized_at[g.job] = now
        for r in plan.releases:
            self._resized_at[r.job] = now
        return self._apply(plan, now)

