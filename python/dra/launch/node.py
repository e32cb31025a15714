"""One node's launcher of ``dra run``: starts this node's workers with torchrun's environment,
copies their output to the console, and supervises each on its own.

What it does that torchrun's agent does not (docs/guide/launch.md):
- a worker that dies does not take the others down: a dra job's survivors shrink in place and go
  on, and with ``--max-restarts N`` up to N replacements join the running world (``DRA_JOIN=1``);
  a job without dra is stopped and restarted as a whole, as torchrun does;
- every worker dies with its launcher (parent-death signal), so none trains on without its store;
- SIGTERM, SIGINT or SIGHUP to the launcher stops the job cleanly: SIGTERM to each worker makes a
  dra job end at the same step everywhere, the code after the training loop runs (the leader
  writes the final checkpoint); a second signal, or ``--shutdown-timeout`` later, SIGKILL;
- several nodes leave without an exit barrier: a node waits for the others only while they beat.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra._process import exit_text, group_alive, kill_group
from dra.launch import rendezvous
from dra.launch._claim import claim_run, log_dir
from dra.launch.tee import Tee, console_wanted, prefix_for

#: What torchrun's agent hands its workers, besides the ranks (torch 2.13, LocalElasticAgent).
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
#: Seconds after the job's end before a worker outside its last world that still runs is stopped: a
#: standby or a process that knows it was left out reads "done" and leaves well within it.
STRAY_GRACE_S = 10.0


@dataclass
class RunConfig:
    command: list[str]
    nproc: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int | None = None
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    run_id: str = "job"
    rdzv_conf: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    role: str = "default"
    log_dir: str = "dra-logs"
    tee: int = 3
    local_ranks: set[int] | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    local_addr: str | None = None
    shutdown_timeout: float = 30.0
    store_host: str = "127.0.0.1"
    advertise: str | None = None
    zygote: bool = True
    preload: list[str] = field(default_factory=lambda: ["torch", "dra", "dra.elastic"])
    fence_timeout_s: float = 10.0
    rdzv_timeout_s: float = 600.0
    cwd: str | None = None


@dataclass
class Worker:
    local_rank: int
    rank: int
    uid: int
    wid: str
    log: Path
    pid: int = 0
    started: float = 0.0
    join: bool = False
    attempt: int = 0  #: the whole-group attempt it belongs to (a job without dra)
    stray_at: float | None = None  #: when it was stopped as a stray after the job's end (monotonic)


class NodeLauncher:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.log_dir = log_dir(cfg.log_dir)
        # One node: the run id and log folder are its alone (_claim); nodes' files are apart by rank.
        self._claim = claim_run(self.log_dir, cfg.run_id) if cfg.max_nodes == 1 else None
        self._log_failed = False
        #: the console blocked the copy of the workers' output at the end: the process must leave without
        #: the interpreter's shutdown (its final flush of stdout would wait on that console)
        self.console_stuck = False
        self.signals: list[int] = []
        self.workers: dict[str, Worker] = {}
        self.exits: list[dict[str, Any]] = []
        self.restarts_left = cfg.max_restarts
        self.restart_count = 0  # whole-group restarts (a job without dra)
        self.placement: rendezvous.Placement | None = None
        self.job: Any = None
        self.spawner: Any = None
        self.tee: Tee | None = None
        self.fenced = False
        self.joining: set[int] = set()  # replacements not admitted yet (uids)
        self._capacity_t = 0.0
        self._is_dra: bool | None = None
        self._store_lost_since: float | None = None
        self._final: tuple[set[int], float] | None = None  # the last world's uids, and when the end was seen
        self._final_t = 0.0
        self._logs_full_said, self._logs_t = False, 0.0
        #: process groups of workers that exited leaving processes behind (their children), killed
        #: at the end; a group checked every look, so its id is dropped as soon as it empties
        self.leftovers: set[int] = set()

    # -- messages ------------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        print(f"[dra run] {text}", file=sys.stderr, flush=True)
        self._log_only(text)

    def _log_only(self, text: str) -> None:
        from dra.pool._spawner import open_private_log

        path = self.log_dir / f"{self.cfg.run_id}.launcher.log"
        try:  # never through a link planted in the folder; a full disk does not stop the job
            with open_private_log(path) as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n".encode())
        except OSError as e:
            if not self._log_failed:
                self._log_failed = True
                print(f"[dra run] cannot write {path} ({e}): the launcher's lines go to the console only", file=sys.stderr,
                      flush=True)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        from dra.pool._spawner import Spawner, is_python

        cfg = self.cfg
        use_zygote = cfg.zygote and is_python(cfg.command)
        self.tee = Tee()
        try:
            self.placement = self._meet_or_stop()
            self.spawner = Spawner(use_zygote, cfg.preload, self.log_dir / f"{cfg.run_id}.zygote.log")
            self._connect_job()
            p = self.placement
            self._say(f"job {cfg.run_id}: node {p.group_rank} of {p.group_world_size}, workers "
                      f"{p.first_rank}..{p.first_rank + cfg.nproc - 1} of {p.world_size}, store {p.address}, "
                      f"{'fork server' if use_zygote else 'plain processes'}, logs in {self.log_dir}/")
            for local_rank in range(cfg.nproc):
                self._start(local_rank, join=False)
            self._supervise()
            self._say_if_logs_full(now=True)  # (a short job may fill it between two looks)
            return self._finish()
        finally:
            for w in list(self.workers.values()):
                kill_group(w.pid, signal.SIGKILL)
            for pgid in self.leftovers:
                kill_group(pgid, signal.SIGKILL)
            if self.spawner is not None:
                self.spawner.close()
            if self.tee is not None and not self.tee.close():
                self.console_stuck = True
                self._log_only("the console did not take the workers' last output in 5 s: the rest is in their log files")
            if self.placement is not None:
                self.placement.close()
            # The store and its clients go now, not at the interpreter's exit (where their C++
            # threads would meet a finalizing interpreter).
            self.job = self.placement = self.beats = None
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._claim is not None:
                os.close(self._claim)
                self._claim = None

    def _meet_or_stop(self) -> rendezvous.Placement:
        """``_meet``, stoppable: torch's store connects and waits inside C++ (up to the rendezvous
        timeout, 600 s), where no Python signal handler runs. It runs in a thread; a stopping signal
        before the nodes met ends the launcher at once (exit 1): no worker has started, and the
        thread blocked in C++ cannot be joined, so the process leaves without its interpreter's
        shutdown."""
        box: dict[str, Any] = {}

        def meet() -> None:
            try:
                box["placement"] = self._meet()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e

        thread = threading.Thread(target=meet, name="dra-run-rendezvous", daemon=True)
        thread.start()
        # torch's rendezvous can wait past join_timeout at an endpoint that takes connections but is
        # no store (silent for 90 s with join_timeout=5): bounded here, with 30 s of slack.
        deadline = time.monotonic() + self.cfg.rdzv_timeout_s + 30.0
        while thread.is_alive():
            thread.join(0.1)
            late = time.monotonic() > deadline
            if late or self.signals:
                where = self.cfg.rdzv_endpoint or f"{self.cfg.master_addr}:{self.cfg.master_port}"
                self._say((f"no rendezvous within join_timeout {self.cfg.rdzv_timeout_s:g} s + 30 s at {where}: is a c10d "
                           "store (dra store, torchrun's) listening there?" if late else
                           f"{signal.Signals(self.signals[0]).name} before the nodes met") + ": stopped (no worker started)")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(1)
        if "error" in box:
            raise box["error"]
        return box["placement"]

    def _meet(self) -> rendezvous.Placement:
        cfg = self.cfg
        if cfg.rdzv_backend == "c10d":
            self._say(f"waiting for {cfg.min_nodes}..{cfg.max_nodes} nodes at {cfg.rdzv_endpoint} (run {cfg.run_id})")
            return rendezvous.dynamic(cfg.run_id, cfg.nproc, cfg.min_nodes, cfg.max_nodes, cfg.rdzv_endpoint,
                                      cfg.local_addr, cfg.rdzv_conf, cfg.rdzv_timeout_s)
        if cfg.max_nodes > 1:
            if cfg.node_rank is None or cfg.master_port is None:
                raise ValueError("--nnodes > 1: give --rdzv-backend c10d --rdzv-endpoint HOST:PORT, or --node-rank with "
                                 "--master-addr and --master-port")
            self._say(f"node {cfg.node_rank} waiting for {cfg.max_nodes} nodes at {cfg.master_addr}:{cfg.master_port}")
            return rendezvous.static(cfg.run_id, cfg.nproc, cfg.max_nodes, cfg.node_rank, cfg.master_addr,
                                     cfg.master_port, cfg.rdzv_timeout_s)
        return rendezvous.local(cfg.run_id, cfg.nproc, cfg.store_host, cfg.advertise, cfg.master_port or 0)

    def _connect_job(self) -> None:
        from dra._core.elastic import JobControl

        assert self.placement is not None
        self.job = JobControl(self.placement.address, self.cfg.run_id, self.restart_count, timeout_s=60.0)
        self.beats = rendezvous.NodeBeats(self.placement)
        if self.placement.group_world_size > 1:
            # A store op on a cut link fails, so that the node fences. Not at the fence's time: TCP
            # resends at doubling intervals, and a connection held by a cut shorter than the fence
            # carries on at most about twice that long after it began.
            rendezvous.bound_store_connections(self.placement.master_port, 2 * self.cfg.fence_timeout_s + 1)

    # -- workers ---------------------------------------------------------------------------------
    def _env(self, w: Worker) -> dict[str, str]:
        cfg, p = self.cfg, self.placement
        assert p is not None
        env = dict(os.environ)
        for k in ("DRA_JOIN", "DRA_JOIN_UID"):
            env.pop(k, None)
        env.update({
            "RANK": str(w.rank), "LOCAL_RANK": str(w.local_rank), "WORLD_SIZE": str(p.world_size),
            "LOCAL_WORLD_SIZE": str(cfg.nproc), "GROUP_RANK": str(p.group_rank),
            "GROUP_WORLD_SIZE": str(p.group_world_size), "ROLE_NAME": cfg.role, "ROLE_RANK": str(w.rank),
            "ROLE_WORLD_SIZE": str(p.world_size), "MASTER_ADDR": p.master_addr, "MASTER_PORT": str(p.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count), "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts),
            "TORCHELASTIC_RUN_ID": cfg.run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_ERROR_FILE": str(self.log_dir / f"{cfg.run_id}.{w.rank}.error.json"),
            "TORCHELASTIC_SIGNALS_TO_HANDLE": os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", SIGNALS_TO_HANDLE),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            # dra's own: the job's store (the same one), its id, and SIGTERM as a clean stop.
            "DRA_STORE": p.address, "DRA_JOB_ID": cfg.run_id, "DRA_STOP_ON_SIGTERM": "1", "DRA_LAUNCHER": "dra run",
            "DRA_UNIVERSE_SIZE": str(p.world_size), "PYTHONUNBUFFERED": "1",
        })
        if cfg.nproc > 1 or p.group_world_size > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with several workers per node
        if w.join:
            # A replacement joins the running world in place with a uid claimed for it. torch's
            # default process group of the launch world cannot take a new member, so the script's
            # own init_process_group() makes a world of one on a private port; once admitted, the
            # controller re-creates it over the world (dra.elastic._default_group).
            env.update({"DRA_JOIN": "1", "DRA_JOIN_UID": str(w.uid), "RANK": "0", "WORLD_SIZE": "1",
                        "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(rendezvous.free_port()),
                        "TORCHELASTIC_USE_AGENT_STORE": "False"})
        return env

    def _start(self, local_rank: int, join: bool) -> Worker:
        cfg, p = self.cfg, self.placement
        assert p is not None
        rank = p.first_rank + local_rank
        uid = self.job.claim_late_uid() if join else rank
        suffix = f".uid{uid}" if join else ""
        w = Worker(local_rank, rank, uid, f"{cfg.run_id}.{rank}{suffix}.a{self.restart_count}",
                   self.log_dir / f"{cfg.run_id}.{rank}{suffix}.log", join=join, attempt=self.restart_count)
        if console_wanted(local_rank, cfg.tee, cfg.local_ranks) and self.tee is not None:
            self.tee.follow(w.log, prefix_for(cfg.role, local_rank))
        # An earlier run's or attempt's error file was reported as this worker's (its own was read at its exit).
        (self.log_dir / f"{cfg.run_id}.{rank}.error.json").unlink(missing_ok=True)
        w.pid = self.spawner.spawn(w.wid, list(cfg.command), self._env(w), [], w.log, cfg.cwd)
        w.started = time.monotonic()  # for how long it ran (a wall-clock step does not move it)
        self.workers[w.wid] = w
        if join:
            self._say(f"rank {rank} (local {local_rank}) replaced by uid {uid} (pid {w.pid}), joining in place; "
                      f"{self.restarts_left} restart(s) left")
        else:
            self._say(f"rank {rank} (local {local_rank}): pid {w.pid}")
        return w

    # -- supervision -----------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signals.append(signum)

    def _is_dra_job(self) -> bool:
        if not self._is_dra:
            try:
                self._is_dra = bool(self.job.started())
            except Exception:  # noqa: BLE001 - the store is gone
                return bool(self._is_dra)
        return bool(self._is_dra)

    def _supervise(self) -> None:
        cfg = self.cfg
        forwarded_at: float | None = None
        killed = False
        while self.workers:
            # Every exit seen now leaves the live set before any is handled: a group stopped for the
            # first would otherwise wait out --shutdown-timeout for the others, already gone.
            ended = [(self.workers.pop(wid), code) for wid, code in self.spawner.poll() if wid in self.workers]
            for w, code in ended:
                if group_alive(w.pid):
                    self.leftovers.add(w.pid)
                self._exited(w, code)
            self.leftovers = {g for g in self.leftovers if group_alive(g)}
            if self.signals and forwarded_at is None:
                name = signal.Signals(self.signals[0]).name
                self._say(f"{name}: stopping the job (SIGTERM to every worker: a dra job ends cleanly at the same "
                          f"step, the leader writes its checkpoint); again, or after {cfg.shutdown_timeout:g} s: SIGKILL")
                self._signal_all(signal.SIGTERM)
                forwarded_at = time.monotonic()
            if not killed and forwarded_at is not None and (
                    len(self.signals) > 1 or time.monotonic() - forwarded_at > cfg.shutdown_timeout):
                self._say("stopping every worker now (SIGKILL)")
                self._signal_all(signal.SIGKILL)
                killed = True
            if self.placement is not None and self.placement.group_world_size > 1:
                self._fence_if_cut_off()
            if self.joining:
                self._admit_replacements()
            if forwarded_at is None and not self.fenced:
                self._stop_strays()
            self._say_if_logs_full()
            time.sleep(cfg.monitor_interval)

    def _say_if_logs_full(self, now: bool = False) -> None:
        """Once: a full or read-only log folder drops the workers' output (a fork-server worker's
        print does not raise), which their logs cannot say."""
        if self._logs_full_said or (not now and time.monotonic() - self._logs_t < 1.0):
            return
        self._logs_t = time.monotonic()
        try:
            st = os.statvfs(self.log_dir)
        except OSError:
            return
        state = "read-only" if st.f_flag & os.ST_RDONLY else "full" if st.f_bavail * st.f_frsize < 4096 else None
        if state:
            self._logs_full_said = True
            self._say(f"the log folder {self.log_dir} is {state}: the workers' output is dropped until it can be "
                      "written (training goes on)")

    def _stop_strays(self) -> None:
        """Once the job finished, a worker outside its last world that still runs was left out
        while it did not answer (stuck in its own code: a long sleep, a deadlocked DataLoader
        worker) and has not looked since: it would hold the launcher until its code returns, for
        ever if it never does. After ``STRAY_GRACE_S`` it is stopped as a stopped job's worker is
        (SIGTERM, then SIGKILL after ``--shutdown-timeout``), saying so. Members of the last world
        are never touched (the leader may be writing its checkpoint)."""
        now = time.monotonic()
        if now - self._final_t < 1.0:
            return
        self._final_t = now
        if self._final is None:
            if not self._is_dra_job() or not self._job_done():
                return
            try:
                final = self.job.final_members()
            except Exception:  # noqa: BLE001 - the store is gone: nothing to tell them apart by
                return
            if final is None:
                return
            self._final = (set(final), now)
        members, seen = self._final
        if now - seen < STRAY_GRACE_S:
            return
        for w in self.workers.values():
            if w.uid in members:
                continue
            if w.stray_at is None:
                w.stray_at = now
                self._say(f"rank {w.rank} (uid {w.uid}, pid {w.pid}) still runs {now - seen:.0f} s after the job "
                          f"finished without it (its last world was {sorted(members)}: it was left out while it did "
                          "not answer, stuck in its own code?): stopping it (SIGTERM; SIGKILL after "
                          f"{self.cfg.shutdown_timeout:g} s)")
                self.spawner.kill(w.wid, signal.SIGTERM)
            elif now - w.stray_at > self.cfg.shutdown_timeout:
                kill_group(w.pid, signal.SIGKILL)

    def _admit_replacements(self) -> None:
        """A replacement waits as a candidate; the launcher asks the leader to admit it through the
        job's capacity (min_size: the world with it) and lifts that floor once it is in."""
        now = time.monotonic()
        if now - self._capacity_t < 1.0:
            return
        self._capacity_t = now
        try:
            report = self.job.report() or {}
            members = set(report.get("members") or [])
            self.joining = {uid for uid in self.joining if uid not in members and any(
                w.uid == uid for w in self.workers.values())}
            if self.joining:
                self.job.set_capacity(len(members) + len(self.joining), 0, [])
            else:
                self.job.set_capacity(0, 0, [])  # admitted: the job's own policy decides again
        except Exception:  # noqa: BLE001 - the store is gone: nothing to ask
            self.joining = set()

    def _signal_all(self, sig: int) -> None:
        for w in self.workers.values():
            if sig == signal.SIGKILL:
                kill_group(w.pid, sig)  # the processes it started too
            else:  # SIGTERM to the worker alone: its DataLoader workers serve it until it stops
                self.spawner.kill(w.wid, sig)

    def _exited(self, w: Worker, code: int) -> None:
        if self.tee is not None:
            self.tee.stop_following(w.log)
        ran = time.monotonic() - w.started
        record = {"rank": w.rank, "local_rank": w.local_rank, "uid": w.uid, "pid": w.pid, "code": code,
                  "time": time.time(), "ran_s": round(ran, 3), "join": w.join, "error_file": self._error(w),
                  "attempt": w.attempt}
        if w.stray_at is not None:
            record["stopped"] = True  # stopped by the launcher after the job's end: not a failure
        self.exits.append(record)
        if code == 0 or self.signals or self.fenced or w.attempt != self.restart_count:
            return  # (a worker of a group already stopped and restarted: its exit is recorded, nothing more)
        how = exit_text(code)
        if self._is_dra_job():
            done = self._job_done()
            if done:
                self._say(f"rank {w.rank} (uid {w.uid}) exited with {how} after the job finished")
                return
            if not w.join and not self._checked_in(w.uid):
                self._founder_lost(w, how, ran)
                return
            self._say(f"rank {w.rank} (uid {w.uid}, local {w.local_rank}) exited with {how} after {ran:.1f} s; the "
                      "others go on in place")
            if self.restarts_left > 0:
                self.restarts_left -= 1
                self.joining.add(self._start(w.local_rank, join=True).uid)
                self._capacity_t = 0.0
            return
        # Not a dra job: torchrun's behaviour, the whole group stops (and restarts while it may).
        # No dra world started: a script without dra, or one whose dra.init failed (a bad option, an
        # unknown policy), which its log names.
        self._say(f"rank {w.rank} exited with {how} before any dra world started (the script does not use dra, or "
                  f"its dra.init failed: {w.log} says why): stopping its other workers, as torchrun does")
        self._stop_group()
        if self.restarts_left > 0 and self.placement is not None and self.placement.group_world_size == 1:
            self.restarts_left -= 1
            self.restart_count += 1
            self._say(f"restarting the worker group ({self.restart_count} of {self.cfg.max_restarts})")
            if not self.cfg.master_port:  # a --master-port store is kept: each attempt's keys are its own
                self.placement = rendezvous.local(self.cfg.run_id, self.cfg.nproc, self.cfg.store_host,
                                                  self.cfg.advertise)
            self._connect_job()
            for local_rank in range(self.cfg.nproc):
                self._start(local_rank, join=False)

    def _checked_in(self, uid: int) -> bool:
        try:
            return bool(self.job.checked_in(uid))
        except Exception:  # noqa: BLE001 - the store is gone: the others cannot wait on it either
            return True

    def _founder_lost(self, w: Worker, how: str, ran: float) -> None:
        """A founding worker exited before it checked in: the others wait for it (up to
        store_timeout_s) before the first world forms, and cannot form it without it. Restarted in
        its place while restarts are left (same rank and uid: the others take it as the one they
        wait for), else the node's other workers are stopped now, saying why."""
        what = (f"rank {w.rank} (uid {w.uid}, local {w.local_rank}) exited with {how} after {ran:.1f} s, before it "
                "checked in to the job")
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self._say(f"{what}: the others wait for it; restarting it in its place ({self.restarts_left} restart(s) "
                      "left)")
            self._start(w.local_rank, join=False)
            return
        self._say(f"{what}: the first world cannot form without it (the others would wait store_timeout_s for it); "
                  f"stopping the other workers ({w.log} says why; --max-restarts N restarts such a worker in its "
                  "place)")
        self._stop_group()

    def _stop_group(self) -> None:
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.shutdown_timeout
        while self.workers and time.monotonic() < deadline:
            for wid, code in self.spawner.poll():
                w = self.workers.pop(wid, None)
                if w is not None:
                    self.exits.append({"rank": w.rank, "local_rank": w.local_rank, "uid": w.uid, "pid": w.pid,
                                       "code": code, "time": time.time(), "stopped": True})
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        for w in list(self.workers.values()):
            self.workers.pop(w.wid)
            self.exits.append({"rank": w.rank, "local_rank": w.local_rank, "uid": w.uid, "pid": w.pid, "code": -9,
                               "time": time.time(), "stopped": True})

    def _fence_if_cut_off(self) -> None:
        """A node that can no longer reach the job's store is cut off from the job (the others have
        gone on without its workers or will): its workers are stopped, saying why."""
        began = time.monotonic()  # a beat on a cut link fails only after it waited, up to the fence's time
        try:
            self.beats.beat()
            self._store_lost_since = None
        except Exception as e:  # noqa: BLE001
            now = time.monotonic()
            self._store_lost_since = self._store_lost_since or began
            if now - self._store_lost_since > self.cfg.fence_timeout_s and not self.fenced:
                self.fenced = True
                self._say(f"the job's store at {self.placement.address} has been unreachable for "
                          f"{now - self._store_lost_since:.0f} s ({e}): this node is cut off; stopping its workers")
                self._signal_all(signal.SIGKILL)

    def _job_done(self) -> bool:
        try:
            return bool(self.job.done())
        except Exception:  # noqa: BLE001
            return False

    def _stopped_at(self) -> int | None:
        try:
            return self.job.stopped_at()
        except Exception:  # noqa: BLE001 - the store is gone: nothing more is known
            return None

    def _error(self, w: Worker) -> str | None:
        path = self.log_dir / f"{self.cfg.run_id}.{w.rank}.error.json"
        if not path.exists():
            return None
        try:
            message = json.loads(path.read_text()).get("message", {})
            return message.get("message") if isinstance(message, dict) else str(message)
        except (OSError, ValueError):
            return None

    # -- the end -------------------------------------------------------------------------------
    def _finish(self) -> int:
        p = self.placement
        assert p is not None
        if self.fenced:
            return 1  # cut off from the store: nothing to ask it, nobody to wait for
        done = self._is_dra_job() and self._job_done()
        if p.group_world_size > 1 and not self.fenced:
            dead = self.beats.wait_for_others()
            if dead:
                self._say(f"node(s) {dead} stopped beating: not waited for")
        failures = [e for e in self.exits if e["code"] != 0 and not e.get("stopped")]
        # A worker that did not stop cleanly (killed by a signal, a non-zero exit) is named: the
        # job's end was not clean for it, and what runs after its loop (a save) did not run.
        unclean = "; ".join(f"rank {e['rank']} (uid {e['uid']}) exited with {exit_text(e['code'])}" for e in failures
                            if e.get("attempt", self.restart_count) == self.restart_count)
        if self.signals:
            clean = " (the job ended cleanly)" if done and not unclean else ""
            self._say(f"stopped by {signal.Signals(self.signals[0]).name}{clean}"
                      + (f": {unclean}, not a clean stop" if unclean else ""))
            return 1  # as torchrun: a job stopped by a signal did not finish
        # A dra job succeeded when it finished (its leader marked it done), whoever died on the way,
        # and some worker of it exited 0 (every one exiting non-zero, `sys.exit(1)` on every rank
        # after its controller finished at exit, failed); any other job, as under torchrun, when
        # every worker of its last attempt exited 0.
        if self._is_dra_job():
            ok = done and any(e["code"] == 0 for e in self.exits)
            if done and not ok:
                self._say("the job marked itself done, but every worker of this node exited non-zero")
            stopped = self._stopped_at() if ok else None
            if stopped is not None:  # a worker's SIGTERM (or ctl.request_stop()) ended it: not a finished training
                ended = (f"{unclean}, not a clean stop" if unclean else "every member ended there cleanly")
                self._say(f"stopped at step {stopped}: a worker asked the job to stop (its SIGTERM, or "
                          f"ctl.request_stop()); {ended}, the training did not run to its end")
                return 1
        else:
            ok = all(e["code"] == 0 for e in self.exits if not e.get("stopped")
                     and e.get("attempt", self.restart_count) == self.restart_count)
        if ok:
            survived = f"; survived {len(failures)} worker failure(s) in place" if failures and done else ""
            self._say(f"job {self.cfg.run_id} finished{survived}")
            return 0
        self._report_failures(failures)
        return 1

    def _report_failures(self, failures: list[dict[str, Any]]) -> None:
        """torchrun's failure summary (ChildFailedError's), on stderr."""
        lines = ["=" * 60, f"{' '.join(self.cfg.command)} FAILED", "-" * 60, "Failures:"]
        for i, e in enumerate(failures or self.exits):
            code = e["code"]
            sig = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.Signals._value2member_map_ else ""
            lines += [f"[{i}]:", f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', time.localtime(e['time']))}",
                      f"  host      : {socket.gethostname()}", f"  rank      : {e['rank']} (local_rank: {e['local_rank']})",
                      f"  exitcode  : {code} (pid: {e['pid']}){sig}",
                      f"  error     : {e.get('error_file') or '<N/A>'}",
                      f"  log       : {self.log_dir / (self.cfg.run_id + '.' + str(e['rank']) + '.log')}"]
        lines.append("=" * 60)
        print("\n".join(lines), file=sys.stderr, flush=True)

