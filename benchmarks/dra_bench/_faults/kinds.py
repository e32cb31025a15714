"""The fault kinds a trial draws from, by name.

A kind turns a seeded random generator into one trial: the job (how many processes, who stands by,
which resizes are scheduled) and the fault (in-process specs for a process, driver-side actions).
Each kind belongs to a class, one row of the report: ``process`` (the kinds here: kill -9, SIGSTOP,
the store, a slow peer), and the classes of ``outside`` (filesystem, store_writers, exceptions,
joiners) and ``launchers`` (launcher).
Everything random about a trial comes from its seed, so a trial reproduces from
``(seed, kind, language)``. Later parts add their own kinds with ``register``: a kind that needs
another launcher (``dra run``'s workers, an emulated NCCL world, RL roles) says so in
``languages`` and builds its trial the same way.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from dataclasses import dataclass

from dra_bench._faults.spec import FaultSpec
from dra_bench._faults.trial import Action, Fault, JobSpec, TrialSpec

PHASES = ("rebuild", "state_transfer", "reshard")


@dataclass
class FaultKind:
    name: str
    doc: str
    build: Callable[[random.Random, JobSpec], Fault]  # may adjust the job
    languages: tuple[str, ...] = ("py", "cpp")
    klass: str = "process"  # the report's row: process, filesystem, store_writers, launcher, exceptions, joiners
    needs: Callable[[], str] | None = None  # why this machine cannot run the kind ("" : it can)


KINDS: dict[str, FaultKind] = {}
CLASSES = ("process", "filesystem", "store_writers", "launcher", "exceptions", "joiners")


def register(
    name: str,
    doc: str,
    languages: tuple[str, ...] = ("py", "cpp"),
    klass: str = "process",
    needs: Callable[[], str] | None = None,
):
    """Decorator: registers `build(rng, job) -> Fault` as the fault kind `name` of the class `klass`;
    `needs()` says why a machine cannot run it ("" when it can)."""
    if klass not in CLASSES:
        raise ValueError(f"klass: unknown fault class '{klass}'; known: {', '.join(CLASSES)}")

    def wrap(build: Callable[[random.Random, JobSpec], Fault]) -> Callable[[random.Random, JobSpec], Fault]:
        if name in KINDS:
            raise ValueError(f"fault kind '{name}' is registered twice")
        KINDS[name] = FaultKind(name, doc, build, languages, klass, needs)
        return build

    return wrap


def unavailable(kind: str) -> str:
    """Why this machine cannot run `kind` ("" when it can)."""
    needs = KINDS[kind].needs
    return needs() if needs is not None else ""


def make_trial(seed: int, kind: str, language: str, fault_timeout_s: float = 2.0) -> TrialSpec:
    if kind not in KINDS:
        raise ValueError(f"kind: unknown fault kind '{kind}'; known: {', '.join(sorted(KINDS))}")
    if language not in KINDS[kind].languages:
        raise ValueError(f"kind '{kind}' runs on {KINDS[kind].languages}, not '{language}'")
    rng = random.Random(f"{seed}:{kind}:{language}")
    job = JobSpec(language=language, fault_timeout_s=fault_timeout_s)
    job.nproc = job.start_size = job.max_size = rng.choice((3, 4))
    fault = KINDS[kind].build(rng, job)
    return TrialSpec(seed, kind, job, fault)


def _step(rng: random.Random, job: JobSpec, low: int = 2, tail: int = 4) -> int:
    return rng.randint(low, job.total_steps - tail)


def _in_step_delay(rng: random.Random, job: JobSpec) -> float:
    """A moment inside a step: anywhere in its compute, reduction or boundary."""
    return rng.uniform(0.0, 2.0 * job.compute_ms / 1000.0 + 0.02)


def _add_joiner(rng: random.Random, job: JobSpec) -> str:
    """One process waits to be admitted: a candidate launched with the others (uid >= start_size),
    or a late joiner (DRA_JOIN=1, uid 10000)."""
    job.wait_candidates = 1  # the world trains once it waits: a scheduled grow then admits it
    if rng.random() < 0.5:
        job.start_size = job.nproc - 1
        return f"r{job.nproc - 1}"
    job.late_joiners = 1
    job.max_size = job.nproc + 1
    return "j0"


def _kill_one(kind: str, who: str, rng: random.Random, job: JobSpec) -> Fault:
    step = _step(rng, job)
    article = "the" if who == "leader" else "a"
    return Fault(
        kind,
        f"kill -9 of {article} {who} at step {step}",
        actions=[Action(who, step, _in_step_delay(rng, job))],
        measure_resume=True,
    )


@register("kill_member", "kill -9 of a member other than the leader, at a random moment of a random step")
def _kill_member(rng: random.Random, job: JobSpec) -> Fault:
    return _kill_one("kill_member", "member", rng, job)


@register("kill_leader", "kill -9 of the leader (rank 0 now), at a random moment of a random step")
def _kill_leader(rng: random.Random, job: JobSpec) -> Fault:
    return _kill_one("kill_leader", "leader", rng, job)


@register("kill_two", "kill -9 of two members (the leader among them half the time) within 100 ms")
def _kill_two(rng: random.Random, job: JobSpec) -> Fault:
    job.nproc = job.start_size = job.max_size = 4
    step, d = _step(rng, job), _in_step_delay(rng, job)
    first = "leader" if rng.random() < 0.5 else "member"
    other = "a member" if first == "leader" else "another member"
    return Fault(
        "kill_two",
        f"kill -9 of the {first} and {other} within 100 ms at step {step}",
        actions=[Action(first, step, d), Action("member", step, d + rng.uniform(0.0, 0.1))],
        measure_resume=True,
    )


@register(
    "kill_in_resize", "kill -9 of the leader, a member or the joiner inside a phase of a scheduled grow or shrink"
)
def _kill_in_resize(rng: random.Random, job: JobSpec) -> Fault:
    at = _step(rng, job, 3, 8)
    phase = rng.choice(PHASES)
    if rng.random() < 0.6:  # a grow admits a waiting process
        joiner = _add_joiner(rng, job)
        job.schedule = {at: job.start_size + 1}
        who = rng.choice(("leader", "member", "joiner"))
        name = {"leader": "r0", "member": "r1", "joiner": joiner}[who]
        change = 0 if who == "joiner" else 1  # the joiner's first world change is its admission
        what = "grow"
    else:
        job.schedule = {at: job.nproc - 1}
        who = rng.choice(("leader", "member"))
        name, change, what = ("r0" if who == "leader" else "r1"), 1, "shrink"
    return Fault(
        "kill_in_resize",
        f"kill -9 of the {who} ({name}) in {phase} of the {what} after step {at}",
        specs={name: [FaultSpec("kill", phase, change)]},
        measure_resume=True,
    )


@register("kill_joiner", "kill -9 of a joiner while it waits to be admitted, or right after its admission")
def _kill_joiner(rng: random.Random, job: JobSpec) -> Fault:
    joiner = _add_joiner(rng, job)
    grow = _step(rng, job, 5, 8)
    job.schedule = {grow: job.start_size + 1}
    if rng.random() < 0.5:
        step = rng.randint(1, grow - 2)
        return Fault(
            "kill_joiner",
            f"kill -9 of the waiting joiner {joiner} at step {step}, before the grow at {grow}",
            actions=[Action(joiner, step, _in_step_delay(rng, job))],
        )
    step = grow + rng.randint(2, 3)
    return Fault(
        "kill_joiner",
        f"kill -9 of the joiner {joiner} at step {step}, admitted by the grow at {grow}",
        actions=[Action(joiner, step, _in_step_delay(rng, job))],
        measure_resume=True,
    )


@register("kill_standby", "kill -9 of a member released by a shrink while it stands by; a later grow re-admits")
def _kill_standby(rng: random.Random, job: JobSpec) -> Fault:
    shrink = _step(rng, job, 3, 14)
    grow = rng.randint(shrink + 5, job.total_steps - 5)
    job.schedule = {shrink: job.nproc - 1, grow: job.nproc}
    step = rng.randint(shrink + 2, grow - 2)
    return Fault(
        "kill_standby",
        f"kill -9 of the standby at step {step} (shrink at {shrink}, grow at {grow})",
        actions=[Action("waiting", step, _in_step_delay(rng, job))],
    )


@register("stop_past_timeout", "SIGSTOP of a member or the leader for longer than fault_timeout_s, then SIGCONT")
def _stop(rng: random.Random, job: JobSpec) -> Fault:
    step = _step(rng, job)
    hold = job.fault_timeout_s + rng.uniform(0.5, 2.0)
    who = rng.choice(("leader", "member"))
    return Fault(
        "stop_past_timeout",
        f"SIGSTOP of the {who} at step {step} for {hold:.1f} s",
        actions=[Action(who, step, _in_step_delay(rng, job), signal.SIGSTOP, hold)],
        measure_resume=True,
    )


@register("kill_store", "kill -9 of the dedicated store while training; the leader keeps touching it")
def _kill_store(rng: random.Random, job: JobSpec) -> Fault:
    # Steps long enough that the leader reads and writes the store (candidates, limit, report: once
    # a second) a few times after it died, and rank 0's code after the loop runs at the end.
    job.private_store = True
    job.compute_ms = 100.0
    step = rng.randint(2, 8)
    return Fault(
        "kill_store", f"kill -9 of the store at step {step}", actions=[Action("store", step, _in_step_delay(rng, job))]
    )


@register(
    "slow_peer", "a member stalls for 20-40 % of fault_timeout_s, mid-step or inside a resize: nobody is declared dead"
)
def _slow_peer(rng: random.Random, job: JobSpec) -> Fault:
    stall = rng.uniform(0.2, 0.4) * job.fault_timeout_s
    if rng.random() < 0.5:
        step = _step(rng, job)
        who = rng.choice(("leader", "member"))
        return Fault(
            "slow_peer",
            f"the {who} stalls {stall:.2f} s (SIGSTOP, SIGCONT) at step {step}",
            actions=[Action(who, step, _in_step_delay(rng, job), signal.SIGSTOP, stall)],
            expect_no_fault_event=True,
        )
    at = _step(rng, job, 3, 8)
    job.start_size = job.nproc - 1
    job.wait_candidates = 1
    job.schedule = {at: job.nproc}
    phase = rng.choice(PHASES)
    name = rng.choice(("r0", "r1", f"r{job.nproc - 1}"))
    change = 0 if name == f"r{job.nproc - 1}" else 1
    return Fault(
        "slow_peer",
        f"{name} stalls {stall:.2f} s in {phase} of the grow after step {at}",
        specs={name: [FaultSpec("sleep", phase, change, round(stall, 3))]},
        expect_no_fault_event=True,
    )


# Faults from outside the processes (filesystem, store writers, exceptions, joiners) and the
# launchers' deaths register their kinds on import.
from dra_bench._faults import launchers, outside  # noqa: E402, F401
