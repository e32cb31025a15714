"""A second outside attack review of a pool run by root (docs/guide/pool-security.md): what it
found, each kept closed here. Real PoolService, real processes run as the user ``nobody``."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest
from test_pool_security import as_root, with_nobody

from dra._core import pool as P
from dra.pool import _auth
from dra.pool._auth import Caller, Forbidden
from dra.pool._launcher_api import REPORT_DEPTH, REPORT_LIMIT, check_report
from dra.pool._quota import UserLimits
from dra.pool.service import PoolService


def _devices(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


@as_root
@with_nobody
def test_a_probe_run_as_the_user_holds_no_descriptor_of_the_daemon_and_a_session_of_its_own() -> None:
    """The submission's checks (``test -d CWD``, the interpreter probe) ran as the user with the
    daemon's stdin, stdout and stderr: the user took them with pidfd_getfd (lines forged in root's
    log, root's terminal read), and the probe sat in root's session."""
    nobody = pwd.getpwnam("nobody")
    owner = _auth.owner_of(nobody.pw_uid, nobody.pw_gid)
    look = "for f in /proc/self/fd/*; do readlink $f; done; echo sid $(cut -d' ' -f6 /proc/self/stat)"
    r = subprocess.run(["sh", "-c", look], capture_output=True, text=True, timeout=10,
                       **_auth._as_owner(owner, output=True))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    fds = [x for x in lines if x and not x.startswith("sid")]
    assert fds[0] == "/dev/null", fds  # stdin
    assert all(x == "/dev/null" or x.startswith("pipe:") or x.startswith("/proc/") for x in fds), fds
    assert int(next(x for x in lines if x.startswith("sid")).split()[1]) != os.getsid(0)
    quiet = _auth._as_owner(owner)  # the test probes: nothing of theirs reaches the daemon's output either
    assert quiet["stdin"] == quiet["stdout"] == quiet["stderr"] == subprocess.DEVNULL and quiet["start_new_session"]


def test_a_report_nested_deeper_than_the_bound_is_refused_and_what_is_kept_stays_bounded(tmp_path: Path) -> None:
    """One report nested 980 deep was kept, and every operator's status failed (RecursionError)
    until the daemon restarted; reports with new keys each time were merged without bound (450 MB
    of the daemon's memory in 2,300 reports)."""
    deep: object = 1
    for _ in range(REPORT_DEPTH):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^report: nested deeper than 8 levels"):
        check_report({"x": deep})
    check_report({"x": deep[0]})  # type: ignore[index]  # at the bound: kept
    svc = PoolService(_devices(1), tmp_path, launch_jobs=False)
    try:
        svc.submit({"name": "j", "min_size": 1, "max_size": 1})
        for i in range(200):
            svc.set_report("j", {f"k{i}": "x" * 2000, "rate_rps": 1.0})
        kept = svc.reports["j"]
        assert len(json.dumps(kept)) <= REPORT_LIMIT
        assert "k199" in kept and kept["rate_rps"] == 1.0  # the newest is kept whole
        json.dumps(svc.status())  # shown without error
    finally:
        svc.close()


def test_a_user_may_not_submit_above_the_pools_user_priority(tmp_path: Path) -> None:
    """Any user's ``priority: critical`` job preempted another user's within 30 s. Classes above
    ``--user-priority`` (default normal) are the operator's to give."""
    user = Caller(uid=65534, gid=65534, via="unix")
    svc = PoolService(_devices(1), tmp_path / "a", launch_jobs=False)
    try:
        for priority in ("high", "critical"):
            with pytest.raises(Forbidden, match=rf"^priority: only an operator may submit '{priority}' jobs here "
                                                 r"\(users: up to 'normal', set by the operator with --user-priority\)"):
                svc.submit({"name": "p", "priority": priority}, user)
        assert "p" not in svc.jobs
        assert svc.submit({"name": "op", "priority": "critical"})["state"] == "waiting"  # the operator may
    finally:
        svc.close()
    with pytest.raises(ValueError, match=r"^user_limits\.priority: must be one of low, normal, high, critical"):
        UserLimits(priority="urgent")


def test_the_launcher_logs_of_a_reused_name_do_not_pile_up(tmp_path: Path) -> None:
    """Each reuse of an ended job's name left its old launcher log as ``<name>.launcher.log.<order>``
    for good (a user's 100 MB each time); one previous job's log is kept, and none once the record
    is forgotten."""
    svc = PoolService(_devices(1), tmp_path, launch_jobs=False)
    try:
        other = svc.logs_dir / "r.launcher.log.7.launcher.log"  # a job named 'r.launcher.log.7' is not r's
        other.write_text("another job's\n")
        for _ in range(4):
            svc.submit({"name": "r", "min_size": 1, "max_size": 1})
            (svc.logs_dir / "r.launcher.log").write_text("x" * 1000)
            svc.cancel("r")
            svc.tick()
        earlier = sorted(p.name for p in svc.logs_dir.glob("r.launcher.log.*") if p != other)
        assert len(earlier) == 1, earlier
        assert other.exists()
        svc._drop("r")
        assert not [p for p in svc.logs_dir.glob("r.launcher.log*") if p != other]
    finally:
        svc.close()
