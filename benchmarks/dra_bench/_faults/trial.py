"""One fault trial: a real elastic job on loopback, a fault injected, every process watched.

A trial starts its workers (Python: ``dra_bench._faults.worker``; C++: the LibTorch example
``dra_elastic_train``) against a dedicated c10d store (``python -m dra store``), follows their
records while they train, lets the fault's driver-side actions act on what it sees (kill -9 of the
leader once the world reached a step, SIGSTOP and SIGCONT, the store killed...), and waits, bounded,
until every process ended. ``dra_bench._faults.check`` then judges the records.

How processes are started is the ``Launcher``'s business: ``LocalLauncher`` runs them as children
of this process; a launcher for ``dra run`` (the pool) can take its place.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_bench._faults.spec import FaultSpec
from dra_bench._store import StoreProcess  # noqa: F401 - the trials' store, imported from here by the suite

POLL_S = 0.02


@dataclass
class JobSpec:
    """The job a trial runs (the same for every process of it)."""

    language: str = "py"  # "py" or "cpp"
    nproc: int = 3  # processes launched together: uids 0..nproc-1
    start_size: int = 3
    max_size: int = 3
    late_joiners: int = 0  # DRA_JOIN=1 processes, started with the others (uids 10000+)
    wait_candidates: int = 0  # the first world trains once this many candidates registered
    schedule: dict[int, int] = field(default_factory=dict)  # committed steps -> size
    epochs: int = 2
    dataset: int = 256
    global_batch: int = 16
    fault_timeout_s: float = 2.0
    compute_ms: float = 20.0  # stands for a model's compute per step
    decide_every: int = 100000
    ballast_mb: float = 0.0  # extra state handed over (Python only)
    private_store: bool = False  # a store of its own (the store is killed)
    variants: dict[str, str] = field(default_factory=dict)  # process name -> "model", "optimizer", "dtype"
    fs_dir: str = ""  # events and checkpoints go here (a filesystem trial breaks it); "" : the trial's folder
    checkpoint_every: int = 0  # rank 0 saves a checkpoint every N committed steps (Python only)

    @property
    def total_steps(self) -> int:
        return self.epochs * -(-self.dataset // self.global_batch)

    def names(self) -> list[str]:
        return [f"r{u}" for u in range(self.nproc)] + [f"j{k}" for k in range(self.late_joiners)]


@dataclass
class Fault:
    """What a fault kind planned for one trial."""

    kind: str
    description: str
    specs: dict[str, list[FaultSpec]] = field(default_factory=dict)  # process name -> in-process faults
    actions: list[Action] = field(default_factory=list)  # driver-side
    measure_resume: bool = False  # a mid-step fault: time to resumed training is reported
    expect_no_fault_event: bool = False  # nothing should be declared dead (a slow peer)
    expect_codes: dict[str, int] = field(default_factory=dict)  # exit codes other than 0 / -9 (by name)
    fs: str = ""  # "tmpfs": the trial's fs_dir is a small tmpfs (mounted here, root only); "dir": a folder
    fuzz_interval_s: float = 0.0  # > 0: an outside client writes bad values into the job's keys this often
    allow_step_out: bool = False  # processes may step out of a split world (overwritten store keys)
    runner: Callable[..., TrialRun] | None = None  # a trial run another way (a launcher's trial)


@dataclass
class TrialSpec:
    seed: int
    kind: str
    job: JobSpec
    fault: Fault

    def repro(self) -> str:
        return f"python -m dra.bench faults --trial {self.seed}:{self.kind}:{self.job.language}"


class LocalLauncher:
    """Starts a trial's processes as children of this one."""

    def __init__(self, cpp_binary: Path | None) -> None:
        self.cpp_binary = cpp_binary

    def command(self, job: JobSpec, out: Path, specs: list[FaultSpec]) -> list[str]:
        if job.language == "py":
            return [sys.executable, "-m", "dra_bench._faults.worker"]
        if self.cpp_binary is None:
            raise RuntimeError(
                "a C++ trial needs the example binary (cmake --build build/cpp --target dra_elastic_train)"
            )
        cmd = [
            str(self.cpp_binary),
            "--epochs",
            str(job.epochs),
            "--dataset",
            str(job.dataset),
            "--global-batch",
            str(job.global_batch),
            "--start-size",
            str(job.start_size),
            "--max-size",
            str(job.max_size),
            "--decide-every",
            str(job.decide_every),
            "--verify",
            "--events",
            str(Path(job.fs_dir or out) / "events.jsonl"),
            "--log-samples",
            str(out),
            "--fault-timeout-ms",
            str(int(job.fault_timeout_s * 1000)),
            "--status-every",
            "0",
            "--compute-ms",
            str(int(job.compute_ms)),
            "--wait-candidates",
            str(job.wait_candidates),
        ]
        if job.schedule:
            cmd += ["--schedule", ",".join(f"{s}:{n}" for s, n in sorted(job.schedule.items()))]
        if specs:
            cmd += ["--test-fault", ",".join(str(s) for s in specs)]
        return cmd

    def start(
        self, name: str, job: JobSpec, out: Path, store: str, job_id: str, specs: list[FaultSpec]
    ) -> subprocess.Popen:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TORCHELASTIC_", "DRA_", "MASTER_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        }
        env.update(DRA_STORE=store, DRA_JOB_ID=job_id, WORLD_SIZE=str(job.nproc), OMP_NUM_THREADS="1")
        if name.startswith("r"):
            env["RANK"] = name[1:]
        else:
            env["DRA_JOIN"] = "1"
        if job.language == "py":
            cfg = {k: v for k, v in job.__dict__.items() if k != "schedule"}
            cfg.update(out=str(out), schedule={str(k): v for k, v in job.schedule.items()})
            env["DRA_FAULT_JOB"] = json.dumps(cfg)
            env["DRA_FAULT_SPEC"] = ",".join(str(s) for s in specs)
            env["DRA_FAULT_VARIANT"] = job.variants.get(name, "")
        with open(out / f"out-{name}.txt", "w") as fh:
            return subprocess.Popen(
                self.command(job, out, specs), env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )


