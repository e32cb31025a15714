"""Launches real elastic jobs for the tests: a dedicated store process plus worker processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from dra_bench._store import StoreProcess

HERE = Path(__file__).resolve().parent
WORKER = HERE / "elastic_worker.py"


#: A test script's digest of its state, pasted into the script (`SCRIPT = HEAD + STATE_DIGEST + BODY`;
#: the script imports hashlib and torch): every tensor's dtype and bytes and every other value's
#: repr, in key order, over one or more state dicts. Two ranks with equal digests hold the same state.
# `dra run` arguments for a job whose workers import sklearn: the fork server imports it once, and
# each worker forked from it skips the import (1.6 s of CPU a worker).
SKLEARN_PRELOAD = ("--preload", "torch,dra,dra.elastic,sklearn.datasets")

STATE_DIGEST = r'''
def digest(*states):
    h = hashlib.sha256()
    def feed(v):
        if torch.is_tensor(v):
            h.update(str(v.dtype).encode()); h.update(v.detach().float().numpy().tobytes())
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(str(k).encode()); feed(v[k])
        elif isinstance(v, (list, tuple)):
            for x in v:
                feed(x)
        elif not callable(v):
            h.update(repr(v).encode())
    for s in states:
        feed(s)
    return h.hexdigest()[:16]
'''


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` of a command a Ctrl-C test starts: SIGINT at its default and unblocked, as a
    command started at a terminal has it. A process started from a background shell (CI's, or
    ``cmd &``) inherits SIGINT ignored, and in two fresh-clone runs of the suite the commands under
    test went on after SIGINT."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, tmp: Path, nproc: int, **cfg):
        self.tmp, self.nproc = Path(tmp), nproc
        self.cfg = {"out": str(self.tmp), **cfg}
        self.procs: dict[str, subprocess.Popen] = {}
        self._store = StoreProcess()  # its output drained: a full pipe would block the store
        self.store = self._store.proc
        self.port = self._store.port

    def env(self, **extra):
        env = dict(os.environ)
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port), "WORLD_SIZE": str(self.nproc),
                    "DRA_JOB_ID": "t", "DRA_TEST_CFG": json.dumps(self.cfg), "OMP_NUM_THREADS": "1"})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, name: str, worker: Path = WORKER, **env):
        with open(self.tmp / f"out-{name}.txt", "w") as out:
            self.procs[name] = subprocess.Popen([sys.executable, str(worker)], env=self.env(**env), stdout=out,
                                                stderr=subprocess.STDOUT)

    def start_all(self):
        for r in range(self.nproc):
            self.start(f"r{r}", RANK=r)

    def wait(self, timeout: float = 120, hung: tuple[str, ...] = ()) -> dict[str, int]:
        """Exit codes; processes named in `hung` are killed once the others are done."""
        deadline = time.monotonic() + timeout
        codes = {}
        try:
            for name, p in self.procs.items():
                if name not in hung:
                    codes[name] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            self.close()
        return codes

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        self._store.close()

    def output(self, name: str) -> str:
        return (self.tmp / f"out-{name}.txt").read_text()

    def records(self, kind: str | None = None) -> list[dict]:
        out = []
        for f in sorted(self.tmp.glob("log-*.jsonl")):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                if kind is None or rec["kind"] == kind:
                    out.append(rec)
        return out

    def events(self) -> list[dict]:
        path = self.tmp / "events.jsonl"
        return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def check_exactly_once(job: Job, dataset_size: int, epochs: int) -> None:
    """Every sample of every data epoch consumed exactly once by the world's committed steps.

    A step may be committed in a world epoch and redone after a fault in a later one: the
    record of the latest world epoch counts. Within one (step, world epoch) the ranks' shares
    are disjoint and lie inside the step's global batch."""
    latest: dict[tuple[int, int], dict] = {}
    groups: dict[tuple[int, int, int], list[dict]] = {}
    for rec in job.records("commit"):
        key = (rec["data_epoch"], rec["step"])
        if key not in latest or rec["epoch"] > latest[key]["epoch"]:
            latest[key] = rec
        groups.setdefault((rec["data_epoch"], rec["step"], rec["epoch"]), []).append(rec)
    for (_, step, wepoch), recs in groups.items():
        batches = {tuple(r["batch"]) for r in recs}
        assert len(batches) == 1, f"step {step} epoch {wepoch}: ranks disagree on the global batch"
        shares = [i for r in recs for i in r["share"]]
        assert len(shares) == len(set(shares)), f"step {step} epoch {wepoch}: a sample in two shares"
        assert set(shares) <= set(recs[0]["batch"])
    for e in range(epochs):
        seen = [i for (de, _), rec in sorted(latest.items()) if de == e for i in rec["batch"]]
        assert len(seen) == dataset_size, f"data epoch {e}: {len(seen)} samples consumed, expected {dataset_size}"
        assert sorted(seen) == list(range(dataset_size)), f"data epoch {e}: some sample skipped or repeated"


