"""The checks every fault trial passes or fails, from the records its processes wrote.

- **Exactly-once data.** A step's ``commit`` records say which world epoch committed it (a step
  redone after a fault is committed again in a later epoch: the latest counts). Every rank of that
  world wrote an ``attempt`` record (its share) before the step's reduction, so the shares of the
  committing world are complete even when a rank died right after the reduction. Over the
  committed steps of each data epoch every sample must be seen exactly once: the samples missing
  are *lost*, the ones seen twice *repeated*.
- **Training completed** on every process that ended as a member, and their state digests are
  identical (parameters, buffers, optimizer state).
- **Every process ended** within the trial's deadline (else it *hung*), with the exit code its
  fault gives it: -9 for a process killed, 1 for one that raised an exception nobody caught or a
  joiner refused at admission, 0 for every other one.
- **Only the dead are reported gone**: no fault event names a process that no fault hit (a process
  that stepped out of a world split by overwritten store keys is not a failure of an outside-writer
  trial).
- **Diagnostics never stop training**: every line of the events file is a whole record, and a
  process warns about an events file it cannot write at most once.
- **Resume time**: from the fault to the first step committed by a world formed after it.
- **A job is lost** when no process finished training as a member (the report counts them per
  class). A launcher's trial is judged on what its launcher leaves behind: no worker may still run
  5 s after the launcher died, no committed sample may be repeated, and a job whose other agents
  live on must complete.
"""

from __future__ import annotations

import json
import math
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_bench._faults.trial import TrialRun


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    samples_lost: int = 0
    samples_repeated: int = 0
    hung: list[str] = field(default_factory=list)
    fired: bool = False
    fault_time: float | None = None
    resume_s: float | None = None
    notes: list[str] = field(default_factory=list)  # what the reader should know; not problems
    job_lost: bool = False  # no process finished training as a member
    orphans: int = 0  # workers still running 5 s after their launcher died
    fuzz_writes: int = 0  # bad values another client wrote into the job's keys

    @property
    def survived(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "survived": self.survived,
            "problems": self.problems,
            "samples_lost": self.samples_lost,
            "samples_repeated": self.samples_repeated,
            "hung": self.hung,
            "fired": self.fired,
            "resume_s": self.resume_s,
            "notes": self.notes,
            "job_lost": self.job_lost,
            "orphans": self.orphans,
            "fuzz_writes": self.fuzz_writes,
        }


