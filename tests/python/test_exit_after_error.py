"""A worker of `dra run` exits promptly, with whatever forked children it has, after an uncaught
exception or at a normal end (real processes: `dra run`, its store, Gloo), and a forked child that
blocks before any of dra's code runs in it still ends at SIGTERM.

`dra run` makes SIGTERM ask the job to stop (dra's handler). A forked child inherited that
handler, where it asked the child's copy of the controller to stop and went on. An interpreter's
exit SIGTERMs its daemonic multiprocessing children and joins them without a timeout: a DataLoader
worker that had not yet installed torch's own SIGTERM handler (a worker still starting, on a
loaded host) lived on, and the training process hung after printing its traceback (seen once in
test_outside_scripts.py: "iterable_workers: still running after 90 s"). A forked child's SIGTERM
now keeps its default action.

The scripts hold every DataLoader worker at its start (an at-fork hook) until the training
process has begun to exit, so that the exit's SIGTERM always reaches a worker still starting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from dra.testing import kill_tagged, tagged_processes

pytestmark = pytest.mark.timeout(120)

# Each process forked from now on (a DataLoader worker) waits at its start until its parent began to
# exit, and a little longer: the exit's SIGTERM arrives while it has only the handlers it inherited.
HOLD_FORKED_CHILDREN = '''
import atexit, os, sys, time

OUT = os.environ["OUT"]

def _exiting(pid):
    return os.path.join(OUT, f"exiting-{pid}")

def _hold():
    deadline = time.monotonic() + 30
    while not os.path.exists(_exiting(os.getppid())) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(2.0)

def _mark_exiting():
    open(_exiting(os.getpid()), "w").close()
'''

LOADER_ERROR = HOLD_FORKED_CHILDREN + '''
import torch
from torch.utils.data import DataLoader, TensorDataset
import dra.elastic as de

ds = TensorDataset(torch.randn(64, 4))
sampler = de.ElasticSampler(len(ds), global_batch=16, seed=0)
net = torch.nn.Linear(4, 1)
ctl = de.init(net, torch.optim.SGD(net.parameters(), lr=0.1), sampler)
atexit.register(_mark_exiting)  # runs before multiprocessing's exit SIGTERMs the workers
os.register_at_fork(after_in_child=_hold)
loader = DataLoader(ds, batch_sampler=sampler, num_workers=2)
batches = iter(loader)  # the workers start
print(f"rank {ctl.rank}: DataLoader workers starting; raising", file=sys.stderr, flush=True)
raise RuntimeError("an error in the training loop")
'''

DAEMON_CHILD_AT_END = HOLD_FORKED_CHILDREN + '''
import multiprocessing
import torch
import dra.elastic as de

sampler = de.ElasticSampler(64, global_batch=16, seed=0)
net = torch.nn.Linear(4, 1)
ctl = de.init(net, torch.optim.SGD(net.parameters(), lr=0.1), sampler)
atexit.register(_mark_exiting)

def serve():
    while True:
        time.sleep(0.1)

child = multiprocessing.get_context("fork").Process(target=serve, daemon=True)
child.start()
print(f"rank {ctl.rank}: a daemon child {child.pid} runs; the script ends", file=sys.stderr, flush=True)
'''


def _dra_run(tmp_path: Path, name: str, script: str, timeout: float = 45) -> tuple[int | None, float, str]:
    """`dra run --nproc-per-node 2` of the script: (exit code or None at the timeout, seconds, logs)."""
    out = tmp_path / name
    out.mkdir()
    (out / "train.py").write_text(textwrap.dedent(script))
    token = uuid.uuid4().hex
    env = dict(os.environ, OUT=str(out), DRA_TEST_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1")
    for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
              "TORCHELASTIC_RUN_ID", "DRA_JOIN", "DRA_STOP_ON_SIGTERM", "DRA_LAUNCHER"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "dra", "run", "--nproc-per-node", "2", "--log-dir", str(out / "logs"),
           "--rdzv-id", name, str(out / "train.py")]
    start = time.monotonic()
    alive = ""
    proc = subprocess.Popen(cmd, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
        # Looked at before the launcher goes (its workers stop once it is gone).
        # Who is still there, and where each Python process stands (faulthandler prints every
        # thread's stack into its log at SIGABRT): a hang seen once under a loaded suite.
        for pid in tagged_processes("DRA_TEST_TOKEN", token):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("State"))
                alive += f"pid {pid} ppid {_ppid(pid)} {state}: {argv[:160]}\n"
                os.kill(pid, signal.SIGABRT)
            except (OSError, StopIteration):
                pass
        time.sleep(2.0)
    finally:
        took = time.monotonic() - start
        proc.kill()
        proc.communicate()
        kill_tagged("DRA_TEST_TOKEN", token)
    logs = "".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted((out / "logs").glob("*.log")))
    return code, took, logs + (f"--- still running at the timeout\n{alive}" if alive else "")


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_rank_with_dataloader_workers_still_starting_exits_after_an_uncaught_exception(tmp_path):
    code, took, logs = _dra_run(tmp_path, "loader_error", LOADER_ERROR)
    assert code is not None, f"a rank never exited after its uncaught exception ({took:.0f} s)\n{logs[-12000:]}"
    assert code == 1, logs[-5000:]
    assert logs.count("\nRuntimeError: an error in the training loop") == 2, logs[-5000:]
    assert logs.count("leaves the job mid-training") == 2, logs[-5000:]
    # A DataLoader worker's copy of dra's handler never took the SIGTERM.
    assert "[dra] SIGTERM" not in logs, logs[-5000:]


def test_a_rank_with_a_daemon_child_exits_at_the_end_of_its_script(tmp_path):
    code, took, logs = _dra_run(tmp_path, "daemon_child", DAEMON_CHILD_AT_END)
    assert code is not None, f"a rank never exited at the end of its script ({took:.0f} s)\n{logs[-12000:]}"
    assert code == 0, logs[-5000:]
    assert logs.count("a daemon child") == 2 and "[dra] SIGTERM" not in logs, logs[-5000:]


# A forked child blocked before dra's own at-fork hook runs (a library's earlier hook deadlocks in
# the child: a second lock of a plain mutex, a futex wait that no signal ends): SIGTERM must still
# end it. Before, the child held dra's Python handler, which could never run, and a SIGTERM (an
# exiting parent's to its daemonic children, which it then joins without a timeout) left it alive.
BLOCKED_BEFORE_DRA_HOOK = """
import ctypes, os, signal, time

def stuck_in_c():
    libc = ctypes.CDLL(None)
    m = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(m)
    libc.pthread_mutex_lock(m)

os.register_at_fork(after_in_child=stuck_in_c)
from dra import _process

class Ctl:
    uid = 0
    stop_requested = False

    def request_stop(self):
        self.stop_requested = True

ctl = Ctl()
_process.stop_on_sigterm(ctl)
pid = os.fork()
if pid == 0:
    os._exit(0)  # never reached: the hook above blocks
time.sleep(1.0)
os.kill(pid, signal.SIGTERM)
deadline, status = time.monotonic() + 10.0, None
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    status = None
ended = status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
print("child ended by SIGTERM" if ended else "child alive 10 s after SIGTERM")
print("parent keeps its handler:", signal.getsignal(signal.SIGTERM) in _process._sigterm_handlers)
"""


def test_a_child_blocked_before_dras_fork_hook_still_ends_at_sigterm(tmp_path):
    script = tmp_path / "fork_blocked.py"
    script.write_text(BLOCKED_BEFORE_DRA_HOOK)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "child ended by SIGTERM" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    # The parent's own SIGTERM still asks the job to stop (its handler is back after the fork).
    assert "parent keeps its handler: True" in proc.stdout, proc.stdout
