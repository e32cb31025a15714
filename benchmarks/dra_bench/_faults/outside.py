"""Faults from outside the training processes: a filesystem that fails under the job, another
client writing bad values into the job's store keys, exceptions in the training loop, joiners that
do not match the world. Each registers its fault kinds with ``dra_bench._faults.kinds.register``
under its class (the report has one row per class).

- **filesystem** (``fs_readonly``, ``fs_full``, ``fs_notdir``): the folder the job writes its events
  and rank 0's checkpoints to is a small tmpfs (256 KiB, mounted by the driver: root only) that is
  remounted read-only or filled up (ENOSPC is real: the events file's last page fills, then the
  write stops mid-line), or a folder replaced by a file (ENOTDIR). Resizes after the fault make the
  leader write events. Checked: the job completes exactly once, every line of the events file is a
  whole record, and each process warned about the events file at most once.
- **store_writers** (``store_fuzz``): another client writes wrong types, garbage, huge and empty
  values into every key of the job's protocol (with the world's current epochs and uids) every
  few milliseconds while it trains and resizes. Checked: the job completes exactly once; a process
  that stepped out of a world that overwritten keys split is not a failure.
- **exceptions** (``exception_uncaught``, ``exception_caught``): an exception nobody catches in a
  member's or the leader's step (the process ends with it; the others resume within
  fault_timeout_s + 1.5 s), or one the training loop catches and goes on from, before backward (the
  batch it was handed is skipped) or after it (no optimizer step, no dra.step).
- **joiners** (``joiner_mismatch``): a late joiner whose model, optimizer class or dtype differs
  from the world's is refused at admission, before anything is sent; the world is untouched.

``store_values`` generates the values (the live writer and the protocol-level fuzzer of
``dra_bench._faults.fuzz`` share it).
"""

from __future__ import annotations

import random

from dra_bench._faults.registry import in_step_delay, register, step_at
from dra_bench._faults.spec import FaultSpec
from dra_bench._faults.tamper import mount_unavailable
from dra_bench._faults.trial import Action, Fault, JobSpec, View


def _filesystem_fault(kind: str, what: str, rng: random.Random, job: JobSpec) -> Fault:
    job.checkpoint_every = 4
    step = step_at(rng, job, 4, 20)
    # The leader writes events after the fault: a shrink and a grow follow it. A full disk leaves
    # the events file the rest of its last page (up to 4 KiB, 6 or 7 events): four of each follow
    # it, so that a write runs out of room mid-line.
    pairs = 4 if kind == "fs_full" else 1
    job.schedule = {}
    for k in range(pairs):
        job.schedule.update({step + 2 + 4 * k: job.nproc - 1, step + 4 + 4 * k: job.nproc})
    fault = Fault(kind, f"the events and checkpoint folder {what} at step {step} (resizes at {sorted(job.schedule)})")
    fault.fs = "dir" if kind == "fs_notdir" else "tmpfs"
    fault.actions = [Action("fs", step, in_step_delay(rng, job), sig=0)]
    return fault


def _bind_fs_action(fault: Fault, method: str) -> Fault:
    """The action calls the trial's filesystem (made when the trial starts)."""
    action = fault.actions[0]

    def call(view: View) -> str | None:
        return getattr(view.fs, method)(view) if getattr(view, "fs", None) is not None else None

    action.call = call
    return fault


@register("fs_readonly", "the events/checkpoint folder is remounted read-only mid-training", klass="filesystem",
          needs=mount_unavailable)
def _fs_readonly(rng: random.Random, job: JobSpec) -> Fault:
    return _bind_fs_action(_filesystem_fault("fs_readonly", "becomes read-only", rng, job), "readonly")


@register("fs_full", "the events/checkpoint folder's filesystem fills up (ENOSPC) mid-training", klass="filesystem",
          needs=mount_unavailable)
def _fs_full(rng: random.Random, job: JobSpec) -> Fault:
    return _bind_fs_action(_filesystem_fault("fs_full", "fills up (ENOSPC)", rng, job), "full")


@register("fs_notdir", "the events/checkpoint folder is replaced by a file (ENOTDIR) mid-training", klass="filesystem")
def _fs_notdir(rng: random.Random, job: JobSpec) -> Fault:
    return _bind_fs_action(_filesystem_fault("fs_notdir", "is replaced by a file (ENOTDIR)", rng, job), "not_a_folder")


@register(
    "store_fuzz",
    "another client writes wrong types, garbage, huge and empty values into every key of the job every 20 ms",
    klass="store_writers",
)
def _store_fuzz(rng: random.Random, job: JobSpec) -> Fault:
    # A shrink and a grow while it writes: decisions, admissions and the epoch counter are in use.
    shrink = rng.randint(6, 10)
    job.schedule = {shrink: job.nproc - 1, shrink + 6: job.nproc}
    return Fault(
        "store_fuzz",
        f"an outside client writes a bad value every 20 ms from step 1 (shrink at {shrink}, grow at {shrink + 6})",
        fuzz_interval_s=0.02,
        allow_step_out=True,
    )


# ---- exceptions in the training loop ------------------------------------------------------------------
def _where_an_exception_hits(rng: random.Random, job: JobSpec) -> tuple[int, str, str, str]:
    """The step, "leader" or "member", the process's name, and before ("step") or after backward."""
    step = step_at(rng, job)
    who = rng.choice(("leader", "member"))
    name = "r0" if who == "leader" else f"r{rng.randint(1, job.nproc - 1)}"
    return step, who, name, rng.choice(("step", "after_reduce"))


@register(
    "exception_uncaught",
    "an exception nobody catches in a member's or the leader's step: the process ends, the others resume",
    klass="exceptions",
)
def _exception_uncaught(rng: random.Random, job: JobSpec) -> Fault:
    step, who, name, where = _where_an_exception_hits(rng, job)
    return Fault(
        "exception_uncaught",
        f"an uncaught exception in the {who} ({name}) at step {step} ({'before backward' if where == 'step' else 'after backward'})",
        specs={name: [FaultSpec("raise", where, step)]},
        expect_codes={name: 1},
        measure_resume=True,
    )


@register(
    "exception_caught",
    "the training loop catches an exception in a member's or the leader's step and goes on with its next batch",
    klass="exceptions",
)
def _exception_caught(rng: random.Random, job: JobSpec) -> Fault:
    step, who, name, where = _where_an_exception_hits(rng, job)
    what = "the batch it was handed" if where == "step" else "its optimizer step and dra.step"
    return Fault(
        "exception_caught",
        f"the {who} ({name}) catches an exception at step {step} and skips {what}",
        specs={name: [FaultSpec("catch", where, step)]},
    )


# ---- joiners that do not match the world ---------------------------------------------------------------
@register(
    "joiner_mismatch",
    "a late joiner whose model, optimizer class or dtype differs from the world's is refused at admission",
    languages=("py",),
    klass="joiners",
)
def _joiner_mismatch(rng: random.Random, job: JobSpec) -> Fault:
    variant = rng.choice(("model", "optimizer", "dtype"))
    job.late_joiners = 1
    job.max_size = job.nproc + 1
    job.wait_candidates = 1
    grow = step_at(rng, job, 3, 8)
    job.schedule = {grow: job.nproc + 1}
    job.variants = {"j0": variant}
    return Fault(
        "joiner_mismatch",
        f"a late joiner with another {variant} asks to join (grow scheduled at step {grow})",
        expect_codes={"j0": 1},
    )
