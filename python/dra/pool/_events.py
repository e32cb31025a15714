"""The pool's events file, ``<state>/events.jsonl``: one JSON object per line, appended by the
daemon, rotated by size so a pool that runs for months keeps a bounded history on disk.

When a line would take the file past ``max_bytes``, the file becomes ``events.jsonl.1`` (the
one before becomes ``.2``, and so on; the oldest past ``keep`` is deleted) and a new file starts
with an ``events_rotated`` line. Each file is opened without following a symbolic link and made
0600 (it holds job names, users and requests). ``read`` gives every kept line, oldest first."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EVENTS_MB = 64.0  # the default size of one file; with KEEP rotated ones, 256 MB at most on disk
KEEP = 3


def rotated(path: Path, keep: int = KEEP) -> list[Path]:
    """The files of an events log, oldest first (the rotated ones that exist, then ``path``)."""
    older = [Path(f"{path}.{i}") for i in range(keep, 0, -1)]
    return [p for p in older if p.exists()] + [path]


def _lock_path(path: Path) -> Path:
    return Path(f"{path}.lock")


def _open_all(path: Path, keep: int) -> list[Any]:
    """The kept files, opened as one set: a rotation (which renames every file) is held off while
    the reader lists and opens them, by a shared lock on ``<path>.lock`` against the daemon's
    exclusive one (names and inodes alone do not do: a rotation frees the oldest inode and the new
    file may take it, so four rotations can look like none)."""
    try:
        lock = os.open(_lock_path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        lock = -1  # a file no daemon of this version wrote: nothing rotates it
    try:
        if lock >= 0:
            fcntl.flock(lock, fcntl.LOCK_SH)
        files = []
        for p in rotated(path, keep):
            try:
                files.append(open(p, "rb"))  # noqa: SIM115 - closed by the caller
            except FileNotFoundError:
                continue
        return files
    finally:
        if lock >= 0:
            os.close(lock)  # the lock goes with it


def read(path: str | Path, keep: int = KEEP) -> Iterator[dict[str, Any]]:
    """Every event kept for ``path``, oldest first, rotated files included, also while the daemon
    rotates them; a line cut short (a daemon killed while it wrote) or not UTF-8 is skipped."""
    files = _open_all(Path(path), keep)
    try:
        texts = [f.read() for f in files]
    finally:
        for f in files:
            f.close()
    for data in texts:
        for line in data.splitlines():
            if line.strip():
                try:
                    yield json.loads(line.decode())
                except ValueError:  # UnicodeDecodeError is one
                    continue


class EventFile:
    """Appends events to ``path``, rotating at ``max_bytes`` and keeping ``keep`` old files."""

    def __init__(self, path: str | Path, max_mb: float = EVENTS_MB, keep: int = KEEP) -> None:
        if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or not 0 < max_mb < float("inf"):
            raise ValueError(f"events_max_mb: must be a finite number of MB > 0 (one events file's size before it "
                             f"is rotated), got {max_mb!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"events_keep: must be an integer >= 1 (rotated files kept), got {keep!r}")
        self.path = Path(path)
        self.max_bytes = max(1, int(max_mb * (1 << 20)))
        self.keep = keep
        self._lock = threading.Lock()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def _rotate(self) -> None:
        lock = os.open(_lock_path(self.path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # readers list and open the files under a shared lock
            self._rename_all()
        finally:
            os.close(lock)

    def _rename_all(self) -> None:
        last = Path(f"{self.path}.{self.keep}")
        if last.is_symlink() or last.exists():
            last.unlink()
        for i in range(self.keep - 1, 0, -1):
            older = Path(f"{self.path}.{i}")
            if older.is_symlink() or older.exists():
                os.replace(older, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")

    def append(self, ev: dict[str, Any]) -> None:
        data = (json.dumps(ev) + "\n").encode()
        with self._lock:
            fd = self._open()
            try:
                size = os.fstat(fd).st_size
                if size > 0 and size + len(data) > self.max_bytes:
                    os.close(fd)
                    fd = -1
                    self._rotate()
                    fd = self._open()
                    mark = {"time": ev.get("time"), "event": "events_rotated", "previous": f"{self.path.name}.1",
                            "previous_bytes": size, "keep": self.keep}
                    os.write(fd, (json.dumps(mark) + "\n").encode())
                os.write(fd, data)
            finally:
                if fd >= 0:
                    os.close(fd)
