"""The README's main job (examples/pool/pool_at_work.py) stopped while it runs: by SIGTERM (a
service manager, ``timeout``, a CI runner) or Ctrl-C. It must end the jobs it submitted and
remove its pool's cgroups, as a run that ends normally does, and exit at once with 130. Before,
it died with its jobs still running in their slots' cgroups and the cgroups left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dra.pool import _cgroup

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "examples" / "pool" / "pool_at_work.py"
NO_CGROUPS = _cgroup.available()


def marked(mark: str) -> list[str]:
    """Processes whose environment carries ``mark`` (the main job's, inherited by its pool's
    launchers, workers and replicas)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if f"DRA_TEST_MARK={mark}".encode() in (p / "environ").read_bytes().split(b"\0"):
                found.append(f"{p.name}: {(p / 'cmdline').read_bytes().replace(bytes(1), b' ')[:160]!r}")
        except OSError:
            pass
    return found


def pool_dirs(pid: int) -> list[Path]:
    return [d for c in _cgroup.CONTROLLERS + _cgroup.OPTIONAL_CONTROLLERS
            if (d := Path(_cgroup.ROOT, c, "dra", f"main-dynamic-{pid}")).exists()]


def lease_procs(pid: int) -> int:
    """Processes in the pool's lease cgroups (slot/lease under the pool's cpu cgroup)."""
    base = Path(_cgroup.ROOT, "cpu", "dra", f"main-dynamic-{pid}")
    n = 0
    for f in base.glob("*/*/cgroup.procs"):
        try:
            n += len(f.read_text().split())
        except OSError:
            pass
    return n


def sweep(p: subprocess.Popen[bytes], mark: str) -> None:
    """What a failed run may leave: its processes, its cgroups (processes moved out first)."""
    for line in marked(mark):
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except OSError:
            pass
    if p.poll() is None:
        p.kill()
        p.wait()
    for d in pool_dirs(p.pid):
        top = Path(_cgroup.ROOT, d.relative_to(_cgroup.ROOT).parts[0])  # the controller's root cgroup
        for sub in sorted((x for x in d.rglob("*") if x.is_dir()), key=lambda x: -len(x.parts)) + [d]:
            try:
                for pid in (sub / "cgroup.procs").read_text().split():
                    (top / "cgroup.procs").write_text(pid)
                sub.rmdir()
            except OSError:
                pass

@pytest.mark.skipif(bool(NO_CGROUPS), reason=f"the main job needs cgroup v1 slots: {NO_CGROUPS}")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_the_main_job_stopped_while_jobs_run_ends_them_and_leaves_no_cgroup(tmp_path: Path, sig: int) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, "DRA_TEST_MARK": mark, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(MAIN), "--modes", "dynamic", "--rounds", "1", "--duration-s", "60",
           "--out", str(tmp_path / "out"), "--timeout-s", "180", "--settle-s", "0"]
    # SIGINT at its default in the child, as at a terminal (a background shell ignores it).
    with (tmp_path / "main.log").open("wb") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Stopped once a training job has a worker (its progress line says so) in a lease's cgroup.
        text = lambda: (tmp_path / "main.log").read_text(errors="replace")  # noqa: E731
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and p.poll() is None and not re.search(r"cnn-digits=[1-9]", text()):
            time.sleep(0.5)
        assert p.poll() is None and lease_procs(p.pid) >= 2, f"no training job ran within 150 s:\n{text()[-3000:]}"
        p.send_signal(sig)
        t = time.monotonic()
        rc = p.wait(timeout=60)
        took = time.monotonic() - t
        assert rc == 130, f"exit {rc} after {took:.1f} s, not 130:\n{text()[-3000:]}"
        assert "interrupted" in text() and "Traceback" not in text(), text()[-3000:]
        left: list[str] = []
        end = time.monotonic() + 10  # the last workers' exit after their leases were released
        while time.monotonic() < end and (left := marked(mark)):
            time.sleep(0.25)
        assert not left, f"processes of the main job outlived it: {left}"
        assert not pool_dirs(p.pid), f"cgroups of the main job outlived it: {pool_dirs(p.pid)}"
        assert not _cgroup._name_lock_path(f"main-dynamic-{p.pid}").exists()
    finally:
        sweep(p, mark)
