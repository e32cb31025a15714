"""A bounded soak of the live pool, as an outside reviewer runs it: a real daemon (``dra pool
serve`` with cgroup CPU slots, restarted once on the same state), driven by a seeded random
stream of operations nobody here wrote: small real training jobs (examples/pool/train.py) of
random sizes (some larger than the pool, some whose min_size is more than is free), priorities,
plain commands, commands that exit non-zero, cancels at random moments, a kill -9 of a worker or
a launcher. At every sample, and over the whole event log, the invariants the pool guide promises
must hold: no device leased past its capacity, no lease granted twice, a job never holds more
than its max_size, an ended job holds no lease, no lease cgroup outlives its lease; after the
stream every job ends within a bound in the state its history asks for (cancelled, failed with
a reason, finished), no launcher outlives its job, and once the pool closes no cgroup of it and
no process of the soak remains."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dra.pool import _cgroup
from dra.pool.server import PoolClient

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pool" / "train.py"
NO_CGROUPS = _cgroup.available()
ENDED = ("finished", "failed", "cancelled")
DEVICES = 3


class Soak:
    def __init__(self, tmp: Path, seed: int) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.name = f"soak{os.getpid()}"
        self.mark = f"DRA_SOAK_MARK={tmp}"  # in every job's environment: how its processes are found
        self.rng = random.Random(seed)
        self.seed = seed
        self.daemon: subprocess.Popen | None = None
        self.client: PoolClient | None = None
        self.jobs: dict[str, dict[str, Any]] = {}  # name -> what the soak did to it, what it expects
        self.violations: list[str] = []
        self.samples = 0
        self.last_status: dict[str, Any] = {"jobs": [], "leases": []}
        self.maxes: dict[str, int] = {}  # the largest max_size a name had

    # -- the daemon ------------------------------------------------------------------------------
    def start(self) -> None:
        log = open(self.tmp / "daemon.log", "a")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "dra", "pool", "serve", "--inventory", f"slots:{DEVICES}", "--state", str(self.state),
             "--name", self.name, "--scale-every-s", "0.5", "--heartbeat-timeout-s", "3",
             "--no-slot-guarantee"],  # its slots must not take the CPU first from the tests beside it
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.client = PoolClient(f"unix:{self.state}/pool.sock")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.daemon.poll() is None, (self.tmp / "daemon.log").read_text()[-3000:]
            try:
                self.client.status()
                return
            except Exception:
                time.sleep(0.1)
        raise AssertionError("the daemon did not answer in 30 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        assert self.daemon is not None
        self.daemon.send_signal(sig)
        self.daemon.wait(timeout=30)
        self.daemon = None

    # -- reading ---------------------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        path = self.state / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    def lease_dirs(self) -> dict[int, Path]:
        base = Path(_cgroup.ROOT, "cpu", "dra", self.name)
        out = {}
        for d in base.glob("slot*/lease-*"):
            out[int(d.name.split("-", 1)[1])] = d
        return out

    def procs_in(self, d: Path) -> list[int]:
        try:
            return [int(x) for x in (d / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def launcher_pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for e in self.events():
            if e["event"] == "launch":
                out.setdefault(e["job"], []).append(e["pid"])
        return out

    def _is_mine(self, pid: int) -> bool:
        """A process of this soak: its mark in the environment, or this pool's state in its command
        line (a launcher gets the job's environment only for its workers)."""
        try:
            proc = Path(f"/proc/{pid}")
            return (self.mark.encode() in (proc / "environ").read_bytes().split(b"\0")
                    or str(self.state).encode() in (proc / "cmdline").read_bytes())
        except OSError:
            return False

    def soak_processes(self) -> list[str]:
        found = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                env = (p / "environ").read_bytes().split(b"\0")
                if self.mark.encode() in env:
                    cmd = (p / "cmdline").read_bytes().replace(bytes(1), b" ")[:200]
                    found.append(f"{p.name}: {cmd!r}")
            except OSError:
                pass
        return found

    # -- invariants at a sample ------------------------------------------------------------------
    def sample(self) -> None:
        assert self.client is not None
        before = self.lease_dirs()
        status = self.client.status()
        self.last_status = status
        after = self.lease_dirs()
        self.samples += 1
        where = f"sample {self.samples} (seed {self.seed})"
        held: dict[str, float] = {}
        ids = [l["id"] for l in status["leases"]]
        if len(ids) != len(set(ids)):
            self.violations.append(f"{where}: a lease id twice: {ids}")
        for l in status["leases"]:
            held[l["device"]] = held.get(l["device"], 0.0) + l["share"]
        for device, share in held.items():
            if share > 1 + 1e-9:
                self.violations.append(f"{where}: device {device} leased {share:g} times: {status['leases']}")
        jobs = {j["name"]: j for j in status["jobs"]}
        for j in jobs.values():
            if j["workers"] > j["max_size"]:
                self.violations.append(f"{where}: {j['name']} holds {j['workers']} > max_size {j['max_size']}")
        for l in status["leases"]:
            state = jobs.get(l["job"], {}).get("state")
            if state in ("finished", "failed"):
                self.violations.append(f"{where}: ended job {l['job']} ({state}) still holds lease {l}")
        # No compute without a lease: nothing runs in a slot's (or the pool's) cgroup outside a lease.
        base = Path(_cgroup.ROOT, "cpu", "dra", self.name)
        for d in [base, *base.glob("slot*")]:
            if self.procs_in(d):
                self.violations.append(f"{where}: processes {self.procs_in(d)} in {d}, outside every lease")
        # A lease cgroup that outlives its lease (seen before and after the status, not in it).
        lingering = {e["lease"] for e in self.events() if e["event"] == "release" and e.get("lingering")}
        for lid in set(before) & set(after) - set(ids) - lingering:
            procs = self.procs_in(after[lid])
            if after[lid].exists():
                self.violations.append(f"{where}: cgroup {after[lid]} of released lease {lid} remains, procs {procs}")

    # -- operations -------------------------------------------------------------------------------
    def submit(self, i: int) -> None:
        assert self.client is not None
        r = self.rng
        kind = r.choice(["dra", "dra", "dra", "plain", "fail"])
        name = f"{kind}{i}"
        ended = [n for n, j in self._states().items() if j in ENDED and n.startswith(kind)]
        if ended and r.random() < 0.2:  # a name free again once its job ended: the new job replaces the old
            name = r.choice(ended)
        min_size = r.choice([1, 1, 1, 2, 2, 3, 4])  # 4: more than the pool has, refused
        max_size = min_size + r.choice([0, 0, 1, 2, 5])  # up to 9: more than the pool, allowed
        spec: dict[str, Any] = {"name": name, "cwd": str(ROOT), "log": str(self.tmp / "logs"),
                                "min_size": min_size, "max_size": max_size,
                                "priority": r.choice(["low", "normal", "normal", "high"]),
                                "elastic": min_size != max_size, "resize_cooldown_s": r.choice([0.0, 1.0]),
                                "env": {"DRA_SOAK_MARK": str(self.tmp)}, "shrink_grace_s": 5.0,
                                "fraction": r.choice([1.0, 1.0, 0.5])}  # half a slot: two jobs share it
        if kind == "dra":
            model, data, epochs = r.choice([("logreg", "breast_cancer", 30), ("mlp", "digits", 4),
                                            ("logreg", "wine", 60)])
            spec.update(preload=["torch", "dra", "dra.elastic", "sklearn.datasets"],
                        command=[sys.executable, str(TRAIN), "--model", model, "--data", data, "--epochs",
                                 str(epochs), "--out", str(self.tmp / "out" / name)])
        elif kind == "plain":
            spec["command"] = ["sh", "-c", f"sleep {r.choice([1, 2, 4])}"]
        else:
            spec["command"] = ["sh", "-c", f"sleep {r.choice([0, 1, 2])}; exit 3"]
        fits = min_size <= DEVICES * int(1 / spec["fraction"])  # half-slot workers: two to a slot
        try:
            self.client.submit(spec)
        except ValueError as e:
            # A name reused while its cancelled job's leases are still being released is refused
            # (the new job took them over, and its launcher was killed for their silence: seed 22).
            releasing = str(e).startswith(f"name: job '{name}' has ended but still holds")
            assert releasing or (not fits and str(e).startswith("min_size")), (spec, e)
            return
        assert fits, spec
        self.jobs[name] = {"kind": kind, "spec": spec, "cancelled": False, "killed": None}
        self.maxes[name] = max(self.maxes.get(name, 0), max_size)

    def _states(self) -> dict[str, str]:
        assert self.client is not None
        return {j["name"]: j["state"] for j in self.client.status()["jobs"]}

    def live(self) -> list[str]:
        assert self.client is not None
        return [j["name"] for j in self.client.status()["jobs"] if j["state"] not in ENDED]

    def cancel(self) -> None:
        assert self.client is not None
        live = self.live()
        if live:
            name = self.rng.choice(live)
            if self.client.cancel(name).get("state") == "cancelled":
                self.jobs[name]["cancelled"] = True

    def kill9(self, offline: bool = False) -> None:
        assert self.client is not None
        status = self.last_status if offline else self.client.status()
        running = [j["name"] for j in status["jobs"] if j["state"] == "running" and not self.jobs[j["name"]]["cancelled"]]
        if not running:
            return
        name = self.rng.choice(running)
        pid = None
        if self.rng.random() < 0.5:
            pids = self.launcher_pids().get(name, [])
            # Only a launcher of this soak's (its mark in the environment): a launcher already gone
            # leaves its pid to be reused (pid_max is 32768 here), and a kill -9 of that pid hit
            # another test's process (the Ctrl-C tests of dra-sim and of the RL CLI then hung).
            if pids and self._is_mine(pids[-1]):
                pid, what = pids[-1], "launcher"
        if pid is None:
            dirs = self.lease_dirs()
            procs = [p for l in status["leases"] if l["job"] == name and l["id"] in dirs for p in self.procs_in(dirs[l["id"]])]
            if not procs:
                return
            pid, what = self.rng.choice(procs), "worker"
        try:
            os.kill(pid, signal.SIGKILL)
            self.jobs[name]["killed"] = what
        except ProcessLookupError:
            pass

    # -- the run ----------------------------------------------------------------------------------
    def run(self, ops: int, stream_s: float, drain_s: float) -> None:
        self.start()
        restart_at = self.rng.randrange(ops // 3, 2 * ops // 3)
        stream_end = time.monotonic() + stream_s
        for i in range(ops):
            if time.monotonic() > stream_end:
                break
            op = self.rng.choice(["submit"] * 4 + ["cancel", "submit_cancel"] + ["kill"] * 2)
            if i == restart_at:
                self.stop(self.rng.choice([signal.SIGTERM, signal.SIGKILL]))  # asked to stop, or gone at once
                if self.rng.random() < 0.5:  # a launcher or worker dies while no daemon is there
                    self.kill9(offline=True)
                time.sleep(self.rng.uniform(0.5, 4.0))  # longer than the heartbeat timeout, at times
                self.start()
            elif op == "submit" or not self.jobs:
                self.submit(i)
            elif op == "cancel":
                self.cancel()
            elif op == "submit_cancel":  # cancelled while its launcher starts, or at its first grant
                self.submit(i)
                time.sleep(self.rng.uniform(0.0, 1.5))
                name = next(reversed(self.jobs))  # the one just submitted, or (refused) an earlier one
                assert self.client is not None
                if self.client.cancel(name).get("state") == "cancelled":
                    self.jobs[name]["cancelled"] = True
            else:
                self.kill9()
            pause_end = time.monotonic() + self.rng.uniform(0.2, 2.0)
            while time.monotonic() < pause_end:
                self.sample()
                time.sleep(0.25)
        # Every job ends within the bound, nothing stuck waiting while devices are free.
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and self.live():
            self.sample()
            time.sleep(0.5)
        self.sample()

    def check_end(self) -> None:
        assert self.client is not None
        status = self.client.status()
        states = {j["name"]: j for j in status["jobs"]}
        stuck = {n: j["state"] for n, j in states.items() if j["state"] not in ENDED}
        assert not stuck, (f"seed {self.seed}: jobs not ended within the bound: {stuck}; leases "
                           f"{status['leases']}; devices {status['devices']}")
        for name, what in self.jobs.items():
            j = states[name]
            print(f"soak seed {self.seed}: {name} {what['spec']['min_size']}-{what['spec']['max_size']} "
                  f"{what['spec']['priority']} cancelled={what['cancelled']} killed={what['killed']} -> {j['state']}")
            if what["cancelled"]:
                expect: tuple[str, ...] = ("cancelled",)
            elif what["killed"]:
                expect = ("finished", "failed")
            elif what["kind"] == "fail":
                expect = ("failed",)
            else:
                expect = ("finished",)
            if j["state"] not in expect:
                self.violations.append(f"seed {self.seed}: {name} ({what}) ended {j['state']}, expected {expect}: "
                                       f"{j['reason']}")
            if j["state"] == "failed" and not j["reason"]:
                self.violations.append(f"seed {self.seed}: {name} failed without a reason")
        # The leases of ended jobs are all back (a cancelled job's within moments), their cgroups gone.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (self.client.status()["leases"] or self.lease_dirs()):
            time.sleep(0.25)
        left = self.client.status()["leases"]
        if left or self.lease_dirs():
            self.violations.append(f"seed {self.seed}: leases {left} / cgroups {list(self.lease_dirs())} after every "
                                   "job ended")
        # No launcher outlives its job.
        deadline = time.monotonic() + 15
        pids = [p for ps in self.launcher_pids().values() for p in ps]
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.25)
        alive = [p for p in pids if _alive(p)]
        if alive:
            self.violations.append(f"seed {self.seed}: launchers {alive} alive after every job ended")

    def check_events(self) -> None:
        """Double-booking over the whole run, not only at samples: replay grants and releases."""
        held: dict[int, dict[str, Any]] = {}
        granted: set[int] = set()
        maxes = self.maxes
        ended: set[str] = set()  # jobs that ended (until their name is submitted again)
        for e in self.events():
            if e["event"] in ("finish", "cancel"):
                ended.add(e["job"])
            elif e["event"] == "submit":
                ended.discard(e["job"])
            if e["event"] == "grant":
                lid = e["lease"]
                if e["job"] in ended:
                    self.violations.append(f"seed {self.seed}: lease granted to {e['job']} after it ended: {e}")
                if lid in granted:
                    self.violations.append(f"seed {self.seed}: lease {lid} granted twice: {e}")
                granted.add(lid)
                on = sum(h["share"] for h in held.values() if h["device"] == e["device"])
                if on + e["share"] > 1 + 1e-9:
                    self.violations.append(f"seed {self.seed}: device {e['device']} double-booked at {e} "
                                           f"(held {[h for h in held.values() if h['device'] == e['device']]})")
                held[lid] = e
                n = sum(1 for h in held.values() if h["job"] == e["job"])
                if n > maxes.get(e["job"], n):
                    self.violations.append(f"seed {self.seed}: {e['job']} holds {n} leases > max_size at {e}")
            elif e["event"] == "error":  # an internal error of the daemon
                self.violations.append(f"seed {self.seed}: {e}")
            elif e["event"] == "release":
                if held.pop(e["lease"], None) is None:
                    self.violations.append(f"seed {self.seed}: release of a lease not held: {e}")
        if held:
            self.violations.append(f"seed {self.seed}: leases granted and never released: {sorted(held)}")

    def close(self) -> None:
        """Stops the daemon; after a failure mid-stream, first its jobs, so that it removes its
        cgroups (a daemon stopped while it holds leases keeps them for the next one)."""
        if self.daemon is not None and self.daemon.poll() is None:
            try:
                assert self.client is not None
                for name in self.live():
                    self.client.cancel(name)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and self.client.status()["leases"]:
                    time.sleep(0.25)
            except Exception:  # noqa: BLE001 - teardown: the daemon stops whatever it answered
                pass
            self.stop()

    def sweep(self) -> None:
        """What a failed soak may leave: its processes, its cgroups, its name lock."""
        for line in self.soak_processes():
            try:
                os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
        for c in _cgroup.CONTROLLERS + _cgroup.OPTIONAL_CONTROLLERS:
            base = Path(_cgroup.ROOT, c, "dra", self.name)
            for d in sorted(base.glob("**/"), key=lambda x: -len(x.parts)) if base.is_dir() else []:
                try:
                    d.rmdir()
                except OSError:
                    pass
        _cgroup._name_lock_path(self.name).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# drain_s: 90 s. A fresh clone's suite (three test files at once on 2 cores) once left seed 22's
# last real training job running, heartbeats fresh and a lease granted 6 s before, at 50 s.
def soak(tmp_path: Path, seed: int, ops: int = 30, stream_s: float = 45.0, drain_s: float = 90.0) -> None:
    s = Soak(tmp_path, seed)
    try:
        s.run(ops, stream_s, drain_s)
        s.check_end()
        s.check_events()
    except BaseException:
        s.close()
        s.sweep()
        raise
    s.close()
    # Once the pool closed: none of its cgroups, no process of the soak.
    for c in _cgroup.CONTROLLERS:
        d = Path(_cgroup.ROOT, c, "dra", s.name)
        if d.exists():
            s.violations.append(f"seed {seed}: {d} remains after the pool closed")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and s.soak_processes():
        time.sleep(0.25)
    left = s.soak_processes()
    if left:
        s.violations.append(f"seed {seed}: processes of the soak remain: {left}")
    s.sweep()  # nothing of a soak that broke an invariant stays for the next test (its processes killed)
    kinds = [e["event"] for e in s.events()]
    assert not s.violations, "\n".join(s.violations) + f"\n(events: {tmp_path / 'state' / 'events.jsonl'})"
    # The soak did what it says: jobs ran and ended, the daemon restarted once.
    assert kinds.count("restore") == 1 and "grant" in kinds and kinds.count("finish") >= 3, kinds


@pytest.mark.skipif(bool(NO_CGROUPS), reason=f"no cgroup v1 slots here: {NO_CGROUPS}")
@pytest.mark.timeout(240)
def test_a_random_stream_of_jobs_cancels_kills_and_a_restart_keeps_the_pools_invariants(tmp_path: Path) -> None:
    """One seeded stream (``DRA_SOAK_SEED`` picks another; seed 22 met the half-slot IndexError
    below); about a minute here. Every violation is listed with the seed and the event log."""
    soak(tmp_path, int(os.environ.get("DRA_SOAK_SEED", "22")))


@pytest.mark.timeout(90)
def test_a_job_of_half_slot_leases_holding_more_leases_than_devices_keeps_the_loop_scaling(tmp_path: Path) -> None:
    """Found by the soak (seed 22): a training job of half-slot workers admitted at 6 leases on 3
    devices, then shrunk by the arbiter. Within its resize cooldown the loop clamped its speedup
    curve at its recent peak (6 leases), past the curve's end (the pool's 3 devices): IndexError at
    every tick of the cooldown (one ``error`` event, ``loop: IndexError``), and no job in the pool
    was re-planned meanwhile. The curve is now flat past its end."""
    from dra._core import pool as P
    from dra.pool.server import PoolServer
    from dra.pool.service import PoolService

    state = tmp_path / "state"
    devices = [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(3)]
    server = PoolServer(PoolService(devices, state, heartbeat_timeout_s=3.0, scale_every_s=0.5)).start()
    client = PoolClient(server.url)

    def events() -> list[dict[str, Any]]:
        return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]

    try:
        client.submit({"name": "halves", "cwd": str(ROOT), "min_size": 4, "max_size": 9, "fraction": 0.5,
                       "log": str(tmp_path / "logs"), "preload": ["torch", "dra", "dra.elastic", "sklearn.datasets"],
                       "command": [sys.executable, str(TRAIN), "--model", "logreg", "--data", "breast_cancer",
                                   "--epochs", "200", "--out", str(tmp_path / "out")]})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(e["event"] == "shrink" for e in events()):
            time.sleep(0.2)
        assert any(e["event"] == "shrink" for e in events()), [e["event"] for e in events()]
        assert sum(1 for e in events() if e["event"] == "grant") == 6  # 6 leases on 3 devices
        time.sleep(2.0)  # ticks of the re-plan inside the job's cooldown (10 s)
        assert client.wait(["halves"], timeout_s=60) == {"halves": "finished"}
    finally:
        server.close()
    assert not [e for e in events() if e["event"] == "error"], [e for e in events() if e["event"] == "error"]
