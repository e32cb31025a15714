"""The launcher's log folder: made private (``log_dir``), and one launcher per run id in it.

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


def log_dir(path: str | Path) -> Path:
    """The folder of the job's logs (``--log-dir``), made 0700 when new. Refused, naming the flag, when
    it is a file, cannot be written, is a symbolic link, belongs to another user or others may write
    into it (a link planted there would take the launcher's and the workers' output), as the
    device pool's launcher refuses it."""
    from dra.pool._spawner import private_log_dir

    path = Path(path)
    try:
        private_log_dir(path)
    except FileExistsError:
        raise ValueError(f"--log-dir: {str(path)!r} exists and is not a folder; give a folder for the workers' "
                         "logs") from None
    except OSError as e:
        raise ValueError(f"--log-dir: cannot make {str(path)!r} ({e.strerror}); give a folder this user can "
                         "create and write") from None
    except ValueError as e:
        raise ValueError(f"--log-dir: {e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"--log-dir: cannot write into {str(path)!r}; give a folder this user can write")
    return path
