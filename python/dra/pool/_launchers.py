"""The launchers of pool jobs (one ``dra run`` process per job), as seen from the daemon: started
as the job's owner, with an environment of their own, and recognised again by a restarted daemon.

A launcher outlives the daemon that started it (its own session; the jobs keep running while the
daemon is away). Each one is known by its pid and the kernel's start time of that pid (so a reused
pid is not mistaken for it) and by a launch id it shows at every call; a restarted daemon reads
those back and adopts a launcher that is still alive instead of starting a second one.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra.pool import _cgroup
from dra.pool._auth import Owner, can_enter, run_as_kwargs
from dra.pool._spawner import module_command

#: Variables of the daemon's environment a job's launcher gets (the rest of a root daemon's
#: environment, tokens included, is not the job's business); the job's own ``env`` comes on top.
PASS_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH")


def proc_start(pid: int) -> int | None:
    """The kernel's start time of a live process (clock ticks since boot), None if it is gone or
    a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3, start field 22
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass
class LauncherRef:
    id: str
    pid: int
    start: int | None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)  # ours (not adopted)
    # Started by the job's user (`dra run --pool ... --job`), its pid taken from the caller's socket:
    # watched, never signalled. That pid is the one that connected, and a process that exits after
    # handing its socket on leaves the pid to whatever gets it next (the daemon's own thread, once).
    by_hand: bool = False

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.start is not None and proc_start(self.pid) == self.start

    def exit_code(self) -> int | None:
        return self.popen.returncode if self.popen is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "pid": self.pid, "start": self.start, **({"by_hand": True} if self.by_hand else {})}

    def kill(self) -> None:
        """SIGKILL to the launcher's session (it leads one, its workers in it), or to it alone; a
        launcher started by hand is left to its lease's cgroup."""
        if self.by_hand or not self.alive():
            return
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
                return
            except OSError:
                continue


def job_env(owner: Owner, extra: dict[str, str]) -> dict[str, str]:
    """A launcher's environment: the passed-through variables, the owner's identity, ``extra``."""
    env = {k: v for k, v in os.environ.items() if k in PASS_ENV or k.startswith("LC_")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=owner.home, USER=owner.user, LOGNAME=owner.user, SHELL=owner.shell)
    env.update(extra)
    return env


def open_log(path: Path, owner: Owner) -> int:
    """The launcher's log, written by the daemon's child and readable by the job's owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    if os.geteuid() == 0:
        os.fchown(fd, owner.uid, owner.gid)
    return fd


# Every launcher this process started, until it is seen to have exited. A daemon that closes leaves
# its jobs' launchers running (jobs outlive it), and a Popen dropped while its process runs warns
# (ResourceWarning, an error under `-W error`) whenever the garbage collector reaches it, in whatever
# code runs then. The exited ones are reaped at the next start.
_started: list[subprocess.Popen[bytes]] = []
_started_lock = threading.Lock()


def _keep(p: subprocess.Popen[bytes]) -> None:
    with _started_lock:
        _started[:] = [q for q in _started if q.poll() is None]
        _started.append(p)


#: The launch ids a daemon gives the launchers it starts begin with this; a launcher started by hand
#: makes its own id (no prefix). A pool takes a launcher it has no record of as started by hand only
#: without the prefix: one with it was started by another pool (a state directory since removed).
DAEMON_LAUNCH_PREFIX = "pool-"


def start(name: str, url: str, owner: Owner, cwd: str, log: Path, env: dict[str, str],
          private_network: bool = False,
          cgroups: list[str] | tuple[str, ...] | Callable[[str], list[str]] = ()) -> LauncherRef:
    """Starts the launcher of a pool job as its owner in its own session: a root daemon starts it
    through ``_isolate`` (its ``cgroups``, a private network namespace when asked, then the
    owner's groups, gid and uid, then its cwd, entered as the owner, then exec); raises OSError
    when it cannot start (a missing cwd, say). Another daemon moves the launcher into ``cgroups``
    once it is started (as far as it may). ``cgroups`` may be a function of the launch id that
    makes them (``Slots.make_launcher``)."""
    launch_id = DAEMON_LAUNCH_PREFIX + secrets.token_hex(8)
    if callable(cgroups):
        cgroups = cgroups(launch_id)
    cmd = module_command("dra", "run", "--pool", url, "--job", name)  # the job's directory is not on its sys.path
    extra: dict[str, Any] = {}
    if os.geteuid() == 0:
        from dra.pool import _isolate

        cmd = [sys.executable, "-I", _isolate.__file__, "--uid", str(owner.uid), "--gid", str(owner.gid),
               "--groups", ",".join(map(str, owner.groups)), "--cwd", cwd,
               *(["--private-network"] if private_network else []),
               *[a for path in cgroups for a in ("--cgroup", path)], "--", *cmd]
        cgroups = ()  # entered by _isolate itself, before anything else runs
        # Said at once, checked as the job's user (root's own look would tell a directory the user
        # may not reach, one swapped in through a link, from a missing one); entering it is
        # _isolate's, as the job's user.
        why = can_enter(cwd, owner)
        if why:
            raise FileNotFoundError(f"cwd: {why} (any more)")
        cwd = "/"  # root never enters the job's directory: a swapped-in one would be entered as root
    else:
        extra = run_as_kwargs(owner)
    fd = open_log(log, owner)
    try:
        p = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             cwd=cwd, env=job_env(owner, {**env, "DRA_LAUNCH_ID": launch_id}), **extra)
    finally:
        os.close(fd)
    try:
        _cgroup.join(list(cgroups), p.pid)
    except OSError:
        pass  # a weight, not a limit: the launcher runs where it is
    _keep(p)
    return LauncherRef(launch_id, p.pid, proc_start(p.pid), p)


def adopt(record: dict[str, Any] | None) -> LauncherRef | None:
    """The launcher a previous daemon started, if it is still alive."""
    if not record or "pid" not in record:
        return None
    ref = LauncherRef(str(record.get("id", "")), int(record["pid"]), record.get("start"),
                      by_hand=bool(record.get("by_hand", False)))
    return ref if ref.alive() else None


def owned_by(pid: int, uid: int) -> bool:
    """Whether process ``pid`` runs now as ``uid`` (its real uid)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False
