"""A dedicated ``python -m dra store`` for benchmarks and tests, with its output drained.

The store's process logs to its standard output and error (c10d warns about every message it cannot
process: ~100 bytes for each ``add()`` on a value that is not a counter). Read once for the "listening"
line and then left alone, a pipe fills after about 640 such warnings and the store's event loop
blocks on the write: every client then waits out its timeout, and the jobs on that store are lost.
A thread here reads the pipe for as long as the store runs and keeps the last lines for diagnostics.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading


class StoreProcess:
    """``python -m dra store`` on a free port of `host`; ``address`` once it listens."""

    def __init__(self, host: str = "127.0.0.1", keep_lines: int = 200) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dra", "store", "--port", "0", "--host", host],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        # "[dra] store listening on HOST:PORT" once it is up; c10d may warn before it (a resolver that
        # does not answer its reverse lookup: "The hostname of the client socket cannot be retrieved").
        self._lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        line = self.proc.stdout.readline()
        while line and "listening" not in line and len(self._lines) < 100:
            self._lines.append(line)
            line = self.proc.stdout.readline()
        if "listening" not in line:
            self.close()
            raise RuntimeError(f"the store did not start: {''.join(self._lines) + line}")
        self.port = int(line.rsplit(":", 1)[1])
        self._drain = threading.Thread(target=self._read, name="dra-store-output", daemon=True)
        self._drain.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.append(line)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output_tail(self) -> str:
        """The store's last lines of output (at most `keep_lines`)."""
        return "".join(self._lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        drain = getattr(self, "_drain", None)
        if drain is not None:
            drain.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
