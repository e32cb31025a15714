"""Worker processes for the launcher: forked from a warm fork server (``_zygote``, Python
commands) or started as plain processes, each in its lease's cgroups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


def is_python(cmd: list[str]) -> bool:
    return bool(cmd) and (os.path.basename(cmd[0]).startswith("python") or cmd[0] == sys.executable)


class Spawner:
    """Starts worker processes, from the zygote (Python commands) or as plain processes."""

    def __init__(self, use_zygote: bool, preload: list[str], log: Path) -> None:
        self.zygote: subprocess.Popen[bytes] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[tuple[str, int]] = []
        self.pids: dict[str, int] = {}
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        if use_zygote:
            self.zygote = subprocess.Popen([sys.executable, "-m", "dra.pool._zygote", ",".join(preload)],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=open(log, "ab"), start_new_session=True)
            assert self.zygote.stdout is not None
            first = json.loads(self.zygote.stdout.readline() or b"{}")
            if not first.get("ready"):
                raise RuntimeError(f"the worker fork server did not start (see {log})")
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.zygote is not None and self.zygote.stdout is not None
        for line in self.zygote.stdout:
            msg = json.loads(line)
            with self._lock:
                if "spawned" in msg:
                    self.pids[msg["spawned"]] = msg["pid"]
                    self._pending.pop(msg["spawned"], threading.Event()).set()
                elif "exited" in msg:
                    self.exits.append((msg["exited"], int(msg["code"])))

    def spawn(self, wid: str, cmd: list[str], env: dict[str, str], cgroups: list[str], log: Path,
              cwd: str | None) -> int:
        if self.zygote is not None and is_python(cmd):
            ev = threading.Event()
            with self._lock:
                self._pending[wid] = ev
            msg = {"op": "spawn", "id": wid, "argv": cmd[1:], "env": env, "cwd": cwd, "cgroups": cgroups,
                   "log": str(log)}
            assert self.zygote.stdin is not None
            self.zygote.stdin.write((json.dumps(msg) + "\n").encode())
            self.zygote.stdin.flush()
            if not ev.wait(10):
                raise RuntimeError(f"the fork server did not start worker {wid}")
            return self.pids[wid]

        def enter() -> None:  # in the child, before exec: into the lease's cgroups
            for p in cgroups:
                with open(os.path.join(p, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))

        out = open(log, "ab")
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=enter if cgroups else None, start_new_session=True)
        out.close()
        self.procs[wid] = p
        self.pids[wid] = p.pid
        return p.pid

    def poll(self) -> list[tuple[str, int]]:
        with self._lock:
            out, self.exits = self.exits, []
        for wid, p in list(self.procs.items()):
            code = p.poll()
            if code is not None:
                out.append((wid, code))
                del self.procs[wid]
        return out

    def kill(self, wid: str, sig: int = signal.SIGKILL) -> None:
        pid = self.pids.get(wid)
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.zygote is not None:
            try:
                assert self.zygote.stdin is not None
                self.zygote.stdin.close()
            except OSError:
                pass
            try:
                self.zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.zygote.kill()
