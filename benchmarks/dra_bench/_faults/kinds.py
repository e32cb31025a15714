"""The fault kinds a trial draws from, by name.

A kind turns a seeded random generator into one trial: the job (how many processes, who stands by,
which resizes are scheduled) and the fault (in-process specs for a process, driver-side actions).
Each kind belongs to a class, one row of the report: the kinds of ``process`` (kill -9, SIGSTOP,
the store, a slow peer), of ``outside`` (filesystem, store_writers, exceptions, joiners) and of
``launchers`` (launcher), each module registering its own with ``registry.register``.
Everything random about a trial comes from its seed, so a trial reproduces from
``(seed, kind, language)``. Later parts add their own kinds with ``register``: a kind that needs
another launcher (``dra run``'s workers, an emulated NCCL world, RL roles) says so in
``languages`` and builds its trial the same way.
"""

from __future__ import annotations

import random

# Each module registers its kinds on import.
from dra_bench._faults import launchers, outside, process  # noqa: F401
from dra_bench._faults.registry import CLASSES, KINDS, FaultKind, register
from dra_bench._faults.trial import JobSpec, TrialSpec

__all__ = ["CLASSES", "KINDS", "FaultKind", "make_trial", "register", "unavailable"]


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
