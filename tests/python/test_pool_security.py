"""Another user against a pool run by root (dra_bench.pool.security_check, the bench's
pool_security_escalations row): the unprivileged user ``nobody`` tries the API on another's job
and the operator's acts, TCP without the token, the pool's state files and the root job's ports,
and, from inside a job of its own, /etc/shadow, /etc, its cgroup's quota and the root cgroup. Every
attempt must be refused, its job must run as nobody, and the root job must run on untouched."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from dra.pool import _cgroup

NO_CGROUPS = _cgroup.available()


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _nobody_can_run_python() -> str:
    """Why the user nobody cannot run this interpreter ("" when it can): its job and the attacker
    run it (a virtual environment whose python links into /root cannot)."""
    if os.geteuid() != 0 or not _has_user("nobody"):
        return ""
    pw = pwd.getpwnam("nobody")
    try:
        r = subprocess.run([sys.executable, "-c", "import dra"], capture_output=True, text=True, timeout=60, cwd="/",
                           user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    except OSError as e:  # the exec itself refused (a path under a directory nobody may enter)
        return f"the user nobody cannot run {sys.executable}: {e}"
    return "" if r.returncode == 0 else f"the user nobody cannot run {sys.executable}: {(r.stderr or r.stdout).strip()[-200:]}"


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a pool as root and attacks it as another user")
@pytest.mark.skipif(bool(NO_CGROUPS), reason=f"no cgroup v1 slots here: {NO_CGROUPS}")
@pytest.mark.skipif(not _has_user("nobody"), reason="no user 'nobody' on this machine")
@pytest.mark.skipif(bool(_nobody_can_run_python()), reason=_nobody_can_run_python() or "-")
def test_nobody_cannot_escalate_or_touch_roots_job(tmp_path: Path) -> None:
    from dra_bench.pool import security_check

    report = security_check(tmp_path)
    attempts = report["attempts"]
    assert attempts["job ran as its submitter"] == "yes", attempts
    assert attempts["the root job still runs"] == "yes", attempts
    for what in ("api: read another's job spec", "api: cancel another's job", "api: drain the pool",
                 "api: submit as root", "api: TCP without the token", "api: read state pool.sqlite",
                 "job: read /etc/shadow", "job: raise its own CPU quota", "job: leave its cgroup for the root one"):
        assert attempts[what].startswith("refused"), (what, attempts)
    assert any(k.startswith("api: connect to the root job's port") for k in attempts), attempts  # its store is there
    assert report["escalations"] == 0, attempts