class View:
    """What the driver knows of a running trial: the processes, and the records they wrote so far."""

    def __init__(
        self, out: Path, procs: dict[str, subprocess.Popen], store: StoreProcess, rng: random.Random, job_id: str = ""
    ) -> None:
        self.out, self.procs, self.store, self.rng, self.job_id = out, procs, store, rng, job_id
        self.fs: Any = None  # a filesystem trial's folder (dra_bench._faults.tamper.TrialFilesystem)
        self.uid_of: dict[str, int] = {n: int(n[1:]) for n in procs if n.startswith("r")}
        self.step = -1  # the highest step any member attempted
        self.world: tuple[int, list[int]] = (-1, [])  # (world epoch, members) of the latest world record
        self.finished: set[str] = set()  # wrote their final record
        self.targeted: set[str] = set()  # chosen by an action already
        self._offsets: dict[Path, int] = {}
        self._name_of_pid = {p.pid: n for n, p in procs.items()}

    def name_of_uid(self, uid: int) -> str | None:
        return next((n for n, u in self.uid_of.items() if u == uid), None)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def refresh(self) -> None:
        for path in self.out.glob("samples-*.jsonl"):
            with open(path) as fh:
                fh.seek(self._offsets.get(path, 0))
                chunk = fh.read()
            end = chunk.rfind("\n") + 1  # whole lines only
            self._offsets[path] = self._offsets.get(path, 0) + len(chunk[:end].encode())
            for line in chunk[:end].splitlines():
                self._see(json.loads(line))

    def _see(self, rec: dict[str, Any]) -> None:
        name = self._name_of_pid.get(rec.get("pid", -1))
        if name is not None:
            self.uid_of[name] = rec["uid"]
        kind = rec["kind"]
        if kind == "attempt":
            self.step = max(self.step, rec["step"])
        elif kind == "world" and rec["epoch"] > self.world[0]:
            self.world = (rec["epoch"], list(rec["members"]))
        elif kind == "final" and name is not None:
            self.finished.add(name)

    def leader(self) -> str | None:
        members = self.world[1]
        return self.name_of_uid(members[0]) if members else None

    def pick(self, target: str) -> str | None:
        """The process an action hits: 'leader' (rank 0 now), 'member' (another member, at random),
        'any' (any member), 'waiting' (alive, not in the world: a candidate or a standby), or a name."""
        members = [n for n in (self.name_of_uid(u) for u in self.world[1]) if n is not None]
        live = [n for n in self.procs if self.alive(n) and n not in self.finished and n not in self.targeted]
        if target == "leader":
            pool = [n for n in members[:1] if n in live]
        elif target == "member":
            pool = [n for n in members[1:] if n in live]
        elif target == "any":
            pool = [n for n in members if n in live]
        elif target == "waiting":
            pool = [n for n in live if n not in members]
        else:
            pool = [target] if target in live else []
        return self.rng.choice(sorted(pool)) if pool else None


