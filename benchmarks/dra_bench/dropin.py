"""``python -m dra.bench dropin``: the torchrun drop-in, measured on the project's tutorial-style
script (examples/ddp/tutorial_dra.py, unchanged) under ``dra run``.

- ``port``: the lines a port changes (examples/ddp/*_ddp.py -> *_dra.py, module docstrings left out);
- ``death``: kill -9 of a worker mid-epoch, with and without a DataLoader worker per process: the
  gap from the kill to the survivors' ``fault`` event (the world rebuilt without it), and whether
  the job finished (0 samples lost is the elastic tests' business; here: time);
- ``launcher``: SIGKILL of ``dra run`` itself: the time until no process of the job runs (the
  workers, their DataLoader workers, the fork server), with the fork server and with plain processes.

Every figure is measured on this machine (2 shared cores, loopback): a ratio side by side in one run
is what it supports. ``--json PATH`` writes the rows; ``--trials N`` repeats each measurement.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dra._argtypes import count_arg, positive_arg
from dra.testing import tagged_processes

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "ddp" / "tutorial_dra.py"


def _code(path: Path) -> list[str]:
    text = path.read_text()
    if text.startswith('"""'):
        text = text[text.index('"""', 3) + 3:]
    return text.splitlines()


def port_lines() -> list[dict]:
    rows = []
    for name in ("train", "tutorial"):
        diff = list(difflib.ndiff(_code(ROOT / f"examples/ddp/{name}_ddp.py"), _code(ROOT / f"examples/ddp/{name}_dra.py")))
        rows.append({"measure": "port_lines", "script": f"examples/ddp/{name}_ddp.py",
                     "added": sum(line.startswith("+ ") for line in diff),
                     "removed": sum(line.startswith("- ") for line in diff), "goal": 6, "label": "measured"})
    return rows


class _Job:
    """One `dra run` of the tutorial script; its processes carry a token so that all are found."""

    def __init__(self, folder: Path, nproc: int, workers: int, extra: list[str], options: dict) -> None:
        self.folder, self.token = folder, uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DRA_", "TORCHELASTIC_"))}
        env.update({"OMP_NUM_THREADS": "1", "DRA_BENCH_TOKEN": self.token})
        self.out = open(folder / "launcher.txt", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dra", "run", "--nproc", str(nproc), *extra, "--options", json.dumps(options),
             str(TUTORIAL), "--epochs", "40", "--workers", str(workers), "--batch-size", "8"],
            cwd=folder, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    def pids(self) -> list[int]:
        return tagged_processes("DRA_BENCH_TOKEN", self.token)

    def worker(self, rank: int) -> int:
        """The training process of launch rank `rank`, as the launcher reports it."""
        found = re.findall(rf"\[dra run\] rank {rank} \(local \d+\): pid (\d+)", (self.folder / "launcher.txt").read_text())
        return int(found[-1])

    def wait_for_epoch(self, epoch: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while f"epoch {epoch} |" not in (self.folder / "launcher.txt").read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"no epoch {epoch}: {(self.folder / 'launcher.txt').read_text()[-2000:]}")
            time.sleep(0.05)

    def close(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.out.close()


def death_notice(trials: int, fault_timeout_s: float) -> list[dict]:
    rows = []
    for workers in (0, 1):
        gaps = []
        for _ in range(trials):
            with tempfile.TemporaryDirectory(prefix="dra-dropin-") as tmp:
                events = Path(tmp) / "events.jsonl"
                job = _Job(Path(tmp), 2, workers, [], {"policy": "none", "fault_timeout_s": fault_timeout_s,
                                                       "events_path": str(events)})
                try:
                    job.wait_for_epoch(1, 240)
                    victim = job.worker(1)
                    t_kill = time.time()
                    os.kill(victim, signal.SIGKILL)
                    deadline = time.monotonic() + 60
                    while not any(json.loads(line)["event"] == "fault" for line in (events.read_text().splitlines()
                                                                                    if events.exists() else [])):
                        if time.monotonic() > deadline:
                            raise RuntimeError("no fault event")
                        time.sleep(0.02)
                    fault = next(json.loads(line) for line in events.read_text().splitlines()
                                 if json.loads(line)["event"] == "fault")
                    gaps.append(fault["time"] - t_kill)
                finally:
                    job.close()
        rows.append({"measure": "kill9_to_recovered_s", "dataloader_workers": workers, "trials": trials,
                     "fault_timeout_s": fault_timeout_s, "median_s": statistics.median(gaps), "max_s": max(gaps),
                     "values_s": [round(g, 3) for g in gaps], "label": "measured"})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def launcher_death(trials: int) -> list[dict]:
    rows = []
    for zygote in (True, False):
        times = []
        for _ in range(trials):
            with tempfile.TemporaryDirectory(prefix="dra-dropin-") as tmp:
                job = _Job(Path(tmp), 2, 1, [] if zygote else ["--no-zygote"], {"policy": "none"})
                try:
                    job.wait_for_epoch(1, 240)
                    processes = len(job.pids())
                    t0 = time.monotonic()
                    job.proc.send_signal(signal.SIGKILL)
                    while job.pids() and time.monotonic() - t0 < 30:
                        time.sleep(0.005)
                    times.append(time.monotonic() - t0)
                finally:
                    job.close()
        rows.append({"measure": "launcher_sigkill_to_no_process_s", "fork_server": zygote, "trials": trials,
                     "processes": processes, "median_s": statistics.median(times), "max_s": max(times),
                     "goal_s": 5.0, "label": "measured"})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dra.bench dropin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=count_arg, default=3)
    p.add_argument("--fault-timeout-s", type=positive_arg, default=3.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = port_lines()
    for r in rows:
        print(json.dumps(r), flush=True)
    rows += death_notice(args.trials, args.fault_timeout_s)
    rows += launcher_death(args.trials)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"suite": "dropin", "date": time.strftime("%Y-%m-%d"), "rows": rows},
                                              indent=1))
    return 0
