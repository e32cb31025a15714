"""Worker processes for the launcher: forked from a warm fork server (``_zygote``, Python
commands) or started as plain processes, each in its lease's cgroups."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from dra import _process


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args`` for the pool's own processes (a job's launcher, its fork server)
    without the working directory on ``sys.path``: they run in the job's directory, which may be
    one others can write to (a root job started from /tmp), and ``-m`` puts it first, so a planted
    ``argparse/`` or ``torch/`` there would run as the job's user (root). ``-P`` on Python 3.11+;
    on 3.10 the same through ``-c``."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", "import runpy, sys; del sys.path[0]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)", *args]


def is_python(cmd: list[str]) -> bool:
    """Whether ``cmd`` runs this very interpreter (the same executable in the same environment:
    another virtual environment's python has other packages) on a script or a module, in a form
    the fork server can run (``[-u] script.py ...`` or ``[-u] -m module ...``)."""
    if not cmd:
        return False
    found = shutil.which(cmd[0])
    if found is None:
        return False
    here = os.path.abspath(sys.executable)
    if os.path.dirname(os.path.abspath(found)) != os.path.dirname(here) or os.path.realpath(found) != os.path.realpath(here):
        return False
    args = [a for a in cmd[1:] if a != "-u"]
    return bool(args) and (args[0] == "-m" and len(args) > 1 or not args[0].startswith("-"))


def preload_problem(spec: dict[str, Any]) -> str | None:
    """Why a job's ``preload`` would never be imported (None: it would be): the fork server that
    imports it is off, or does not run the command (a job naming a module that does not import
    ran anyway, the module never tried)."""
    if not spec.get("preload"):
        return None
    if spec.get("zygote") is False:
        return "preload: the fork server imports it, and zygote: false turns the fork server off: drop one of the two"
    if not is_python(spec["command"]):
        return (f"preload: only a command of the form [python, script.py, ...] or [python, -m, module, ...] (this "
                f"pool's interpreter, {sys.executable}) starts its workers from the fork server that imports them; "
                f"this one is {spec['command'][:3]}: drop preload, or run the script with that interpreter directly")
    return None


def log_dir_problem(path: Path, uid: int) -> str | None:
    """Why an existing folder cannot hold the logs of a job run as ``uid`` (None: it can, or it
    does not exist yet): a symbolic link or not a directory, another user's, or writable by others
    (a file planted there, a link to a file of this user's, would take the job's output)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "a symbolic link or not a directory"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this job's user (uid {uid})"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-empty line of a log (its error, as a rule), at most ``limit`` characters, read
    from its last 8 KiB only: the daemon reads a job's launcher log, which belongs to the job's user
    (a sparse 2 GiB one, read whole under the pool's lock, froze the daemon and grew it by 4 GB)."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            lines = [x.strip() for x in f.read(8192).decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    # Shown by `dra pool status` on an operator's terminal: escape sequences and other control
    # characters written by the job are shown, not obeyed (one erased the line and printed a green
    # "all fine" in its place).
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in lines[-1][:limit]) if lines else ""


def private_log_dir(path: Path) -> Path:
    """The folder of a job's logs, made 0700 when new; refused as ``log_dir_problem`` says."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    problem = log_dir_problem(path, os.geteuid())
    if problem:
        raise ValueError(f"log: {path} is {problem}; remove it, or give the job a log folder of its own "
                         "(the spec's 'log', dra run --log-dir)")
    return path


def open_private_log(path: Path) -> Any:
    """A log file for appending, 0600 when new, never through a symbolic link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "ab")