@dataclass
class Action:
    """A driver-side fault: once any member attempted step `at_step`, wait `delay_s`, then send
    `sig` to the process `target` names (see View.pick; 'store': the store), or run `call(view)`
    (which returns what it hit, or None). With `resume_after_s` the process gets SIGCONT that long
    after (a SIGSTOP past the timeout, or a short one: a slow peer)."""

    target: str
    at_step: int
    delay_s: float = 0.0
    sig: int = signal.SIGKILL
    resume_after_s: float | None = None
    armed_at: float | None = None
    fired_at: float | None = None  # monotonic
    fired_wall: float = 0.0  # wall clock, comparable with the records' times
    hit: str | None = None  # the process name (or 'store') it hit
    resumed: bool = False
    call: Callable[[View], str | None] | None = None

    @property
    def done(self) -> bool:
        return self.fired_at is not None and (self.resume_after_s is None or self.resumed or self.hit is None)

    def poll(self, view: View, now: float) -> None:
        if self.fired_at is None:
            if self.armed_at is None and view.step >= self.at_step:
                self.armed_at = now
            if self.armed_at is not None and now >= self.armed_at + self.delay_s:
                self._fire(view, now)
        elif self.resume_after_s is not None and not self.resumed and now >= self.fired_at + self.resume_after_s:
            self.resumed = True
            if self.hit in view.procs and view.alive(self.hit):
                os.kill(view.procs[self.hit].pid, signal.SIGCONT)

    def _fire(self, view: View, now: float) -> None:
        self.fired_at, self.fired_wall = now, time.time()
        if self.call is not None:
            self.hit = self.call(view)
            return
        if self.target == "store":
            if view.store.alive():
                self.hit = "store"
                view.store.proc.send_signal(self.sig)
            return
        name = view.pick(self.target)
        if name is None:
            return  # nobody to hit (the job ended first): the fault did not fire
        self.hit = name
        view.targeted.add(name)
        try:
            os.kill(view.procs[name].pid, self.sig)
        except ProcessLookupError:
            self.hit = None


@dataclass
class TrialRun:
    """What happened in one trial, for the checks."""

    spec: TrialSpec
    out: Path
    codes: dict[str, int | None]  # None: still running at the deadline (hung; killed then)
    uid_of: dict[str, int]
    actions: list[Action]
    wall_s: float
    fuzz_writes: int = 0  # values an outside client wrote into the job's keys
    notes: list[str] = field(default_factory=list)


def run_trial(
    spec: TrialSpec, out: Path, launcher: LocalLauncher, shared_store: StoreProcess | None, timeout_s: float
) -> TrialRun:
    if spec.fault.runner is not None:
        return spec.fault.runner(spec, out, launcher, timeout_s)
    out.mkdir(parents=True, exist_ok=True)
    job = spec.job
    from dra_bench._faults import tamper  # filesystem and outside-writer helpers

    fs = tamper.TrialFilesystem(out, spec.fault.fs) if spec.fault.fs else None
    if fs is not None:
        job.fs_dir = str(fs.path)
    store = StoreProcess() if job.private_store or shared_store is None else shared_store
    t0 = time.monotonic()
    procs: dict[str, subprocess.Popen] = {}
    job_id = f"faults-{spec.seed}-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
    fuzz = None
    if spec.fault.fuzz_interval_s > 0:
        # Before the job starts: on a loaded host importing torch.distributed took longer than the
        # whole trial, and the outside writer wrote nothing.
        import torch.distributed  # noqa: F401
    try:
        for name in job.names():
            procs[name] = launcher.start(name, job, out, store.address, job_id, spec.fault.specs.get(name, []))
        view = View(out, procs, store, random.Random(spec.seed * 7919 + 1), job_id)
        view.fs = fs
        if spec.fault.fuzz_interval_s > 0:
            fuzz = tamper.StoreFuzzer(view, spec.seed, spec.fault.fuzz_interval_s)
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:
            view.refresh()
            now = time.monotonic()
            for a in spec.fault.actions:
                a.poll(view, now)
            if fuzz is not None and view.step >= 1:
                fuzz.start()
            if all(p.poll() is not None for p in procs.values()):
                # Stopped processes are all resumed by now (a resume is due before the end).
                if all(a.done or a.fired_at is None for a in spec.fault.actions):
                    break
            time.sleep(POLL_S)
        codes: dict[str, int | None] = {n: p.poll() for n, p in procs.items()}
        view.refresh()
        run = TrialRun(spec, out, codes, dict(view.uid_of), spec.fault.actions, time.monotonic() - t0)
        if fuzz is not None:
            run.fuzz_writes = fuzz.stop()
        return run
    finally:
        if fuzz is not None:
            fuzz.stop()
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # its own session: nothing it started survives
                except ProcessLookupError:
                    pass
            p.wait()
        if store is not shared_store:
            store.close()
        if fs is not None:
            fs.close()
