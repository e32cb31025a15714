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
    """Copies new lines of each followed file to ``out`` with the file's prefix (a thread).

    Only that thread reads the files and writes the console, and never while holding the lock the
    launcher takes: a console that blocks (a paused pager, a terminal stopped with Ctrl-S, a stalled
    ssh session) stalls the copy alone, never the launcher's supervision (its signals, a dead
    worker's replacement). It reads at most ``chunk`` bytes of a file per look, so a worker that
    floods its log while the console lags does not make the launcher hold it all in memory."""

    def __init__(self, out: TextIO | None = None, interval_s: float = 0.05, chunk: int = 1 << 20) -> None:
        self.out = out or sys.stdout
        self.interval_s = interval_s
        self.chunk = chunk
        self._files: dict[Path, list] = {}  # path -> [prefix, offset, partial line, last copy wanted]
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
            entry = self._files.get(path)
            if entry is not None:  # followed still (a group restarted): its rest is copied too
                entry[0], entry[3] = prefix, False
            else:
                self._files[path] = [prefix, offset, b"", False]

    def stop_following(self, path: Path) -> None:
        """The copy thread copies what is left of ``path`` (a last partial line too), then forgets it."""
        with self._lock:
            entry = self._files.get(Path(path))
            if entry is not None:
                entry[3] = True

    def close(self, timeout_s: float = 5.0) -> bool:
        """Copies what is left of every file, then stops. False when the console did not take it within
        ``timeout_s`` (the copy thread is left blocked in its write; the log files hold everything)."""
        with self._lock:
            for entry in self._files.values():
                entry[3] = True
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval_s)
            while self._pass() and not self._stop.is_set():
                pass  # more than a chunk was waiting: go on at once
            if stopping:
                while self._pass():
                    pass
                return

    def _pass(self) -> bool:
        """One look at every file; True when some file had more than a chunk waiting."""
        with self._lock:
            entries = list(self._files.items())
        more = False
        for path, entry in entries:
            text, behind, final = self._pump(path, entry)
            if final and not behind:
                with self._lock:
                    if self._files.get(path) is entry:
                        del self._files[path]
            more = more or behind
            if text:
                try:
                    self.out.write(text)
                    self.out.flush()
                except (OSError, ValueError):  # the console went away: the log files still hold everything
                    pass
        return more

    def _pump(self, path: Path, entry: list) -> tuple[str, bool, bool]:
        """The prefixed lines ``path`` gained (at most a chunk), whether more is waiting, and whether
        this was the copy of a file no longer written (its last partial line included)."""
        prefix, offset, partial, final = entry
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(self.chunk)
        except OSError:
            data = b""
        behind = len(data) == self.chunk
        entry[1] = offset + len(data)
        lines = (partial + data).split(b"\n")
        rest = lines.pop()  # after the last newline: a line still being written
        if (final and not behind and rest) or len(rest) >= self.chunk:
            lines.append(rest)  # the last line of a file that ended, or one too long to hold back
            rest = b""
        entry[2] = rest
        return "".join(f"{prefix}{line.decode(errors='replace')}\n" for line in lines), behind, final


def prefix_for(role: str, local_rank: int) -> str:
    """torchrun's prefix of a worker's lines: ``[<role><local rank>]:``."""
    return f"[{role}{local_rank}]:"


def console_wanted(local_rank: int, tee: int, local_ranks: set[int] | None) -> bool:
    """Whether a worker's output goes to the console (torchrun's ``--tee`` / ``--local-ranks-filter``)."""
    return tee != 0 and (local_ranks is None or local_rank in local_ranks)

