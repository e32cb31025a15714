"""The wall clock steps while the pool runs jobs (NTP correcting a drifted clock, a VM resumed
after a suspend, an operator's ``date -s``): an hour forward or back, for the daemon's process, or
for a job's launcher and its workers. Heartbeat expiry, silence limits, cooldowns, re-plans and a
launcher's own windows are durations: none may move with the wall clock. Real processes, real
cgroup slots, a real training job; the clock is stepped for the processes under test only, with
libfaketime (LD_PRELOAD, its offset read from a file at every call; the monotonic clock is left
alone, as an NTP step leaves it), never for the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool import _cgroup
from dra.pool.client import PoolClient
from dra.pool.server import PoolServer
from dra.pool.service import PoolService

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pool" / "train.py"
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
NO_FAKETIME = None if FAKETIME.exists() else (f"libfaketime is not installed ({FAKETIME} is missing; Debian package "
                                              "'faketime', which scripts/setup.sh installs)")
NO_CGROUPS = _cgroup.available()

pytestmark = pytest.mark.skipif(bool(NO_FAKETIME), reason=str(NO_FAKETIME))

# libfaketime 0.9.10 (Debian 12) with FAKETIME_DONT_FAKE_MONOTONIC turns Python 3.11's time.sleep
# (clock_nanosleep on CLOCK_MONOTONIC, TIMER_ABSTIME) into EINVAL (wolfcw/libfaketime#426): preloaded
# before it, this passes clock_nanosleep to the kernel as it is (no clock it sleeps on is faked here).
SLEEP_FIX = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
  return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
}
"""


@pytest.fixture(scope="module")
def sleep_fix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sleep_fix")
    (folder / "sleep_fix.c").write_text(SLEEP_FIX)
    try:
        r = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(folder / "sleep_fix.so"),
                            str(folder / "sleep_fix.c")], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no C compiler (cc) to build the shim libfaketime 0.9.10 needs under Python 3.11")
    assert r.returncode == 0, r.stderr
    return folder / "sleep_fix.so"


