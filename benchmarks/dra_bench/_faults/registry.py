"""The registry of fault kinds: what a kind is, ``register`` (a decorator each module of kinds
uses), and the draws every kind shares (a step of the job, a moment inside a step).

The kinds themselves live in ``process`` (kill -9, SIGSTOP, the store, a slow peer), ``outside``
(filesystem, store writers, exceptions, joiners) and ``launchers`` (launcher); ``kinds`` imports
them all and builds trials from any of them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from dra_bench._faults.trial import Fault, JobSpec


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


def step_at(rng: random.Random, job: JobSpec, low: int = 2, tail: int = 4) -> int:
    return rng.randint(low, job.total_steps - tail)


def in_step_delay(rng: random.Random, job: JobSpec) -> float:
    """A moment inside a step: anywhere in its compute, reduction or boundary."""
    return rng.uniform(0.0, 2.0 * job.compute_ms / 1000.0 + 0.02)
