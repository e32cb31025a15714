"""Workers' output on the launcher's console, each line prefixed as torchrun's ``--tee`` does
(``[default0]:``), while every worker writes to its own log file.

The console copy is read from the log files (as torchrun's tail does), so a worker never writes to
a pipe its launcher holds: a launcher that dies cannot block or kill a worker through its output.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TextIO


class Tee:
    """Copies new lines of each followed file to ``out`` with the file's prefix (a thread)."""

    def __init__(self, out: TextIO | None = None, interval_s: float = 0.05) -> None:
        self.out = out or sys.stdout
        self.interval_s = interval_s
        self._files: dict[Path, list] = {}  # path -> [prefix, offset, partial line]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dra-run-tee", daemon=True)
        self._thread.start()

    def follow(self, path: Path, prefix: str) -> None:
        """Copies what ``path`` gains from now on (its current end: a reused log's old lines are not shown)."""
        path = Path(path)
        try:
            offset = path.stat().st_size
        except OSError:
            offset = 0
        with self._lock:
            self._files[path] = [prefix, offset, b""]

    def stop_following(self, path: Path) -> None:
        """Copies what is left of ``path`` (a last partial line too), then forgets it."""
        with self._lock:
            self._pump(Path(path), final=True)
            self._files.pop(Path(path), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for path in list(self._files):
                self._pump(path, final=True)
            self._files.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                for path in list(self._files):
                    self._pump(path, final=False)

    def _pump(self, path: Path, final: bool) -> None:
        entry = self._files.get(path)
        if entry is None:
            return
        prefix, offset, partial = entry
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return
        if not data and not (final and partial):
            return
        entry[1] = offset + len(data)
        lines = (partial + data).split(b"\n")
        rest = lines.pop()  # after the last newline: a line still being written
        if final and rest:
            lines.append(rest)
            rest = b""
        entry[2] = rest
        text = "".join(f"{prefix}{line.decode(errors='replace')}\n" for line in lines)
        if text:
            try:
                self.out.write(text)
                self.out.flush()
            except (OSError, ValueError):  # the console went away: the log files still hold everything
                pass


def prefix_for(role: str, local_rank: int) -> str:
    """torchrun's prefix of a worker's lines: ``[<role><local rank>]:``."""
    return f"[{role}{local_rank}]:"


def console_wanted(local_rank: int, tee: int, local_ranks: set[int] | None) -> bool:
    """Whether a worker's output goes to the console (torchrun's ``--tee`` / ``--local-ranks-filter``)."""
    return tee != 0 and (local_ranks is None or local_rank in local_ranks)

