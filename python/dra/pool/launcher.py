"""``dra run``: start one worker per lease and supervise each on its own (docs/design/pool.md).

    dra run --nproc 4 -- python train.py ...            # no pool: 4 workers on this machine
    dra run --pool http://127.0.0.1:8470 --job NAME      # a pool job: workers follow its leases

The launcher hosts the job's c10d store (``DRA_STORE``), so the job survives the loss of any
worker, rank 0 included, and a crashed worker is only reported (its lease goes back) while the
others shrink in place and go on, where a one-node torchrun would stop them all. Workers get
``DRA_JOB_ID``, ``RANK``/``WORLD_SIZE`` (the first world) or ``DRA_JOIN=1`` (a later lease: the
worker joins the running world in place), their lease's environment and, for a pool job,
``DRA_OPTIONS``. For a pool job it keeps the job's ``capacity`` key to the leases held and
forwards the leader's ``report``: the contract, key by key, is in docs/guide/pool.md ("The
launcher"). Python workers start from a fork server that imported torch once (``_zygote``);
``--no-zygote`` starts plain processes.

A pool job's launcher runs as the job's user and outlives the daemon: while the pool is
unreachable its workers keep running (``DRA_POOL_ORPHAN_LIMIT_S``, when the operator set one, is
how long; a pool on a Unix socket whose state directory was removed cannot come back, and its
launchers stop their workers and exit), and when the pool is back it reports what happened
meanwhile. It shows its launch id (``DRA_LAUNCH_ID``) at every call, so the pool never lets a
second launcher drive the same job; one that cannot start tells the pool why, and the job fails
at once."""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from dra._argtypes import count_arg, nonnegative_arg
from dra.launch.rendezvous import free_port
from dra.pool import _cgroup, _clock
from dra.pool._spawner import Spawner, cut_log, is_python, last_line, private_log_dir

#: The default of a pool job's ``log_limit_mb``: the most one worker's log holds.
LOG_LIMIT_MB = 1024


class JobStore:
    """The job's c10d store, hosted here; the contract's keys go through dra's one API for outside
    actors (``dra._core.elastic.JobControl``: capacity, report, done, late joiners' uids)."""

    def __init__(self, job: str, host: str, advertise: str | None) -> None:
        import torch.distributed as dist

        from dra._core.elastic import JobControl

        self.store = dist.TCPStore(host, 0, None, True, timedelta(seconds=60), wait_for_workers=False)
        self.address = f"{advertise or host}:{self.store.port}"
        local = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        self.control = JobControl(f"{local}:{self.store.port}", job)  # TORCHELASTIC_RESTART_COUNT is 0 here

    def report(self) -> dict[str, Any] | None:
        try:
            return self.control.report()
        except Exception:  # noqa: BLE001 - a half-written or odd value is not fatal
            return None

    def set_capacity(self, cap: dict[str, Any]) -> None:
        self.control.set_capacity(int(cap["min_size"]), int(cap["max_size"]), [int(u) for u in cap["leave"]])

    def done(self) -> bool:
        try:
            return bool(self.control.done())
        except Exception:  # noqa: BLE001
            return False

    def started(self) -> bool:
        """Whether the job's processes formed their dra world (a script without dra never does)."""
        try:
            return bool(self.control.started())
        except Exception:  # noqa: BLE001 - asked again at the next look
            return False

    def claim_uid(self) -> int:
        """A late joiner's uid, taken from the counter the controller takes it from."""
        return int(self.control.claim_late_uid())