def cut_log(path: Path, limit: int, dropped_before: int = 0, keep: int = 65536) -> int:
    """Cuts a log past ``limit`` bytes to a line saying so and its last whole lines (at most
    ``keep`` bytes), in place, and returns the bytes dropped now (``dropped_before``: by earlier
    cuts, counted in the line).

    The worker goes on writing with O_APPEND meanwhile. Truncating to nothing and then writing
    the line let its writes land first (on a loaded host the log began with the flood, the line in
    its middle). So the line and the tail are written over the log's start, and the log is then
    shortened to them: what the worker wrote during the cut is read first and kept after the
    tail, in order; what it writes between that last read and the shortening (microseconds) is
    lost."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        end = os.fstat(fd).st_size
        if end <= limit:
            return 0
        want = min(keep, limit // 2)
        kept = os.pread(fd, want, end - want)
        for _ in range(8):  # a worker that outwrites the reads is cut again at the next look
            more = os.pread(fd, limit, end)
            if not more:
                break
            kept, end = (kept + more)[-want:], end + len(more)
        kept = kept[kept.find(b"\n") + 1:]
        dropped = end - len(kept)
        note = (f"[dra run] this log passed its limit ({limit} bytes, the job's log_limit_mb): "
                f"{dropped_before + dropped} bytes of it before this line were dropped\n").encode()
        os.pwrite(fd, note + kept, 0)
        os.ftruncate(fd, len(note) + len(kept))
        return dropped
    finally:
        os.close(fd)


class Spawner:
    """Starts worker processes, from the zygote (Python commands) or as plain processes."""

    def __init__(self, use_zygote: bool, preload: list[str], log: Path) -> None:
        self.zygote: subprocess.Popen[bytes] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[tuple[str, int]] = []
        self.pids: dict[str, int] = {}
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._log = log
        # Set once the fork server said it is ready (its modules imported) or ended without saying
        # so; the launcher goes on meanwhile (it checks in with the pool, hosts the job's store)
        # and only a first spawn waits for it: the imports overlap the launcher's own start-up.
        self._ready = threading.Event()
        self._failed = False
        if use_zygote:
            # The fork server dies with this launcher (it arms its parent-death signal at start),
            # and its workers with it: none is left running without the job's store.
            env = dict(os.environ, DRA_PARENT_PID=str(os.getpid()))
            err = open_private_log(log)
            try:
                self.zygote = subprocess.Popen(module_command("dra.pool._zygote", ",".join(preload)),
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                               stderr=err, start_new_session=True)
            finally:
                err.close()  # the fork server has its own copy
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _read(self) -> None:
        assert self.zygote is not None and self.zygote.stdout is not None
        first = True
        for line in self.zygote.stdout:
            msg = json.loads(line)
            if first:
                first = False
                self._failed = not msg.get("ready")
                self._ready.set()
                continue
            with self._lock:
                if "spawned" in msg:
                    self.pids[msg["spawned"]] = msg["pid"]
                    self._pending.pop(msg["spawned"], threading.Event()).set()
                elif "exited" in msg:
                    self.exits.append((msg["exited"], int(msg["code"])))
        if first:  # it ended before it was ready (a module it preloads failed to import, say)
            self._failed = True
            self._ready.set()

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Waits until the fork server is ready; RuntimeError (naming its log) if it is not."""
        if self.zygote is None:
            return
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the worker fork server was not ready after {timeout_s:g} s (see {self._log})")
        if self._failed:
            raise RuntimeError(f"the worker fork server did not start{self._why_not()} (see {self._log})")

    def _why_not(self) -> str:
        """Why the fork server ended before it was ready, where the kernel says: its signal, and
        whether the OOM killer stopped it at its memory cgroup's limit (a pool launcher's)."""
        assert self.zygote is not None
        try:
            code = self.zygote.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return ""
        if code >= 0:
            return f": it exited with code {code}"
        from dra.pool import _cgroup

        why = f": it was killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else ""
        own = _cgroup.own_memory_cgroup()
        state = _cgroup.memory_state(own) if own else None
        if code == -signal.SIGKILL and state and state["oom_kills"]:
            why += (f", the kernel's OOM killer, at its cgroup's memory limit ({state['limit'] / 2**30:.3g} GiB, a "
                    "pool's --launcher-memory-gb) while it imported its preload modules")
        return why

    def spawn(self, wid: str, cmd: list[str], env: dict[str, str], cgroups: list[str], log: Path,
              cwd: str | None) -> int:
        if self.zygote is not None and is_python(cmd):
            self.wait_ready()
            ev = threading.Event()
            with self._lock:
                self._pending[wid] = ev
            msg = {"op": "spawn", "id": wid, "argv": [a for a in cmd[1:] if a != "-u"], "env": env, "cwd": cwd,
                   "cgroups": cgroups, "log": str(log)}
            assert self.zygote.stdin is not None
            self.zygote.stdin.write((json.dumps(msg) + "\n").encode())
            self.zygote.stdin.flush()
            if not ev.wait(10):
                raise RuntimeError(f"the fork server did not start worker {wid}")
            return self.pids[wid]

        # Through the trampoline (dra/_process.py): into the lease's cgroups, the parent-death
        # signal armed (the worker dies with this launcher), then exec of the command itself.
        trampoline = [sys.executable, "-I", "-S", _process.__file__]
        for path in cgroups:
            trampoline += ["--cgroup", path]
        out = open_private_log(log)
        p = subprocess.Popen([*trampoline, "--", *cmd], env=dict(env, DRA_PARENT_PID=str(os.getpid())), cwd=cwd,
                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
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
                self.zygote.wait()
            self._reader.join(timeout=5)
            if not self._reader.is_alive() and self.zygote.stdout is not None:
                self.zygote.stdout.close()
