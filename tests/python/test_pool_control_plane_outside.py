"""The pool's control plane (its jobs' launchers and their fork servers) in a cgroup of its own
beside the slots, with a CPU weight: with slots guaranteed (a large cpu.shares for the pool), a
launcher left in the root cgroup weighed 1024 against 262,144 and, when busy slots reserved every
core, waited a minute before it could start its job's workers (seen: 62 s). Real cgroups, a real
pool and real launchers; the start-up latency itself is measured in docs/guide/pool.md, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra.pool import _cgroup
from dra.pool.factory import make_service
from dra.pool.server import PoolClient, PoolServer

NO_CGROUPS = _cgroup.available()
pytestmark = pytest.mark.skipif(bool(NO_CGROUPS), reason=f"no cgroup v1 slots here: {NO_CGROUPS}")


def _cgroup_of(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise AssertionError(f"no {controller} line in /proc/{pid}/cgroup")


def test_the_control_plane_weighs_its_cores_beside_slots_weighted_by_theirs() -> None:
    name = f"ctl{os.getpid()}"
    specs = [_cgroup.SlotSpec("slot0", 1.5, "0", None), _cgroup.SlotSpec("slot1", 0.25, "0", None)]
    slots = _cgroup.Slots(name, specs, guarantee=True, control_cpus=0.5)
    sleeper = None
    try:
        base = Path(_cgroup.ROOT, "cpu", "dra", name)
        assert (base / "control" / "cpu.shares").read_text().strip() == "512"
        assert (base / "slot0" / "cpu.shares").read_text().strip() == "1536"
        assert (base / "slot1" / "cpu.shares").read_text().strip() == "256"
        assert (base / "cpu.shares").read_text().strip() == str(_cgroup.MAX_SHARES)  # the pool's guarantee
        assert slots.control == [str(Path(_cgroup.ROOT, c, "dra", name, "control")) for c in ("cpu", "cpuacct")]
        # Its CPU is accounted: a process inside that burns 0.2 CPU-s shows in control_usage_s.
        burn = "import time\np=time.process_time()\nwhile time.process_time()-p<0.2: pass\n"
        subprocess.run([sys.executable, "-c", burn], check=True, timeout=60,
                       preexec_fn=lambda: _cgroup.join(slots.control))
        assert slots.control_usage_s() >= 0.2
        # A process still inside when the pool closes is moved out, and the cgroup goes.
        sleeper = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: _cgroup.join(slots.control))
        assert _cgroup_of(sleeper.pid, "cpu") == f"/dra/{name}/control"
    finally:
        slots.close()
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
    assert not Path(_cgroup.ROOT, "cpu", "dra", name).exists()
    # Without control_cpus: no such cgroup, and the slots keep the kernel's default weight.
    with_none = _cgroup.Slots(name, specs[:1])
    try:
        assert with_none.control == [] and with_none.control_usage_s() is None
        assert not Path(_cgroup.ROOT, "cpu", "dra", name, "control").exists()
        assert Path(_cgroup.ROOT, "cpu", "dra", name, "slot0", "cpu.shares").read_text().strip() == "1024"
    finally:
        with_none.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"control_cpus": 0.0}, r"^control_cpus: the control plane's share must lie in \[0.01, 64\] cores, got 0.0"),
    ({"control_cpus": float("nan")}, r"^control_cpus: .* got nan"),
    ({"control_cpus": "half"}, r"^control_cpus: .* got 'half'"),
    ({"specs": [_cgroup.SlotSpec("control", 0.5, "0", None)]}, r"^slots: a slot may not be named 'control'"),
    ({"launcher_memory_gb": 0.1}, r"^launcher memory: 0.1 GB; a job's launcher and fork server need at least 0.25"),
    ({"launcher_memory_gb": float("inf")}, r"^launcher memory: inf GB"),
])
def test_a_bad_control_plane_setting_is_refused_before_any_cgroup_is_made(kwargs: dict, message: str) -> None:
    name = f"ctlbad{os.getpid()}"
    specs = kwargs.pop("specs", [_cgroup.SlotSpec("slot0", 0.5, "0", None)])
    with pytest.raises(ValueError, match=message):
        _cgroup.Slots(name, specs, **kwargs)
    assert not Path(_cgroup.ROOT, "cpu", "dra", name).exists()
    _cgroup.Slots(name, [_cgroup.SlotSpec("slot0", 0.5, "0", None)]).close()  # the name's lock was not kept


@pytest.mark.timeout(120)
def test_a_jobs_launcher_runs_in_the_control_plane_and_its_worker_in_its_lease(tmp_path: Path) -> None:
    name = f"ctlpool{os.getpid()}"
    before = _cgroup_of(os.getpid(), "cpu")
    svc = make_service("slots:2", tmp_path / "state", name=name, memory_gb=1.0, heartbeat_timeout_s=5.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    seen, stop = tmp_path / "worker-cgroup", tmp_path / "stop"
    # The worker writes where it runs, then waits (at most 60 s) for the test to have looked at
    # its launcher.
    code = ("import pathlib, sys, time\n"
            "pathlib.Path(sys.argv[1]).write_text(pathlib.Path('/proc/self/cgroup').read_text())\n"
            "t = time.time()\n"
            "while not pathlib.Path(sys.argv[2]).exists() and time.time() - t < 60: time.sleep(0.05)\n")
    try:
        client.submit({"name": "probe", "cwd": str(tmp_path), "command": [sys.executable, "-c", code, str(seen), str(stop)]})
        deadline = time.time() + 90
        while not seen.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert seen.exists(), "the job's worker never started"
        events = [json.loads(x) for x in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
        (launch,) = [e for e in events if e.get("event") == "launch" and e.get("job") == "probe"]
        # In a cgroup of its own under the control plane's, named by its launch id, memory limited.
        (launch_id,) = svc.slots.launcher_ids()
        assert launch_id.startswith("pool-")
        for controller in ("cpu", "cpuacct", "memory"):
            assert _cgroup_of(launch["pid"], controller) == f"/dra/{name}/control/{launch_id}", controller
        limit = Path(_cgroup.ROOT, "memory", "dra", name, "control", launch_id, "memory.limit_in_bytes")
        assert int(limit.read_text()) == int(_cgroup.LAUNCHER_MEMORY_GB * 2**30)
        print("launcher cgroup peak", int(Path(limit.parent, "memory.max_usage_in_bytes").read_text()) >> 20, "MiB")
        worker = dict(line.split(":", 2)[1:] for line in seen.read_text().splitlines())
        assert worker["cpu"].startswith(f"/dra/{name}/slot") and "/lease-" in worker["cpu"], worker
        assert worker["cpuset"] == worker["cpu"] and worker["memory"] == worker["cpu"], worker
        # The daemon (this process: its API and loop) is in the control plane too.
        assert _cgroup_of(os.getpid(), "cpu") == _cgroup_of(os.getpid(), "cpuacct") == f"/dra/{name}/control"
        stop.touch()
        assert client.wait(["probe"], timeout_s=60) == {"probe": "finished"}
    finally:
        stop.touch()
        server.close()
    assert _cgroup_of(os.getpid(), "cpu") == before  # back where it was, and the pool's cgroups gone
    assert not Path(_cgroup.ROOT, "cpu", "dra", name).exists()


@pytest.mark.timeout(180)
def test_a_jobs_own_code_in_its_launcher_is_held_to_its_cgroup_and_goes_with_it(tmp_path: Path) -> None:
    """A job's ``preload`` modules (from its directory), or a ``sitecustomize`` on its env's
    PYTHONPATH, run its user's code in its launcher and fork server, before any lease: in the
    control plane's cgroup, with no memory limit, and whatever they started there outlived the job.
    Each launcher now has a cgroup of its own under the control plane's: a memory limit holds it,
    and what is left in it when the launcher is gone is killed and the cgroup removed."""
    name = f"ctlown{os.getpid()}"
    stray_pid = tmp_path / "stray.pid"
    (tmp_path / "stray.py").write_text(
        "import subprocess, sys\n"
        f"p = subprocess.Popen(['sleep', '120'], start_new_session=True)\n"
        f"open({str(stray_pid)!r}, 'w').write(str(p.pid))\n")
    (tmp_path / "hog.py").write_text("x = bytearray(3 << 30)\nx[::4096] = b'x' * len(x[::4096])\n")
    (tmp_path / "work.py").write_text("pass\n")  # a script: run by the fork server, which preloads
    svc = make_service("slots:1", tmp_path / "state", name=name, memory_gb=1.0, heartbeat_timeout_s=5.0,
                       launcher_memory_gb=1.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    stray = None
    try:
        client.submit({"name": "leaves-one", "cwd": str(tmp_path), "preload": ["stray"],
                       "command": [sys.executable, str(tmp_path / "work.py")]})
        assert client.wait(["leaves-one"], timeout_s=90) == {"leaves-one": "finished"}
        stray = int(stray_pid.read_text())
        deadline = time.time() + 30
        while (Path(f"/proc/{stray}").exists() or svc.slots.launcher_ids()) and time.time() < deadline:
            time.sleep(0.1)
        state = Path(f"/proc/{stray}/stat").read_text().split()[2] if Path(f"/proc/{stray}").exists() else "gone"
        assert state in ("gone", "Z"), f"the process the job's preload started is still running ({state})"
        assert svc.slots.launcher_ids() == []
        events = [json.loads(x) for x in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
        assert any(e.get("event") == "launcher_cgroup_removed" for e in events), events[-5:]
        # A preload that takes 3 GiB is stopped at the launcher's 1 GiB, and its job fails, naming the fork server.
        client.submit({"name": "hog", "cwd": str(tmp_path), "preload": ["hog"],
                       "command": [sys.executable, str(tmp_path / "work.py")]})
        assert client.wait(["hog"], timeout_s=90) == {"hog": "failed"}
        job = next(j for j in client.status()["jobs"] if j["name"] == "hog")
        assert ("fork server did not start: it was killed by SIGKILL, the kernel's OOM killer, at its cgroup's memory "
                "limit (1 GiB") in job["reason"], job
    finally:
        server.close()
        if stray is not None:
            try:
                os.kill(stray, 9)
            except ProcessLookupError:
                pass
    assert not Path(_cgroup.ROOT, "memory", "dra", name).exists()
