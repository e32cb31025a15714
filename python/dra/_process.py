"""Process lifetimes: a child that dies with its parent, on Linux (``PR_SET_PDEATHSIG``).

A worker of ``dra run`` must not outlive its launcher: the launcher hosts the job's store (on one
node, or this node's part of it), so a worker left behind would train on without a store and
break the next fault's recovery. Each worker is started with its parent-death signal set; a
worker's forked children (DataLoader workers) get it too (``die_with_parent_on_fork``), since they
hold copies of the worker's sockets: a killed worker whose DataLoader workers live on keeps its
connections open, and its peers would notice it only after a timeout. Under ``dra run`` SIGTERM
asks the job to stop cleanly (``stop_on_sigterm``); a forked child has SIGTERM's default action
from its first instruction.

``python -m dra._process [--cgroup PATH ...] -- COMMAND ...`` is the trampoline the launcher
starts a plain (non-forked) worker through: it joins the lease's cgroups, sets the parent-death
signal, and execs the command (the setting survives exec).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import sys
import threading
import weakref
from typing import Any

_PR_SET_PDEATHSIG = 1
_libc: ctypes.CDLL | None = None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Asks the kernel to send ``sig`` to this process when its parent dies. When ``parent`` (the
    pid the parent had) is given and the parent is already gone, exits at once. False where the
    platform has no such call (then nothing changes)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was armed
    return True


class _OutputOnFullDisk:
    """A worker's stdout or stderr (its log file) that drops what a full or read-only disk cannot
    take instead of raising: a ``print`` in a training script raised ``OSError: [Errno 28] No
    space left on device`` on every rank at once when the log folder filled, and the job was lost
    for its logs. Writing resumes when it can; the launcher says that the folder is full."""

    _FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno not in self._FULL:
                raise
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno not in self._FULL:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tolerate_full_disk() -> None:
    """``sys.stdout`` and ``sys.stderr`` of this process drop output a full or read-only disk cannot take."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _OutputOnFullDisk):
            setattr(sys, name, _OutputOnFullDisk(stream))


_fork_state = {"registered": False, "main": True, "parent": 0}


def die_with_parent_on_fork() -> None:
    """Every process forked from now on from this process's main thread (a DataLoader's workers)
    dies with it. Children forked from another thread are left alone: the signal follows the
    forking thread, and a short-lived thread would take them with it."""
    if _fork_state["registered"] or not sys.platform.startswith("linux"):
        return

    def before() -> None:
        _fork_state["main"] = threading.current_thread() is threading.main_thread()
        _fork_state["parent"] = os.getpid()

    def after_in_child() -> None:
        if _fork_state["main"]:
            die_with_parent(signal.SIGKILL, _fork_state["parent"])

    os.register_at_fork(before=before, after_in_child=after_in_child)
    _fork_state["registered"] = True


def stop_on_sigterm(controller: Any) -> None:
    """SIGTERM (what `dra run` sends its workers when it is itself stopped) asks the job to stop
    cleanly: the step in hand is finished, every member ends at the same boundary, and the code
    after the training loop runs (the leader writes the final checkpoint). A second SIGTERM ends
    the process at once. Only when SIGTERM still has its default action (a handler of the
    script's own is kept) and from the main thread."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    ref = weakref.ref(controller)
    owner = os.getpid()

    def on_sigterm(signum: int, _frame: Any) -> None:
        ctl = ref()
        # In a forked child (a DataLoader worker not yet in its loop, a multiprocessing child)
        # SIGTERM keeps its default action: its copy of the controller is not in the job.
        if os.getpid() != owner or ctl is None or ctl.stop_requested:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        ctl.request_stop()
        print(f"[dra] SIGTERM: process {ctl.uid} asks the job to stop; every member ends training at the same step "
              "(a second SIGTERM ends this process at once)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, on_sigterm)
    _sigterm_handlers.add(on_sigterm)
    from dra import _core

    # The handler runs in this process only: a process forked from it (a DataLoader worker) ends at
    # SIGTERM from its first instruction, decided at the signal by pid (C), so no fork changes
    # the handler and a stop that lands during one still reaches on_sigterm here.
    _core._sigterm_ends_forked_children()
    if not _sigterm_reset_on_fork[0]:
        os.register_at_fork(after_in_child=_default_sigterm_in_child)
        _sigterm_reset_on_fork[0] = True


# The SIGTERM handlers stop_on_sigterm installed: a forked child inherits them, and there a SIGTERM
# must end the process. An interpreter's exit sends SIGTERM to its daemonic multiprocessing children
# (a DataLoader's workers) and joins them without a timeout: a worker that took the handler over
# (one that had not yet installed its own) asked a copy of the controller to stop, lived on, and the
# training process never exited (seen after an uncaught exception under `dra run`). Two designs
# before this one changed the handler around each fork: the default action in the parent for the
# fork's duration (a stop landing while a DataLoader forked its workers, at every epoch on every
# rank, killed ranks silently: an outside review saw it in 2 of 4 stops), then SIGTERM blocked in
# the forking thread (a child stuck in an earlier at-fork hook could then not be ended by SIGTERM).
_sigterm_handlers: weakref.WeakSet[Any] = weakref.WeakSet()
_sigterm_reset_on_fork = [False]


def _default_sigterm_in_child() -> None:
    try:
        if signal.getsignal(signal.SIGTERM) in _sigterm_handlers:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Python's view matches what the kernel does
    except ValueError:  # signal.signal() off the main thread: the handler itself checks the pid
        pass


def group_alive(pgid: int) -> bool:
    """Whether a process group (a worker's: each is a session leader) has a process left."""
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_text(code: int) -> str:
    """How a process ended, from its exit status as subprocess gives it (-N: signal N)."""
    if code < 0 and -code in signal.Signals._value2member_map_:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def kill_group(pgid: int, sig: int) -> None:
    """``sig`` to a worker and every process it started in its session (as torchrun's killpg)."""
    if pgid <= 1:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> None:
    """The trampoline: ``[--cgroup PATH ...] -- COMMAND ...``."""
    if "--" not in argv:
        raise SystemExit("usage: python -m dra._process [--cgroup PATH ...] -- COMMAND ...")
    i = argv.index("--")
    opts, command = argv[:i], argv[i + 1:]
    cgroups = [opts[k + 1] for k in range(len(opts) - 1) if opts[k] == "--cgroup"]
    for path in cgroups:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    parent = int(os.environ.pop("DRA_PARENT_PID", "0")) or None
    die_with_parent(signal.SIGKILL, parent)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        # As a shell says it: 127 for a command not found, 126 for one found that cannot run (a
        # directory, a file without execute permission), whose reason is named.
        import errno
        import shutil

        found = shutil.which(command[0]) or (command[0] if os.sep in command[0] else None)
        if found and os.path.isdir(found):
            why = f"{found} is a directory, not a program; give the program to run in it"
        elif found and e.errno == errno.EACCES:
            why = f"{found} is not executable by uid {os.getuid()} ({e.strerror}); chmod +x it or run it with its interpreter"
        else:
            why = str(e)
        print(f"[dra run] cannot start {command[0]!r}: {why}", file=sys.stderr, flush=True)
        os._exit(127 if e.errno == errno.ENOENT else 126)


if __name__ == "__main__":
    main(sys.argv[1:])