class Launcher:
    def __init__(self, command: list[str] | None, *, job: str, pool: str | None = None, nproc: int = 1,
                 store_host: str = "127.0.0.1", advertise: str | None = None, log_dir: str | Path = ".",
                 zygote: bool = True, preload: list[str] | None = None, shrink_grace_s: float | None = None,
                 poll_s: float = 0.05, cwd: str | None = None, env: dict[str, str] | None = None,
                 ray: str | None = None) -> None:
        from dra.pool.client import PoolClient

        self.job = job
        self.launch_id = os.environ.get("DRA_LAUNCH_ID") or secrets.token_hex(8)
        limit = os.environ.get("DRA_POOL_ORPHAN_LIMIT_S")
        self.orphan_limit_s = float(limit) if limit else None  # None: wait for the pool as long as it takes
        self.away_since: float | None = None
        self._report_refused: str | None = None  # the last report the pool dropped, and why
        # Short calls: the sync loop also watches the workers; a slow daemon is asked again next tick.
        self.client = PoolClient(pool, timeout_s=5.0, retry_s=0.0) if pool else None
        # A pool on a Unix socket lives in its state directory: once that directory is gone, no
        # daemon can come back to this job (a new one there would not know its launch id).
        path = pool[len("unix:"):] if pool and pool.startswith("unix:") else None
        self.pool_dir = Path(path).parent if path and os.path.isabs(path) else None
        spec: dict[str, Any] = PoolClient(pool, retry_s=30.0).job_spec(job) if pool else {}
        self.command = command or spec.get("command")
        if not self.command:
            raise ValueError("command: nothing to run; give one after '--' or submit the job with a command")
        self.cwd = cwd or spec.get("cwd")
        self.kind = spec.get("kind", "training")
        self.extra_env = {**(spec.get("env") or {}), **(env or {})}
        if self.client and self.kind == "training":
            self.extra_env["DRA_OPTIONS"] = json.dumps(self._options(spec))
        self.nproc = nproc
        # A member the pool asked to leave that is still there after this long is stopped
        # (SIGTERM, then SIGKILL 5 s later): only for a job that does not follow the contract.
        self.shrink_grace_s = float(shrink_grace_s if shrink_grace_s is not None else spec.get("shrink_grace_s", 30.0))
        if not 0 <= self.shrink_grace_s < math.inf:
            raise ValueError(f"shrink_grace_s: must be a finite number >= 0, got {self.shrink_grace_s}")
        self.poll_s = poll_s
        self.log_dir = private_log_dir(Path(spec.get("log") or log_dir))
        # A pool job's worker logs share a disk with the pool and other jobs: one print in a hot
        # loop wrote 1.3 GB in 10 s on a third of a core. Past the limit a log keeps its tail.
        self.log_limit = int(float(spec.get("log_limit_mb", LOG_LIMIT_MB)) * 2**20) if pool else None
        use_zygote = zygote and spec.get("zygote", True) and is_python(self.command)
        preload = preload if preload is not None else spec.get("preload", ["torch", "dra", "dra.elastic"])
        ray = ray or spec.get("ray")
        if ray:  # workers on the lease's Ray node (a placement group per lease)
            from dra.pool.ray_cluster import RaySpawner

            self.spawner: Any = RaySpawner(ray)
        else:  # first: its fork server imports torch while this process imports it for the store
            self.spawner = Spawner(use_zygote, preload, self.log_dir / f"{job}.zygote.log")
        self.store = JobStore(job, store_host, advertise)
        self.workers: dict[int, dict[str, Any]] = {}  # lease id -> worker
        self.ended: set[int] = set()
        self.leaving: dict[int, int] = {}  # lease the pool asked back -> lease of the worker leaving for it
        self.leave_uids: set[int] = set()  # every uid asked to go (never reused, so never admitted again)
        self.capacity: dict[str, Any] | None = None
        self.started_world = False
        self.first_world = 0
        self.failures: list[str] = []  # how each worker that failed ended (the job's reason if all fail)
        # Workers that exited 0 on their own: neither asked to leave (a shrink) nor signalled by
        # this launcher. Only these say a job that never wrote done finished; one that exited 0
        # because it was asked back says nothing about the job.
        self.finished_workers = 0
        # Whether the job's processes formed a dra world, and when that was last asked. Until they
        # do (a script without dra never does), a lease past the first world's is given back
        # unused: a process started on it would run the whole script again, as a world of one.
        self.world = False
        self._world_asked = 0.0

    def _options(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The controller options a pool job gets through DRA_OPTIONS (the script's keywords win)."""
        env_options = json.loads(self.extra_env.get("DRA_OPTIONS") or os.environ.get("DRA_OPTIONS") or "{}")
        return {"release": "exit", "max_size": int(spec.get("max_size", 1)), **env_options, **(spec.get("options") or {})}

    def _say(self, **ev: Any) -> None:
        # Printed only (the launcher's log): kept in a list too, they grew its memory for the job's life.
        ev = {"time": _clock.now(), "job": self.job, **ev}
        print("[dra run] " + json.dumps(ev), flush=True)

    # -- workers ---------------------------------------------------------------------------------
    def _start(self, lease: dict[str, Any], rank: int, world: int, join: bool) -> None:
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(lease.get("env", {}))
        env.update({"DRA_STORE": self.store.address, "DRA_JOB_ID": self.job, "RANK": str(rank),
                    "WORLD_SIZE": str(world), "PYTHONUNBUFFERED": "1",
                    # What torchrun's agent tells a worker, so that a script written for torchrun
                    # (init_process_group() from the environment) runs here as it is: one worker per
                    # lease.
                    "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": str(world),
                    "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
                    # A pool job started again (its max_restarts): the attempt, as torchrun counts it.
                    "TORCHELASTIC_RESTART_COUNT": env.get("DRA_RESTART_COUNT", "0"),
                    "TORCHELASTIC_MAX_RESTARTS": env.get("DRA_MAX_RESTARTS", "0")})
        env.update(self._rendezvous_env(world))
        env.setdefault("OMP_NUM_THREADS", "1")
        uid = rank
        env.pop("DRA_JOIN", None)
        env.pop("DRA_JOIN_UID", None)
        if join:
            uid = self.store.claim_uid()
            # A joiner enters the running world through dra; torch's default process group of the
            # launched world cannot take a new member, so the script's own init_process_group()
            # makes a world of one (as under `dra run`).
            env.update({"DRA_JOIN": "1", "DRA_JOIN_UID": str(uid)})
            if self.first_world:  # the launched world (a DistributedSampler's global batch is per-rank x this)
                env["DRA_UNIVERSE_SIZE"] = str(self.first_world)
        cgroups = [p for p in env.get("DRA_CGROUPS", "").split(":") if p]
        wid = f"{self.job}.{lease['id']}"
        log = self.log_dir / f"{wid}.log"
        # The lease's memory cgroup and its slot's, as they were before the worker ran: an OOM kill
        # counted there later is the worker's (docs/guide/pool.md, "Why a job failed").
        memory = _cgroup.memory_cgroup(cgroups)
        watched = [("lease's", memory), ("slot's", os.path.dirname(memory))] if memory else []
        pid = self.spawner.spawn(wid, list(self.command), env, cgroups, log, self.cwd)
        self.workers[lease["id"]] = {"wid": wid, "pid": pid, "lease": lease["id"], "device": lease.get("device"),
                                     "uid": uid, "started": _clock.now(), "asked": None, "signals": 0, "join": join, "taken": False,
                                     "fenced": None,
                                     "log": log, "memory": [(whose, p, _cgroup.memory_state(p)) for whose, p in watched]}
        self._say(event="worker_start", lease=lease["id"], device=lease.get("device"), pid=pid, join=join, uid=uid)

    def _rendezvous_env(self, world: int) -> dict[str, str]:
        """Where torch's init_process_group() from the environment meets. A world of several
        workers meets at the job's store, as torchrun's agent store (workers connect as clients,
        on whatever node). A world of one (one lease, or a joiner) gets a private port its process
        hosts itself, as a plain `python` run would: a script that sets MASTER_ADDR and
        MASTER_PORT itself and starts its own processes (torch.multiprocessing.spawn, the DDP
        tutorial's way) must find no agent store announced, or its rank 0 would not host one."""
        if world > 1:
            host, _, port = self.store.address.rpartition(":")
            return {"MASTER_ADDR": host, "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "True"}
        return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TORCHELASTIC_USE_AGENT_STORE": "False"}

    def _reap(self) -> tuple[list[int], list[int]]:
        """Exited workers: (leases freed, exit codes)."""
        freed, codes = [], []
        by_wid = {w["wid"]: lid for lid, w in self.workers.items()}
        for wid, code in self.spawner.poll():
            lid = by_wid.get(wid)
            if lid is None:
                continue
            self._bound_log(self.workers[lid])  # what it wrote since the last look
            w = self.workers.pop(lid)
            self.ended.add(lid)
            freed.append(lid)
            codes.append(code)
            own = w["asked"] is None and w["signals"] == 0  # it ended by itself, not at the pool's or our word
            if code == 0 and own:
                self.finished_workers += 1
            why = self._exit_why(w, code) if code != 0 else None
            if why:
                self.failures.append(why)
            self._say(event="worker_exit", lease=lid, uid=w["uid"], code=code, ran_s=_clock.now() - w["started"],
                      asked=w["asked"] is not None, signalled=w["signals"] > 0, **({"why": why} if why else {}))
        for w in self.workers.values():
            self._bound_log(w)
        return freed, codes

    def _bound_log(self, w: dict[str, Any]) -> None:
        """Holds a worker's log under the job's ``log_limit_mb`` (said once per worker: ``log_cut``)."""
        if self.log_limit is None:
            return
        before = w.get("log_dropped", 0)
        dropped = cut_log(w["log"], self.log_limit, before)
        if dropped:
            w["log_dropped"] = before + dropped
            if not before:
                self._say(event="log_cut", lease=w["lease"], uid=w["uid"], limit_bytes=self.log_limit,
                          dropped_bytes=dropped)

    def _exit_why(self, w: dict[str, Any], code: int) -> str:
        """How a worker ended, in words: its exit code or signal, an OOM kill its lease's memory
        cgroup (or its slot's) counted while it ran, and the last line of its log."""
        if w["fenced"] and code in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return (f"worker on lease {w['lease']} (member {w['uid']}): stopped (SIGKILL) because the pool took its lease "
                    f"back: {w['fenced']}")
        if code < 0:
            what = f"killed by {_signal_name(-code)}"
        else:
            what = f"exit code {code}" + {127: " (command not found)", 126: " (command found but not executable)"}.get(
                code, f" (128 + {_signal_name(code - 128)}: a command it ran was killed by that signal)"
                if 128 < code < 160 else "")
        for whose, path, before in w["memory"]:
            now = _cgroup.memory_state(path)
            if now is None or before is None or now["oom_kills"] <= before["oom_kills"]:
                continue
            if whose == "slot's" and code not in (-signal.SIGKILL, 128 + signal.SIGKILL):
                continue  # the slot's count is shared: another lease's process may have been the one killed
            what += (f"; out of memory: its {whose} memory limit ({now['limit'] / 2**20:.0f} MiB) was reached and the "
                     f"kernel's OOM killer stopped a process in it (memory.oom_control oom_kill "
                     f"+{now['oom_kills'] - before['oom_kills']}, memory.failcnt {now['failcnt']}): give it more "
                     "memory (a larger fraction, --slot-memory-gb) or make it use less")
            break
        asked = ", asked to leave" if w["asked"] is not None else ""
        text = f"worker on lease {w['lease']} (member {w['uid']}{asked}): {what}"
        last = last_line(w["log"])
        return text + (f"; its log ({os.path.abspath(w['log'])}) ends: {last}" if last else "")

    def _failure(self) -> str:
        """Why the job failed: every worker is gone, the job did not say it was done and no worker
        ended on its own with exit code 0."""
        if not self.failures:
            return ("every worker left because it was asked to (a shrink) and none ended on its own: the job "
                    "neither said it was done nor had a worker exit 0 by itself")
        shown = self.failures[-3:]
        more = len(self.failures) - len(shown)
        return ("no worker is left and the job did not finish: " + "; ".join(shown)
                + (f" (and {more} earlier worker failure(s))" if more else ""))[:2000]

    # -- giving leases back ----------------------------------------------------------------------
    def _fence(self, answer: dict[str, Any], report: dict[str, Any] | None) -> None:
        """Workers whose lease is no longer the job's. The pool took it back outright and says
        why in ``fence`` (its node was declared lost, its heartbeats stopped past the timeout):
        the device may be granted again, so the worker is stopped now, before any new worker
        starts (on a local pool the lease's cgroup was emptied already); a member other than the
        leader is also named in "leave", for a process that outlives the signal. A lease gone
        without a fence (a local pool restarted without the lease's device) leaves its worker running. Either way the worker stays counted in the job's size until it
        exited: a lower max_size would have the leader shrink the world by a healthy member of its
        choosing before the lost one's fault is seen (the lost one may be the leader, which never
        leaves)."""
        held = {l["id"] for l in answer["leases"]}
        fence = answer.get("fence") or {}
        members = (report or {}).get("members") or []
        leader = members[0] if members else 0
        for lid, w in self.workers.items():
            if lid in held:
                continue
            if not w["taken"]:
                w["taken"] = True
                self._say(event="lease_gone", lease=lid, uid=w["uid"], device=w["device"],
                          fenced=str(lid) in fence, why=fence.get(str(lid), "not said"))
            if str(lid) in fence and not w["fenced"]:
                w["fenced"] = fence[str(lid)]
                if self.kind == "training" and w["uid"] != leader:
                    self.leave_uids.add(w["uid"])
                self._signal(w, signal.SIGKILL)

    def _give_back(self, answer: dict[str, Any], report: dict[str, Any] | None) -> None:
        """Follows the pool's answer: the job's size bounds in ``capacity`` and who leaves."""
        asked = set(answer["release"])
        self.leaving = {x: lid for x, lid in self.leaving.items() if x in asked and lid in self.workers}
        members = (report or {}).get("members") or []
        leader = members[0] if members else 0
        for x in sorted(asked - set(self.leaving)):
            w = self.workers.get(x)
            if w is None:
                continue  # its worker already exited; the pool learns it at the next sync
            if w["asked"] is not None or (self.kind == "training" and w["uid"] == leader):
                # The leader never leaves (it may hold the only copy of the state mid-change), and a
                # worker already leaving for another lease counts once: the newest other worker
                # goes, and the pool takes its lease instead.
                others = [v for v in self.workers.values() if v["asked"] is None and not v["taken"]
                          and (self.kind != "training" or v["uid"] != leader)]
                if not others:
                    continue
                w = max(others, key=lambda v: v["started"])
            w["asked"] = _clock.now()
            self.leaving[x] = w["lease"]
            self.leave_uids.add(w["uid"])
            self._say(event="leave", lease=w["lease"], uid=w["uid"], asked_for=x)
            if self.kind != "training":
                self._signal(w, signal.SIGTERM)  # a replica finishes its request and exits 0
        if self.kind == "training" and self.started_world:
            # A worker whose lease the pool took back stays counted until it exited (_fence).
            k = sum(1 for l in answer["leases"] if l["state"] == "active") + sum(1 for w in self.workers.values() if w["taken"])
            cap = {"min_size": k, "max_size": k, "leave": sorted(self.leave_uids)}
            if cap != self.capacity:
                self.store.set_capacity(cap)
                # The event names the uids new to "leave" (and how many it holds): the whole list,
                # which only grows, made the log grow with the square of the shrinks.
                new = sorted(set(cap["leave"]) - set((self.capacity or {}).get("leave", [])))
                self.capacity = cap
                self._say(event="capacity", min_size=k, max_size=k, leave=new, leaving_total=len(cap["leave"]))
        now = _clock.now()
        for w in self.workers.values():
            # A member named in "leave" leaves at the leader's next look and exits 0, a joiner not
            # yet admitted is dismissed and exits 0: a signal only for a job that ignores the contract.
            if w["asked"] is not None and now - w["asked"] > self.shrink_grace_s + 5.0 * w["signals"] and w["signals"] < 2:
                self._say(event="leave_timeout", lease=w["lease"], uid=w["uid"], after_s=now - w["asked"])
                self._signal(w, signal.SIGTERM if w["signals"] == 0 else signal.SIGKILL)

    def _world_formed(self) -> bool:
        """Whether the job formed its dra world (asked of its store at most twice a second)."""
        if not self.world and _clock.now() - self._world_asked >= 0.5:
            self._world_asked = _clock.now()
            self.world = self.store.started()
        return self.world

    def _signal(self, w: dict[str, Any], sig: int) -> None:
        w["signals"] += 1
        self.spawner.kill(w["wid"], sig)

    # -- main loop -------------------------------------------------------------------------------
    def run(self) -> int:
        if self.client:
            from dra import _process

            # Its output is its launcher log, in the pool's state folder: a full disk there loses
            # lines, never the launcher (a print that raised ended it, its workers and its job).
            _process.tolerate_full_disk()
        try:
            return self._run_pool() if self.client else self._run_local()
        finally:
            for w in list(self.workers.values()):
                self.spawner.kill(w["wid"], signal.SIGKILL)
            self.spawner.close()

    def _run_local(self) -> int:
        for i in range(self.nproc):
            self._start({"id": i, "env": {}}, i, self.nproc, join=False)
        codes: list[int] = []
        while self.workers:
            _, c = self._reap()
            codes += c
            time.sleep(self.poll_s)
        _, c = self._reap()
        codes += c
        ok = self.store.done() or self.finished_workers > 0
        self._say(event="job_end", ok=ok, codes=codes)
        return 0 if ok else (next((c for c in codes if c != 0), 1) & 0xFF or 1)

    def _sync(self, heartbeats: list[int], released: list[int], report: dict[str, Any] | None, done: bool = False,
              failed: bool = False, reason: str | None = None,
              exits: dict[int, int] | None = None) -> dict[str, Any] | None:
        """One call to the pool; None while it is unreachable (the workers carry on, and what
        happened meanwhile is reported when it is back)."""
        from dra.pool.client import Superseded

        assert self.client is not None
        try:
            answer = self.client.sync(self.job, heartbeats, released, report, done=done, failed=failed,
                                      reason=reason, launcher=self.launch_id,
                                      world=self.world if self.kind == "training" and self.started_world else None,
                                      exits=exits)
        except (ConnectionError, RuntimeError) as e:
            if isinstance(e, Superseded):
                raise
            if self.away_since is None:
                self.away_since = _clock.now()
                self._say(event="pool_unreachable", error=str(e), limit_s=self.orphan_limit_s)
            if self._pool_dir_gone():
                raise TimeoutError(f"the pool's state directory {self.pool_dir} is gone: no daemon can come "
                                   "back to this job") from None
            if self.orphan_limit_s is not None and _clock.now() - self.away_since > self.orphan_limit_s:
                raise TimeoutError(f"the pool was unreachable for more than {self.orphan_limit_s:g} s "
                                   "(the operator's limit)") from None
            return None
        if self.away_since is not None:
            self._say(event="pool_back", away_s=_clock.now() - self.away_since)
            self.away_since = None
        refused = answer.get("report_refused") if isinstance(answer, dict) else None
        if refused and refused != self._report_refused:
            self._report_refused = refused  # said once per distinct problem: the pool drops such reports
            self._say(event="report_refused", reason=refused)
        return answer

    def _pool_dir_gone(self) -> bool:
        """Whether the Unix-socket pool's state directory no longer exists (not merely unreadable)."""
        if self.pool_dir is None:
            return False
        try:
            os.stat(self.pool_dir)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:
            return False
        return False

    def _run_pool(self) -> int:
        from dra.pool.client import Superseded

        try:
            return self._pool_loop()
        except Superseded as e:
            self._say(event="superseded", error=str(e))
            return 4
        except TimeoutError as e:
            self._say(event="pool_lost", error=str(e))
            return 3

    def _pool_loop(self) -> int:
        assert self.client is not None
        released: list[int] = []
        codes: list[int] = []
        exits: dict[int, int] = {}  # the released leases' exit codes, said to the pool with them
        while True:
            freed, c = self._reap()
            released += freed
            codes += c
            exits.update(zip(freed, c))
            report = self.store.report()
            if self.started_world and self.kind == "training":
                self._world_formed()  # the pool resizes the job only once it did
            # Finished: the job said so, or every worker is gone and one of them exited 0 on its own
            # (a plain script). A worker that exited 0 because it was asked to leave does not count:
            # a job that gave a lease back and whose last workers then crashed failed.
            done = self.store.done() or (self.started_world and not self.workers and self.finished_workers > 0)
            if done:  # the job finished: its workers end by themselves (the leader writes results)
                t_done = _clock.now()
                leader = ((report or {}).get("members") or [0])[0]
                while self.workers and _clock.now() < t_done + 60:
                    time.sleep(self.poll_s)
                    for w in self.workers.values():  # the others have nothing left to do: one stuck
                        # (a joiner on a lost node never started) is stopped after 10 s
                        if w["uid"] != leader and w["signals"] == 0 and _clock.now() > t_done + 10:
                            self._say(event="stuck_after_done", lease=w["lease"], uid=w["uid"])
                            self._signal(w, signal.SIGKILL)
                    freed, c = self._reap()
                    released += freed
                    codes += c
                    exits.update(zip(freed, c))
                    # The job keeps its leases alive until it ends (a worker on a lost node may
                    # linger); freed now, they would be granted to it again.
                    self._sync(list(self.workers) + released, [], None)
            failed = self.started_world and not self.workers and not done
            answer = self._sync(list(self.workers), released, report, done=done, failed=failed,
                                reason=self._failure() if failed else None,
                                exits={lid: exits[lid] for lid in released if lid in exits})
            if answer is None:  # the pool is away: keep supervising, report later
                time.sleep(max(self.poll_s, 0.2))
                continue
            for lid in released:
                exits.pop(lid, None)
            released = []
            if done or failed or answer["state"] in ("finished", "failed", "cancelled"):
                if answer["state"] == "cancelled":
                    for w in self.workers.values():
                        self.spawner.kill(w["wid"], signal.SIGTERM)
                self._say(event="job_end", state=answer["state"], codes=codes)
                return 0 if answer["state"] == "finished" or done else 1
            self._fence(answer, report)
            new = [l for l in answer["leases"] if l["id"] not in self.workers and l["id"] not in self.ended
                   and l["state"] == "active"]
            if new and not self.started_world:
                if len(new) >= answer["min_size"]:
                    self.first_world = len(new)
                    for rank, lease in enumerate(new):
                        self._start(lease, rank, len(new), join=False)
                    self.started_world = True
            elif new:
                if self.kind == "training" and not self._world_formed():
                    for lease in new:  # given back at the next sync (the pool holds the job as it is now)
                        self.ended.add(lease["id"])
                        released.append(lease["id"])
                        self._say(event="lease_unused", lease=lease["id"],
                                  why="the job's processes formed no dra world: a script without dra runs at the "
                                      "size it started at")
                else:
                    for lease in new:
                        self._start(lease, 0, 1, join=True)
            self._give_back(answer, report)
            time.sleep(self.poll_s)


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


def _tell_pool_failed(pool: str, job: str, reason: str) -> None:
    """A pool job's launcher that cannot run it says why, so the job fails at once."""
    from dra.pool.client import PoolClient

    try:
        PoolClient(pool, retry_s=5.0).sync(job, [], [], None, failed=True, reason=reason[:2000],
                                           launcher=os.environ.get("DRA_LAUNCH_ID"))
    except Exception as e:  # noqa: BLE001 - the pool learns it from this process's exit instead
        print(f"[dra run] could not tell the pool: {e}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="dra run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pool", help="pool URL (http://host:port); without it the job runs --nproc workers here")
    p.add_argument("--job", default=None, help="job name (a pool job's name; default: 'job')")
    p.add_argument("--nproc", type=count_arg, default=1)
    p.add_argument("--store-host", default="127.0.0.1", help="address the job's store listens on")
    p.add_argument("--advertise", default=None, help="address workers reach the store at (default: --store-host)")
    p.add_argument("--log-dir", default="dra-logs")
    p.add_argument("--no-zygote", action="store_true", help="start plain processes instead of forking a warm one")
    p.add_argument("--preload", default=None, help="modules the fork server imports (default torch,dra,dra.elastic)")
    p.add_argument("--shrink-grace-s", type=nonnegative_arg, default=None,
                   help="stop a worker the pool asked back that has not left after this long (default 30)")
    p.add_argument("--ray", default=None, help="start workers on a Ray cluster (address, or 'auto')")
    args = p.parse_args(argv)
    if args.pool and not args.job:
        p.error("--job is required with --pool")
    if not args.pool and not command:
        p.error("give the worker command after '--', e.g. dra run --nproc 2 -- python train.py")
    try:
        launcher = Launcher(command or None, job=args.job or "job", pool=args.pool, nproc=args.nproc,
                            store_host=args.store_host, advertise=args.advertise, log_dir=args.log_dir,
                            zygote=not args.no_zygote, preload=args.preload.split(",") if args.preload else None,
                            shrink_grace_s=args.shrink_grace_s, ray=args.ray)
        return launcher.run()
    except Exception as e:
        if not args.pool:
            raise
        print(f"[dra run] job '{args.job}' cannot run: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        _tell_pool_failed(args.pool, args.job, f"{type(e).__name__}: {e}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
