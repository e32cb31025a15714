"""One launcher per run id and log folder on one node.

Two one-node ``dra run`` launches in one folder without ``--rdzv-id`` both ran as job ``job``:
their workers wrote the same ``dra-logs/job.<rank>.log``, and each console, which follows a
worker's log by name, printed the other job's lines as its own (both exited 0). The launcher now
holds ``<log-dir>/<run id>.lock`` (``flock``) while it runs; a second one with the same run id and
log folder is refused at once, naming the first and the fix. A lock, not a file's presence: a
launcher killed with SIGKILL leaves the file, and the kernel lets its lock go.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def claim_run(folder: Path, run_id: str) -> int:
    """Locks ``folder/<run_id>.lock`` for this process (the descriptor, kept open until the
    launcher ends: it is not inherited by the workers). Raises ValueError naming the other
    launcher's pid and the fix when another holds it."""
    path = folder / f"{run_id}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ValueError(f"run id {run_id!r}: another dra run (pid {other}) is running with it and writes its logs in "
                         f"{folder}/ (its console would print this one's workers' lines); give this one its own "
                         "--rdzv-id NAME (--standalone picks a fresh one) or another --log-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