def load_records(out: Path) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for path in sorted(out.glob("samples-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # the last line of a process killed while writing it
    return recs


def events_path(out: Path) -> Path | None:
    """The trial's events file (a filesystem trial's is copied out of its broken folder)."""
    for path in (out / "fs-copy" / "events.jsonl", out / "fs" / "events.jsonl", out / "events.jsonl"):
        if path.is_file():
            return path
    return None


def load_events(out: Path, partial: list[str] | None = None) -> list[dict[str, Any]]:
    """The events; a line that is not a whole record is left out and reported to `partial`."""
    path = events_path(out)
    if path is None:
        return []
    events = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if partial is not None:
                partial.append(f"line {n} of the events file is not a whole record: {line[:80]!r}")
    return events


def exactly_once(recs: list[dict[str, Any]], dataset: int, epochs: int) -> tuple[int, int, list[str]]:
    """(samples lost, samples repeated, problems) over the committed steps' sample records."""
    problems: list[str] = []
    committing: dict[int, dict[str, Any]] = {}
    for r in recs:
        if r["kind"] == "commit" and (
            r["step"] not in committing or r["world_epoch"] > committing[r["step"]]["world_epoch"]
        ):
            committing[r["step"]] = r
    shares: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for r in recs:
        if r["kind"] == "attempt":
            shares.setdefault((r["step"], r["world_epoch"]), {})[r["rank"]] = r
    seen: dict[int, Counter[int]] = {e: Counter() for e in range(epochs)}
    for step, c in sorted(committing.items()):
        by_rank = shares.get((step, c["world_epoch"]), {})
        world = next(iter(by_rank.values()))["world"] if by_rank else 0
        if not by_rank or sorted(by_rank) != list(range(world)):
            problems.append(
                f"step {step} (world epoch {c['world_epoch']}): shares of ranks "
                f"{sorted(set(range(max(world, 1))) - set(by_rank))} missing from the records"
            )
        for r in by_rank.values():
            if r["data_epoch"] != c["data_epoch"]:
                problems.append(
                    f"step {step}: rank {r['rank']} took data epoch {r['data_epoch']}, the commit says "
                    f"{c['data_epoch']}"
                )
            seen.setdefault(r["data_epoch"], Counter()).update(r["ids"])
    lost = repeated = 0
    for e, counts in sorted(seen.items()):
        missing = dataset - sum(1 for i in range(dataset) if counts[i] > 0)
        extra = sum(n - 1 for n in counts.values() if n > 1) + sum(n for i, n in counts.items() if not 0 <= i < dataset)
        lost += missing
        repeated += extra
        if missing or extra:
            problems.append(f"data epoch {e}: {missing} samples lost, {extra} repeated")
    return lost, repeated, problems


def resume_time(recs: list[dict[str, Any]], fault_time: float) -> float | None:
    """Seconds from `fault_time` to the first commit by a world formed after it."""
    commits = sorted((r["time"], r["world_epoch"]) for r in recs if r["kind"] == "commit")
    before = max((e for t, e in commits if t <= fault_time), default=-1)
    after = [t for t, e in commits if t > fault_time and e > before]
    return after[0] - fault_time if after else None


def landed_after_training(recs: list[dict[str, Any]], fault_time: float, total_steps: int) -> bool:
    """Whether every step of the job was committed before `fault_time`."""
    commits = [r for r in recs if r["kind"] == "commit"]
    steps = {r["step"] for r in commits}
    return steps >= set(range(total_steps)) and max((r["time"] for r in commits), default=math.inf) <= fault_time


def judge_launcher(run: TrialRun) -> Verdict:
    """A launcher's trial: orphans, repeated samples, and (torchrun agents) a job lost."""
    spec, job, v = run.spec, run.spec.job, Verdict()
    recs = load_records(run.out)
    v.fired = any(a.hit is not None for a in run.actions)
    v.fault_time = next((a.fired_wall for a in run.actions if a.hit is not None), None)
    for note in run.notes:
        if note.startswith("orphans:"):
            v.orphans = len(note.split("[", 1)[1].split("]", 1)[0].split(","))
            v.problems.append(note)
        else:
            v.notes.append(note)
    _, v.samples_repeated, _ = exactly_once(recs, job.dataset, job.epochs)
    if v.samples_repeated:
        v.problems.append(f"{v.samples_repeated} committed samples repeated")
    finals = [r for r in recs if r["kind"] == "final" and r["member"] and r["step"] == job.total_steps]
    if spec.kind == "agent_rdzv_host":
        v.job_lost = not finals
        if v.job_lost:
            v.problems.append("job lost: no worker finished training after the first agent died")
        else:
            v.samples_lost, _, problems = exactly_once(recs, job.dataset, job.epochs)
            v.problems += problems
    return v


def judge(run: TrialRun) -> Verdict:
    if run.spec.fault.runner is not None:
        return judge_launcher(run)
    spec, job, v = run.spec, run.spec.job, Verdict()
    v.fuzz_writes = run.fuzz_writes
    v.fired = run.fuzz_writes > 0  # an outside writer's fault is its values: no action, no record
    recs = load_records(run.out)
    # Who was hit: driver-side actions (by name) and in-process faults (their records name the uid).
    killed: set[str] = set()
    hit: set[str] = set()
    times: list[float] = []
    for a in run.actions:
        if a.hit is not None:
            v.fired = True
            times.append(a.fired_wall)
            if a.hit != "store":
                hit.add(a.hit)
                if a.sig == signal.SIGKILL and a.resume_after_s is None:
                    killed.add(a.hit)
    name_of_uid = {u: n for n, u in run.uid_of.items()}
    for r in recs:
        if r["kind"] == "fault":
            v.fired = True
            times.append(r["time"])
            name = name_of_uid.get(r["uid"])
            if name is not None:
                hit.add(name)
                if r["action"] == "kill":
                    killed.add(name)
    v.fault_time = min(times) if times else None

    v.hung = sorted(n for n, c in run.codes.items() if c is None)
    if v.hung:
        v.problems.append(f"hung: {', '.join(v.hung)} still running after {run.wall_s:.0f} s")
    for name, code in sorted(run.codes.items()):
        if code is None:
            continue
        want = -9 if name in killed else spec.fault.expect_codes.get(name, 0)
        if code != want:
            tail = (run.out / f"out-{name}.txt").read_text(errors="replace")[-600:].strip().replace("\n", " | ")
            v.problems.append(f"{name} exited {code}, expected {want}: {tail}")
    for name, variant in job.variants.items():
        # A mismatched joiner's fault is its request to join: it fired when admission refused it
        # (its output names the refusal); one that exited for another reason is a problem.
        log = run.out / f"out-{name}.txt"
        if "StateMismatchError" in (log.read_text(errors="replace") if log.exists() else ""):
            v.fired = True
        elif run.codes.get(name) is not None:
            v.problems.append(f"{name} (another {variant}) was not refused at admission (no StateMismatchError)")

    v.samples_lost, v.samples_repeated, data_problems = exactly_once(recs, job.dataset, job.epochs)
    v.problems += data_problems

    finals = [r for r in recs if r["kind"] == "final"]
    members = [r for r in finals if r["member"]]
    if not members:
        v.job_lost = True
        v.problems.append("no process finished training as a member")
    elif any(r["step"] != job.total_steps for r in members):
        v.problems.append(
            f"training incomplete: members ended at steps {sorted({r['step'] for r in members})}, "
            f"expected {job.total_steps}"
        )
    if len({r["digest"] for r in members}) > 1:
        v.problems.append(
            f"state differs between the final members: {sorted((r['uid'], r['digest']) for r in members)}"
        )
    for name, code in run.codes.items():
        uid = run.uid_of.get(name)
        if code == 0 and uid is not None and not any(r["uid"] == uid for r in finals):
            v.problems.append(f"{name} exited 0 without its final record")

    alive_uids = {run.uid_of[n] for n in run.codes if n not in hit and n in run.uid_of}
    outputs = {n: (run.out / f"out-{n}.txt").read_text(errors="replace") for n in run.codes if (run.out / f"out-{n}.txt").exists()}
    if spec.fault.allow_step_out:
        # Survivors split by overwritten store keys: the group that found another world ahead of it
        # stepped out (stood by) instead of training as a second world. Alive, not dead, not a fault.
        alive_uids -= {run.uid_of[n] for n, text in outputs.items() if "steps out" in text and n in run.uid_of}
    for name, text in outputs.items():
        # Once per streak: a full disk can take a short line again between two failures (said so).
        warned = text.count("cannot append to events_path")
        streaks = 1 + text.count("is writable again")
        if warned > streaks:
            v.problems.append(f"{name} warned {warned} times about the events file in {streaks} streak(s) "
                              "(once per streak is the rule)")
    partial: list[str] = []
    events = load_events(run.out, partial)
    v.problems += partial
    for ev in events:
        if ev.get("event") != "fault":
            continue
        if spec.fault.expect_no_fault_event:
            v.problems.append(
                f"a fault was declared at step {ev['step']} (left {ev['left']}): {ev.get('reason', '')[:200]}"
            )
        wrong = sorted(set(ev["left"]) & alive_uids)
        if wrong:
            v.problems.append(f"fault event at step {ev['step']} lists live processes {wrong} among those who left")

    if v.fired and spec.fault.measure_resume and v.fault_time is not None:
        v.resume_s = resume_time(recs, v.fault_time)
        if v.resume_s is None and landed_after_training(recs, v.fault_time, job.total_steps):
            # The driver saw the chosen step late (a loaded host) and the fault landed after the
            # last step: training was over, there was nothing to resume. Not a fault of this trial.
            v.fired = False
            v.notes.append("the fault landed after the last step was committed")
        elif v.resume_s is None and not v.problems:
            v.problems.append("no step was committed after the fault")
    return v
