"""The live RL loop's worker processes as processes: how one is started in its slot, what a run
killed before its ``close()`` left behind, and which worker a failure comes from."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from dra.pool import _cgroup as cg


class WorkerError(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stopped(pid: int) -> bool:
    """Whether a process is stopped (SIGSTOP, a debugger): state T or t in /proc/<pid>/stat."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def child_setup(cgroup_paths: list[str] | None) -> None:
    """In the worker before exec: into its slot's cgroups, and killed if the coordinator dies
    (Linux PR_SET_PDEATHSIG), so no worker outlives an interrupted run."""
    import ctypes

    if cgroup_paths:
        cg.join(cgroup_paths)
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def remove_leftovers(out: Path, use_cgroups: bool) -> None:
    """What a run killed before its close() left: its start weights and staged versions in the out
    directory (locked by the caller, so nobody else's), and the cgroups of coordinators no longer
    alive."""
    for f in (out / "cache").glob("rl-live-start-*.pt"):
        f.unlink(missing_ok=True)
    shutil.rmtree(out / "stage", ignore_errors=True)
    if not use_cgroups:
        return
    for d in sorted((cg.ROOT / "cpu" / "dra").glob("rl-*-*")):
        m = re.fullmatch(r"rl-(\d+)-\d+", d.name)
        if m is None or _alive(int(m.group(1))):
            continue
        def occupied() -> bool:
            return any(_read_text(f) for c in cg.CONTROLLERS for f in (cg.ROOT / c / "dra" / d.name).glob("**/cgroup.procs"))

        # Its workers die with it (PR_SET_PDEATHSIG), a moment later on a loaded host: wait for them.
        deadline = time.monotonic() + 5.0
        while occupied() and time.monotonic() < deadline:
            time.sleep(0.05)
        if occupied():
            continue  # processes still inside: not ours to move
        try:
            cg.Slots(d.name, []).close()  # takes the name's lock: a live holder is never touched
        except (ValueError, OSError):
            pass


def worker_failure(procs: list[subprocess.Popen[bytes]], slot: int | None, what: str, out: Path) -> WorkerError:
    """The error for a worker that died or did not answer, naming the slot that failed first as
    far as can be told: the others often fail *because* of it (a collective with a dead or
    stopped peer), and the slot read first is not necessarily the culprit. A worker killed by
    a signal is named before those that exited with an error; every worker's state follows."""
    deadline = time.monotonic() + 2.0  # the collateral failures take a moment to show
    while time.monotonic() < deadline and not any((p.poll() or 0) < 0 for p in procs):
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    states = []
    killed = None
    for i, p in enumerate(procs):
        code = p.poll()
        if code is None:
            states.append(f"slot {i} {'stopped' if _stopped(p.pid) else 'running'}")
        elif code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            states.append(f"slot {i} killed by {name}")
            killed = killed if killed is not None else (i, name)
        else:
            states.append(f"slot {i} exited {code}")
    stopped = [i for i, p in enumerate(procs) if p.poll() is None and _stopped(p.pid)]
    if killed is not None and killed[0] != slot:
        what = f"slot {killed[0]}: worker killed by {killed[1]} ({what})"
    elif killed is not None:
        what = f"slot {slot}: worker killed by {killed[1]}"
    elif stopped and slot not in stopped:
        what = f"slot {stopped[0]}: worker stopped (SIGSTOP), the others wait for it ({what})"
    culprit = killed[0] if killed is not None else (stopped[0] if stopped else slot)
    log = f"; see {out / f'worker-{culprit}.log'}" if culprit is not None else ""
    return WorkerError(f"{what}; workers: {', '.join(states)}{log}")