#: The start of a torchrun-style script for ``run_logged_script``: its imports, its CFG, torch's
#: default group, and LOG (the process's JSON-lines file, by pid: a replacement writes its own).
SCRIPT_HEAD = r"""
import json, os
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
dist.init_process_group("gloo")
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
"""

def grown_run(tmp_path: Path, script: str, cfg: dict, grow_at: int, **options: object) -> tuple[str, dict[int, list[dict]]]:
    """``script`` on 3 processes started as a world of 2 that grows to 3 at step ``grow_at``
    (policy none, fault timeout 3 s, ``options`` added): its output, and its records by step.
    Asserts that it exited 0 and that the world did grow."""
    code, logs, records = run_logged_script(
        tmp_path, script, 3, {"policy": "none", "fault_timeout_s": 3.0, "start_size": 2,
                              "resize_schedule": {str(grow_at): 3}, **options}, cfg, timeout=120)
    assert code == 0, logs[-4000:]
    steps: dict[int, list[dict]] = {}
    for r in records:
        steps.setdefault(r["step"], []).append(r)
    assert max(len(rs) for rs in steps.values()) == 3, "the world never grew to 3"
    return logs, steps


LINEAR_DATA = """
x, y = torch.randn(n, 4), torch.randn(n, 1)
ds = torch.utils.data.TensorDataset(x, y)
"""


def linear_job_script(body: str, after: str = "", data: str = LINEAR_DATA, loader_args: str = "") -> str:
    """A worker script for ``run_logged_script``: a linear model on CFG["n"] (default 64) random
    samples, batches of 4, one epoch under ``de.init``; ``body`` runs after each optimizer step
    (indented 8 spaces) with ``loss``, ``step``, ``ctl``, ``cfg``, ``log`` (the worker's JSON-lines
    file) and ``dra`` at hand; ``after`` (not indented) after the epoch, before the log closes.
    ``data`` defines the dataset ``ds`` from ``n`` (pairs of a 4-vector and a target);
    ``loader_args`` adds the DataLoader's keywords (``", num_workers=1"``)."""
    return """
import json, math, os, time, torch
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
torch.manual_seed(0)
n = cfg.get("n", 64)
""" + data + """model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sampler = de.DistributedSampler(ds, seed=1)
loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler""" + loader_args + """)
ctl = de.init(model, opt, sampler)
log = open(os.path.join(cfg["out"], f"log-{ctl.uid}.jsonl"), "a")
for epoch in ctl.epochs(1):
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(ctl.model(xb), yb)
        ctl.optimizer.zero_grad(); loss.backward(); ctl.optimizer.step()
        step = ctl.step_index
""" + body + after + """
log.close()
"""


def run_logged_script(tmp_path: Path, script: str, nproc: int, options: dict, cfg: dict,
                      timeout: float, launcher_args: tuple[str, ...] = ()) -> tuple[int, str, list[dict]]:
    """Runs ``script`` under ``dra run`` with ``nproc`` workers (and ``launcher_args``), the job's
    options and CFG (JSON, ``out`` = tmp_path) in its environment; returns the exit code (-1: timed out), the launcher's
    output, and every record the workers wrote to tmp_path/log-*.jsonl. Every process it started is
    killed at the end (an environment token marks them)."""
    import uuid

    from dra.testing import kill_tagged

    path = tmp_path / "train.py"
    path.write_text(script)
    token = uuid.uuid4().hex
    env = dict(os.environ, DRA_TEST_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               CFG=json.dumps(dict(cfg, out=str(tmp_path))))
    for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
              "TORCHELASTIC_RUN_ID", "DRA_JOIN", "DRA_LAUNCHER"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "dra", "run", "--nproc", str(nproc), "--log-dir", str(tmp_path / "logs"),
           "--options", json.dumps(options), *launcher_args, str(path)]
    try:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        code, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        code, out = -1, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    finally:
        kill_tagged("DRA_TEST_TOKEN", token)
    records = [json.loads(line) for f in sorted(tmp_path.glob("log-*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    return code, out, records
