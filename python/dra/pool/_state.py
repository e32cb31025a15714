"""The pool's durable state in SQLite (the embedded default): jobs, leases, counters.

Every change is written in one transaction before it is acted on, so a pool daemon that restarts
reads back every job and lease and carries on; the launchers of running jobs keep heartbeating
their leases meanwhile (they retry until the daemon answers again).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

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
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

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
