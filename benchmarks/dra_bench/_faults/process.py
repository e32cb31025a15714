"""The fault kinds of the ``process`` class: a process killed (-9) at a step or inside a resize's
phase, two at once, a joiner or a standby killed, a process stopped (SIGSTOP) past the fault
timeout, the store killed, a slow peer inside a grow."""

from __future__ import annotations

import random
import signal

from dra_bench._faults.registry import in_step_delay, register, step_at
from dra_bench._faults.spec import FaultSpec
from dra_bench._faults.trial import Action, Fault, JobSpec

PHASES = ("rebuild", "state_transfer", "reshard")


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
    step = step_at(rng, job)
    article = "the" if who == "leader" else "a"
    return Fault(
        kind,
        f"kill -9 of {article} {who} at step {step}",
        actions=[Action(who, step, in_step_delay(rng, job))],
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
    step, d = step_at(rng, job), in_step_delay(rng, job)
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
    at = step_at(rng, job, 3, 8)
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
    grow = step_at(rng, job, 5, 8)
    job.schedule = {grow: job.start_size + 1}
    if rng.random() < 0.5:
        step = rng.randint(1, grow - 2)
        return Fault(
            "kill_joiner",
            f"kill -9 of the waiting joiner {joiner} at step {step}, before the grow at {grow}",
            actions=[Action(joiner, step, in_step_delay(rng, job))],
        )
    step = grow + rng.randint(2, 3)
    return Fault(
        "kill_joiner",
        f"kill -9 of the joiner {joiner} at step {step}, admitted by the grow at {grow}",
        actions=[Action(joiner, step, in_step_delay(rng, job))],
        measure_resume=True,
    )


@register("kill_standby", "kill -9 of a member released by a shrink while it stands by; a later grow re-admits")
def _kill_standby(rng: random.Random, job: JobSpec) -> Fault:
    shrink = step_at(rng, job, 3, 14)
    grow = rng.randint(shrink + 5, job.total_steps - 5)
    job.schedule = {shrink: job.nproc - 1, grow: job.nproc}
    step = rng.randint(shrink + 2, grow - 2)
    return Fault(
        "kill_standby",
        f"kill -9 of the standby at step {step} (shrink at {shrink}, grow at {grow})",
        actions=[Action("waiting", step, in_step_delay(rng, job))],
    )


@register("stop_past_timeout", "SIGSTOP of a member or the leader for longer than fault_timeout_s, then SIGCONT")
def _stop(rng: random.Random, job: JobSpec) -> Fault:
    step = step_at(rng, job)
    hold = job.fault_timeout_s + rng.uniform(0.5, 2.0)
    who = rng.choice(("leader", "member"))
    return Fault(
        "stop_past_timeout",
        f"SIGSTOP of the {who} at step {step} for {hold:.1f} s",
        actions=[Action(who, step, in_step_delay(rng, job), signal.SIGSTOP, hold)],
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
        "kill_store", f"kill -9 of the store at step {step}", actions=[Action("store", step, in_step_delay(rng, job))]
    )


@register(
    "slow_peer", "a member stalls for 20-40 % of fault_timeout_s, mid-step or inside a resize: nobody is declared dead"
)
def _slow_peer(rng: random.Random, job: JobSpec) -> Fault:
    stall = rng.uniform(0.2, 0.4) * job.fault_timeout_s
    if rng.random() < 0.5:
        step = step_at(rng, job)
        who = rng.choice(("leader", "member"))
        return Fault(
            "slow_peer",
            f"the {who} stalls {stall:.2f} s (SIGSTOP, SIGCONT) at step {step}",
            actions=[Action(who, step, in_step_delay(rng, job), signal.SIGSTOP, stall)],
            expect_no_fault_event=True,
        )
    at = step_at(rng, job, 3, 8)
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
