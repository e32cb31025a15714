"""A fork server for Python workers: imports torch (and whatever else is named) once, then forks a
worker per request, so a worker on a new lease starts in tens of milliseconds rather than the
seconds an interpreter takes to import torch. The handover goal (a lease released by one job, a
step of another on it, in under a second) needs this.

Protocol (JSON lines): the launcher writes ``{"op": "spawn", "id", "argv", "env", "cwd",
"cgroups", "log"}`` to stdin; the zygote answers ``{"spawned": id, "pid": pid}`` and, when a
worker ends, ``{"exited": id, "code": code}`` (a negative code: killed by that signal). It forks
only from this single thread, before any torch operation has started a thread pool.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import sys
import time

from dra import _process


def _child(msg: dict, out_fd: int, zygote: int) -> None:
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Blocked across the fork (main): a SIGTERM that came meanwhile is delivered now, with its default
    # action. Caught by the server's handler and then replaced, it was dropped: the worker ran on.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _process.die_with_parent(signal.SIGKILL, zygote)  # the fork server goes only with its launcher
    # stdout/stderr become the worker's log and stdin /dev/null (dup2 closes the zygote's pipes
    # in this process); opened above 2 first, so dup2 never closes what it just opened.
    log = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(devnull, 0)
    for fd in {log, devnull} - {0, 1, 2}:
        os.close(fd)
    if out_fd not in (0, 1, 2):
        os.close(out_fd)
    _process.tolerate_full_disk()  # a full log folder loses output, never the worker
    code = 0
    try:
        for path in msg.get("cgroups") or []:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        os.environ.clear()
        os.environ.update(msg["env"])
        if msg.get("cwd"):
            os.chdir(msg["cwd"])
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))
        argv = list(msg["argv"])
        if argv[0] == "-m":
            sys.path.insert(0, os.getcwd())  # as `python -m` does (the fork server itself runs without it)
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            # __file__ absolute, as Python's own (3.9+); sys.argv[0] stays as typed
            runpy.run_path(os.path.abspath(argv[0]), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code != 0 and "dra._lifecycle" in sys.modules:  # a failure, not the end of its loop: it leaves the job
            sys.modules["dra._lifecycle"].exiting(code)
    except BaseException:  # noqa: BLE001 - as an interpreter does: through sys.excepthook
        # (dra's hook makes an uncaught exception leave the job; printed by hand, the process went
        # on to finish the job at exit, and a crash on every rank was reported as a finished job)
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        # An interpreter's exit runs the atexit handlers (a ported DDP script's controller finishes
        # there: the members meet once more and the leader marks the job done).
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _warm_torch() -> None:
    """torch imports much lazily: the first optimizer pulls in torch._dynamo (seconds). Done here
    once, single-threaded (no intra-op pool is started, so forking stays safe)."""
    torch = sys.modules["torch"]
    torch.set_num_threads(1)
    p = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(p.parameters(), lr=0.1, momentum=0.9)
    p(torch.zeros(1, 2)).sum().backward()
    opt.step()


def main() -> None:
    # This server dies with its launcher (the job's store goes with it): its parent-death signal
    # stops every worker it forked, saying why in the worker's log.
    logs: dict[int, str] = {}
    launcher = int(os.environ.pop("DRA_PARENT_PID", "0")) or os.getppid()

    def launcher_gone(*_: object) -> None:
        for pid, log in list(logs.items()):
            try:
                with open(log, "a") as f:
                    f.write(f"[dra run] the launcher (pid {launcher}) is gone, and the job's store with it: "
                            "this worker is stopped\n")
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(1)

    signal.signal(signal.SIGTERM, launcher_gone)
    _process.die_with_parent(signal.SIGTERM, launcher)
    # Started without its directory (the job's) on sys.path: a module there is preloaded only when
    # nothing installed has its name, so one planted there shadows neither the standard library nor torch.
    sys.path.append(os.getcwd())
    began = time.monotonic()
    names = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else []
    for name in names:
        importlib.import_module(name)
    if "torch" in sys.modules:
        _warm_torch()
    # In its log (the job's <job>.zygote.log): how long the preload took, and that workers can start.
    print(f"[dra] fork server ready: preloaded {', '.join(names) or 'nothing'} in {time.monotonic() - began:.1f} s",
          file=sys.stderr, flush=True)
    out = sys.stdout.fileno()
    ids: dict[int, str] = {}

    def say(obj: dict) -> None:
        os.write(out, (json.dumps(obj) + "\n").encode())

    say({"ready": True, "pid": os.getpid()})
    buf = b""
    inp = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([inp], [], [], 0.02)
        if ready:
            chunk = os.read(inp, 65536)
            if not chunk:  # the launcher closed the pipe: no more workers; those running go on
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg.get("op") == "spawn":
                    zygote = os.getpid()
                    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                    pid = os.fork()
                    if pid == 0:
                        _child(msg, out, zygote)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                    ids[pid] = msg["id"]
                    logs[pid] = msg["log"]
                    say({"spawned": msg["id"], "pid": pid})
        while ids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = os.waitstatus_to_exitcode(status)
            logs.pop(pid, None)
            say({"exited": ids.pop(pid, "?"), "code": code})


if __name__ == "__main__":
    main()
