"""The pool's durable state in SQLite (the embedded default): jobs, leases, counters; and the lock
that keeps one daemon per state directory.

Every change is written in one transaction before it is acted on, so a pool daemon that restarts
reads back every job and lease and carries on; the launchers of running jobs keep their workers
running meanwhile and report again when it is back. The database is readable by its owner only
(0600): job specs hold commands and environments.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any


def exclusive_lock(path: str | Path, busy: Any) -> int:
    """An exclusive ``flock`` on ``path`` (made 0600, never through a link), held by the returned
    descriptor and released by the kernel however its holder ends; the holder's pid is written in
    it. When another process holds it, ValueError(busy(that pid))."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise ValueError(busy(holder)) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class StateLock:
    """An exclusive lock on a state directory (``flock`` on ``<dir>/lock``, released by the kernel
    when its holder exits however it exits): two daemons on one state would double-book devices."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "lock"
        self.fd: int | None = exclusive_lock(
            self.path, lambda pid: f"state: another pool daemon (pid {pid}) serves {Path(state_dir).resolve()}; "
                                   "stop it first, or give this one another --state directory")

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (name TEXT PRIMARY KEY, ord INTEGER, spec TEXT, state TEXT,
  submitted_at REAL, started_at REAL, finished_at REAL, info TEXT);
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, job TEXT, device TEXT, share REAL,
  granted_at REAL, heartbeat_at REAL, state TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class StateDB:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))  # SQLite's WAL files follow its mode
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._db.execute("SELECT name, ord, spec, state, submitted_at, started_at, finished_at, info FROM jobs LIMIT 1")
            self._db.execute("SELECT id, job, device, share, granted_at, heartbeat_at, state FROM leases LIMIT 1")
            self.jobs()
            self.leases()
        except (sqlite3.DatabaseError, ValueError, KeyError, TypeError) as e:
            self._db.close()
            raise ValueError(f"state: {self.path} is not a readable pool state ({type(e).__name__}: {e}); move it "
                             "away (the pool then starts empty) or give another --state directory") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- meta --------------------------------------------------------------------------------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    # -- jobs --------------------------------------------------------------------------------------
    def put_job(self, job: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (job["name"], job["order"], json.dumps(job["spec"]), job["state"], job["submitted_at"],
                 job.get("started_at"), job.get("finished_at"), json.dumps(job.get("info", {}))),
            )

    def jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM jobs ORDER BY ord").fetchall()
        return [
            {"name": r[0], "order": r[1], "spec": json.loads(r[2]), "state": r[3], "submitted_at": r[4],
             "started_at": r[5], "finished_at": r[6], "info": json.loads(r[7] or "{}")}
            for r in rows
        ]

    # -- leases ------------------------------------------------------------------------------------
    def put_leases(self, leases: list[Any], removed: list[int] = ()) -> None:  # type: ignore[assignment]
        """Writes leases (dra._core.pool.Lease) and deletes removed ids, in one transaction."""
        with self._lock:
            self._db.execute("BEGIN")
            for lid in removed:
                self._db.execute("DELETE FROM leases WHERE id=?", (int(lid),))
            for l in leases:
                self._db.execute(
                    "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (l.id, l.job, l.device, l.share, l.granted_at, l.heartbeat_at, l.state),
                )
            self._db.execute("COMMIT")

    def leases(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM leases ORDER BY id").fetchall()
        return [
            {"id": r[0], "job": r[1], "device": r[2], "share": r[3], "granted_at": r[4], "heartbeat_at": r[5],
             "state": r[6]}
            for r in rows
        ]
