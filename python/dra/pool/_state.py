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
import stat
import threading
from pathlib import Path
from typing import Any


def exclusive_lock(path: str | Path, busy: Any) -> int:
    """An exclusive ``flock`` on ``path`` (made 0600, never through a link), held by the returned
    descriptor and released by the kernel however its holder ends; the holder's pid is written in
    it. When another process holds it, ValueError(busy(that pid)). A holder may remove the file
    when it lets go (``release_lock``): the lock taken here is the one on the file the path names
    once it is held, never on a file another holder removed meanwhile."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise ValueError(busy(holder)) from None
            raise
        held = os.fstat(fd)
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # its holder removed that file as it let go: take the one the path names now
    raise RuntimeError(f"{path}: the lock file kept being replaced; is another program removing it?")


def release_lock(path: str | Path, fd: int) -> None:
    """Lets go of ``exclusive_lock(path)`` and removes its file (when it is still the one held)."""
    try:
        held, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            os.unlink(path)
    except OSError:
        pass  # gone already, or not ours to remove: the descriptor still lets go
    os.close(fd)


def control_problem(path: str | Path) -> str | None:
    """Why another user could swap or fill the directory ``path`` (None: only this user and root
    can): a directory on the way to it, or a link on the way, that belongs to another user, a
    directory on the way that others may write to without the sticky bit (/tmp has it), or the
    directory itself writable by others. Parts that do not exist yet are not checked (this user
    makes them). Whoever controls a state directory controls the daemon: they plant its token
    file, its database (jobs to run as anyone) or a link its logs folder is made through."""
    me = os.geteuid()
    path = Path(os.path.abspath(path))
    for walk in (path, Path(os.path.realpath(path))):  # the links as named, then what they lead to
        for part in (*reversed(walk.parents), walk):
            try:
                st = os.lstat(part)
            except FileNotFoundError:
                break
            if st.st_uid not in (0, me):
                return f"{part} belongs to uid {st.st_uid}, not to this user (uid {me}) or root"
            if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and (part == walk or not st.st_mode & stat.S_ISVTX):
                return f"{part} may be written by anyone (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def state_dir(path: str | Path) -> Path:
    """The pool's state directory, made when absent; ValueError naming it when it cannot be one
    (a file, a link to nothing, a folder this user cannot make) or when another user controls it
    (``control_problem``): checked before anything is made, and again once it exists."""
    path = Path(path)
    fix = f"give --state a directory of its own, or move {path} away"
    for _ in range(2):
        problem = control_problem(path)
        if problem:
            raise ValueError(f"state: {path} is not safe for a pool's state: {problem}; whoever controls it could "
                             f"swap it or plant files in it (a token, a database of jobs to run as anyone); {fix}")
        if path.is_dir():
            break
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            what = "exists and is not a directory" if isinstance(e, (FileExistsError, NotADirectoryError)) else \
                f"cannot be made ({e.strerror or e})"
            raise ValueError(f"state: {path} {what}; {fix}") from None
    return path


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


JOB_STATES = ("waiting", "running", "finished", "failed", "cancelled")
LEASE_STATES = ("active", "releasing")
#: Counters and ids the pool keeps in ``meta``, with the type each must have.
META_TYPES: dict[str, tuple[type, ...]] = {"next_lease": (int,), "order": (int,), "counters": (dict,),
                                           "draining": (bool,)}


_REQUEST_TYPES: dict[str, type] = {"kind": str, "device_type": str, "memory_gb": float, "fraction": float,
                                   "min_size": int, "max_size": int, "priority": str, "elastic": bool, "gang": bool}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_job(name: Any, order: Any, spec: dict[str, Any], state: Any, times: tuple[Any, ...],
               info: dict[str, Any]) -> None:
    """A stored job as the pool reads it back; ValueError saying what in it is wrong."""
    from dra.pool._auth import Owner
    from dra.pool._spec import REQUEST_FIELDS, make_request

    if not isinstance(name, str) or not name:
        raise ValueError(f"a job row's name is {name!r}, not a job name")
    if not isinstance(order, int) or isinstance(order, bool):
        raise ValueError(f"job '{name}': its order is {order!r}, not an integer")
    if not isinstance(spec, dict):
        raise ValueError(f"job '{name}': its stored spec is a JSON {type(spec).__name__}, not an object")
    missing = [k for k in REQUEST_FIELDS if k not in spec]
    if missing:
        raise ValueError(f"job '{name}': its stored spec lacks {', '.join(missing)}")
    # Types only: a range a newer pool refuses at submission (a finer fraction) must not make an
    # older pool's state unreadable.
    for k in REQUEST_FIELDS:
        v, want = spec[k], _REQUEST_TYPES[k]
        if not (_number(v) if want is float else isinstance(v, want) and (want is bool or not isinstance(v, bool))):
            raise ValueError(f"job '{name}': its stored spec's {k} is {json.dumps(v)[:40]}, not "
                             f"{ {str: 'a string', int: 'an integer', float: 'a number', bool: 'true or false'}[want]}")
    try:
        make_request({**spec, "name": name})
    except (TypeError, ValueError) as e:
        raise ValueError(f"job '{name}': its stored spec is not a request ({str(e).splitlines()[0]})") from None
    if state not in JOB_STATES:
        raise ValueError(f"job '{name}': its state is {state!r}, not one of {', '.join(JOB_STATES)}")
    if not _number(times[0]) or not all(t is None or _number(t) for t in times[1:]):
        raise ValueError(f"job '{name}': its times {times!r} are not numbers")
    if not isinstance(info, dict):
        raise ValueError(f"job '{name}': its stored info is a JSON {type(info).__name__}, not an object")
    try:
        if "owner" in info:
            Owner.from_json(info["owner"])
        if info.get("launcher") is not None:
            int(info["launcher"]["pid"])
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"job '{name}': its owner or launcher record is unreadable ({type(e).__name__}: {e})") from None


def _check_lease(row: tuple[Any, ...]) -> None:
    lid, job, device, share, granted_at, heartbeat_at, state = row
    if not isinstance(lid, int) or isinstance(lid, bool) or lid < 1:
        raise ValueError(f"a lease row's id is {lid!r}, not an integer >= 1")
    if not isinstance(job, str) or not isinstance(device, str):
        raise ValueError(f"lease {lid}: its job {job!r} or device {device!r} is not a name")
    if not _number(share) or not 0 < share <= 1:
        raise ValueError(f"lease {lid}: its share {share!r} is not a number in (0, 1]")
    if not _number(granted_at) or not _number(heartbeat_at):
        raise ValueError(f"lease {lid}: its times {granted_at!r}, {heartbeat_at!r} are not numbers")
    if state not in LEASE_STATES:
        raise ValueError(f"lease {lid}: its state is {state!r}, not one of {', '.join(LEASE_STATES)}")


class StateDB:
    """The pool's SQLite file. Opening it reads and checks every row the pool would read back (a
    corrupt file, a row of another program, a spec that does not parse): a state that cannot be
    read is one ValueError naming the file, what is wrong in it and what to do, before anything
    else of the pool is made."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        fix = ("move it away (the pool then starts empty), restore it from a backup, or give another --state "
               "directory")
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # SQLite's WAL files follow its mode; never through a link, never a non-file.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
        except OSError as e:
            why = "a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
            raise ValueError(f"state: {self.path} cannot be the pool's database ({why}); {fix}") from None
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
            self._check_meta()
        except (sqlite3.DatabaseError, ValueError, KeyError, TypeError, RecursionError) as e:
            self._db.close()
            what = f"SQLite: {e}" if isinstance(e, sqlite3.DatabaseError) else f"{type(e).__name__}: {e}"
            raise ValueError(f"state: {self.path} is not a readable pool state ({what}); {fix}") from None

    def _check_meta(self) -> None:
        for key, text in self._db.execute("SELECT key, value FROM meta").fetchall():
            try:
                value = json.loads(text)
            except (TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"meta '{key}': its value is not JSON ({e})") from None
            want = META_TYPES.get(key)
            if want and (not isinstance(value, want) or (int in want and isinstance(value, bool))):
                raise ValueError(f"meta '{key}': its value {text[:40]!r} is not a {want[0].__name__}")
            if key == "counters" and not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
                raise ValueError(f"meta 'counters': {text[:60]!r} holds a count that is not an integer")

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

    def delete_job(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM jobs WHERE name = ?", (name,))

    def jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM jobs ORDER BY ord").fetchall()
        out = []
        for r in rows:
            try:
                spec, info = json.loads(r[2]), json.loads(r[7] or "{}")
            except (TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"job {r[0]!r}: its stored spec or info is not JSON ({e})") from None
            _check_job(r[0], r[1], spec, r[3], (r[4], r[5], r[6]), info)
            out.append({"name": r[0], "order": r[1], "spec": spec, "state": r[3], "submitted_at": r[4],
                        "started_at": r[5], "finished_at": r[6], "info": info})
        return out

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
        for r in rows:
            _check_lease(r)
        return [
            {"id": r[0], "job": r[1], "device": r[2], "share": r[3], "granted_at": r[4], "heartbeat_at": r[5],
             "state": r[6]}
            for r in rows
        ]
