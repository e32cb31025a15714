"""Another user against a pool run by root (dra_bench.pool_security, the bench's
pool_security_escalations row): the unprivileged user ``nobody`` tries the API on another's job
and the operator's acts, TCP without the token, the pool's state files and the root job's ports,
and, from inside a job of its own, /etc/shadow, /etc, its cgroup's quota and the root cgroup. Every
attempt must be refused, its job must run as nobody, and the root job must run on untouched.

The pool runs its jobs' launchers with its own interpreter as the jobs' users; where ``nobody``
cannot run this one (a virtual environment of a pyenv Python under a 0700 /root, as here and in
CI), the check runs the pool from the system's Python of the same version with this environment's
packages (``shared_interpreter``), and a pool that does run from an interpreter a job's user
cannot execute refuses that user's jobs at submission with one clear event."""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool import _cgroup
from dra.pool.service import PoolService

NO_CGROUPS = _cgroup.available()


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs a pool as root and acts as another user")
with_nobody = pytest.mark.skipif(not _has_user("nobody"), reason="no user 'nobody' on this machine")


@pytest.mark.skipif(bool(NO_CGROUPS), reason=f"no cgroup v1 slots here: {NO_CGROUPS}")
@as_root
@with_nobody
def test_nobody_cannot_escalate_or_touch_roots_job(tmp_path: Path) -> None:
    from dra_bench.pool_security import NoInterpreter, security_check

    try:
        report = security_check(tmp_path)
    except NoInterpreter as e:
        pytest.skip(f"no interpreter the user nobody can run: {e}")
    attempts = report["attempts"]
    assert attempts["job ran as its submitter"] == "yes", attempts
    assert attempts["the root job still runs"] == "yes", attempts
    for what in ("api: read another's job spec", "api: cancel another's job", "api: drain the pool",
                 "api: submit as root", "api: TCP without the token", "api: read state pool.sqlite",
                 "job: read /etc/shadow", "job: raise its own CPU quota", "job: leave its cgroup for the root one"):
        assert attempts[what].startswith("refused"), (what, attempts)
    assert any(k.startswith("api: connect to the root job's port") for k in attempts), attempts  # its store is there
    assert report["escalations"] == 0, attempts


@as_root
@with_nobody
def test_a_user_who_cannot_run_the_pools_python_is_refused_at_submission(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The pool's interpreter behind a directory only root may enter (as a pyenv Python under a
    # 0700 /root is): nobody's job could never start its launcher.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "executable", str(python))
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0)
    try:
        with pytest.raises(ValueError, match="^user: nobody cannot run this pool's Python " + re.escape(f"({python})")) as e:
            svc.submit({"name": "theirs", "user": "nobody", "command": ["true"], "cwd": "/tmp"})
        assert "Permission denied" in str(e.value) and "docs/guide/pool.md" in str(e.value)
        assert "theirs" not in svc.jobs and not svc.book.all()  # nothing kept, nothing allocated
        # root's own job is not probed (the daemon's user runs its interpreter).
        svc.submit({"name": "mine", "command": ["true"], "cwd": "/tmp"})
    finally:
        svc.close()
    events = [json.loads(x) for x in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
    refused = [e for e in events if e["event"] == "refused"]
    assert len(refused) == 1 and refused[0]["job"] == "theirs" and str(python) in refused[0]["error"], refused
