"""The launchers' deaths: the process that started the workers dies while they train.

- ``launcher_sigterm``, ``launcher_sigkill``: ``dra run --nproc N`` (the pool's launcher, which hosts
  the job's store) gets SIGTERM or SIGKILL mid-training. Nothing may be left behind: every worker
  must be gone 5 s after the launcher died (an orphan keeps training without its store and loses
  the job at the next fault), and no committed sample may be repeated.
- ``agent_rdzv_host``: three torchrun agents (one worker each) as docs/guide/launch.md's crash
  recipe runs them: the c10d rendezvous and the workers on one dedicated store (``DRA_STORE``); the
  first agent, the one that would host the rendezvous without that store, is killed. The job must go
  on with the other agents' workers (it is lost when they are stopped), and the dead agent's worker
  must not run on as an orphan (a worker under torchrun dies with its agent). With the rendezvous on
  an agent's node instead, that agent's death ends every agent (torch's ``RendezvousConnectionError``):
  not survived, as the guide says; this trial does not run that layout.

These trials run their own launchers (``Fault.runner``); the checker reads the same worker records
as every other trial, and the runner adds its own problems (orphans, a lost job) to the run's notes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from dra_bench._faults.registry import register, step_at
from dra_bench._faults.trial import POLL_S, Action, Fault, JobSpec, StoreProcess, TrialRun, TrialSpec

ORPHAN_GRACE_S = 5.0  # a worker still running this long after its launcher died is an orphan


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pids_with(token: str) -> list[int]:
    """Every process of this trial (they all carry the token in their environment)."""
    needle = f"DRA_FAULTS_TOKEN={token}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def _records(out: Path) -> list[dict]:
    recs = []
    for path in sorted(out.glob("samples-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return recs


def _worker_env(job: JobSpec, out: Path, token: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHELASTIC_", "DRA_", "MASTER_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    cfg = {k: v for k, v in job.__dict__.items() if k != "schedule"}
    cfg.update(out=str(out), schedule={str(k): v for k, v in job.schedule.items()})
    env.update(DRA_FAULT_JOB=json.dumps(cfg), DRA_FAULTS_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _watch(
    spec: TrialSpec, out: Path, procs: dict[str, subprocess.Popen], target: str, sig: int, token: str, timeout_s: float
) -> TrialRun:
    """Waits for step `at`, sends `sig` to procs[target], counts the trial's workers still running
    ORPHAN_GRACE_S later, then waits (bounded) for the others and ends everything."""
    action = spec.fault.actions[0]
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    notes: list[str] = []
    orphans_checked = False
    while time.monotonic() < deadline:
        recs = _records(out)
        step = max((r["step"] for r in recs if r["kind"] == "attempt"), default=-1)
        now = time.monotonic()
        if action.fired_at is None and step >= action.at_step:
            action.fired_at, action.fired_wall, action.hit = now, time.time(), target
            procs[target].send_signal(sig)
        if action.fired_at is not None and not orphans_checked and now >= action.fired_at + ORPHAN_GRACE_S:
            orphans_checked = True
            dead = {procs[target].pid}
            workers = {r["pid"]: r["uid"] for r in recs if r["kind"] == "attempt"}
            children = spec.fault.description  # for the note
            orphans = sorted(u for p, u in workers.items() if p not in dead and _alive(p) and _orphaned(p, procs, target))
            if orphans:
                notes.append(
                    f"orphans: workers {orphans} still run {ORPHAN_GRACE_S:g} s after the {target} died ({children})"
                )
        if orphans_checked and all(p.poll() is not None for n, p in procs.items() if n != target):
            break
        time.sleep(POLL_S)
    codes = {n: p.poll() for n, p in procs.items()}
    for pid in _pids_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()
    run = TrialRun(spec, out, {}, {}, spec.fault.actions, time.monotonic() - t0)
    run.notes = notes + [f"{n} exited {c}" for n, c in sorted(codes.items())]
    return run


def _orphaned(pid: int, procs: dict[str, subprocess.Popen], target: str) -> bool:
    """A worker whose launcher is the dead process (its parent chain no longer reaches an agent
    that is alive): for dra run every worker; for torchrun, the dead agent's."""
    if target == "launcher":
        return True
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    live_agents = {p.pid for n, p in procs.items() if n != target and p.poll() is None}
    return ppid not in live_agents


def run_launcher_trial(spec: TrialSpec, out: Path, _launcher: object, timeout_s: float) -> TrialRun:
    out.mkdir(parents=True, exist_ok=True)
    job, token = spec.job, uuid.uuid4().hex
    env = _worker_env(job, out, token)
    cmd = [sys.executable, "-m", "dra", "run", "--nproc", str(job.nproc), "--job", f"faults-{spec.seed}-{token[:8]}",
           "--log-dir", str(out / "logs"), "--", sys.executable, "-m", "dra_bench._faults.worker"]  # fmt: skip
    with open(out / "out-launcher.txt", "w") as fh:
        launcher = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    sig = signal.SIGTERM if spec.kind == "launcher_sigterm" else signal.SIGKILL
    return _watch(spec, out, {"launcher": launcher}, "launcher", sig, token, timeout_s)


def run_agent_trial(spec: TrialSpec, out: Path, _launcher: object, timeout_s: float) -> TrialRun:
    out.mkdir(parents=True, exist_ok=True)
    job, token = spec.job, uuid.uuid4().hex
    store = StoreProcess()  # docs/guide/launch.md's recipe: the rendezvous and the job on one dedicated store
    procs: dict[str, subprocess.Popen] = {}
    try:
        for node in range(job.nproc):
            env = _worker_env(job, out, token)
            env.update(DRA_STORE=store.address, LOGLEVEL="WARNING")
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={job.nproc}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint={store.address}", f"--rdzv-id=faults-{token[:8]}",
                   f"--local-addr=127.0.0.{node + 1}",
                   "--max-restarts=0", "-m", "dra_bench._faults.worker"]  # fmt: skip
            with open(out / f"out-agent{node}.txt", "w") as fh:
                procs[f"agent{node}"] = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        return _watch(spec, out, procs, "agent0", signal.SIGKILL, token, timeout_s)
    finally:
        store.close()


def _launcher_death(kind: str, signame: str):
    def make(rng: random.Random, job: JobSpec) -> Fault:
        step = step_at(rng, job)
        return Fault(kind, f"{signame} of dra run at step {step}", actions=[Action("launcher", step, sig=0)],
                     runner=run_launcher_trial)  # fmt: skip

    return make


for _signame in ("SIGTERM", "SIGKILL"):
    _kind = f"launcher_{_signame.lower()}"
    register(_kind, f"dra run (which hosts the store) gets {_signame} mid-training: no worker may outlive it by 5 s",
             languages=("py",), klass="launcher")(_launcher_death(_kind, _signame))  # fmt: skip


@register(
    "agent_rdzv_host",
    "torchrun, one agent per node, rendezvous and job on a dedicated store (the recipe): the first agent is killed",
    languages=("py",), klass="launcher",
)  # fmt: skip
def _agent_rdzv_host(rng: random.Random, job: JobSpec) -> Fault:
    job.nproc = job.start_size = job.max_size = 3
    step = step_at(rng, job)
    return Fault("agent_rdzv_host", f"SIGKILL of the first torchrun agent at step {step}",
                 actions=[Action("agent0", step, sig=0)], runner=run_agent_trial)  # fmt: skip