def _clock(tmp_path: Path, sleep_fix: Path) -> tuple[Path, dict[str, str]]:
    """A clock file (libfaketime's offset from the real time, "+0" to start with) and the
    environment that makes a process read its wall clock (only that) through it."""
    path = tmp_path / "clock"
    path.write_text("+0\n")
    return path, {"LD_PRELOAD": f"{sleep_fix} {FAKETIME}", "FAKETIME_TIMESTAMP_FILE": str(path),
                  "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _step(clock: Path, offset: str) -> None:
    tmp = clock.with_suffix(".tmp")
    tmp.write_text(offset + "\n")
    os.replace(tmp, clock)  # never a half-written offset


def _events(state: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []


def _wait_event(state: Path, match, timeout_s: float) -> dict | None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = next((e for e in _events(state) if match(e)), None)
        if found is not None:
            return found
        time.sleep(0.05)
    return None


def _train(tmp_path: Path, epochs: int) -> list[str]:
    return [sys.executable, str(TRAIN), "--model", "logreg", "--data", "wine", "--epochs", str(epochs),
            "--global-batch", "16", "--out", str(tmp_path / "out")]


class _Daemon:
    """``dra pool serve`` on two cgroup CPU slots, its wall clock read through ``clock``."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.state = tmp_path / "state"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dra", "pool", "serve", "--inventory", "slots:2", "--state", str(self.state),
             "--name", f"clk{os.getpid()}", "--heartbeat-timeout-s", "3", "--no-slot-guarantee"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env}, cwd=tmp_path)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert "serving" in line, line + (self.proc.stdout.read() if self.proc.stdout else "")
        self.client = PoolClient(f"unix:{self.state / 'pool.sock'}")

    def close(self) -> None:
        for e in _events(self.state):  # whatever of a job is left (the test failed halfway)
            if e["event"] == "launch":
                try:
                    os.killpg(e["pid"], signal.SIGKILL)
                except OSError:
                    pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.mark.skipif(bool(NO_CGROUPS), reason=f"no cgroup v1 slots here: {NO_CGROUPS}")
@pytest.mark.timeout(90)
def test_the_daemons_clock_an_hour_forward_leaves_a_training_job_its_leases(tmp_path: Path, sleep_fix: Path) -> None:
    """Before: the daemon compared heartbeats with its wall clock; stepped an hour forward, every
    lease looked silent for an hour, past the silence limit, so the loop killed the launcher of a
    healthy job as hung and the job failed as lost. (The launcher is held for a second around the
    step, as a loaded host holds it, so that the loop looks before its next sync; without that the
    race decides.)"""
    clock, env = _clock(tmp_path, sleep_fix)
    pool = _Daemon(tmp_path, env)
    state = pool.state
    try:
        pool.client.submit({"name": "t", "cwd": str(tmp_path), "min_size": 2, "max_size": 2,
                            "command": _train(tmp_path, 200)})
        assert _wait_event(state, lambda e: e["event"] == "first_step", 45), _events(state)[-10:]
        launcher = next(e["pid"] for e in _events(state) if e["event"] == "launch")
        os.kill(launcher, signal.SIGSTOP)
        try:
            time.sleep(0.3)
            _step(clock, "+3600")
            time.sleep(1.0)
        finally:
            try:
                os.kill(launcher, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the daemon killed it as hung (before): the job's state below says so
        assert pool.client.wait(["t"], timeout_s=60) == {"t": "finished"}, _events(state)[-10:]
        events = _events(state)
    finally:
        pool.close()
    assert not [e for e in events if e["event"] == "heartbeat_late"], events
    releases = [e for e in events if e["event"] == "release"]
    assert len(releases) == 2 and {e["reason"] for e in releases} <= {"worker exited", "job ended"}, releases
    assert json.loads((tmp_path / "out" / "result.json").read_text())["final_world"] == 2


@pytest.mark.skipif(bool(NO_CGROUPS), reason=f"no cgroup v1 slots here: {NO_CGROUPS}")
@pytest.mark.timeout(90)
def test_the_daemons_clock_an_hour_back_still_reclaims_a_dead_jobs_leases_at_once(tmp_path: Path, sleep_fix: Path) -> None:
    """Before: stepped an hour back, the daemon's loop stopped looking at its launchers (it did so
    once a quarter second of wall time after its last look, an hour ahead now) and the last
    heartbeats came from the future: a job killed right then kept both its devices for an hour.
    Now its leases come back within the heartbeat timeout (3 s)."""
    clock, env = _clock(tmp_path, sleep_fix)
    pool = _Daemon(tmp_path, env)
    state = pool.state
    released: list[dict] = []
    try:
        pool.client.submit({"name": "t", "cwd": str(tmp_path), "min_size": 2, "max_size": 2,
                            "command": _train(tmp_path, 100000)})
        assert _wait_event(state, lambda e: e["event"] == "first_step", 45), _events(state)[-10:]
        launcher = next(e["pid"] for e in _events(state) if e["event"] == "launch")
        os.kill(launcher, signal.SIGSTOP)  # no sync between the step and the kill
        time.sleep(0.3)
        _step(clock, "-3600")
        killed = time.monotonic()
        os.killpg(launcher, signal.SIGKILL)  # the launcher and its workers: the job is dead
        deadline = killed + 20
        while time.monotonic() < deadline:
            released = [e for e in _events(state) if e["event"] == "release"]
            if len(released) == 2:
                break
            time.sleep(0.05)
        took = time.monotonic() - killed
        events = _events(state)
        status = pool.client.status()
    finally:
        pool.close()
    assert len(released) == 2, (took, events[-10:])
    assert took < 10, took
    assert not status["leases"], status["leases"]
    assert next(j for j in status["jobs"] if j["name"] == "t")["state"] == "failed", status["jobs"]


@pytest.mark.timeout(90)
def test_a_launchers_clock_an_hour_back_still_reports_its_world_and_the_job_grows(tmp_path: Path, sleep_fix: Path) -> None:
    """Before: a launcher asked its store whether the job's world had formed at most twice a second
    of wall time; stepped an hour back before the world formed, it stopped asking for an hour, the
    pool took the job for a script without dra and never resized it. Now the job grows onto a
    device freed beside it. The launcher (and its workers) run on the stepped clock,
    the pool on the real one."""
    clock, env = _clock(tmp_path, sleep_fix)
    state = tmp_path / "state"
    svc = PoolService([P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(2)], state,
                      heartbeat_timeout_s=3.0, scale_every_s=0.5, launch_jobs=False)
    server = PoolServer(svc).start()
    go = tmp_path / "go"
    wrapper = tmp_path / "wrapper.py"  # the workers form their world once the test says so
    wrapper.write_text(f"import os, runpy, sys, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
                       f"sys.argv = {[str(TRAIN), *_train(tmp_path, 100000)[2:]]!r}\n"
                       f"runpy.run_path({str(TRAIN)!r}, run_name='__main__')\n")
    launcher = None
    try:
        client = PoolClient(server.url)
        # "hold" holds one device (this test is its launcher); "t" starts on the other.
        client.submit({"name": "hold", "cwd": str(tmp_path), "min_size": 1, "max_size": 1, "command": ["true"]})
        client.submit({"name": "t", "cwd": str(tmp_path), "min_size": 1, "max_size": 2,
                       "command": [sys.executable, str(wrapper)]})
        with open(tmp_path / "launcher.log", "w") as log:
            launcher = subprocess.Popen([sys.executable, "-m", "dra", "run", "--pool", server.url, "--job", "t"],
                                        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=tmp_path,
                                        start_new_session=True)
        assert _wait_event(state, lambda e: e["event"] == "worker_start" and e["job"] == "t", 45), \
            (tmp_path / "launcher.log").read_text()[-2000:]
        time.sleep(1.0)  # the launcher asked its store once: no world yet
        _step(clock, "-3600")
        stepped = time.monotonic()
        time.sleep(0.3)
        go.write_text("")
        assert _wait_event(state, lambda e: e["event"] == "world" and e["job"] == "t", 30), \
            (_events(state)[-10:], (tmp_path / "launcher.log").read_text()[-2000:])
        (held,) = [l["id"] for l in svc.status()["leases"] if l["job"] == "hold"]
        svc.sync("hold", [], [held], None, done=True)  # its device is free: the job grows onto it
        grown = _wait_event(state, lambda e: e["event"] == "grant" and e["job"] == "t" and e["reason"].startswith("resize"),
                            20)
        assert grown, _events(state)[-10:]
        assert _wait_event(state, lambda e: e["event"] == "worker_start" and e["lease"] == grown["lease"], 20), \
            _events(state)[-10:]  # a joiner runs on it (the arbiter may give it back later: a tiny model)
        assert next(j for j in svc.status()["jobs"] if j["name"] == "t")["state"] == "running"
        # Its heartbeats go on after the step: 5 s on, a lease of its has been heard from within the
        # last 2 s. Paced by the wall clock, they stopped for an hour (the age would only grow). A
        # heartbeat_late event alone says little here: the suite's load once held the launcher 3 s.
        time.sleep(max(0.0, stepped + 5 - time.monotonic()))
        deadline, ages = time.monotonic() + 10, []
        while time.monotonic() < deadline:
            ages = [l["heartbeat_age_s"] for l in svc.status()["leases"] if l["job"] == "t"]
            if ages and min(ages) < 2.0:
                break
            time.sleep(0.1)
        assert ages and min(ages) < 2.0, (ages, _events(state)[-10:])
        assert not [e for e in _events(state) if e["event"] == "finish" and e["job"] == "t"], "lost before its cancel"
        client.cancel("t")
        assert launcher.wait(timeout=30) is not None
        deadline = time.monotonic() + 10  # the pool sees its launcher gone within a quarter second
        while time.monotonic() < deadline and [l for l in svc.status()["leases"] if l["job"] == "t"]:
            time.sleep(0.05)
        assert not [l for l in svc.status()["leases"] if l["job"] == "t"], svc.status()["leases"]
    finally:
        if launcher is not None and launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=10)
        server.close()
