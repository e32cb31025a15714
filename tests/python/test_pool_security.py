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
import shutil
import sys
import tempfile
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
    # Its store is there: tried and refused, or, in the job's own network namespace, its port taken
    # here too by chance (then no connection from here could tell the two apart).
    tried = [k for k in attempts if k.startswith("api: connect to the root job's port")]
    assert tried, attempts
    assert all(attempts[k].startswith(("refused", "not tried: its store listens on port")) for k in tried), attempts
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


@as_root
@with_nobody
def test_the_jobs_directory_is_entered_as_the_job_user_and_its_logs_never_follow_a_planted_link(tmp_path: Path) -> None:
    """Two ways past the privilege boundary an outside review found. (1) The launcher's cwd was
    entered by root before the uid was dropped: a directory swapped in after the submission's check
    (a link to one the user may not enter) was entered anyway. _isolate now enters it as the job's
    user. (2) Worker logs were opened through links in a folder others could write into: a root
    job appended its output to a file of root's. Log folders must be the job user's own and not
    writable by others, and log files are opened 0600 without following a link."""
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="dra-cwd-"))  # pytest's own folders are 0700: nobody could enter none
    base.chmod(0o755)
    try:
        _entered_as_the_user(base, nobody)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _private_logs(tmp_path, nobody)


def _entered_as_the_user(tmp_path: Path, nobody: pwd.struct_passwd) -> None:
    import subprocess

    from dra.pool import _isolate

    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    closed.chmod(0o700)  # root's: nobody may not enter closed/inner
    (closed / "inner").chmod(0o755)
    tmp_path.chmod(0o755)
    isolate = [sys.executable, "-I", _isolate.__file__, "--uid", str(nobody.pw_uid), "--gid", str(nobody.pw_gid),
               "--groups", str(nobody.pw_gid)]
    r = subprocess.run([*isolate, "--cwd", str(closed / "inner"), "--", "/bin/pwd"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 126 and "Permission denied" in r.stderr, (r.returncode, r.stdout, r.stderr)
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    r = subprocess.run([*isolate, "--cwd", str(open_dir), "--", "/bin/pwd"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(open_dir), (r.returncode, r.stdout, r.stderr)



def _private_logs(tmp_path: Path, nobody: pwd.struct_passwd) -> None:
    from dra.pool._spawner import open_private_log, private_log_dir

    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    planted = tmp_path / "planted"
    planted.mkdir()
    os.chown(planted, nobody.pw_uid, nobody.pw_gid)  # another user's folder
    (planted / "job.1.log").symlink_to(victim)
    with pytest.raises(ValueError, match="not by this job's user"):
        private_log_dir(planted)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    with pytest.raises(ValueError, match="writable by others"):
        private_log_dir(shared)
    mine = private_log_dir(tmp_path / "mine")
    assert (mine.stat().st_mode & 0o777) == 0o700
    (mine / "job.2.log").symlink_to(victim)
    with pytest.raises(OSError):
        open_private_log(mine / "job.2.log")
    with open_private_log(mine / "job.3.log") as f:
        f.write(b"x")
    assert ((mine / "job.3.log").stat().st_mode & 0o777) == 0o600 and victim.read_text() == "root's\n"


@as_root
@with_nobody
def test_the_daemons_probes_get_none_of_its_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon checks a job's cwd and log paths by running `test` as the job's user. Those probes
    inherited the daemon's environment (a token, a cloud key of the operator's shell), which the
    user reads from /proc/<pid>/environ while they run, and the daemon's PATH chose which `test`
    ran. Now they get a bare environment and `/` as their directory."""
    import subprocess

    from dra.pool import _auth

    nobody = _auth.owner_named("nobody")
    monkeypatch.setenv("DRA_POOL_TOKEN", "operator-secret-7f3a")
    planted = tmp_path / "bin"
    planted.mkdir()
    dump = tmp_path / "dumped"
    (planted / "test").write_text(f"#!/bin/sh\nenv > {dump}\nexit 0\n")
    (planted / "test").chmod(0o755)
    tmp_path.chmod(0o755)
    dump.touch()
    dump.chmod(0o666)
    monkeypatch.setenv("PATH", f"{planted}:{os.environ['PATH']}")
    assert _auth.can_enter("/tmp", nobody) is None and _auth.can_see("/tmp", nobody)
    assert dump.read_text() == "", "a `test` of the daemon's PATH ran as the user, with its environment"
    seen = subprocess.run(["/usr/bin/env"], capture_output=True, text=True, timeout=30,
                          **_auth._as_owner(nobody, output=True))
    assert seen.returncode == 0 and "operator-secret" not in seen.stdout and "PATH=/usr/bin:/bin" in seen.stdout


@as_root
@with_nobody
def test_a_by_hand_launchers_pid_is_watched_never_signalled(tmp_path: Path) -> None:
    """A launcher started by hand is known by the pid its caller connected from. A caller that
    hands its socket on and exits leaves that pid to the next process (once, the daemon's own
    thread), and a silent launcher past the silence limit was SIGKILLed, session and all: the
    daemon killed itself. A pid that is not the caller's user's is not recorded, and a by-hand
    launcher is never signalled (its lease's cgroup holds its workers)."""
    import subprocess

    from dra.pool import _auth, _launchers

    nobody = _auth.owner_named("nobody")
    theirs = subprocess.Popen(["sleep", "60"], **_auth._as_owner(nobody))
    mine = subprocess.Popen(["sleep", "60"], start_new_session=True)
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0,
                      launch_jobs=False)
    try:
        svc.submit({"name": "job", "command": ["true"], "cwd": "/tmp"})
        # root's job, its "launcher" calling from a pid that is nobody's process now.
        svc.sync("job", [], [], None, launcher="by-hand-1", caller=_auth.Caller(uid=0, gid=0, pid=theirs.pid, via="unix"))
        assert svc.jobs["job"]["info"]["launcher"]["pid"] == 0 and "job" not in svc.launchers
        ref = _launchers.LauncherRef("by-hand-2", mine.pid, _launchers.proc_start(mine.pid), by_hand=True)
        ref.kill()
        assert mine.poll() is None, "a by-hand launcher's pid was signalled"
        assert _launchers.adopt(ref.to_json()).by_hand  # the mark survives a daemon's restart
        _launchers.LauncherRef("daemon", mine.pid, _launchers.proc_start(mine.pid)).kill()  # one the daemon started
        assert mine.wait(10) == -9
    finally:
        svc.close()
        for p in (theirs, mine):
            p.kill()
            p.wait()


def test_a_jobs_end_reason_and_its_launchers_last_line_are_read_bounded(tmp_path: Path) -> None:
    """A job's user controls its end reason (up to the 4 MiB request limit: events.jsonl grew by
    100 MB in 20 s of end and resubmit) and its launcher log (a sparse 2 GiB file the daemon read
    whole, under the pool's lock, when the launcher exited 126). Both are read to a bound now."""
    from dra.pool._launcher_api import REASON_LIMIT
    from dra.pool._spawner import last_line

    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0,
                      launch_jobs=False)
    try:
        svc.submit({"name": "job", "command": ["true"], "cwd": "/tmp"})
        svc.sync_request("job", {"failed": True, "reason": "x" * 3_000_000})
        reason = svc.jobs["job"]["info"]["reason"]
        assert len(reason) < REASON_LIMIT + 100 and reason.endswith("characters more, cut)"), reason[-80:]
    finally:
        svc.close()
    assert (tmp_path / "state" / "events.jsonl").stat().st_size < 64 * 1024
    log = tmp_path / "launcher.log"
    with open(log, "wb") as f:
        f.truncate(2**31)  # sparse: 2 GiB of zeros on no disk
        f.seek(0, 2)
        f.write(b"\n_isolate: cannot enter /x: Permission denied\n")
    assert last_line(log) == "_isolate: cannot enter /x: Permission denied"


@as_root
@with_nobody
def test_a_user_holding_tcp_connections_turns_away_only_their_own_calls(tmp_path: Path) -> None:
    """TCP had one connection limit for every caller, counted before the token: a user without
    the token who held them all turned the operator's calls away. A caller on loopback is now
    counted as its user (the kernel's socket table), as on the Unix socket."""
    import socket
    import subprocess
    import time

    from dra.pool import _auth
    from dra.pool.server import PoolClient, PoolServer

    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0)
    token = "t" * 32
    server = PoolServer(svc, port=0, token=token, max_connections_per_peer=3).start()
    port = int(server.tcp_url.rsplit(":", 1)[1])
    hold = " ".join(f"exec {fd}<>/dev/tcp/127.0.0.1/{port};" for fd in (3, 4, 5))
    holder = subprocess.Popen(["bash", "-c", f"{hold} echo held; sleep 60"], stdout=subprocess.PIPE, text=True,
                              **_auth._as_owner(_auth.owner_named("nobody"), output=True))
    try:
        assert holder.stdout.readline().strip() == "held"
        time.sleep(0.3)
        assert PoolClient(server.tcp_url, token=token).status()["draining"] is False  # the operator is answered
        own = socket.create_connection(("127.0.0.1", port), timeout=5)  # root's own share is whole
        own.close()
        # Read only: the 503 comes at once and the connection is closed (a request written after it
        # ended the shell with SIGPIPE on a loaded host).
        fourth = subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}; timeout 20 cat <&3"],
                                capture_output=True, text=True, timeout=30,
                                **_auth._as_owner(_auth.owner_named("nobody"), output=True))
        assert "503" in fourth.stdout and "3 already open from uid" in fourth.stdout, fourth.stdout[:300]
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        server.close()


def _remote_hosts(n: int, net: str) -> tuple[list[str], str]:
    """``n`` namespaces, each one host on a veth pair to this one: ``<net>.<k+2>`` there,
    ``<net>.1`` here (a /24 per pair would clash, so every pair is a /32 route). Returns the
    namespaces and this host's address on them."""
    import subprocess
    import uuid

    tag = uuid.uuid4().hex[:6]
    names: list[str] = []

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    try:
        for k in range(n):
            ns, here, there = f"dra-remote-{tag}-{k}", f"drh{tag}{k}", f"drr{tag}{k}"
            sh("ip", "netns", "add", ns)
            names.append(ns)
            sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            sh("ip", "link", "set", there, "netns", ns)
            sh("ip", "addr", "add", f"{net}.1/32", "dev", here)
            sh("ip", "link", "set", here, "up")
            sh("ip", "route", "add", f"{net}.{k + 2}/32", "dev", here)
            sh("ip", "-n", ns, "addr", "add", f"{net}.{k + 2}/32", "dev", there)
            sh("ip", "-n", ns, "link", "set", there, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", f"{net}.1/32", "dev", there)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        _drop_hosts(names)
        pytest.skip(f"network namespaces with veth pairs are not available here: {getattr(e, 'stderr', e)}")
    return names, f"{net}.1"


def _drop_hosts(names: list[str]) -> None:
    import subprocess

    for ns in names:  # deleting the namespace deletes its end of the pair, and so the pair
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@as_root
def test_one_remote_host_holding_tcp_connections_turns_away_only_its_own_calls(tmp_path: Path) -> None:
    """With --allow-remote, every other host had one connection share: one host without the token
    that held them all turned every other host's calls away. Another host is now counted by its
    address (and all of them together at most ``remote_total``)."""
    import subprocess
    import time

    from dra.pool.server import PoolClient, PoolServer

    hosts, here = _remote_hosts(2, "10.215.77")
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0)
    token = "t" * 32
    server = None
    holder = None
    try:
        server = PoolServer(svc, host=here, port=0, token=token, allow_remote=True, max_connections_per_peer=3).start()
        port = int(server.tcp_url.rsplit(":", 1)[1])
        hold = " ".join(f"exec {fd}<>/dev/tcp/{here}/{port};" for fd in (3, 4, 5))
        holder = subprocess.Popen(["ip", "netns", "exec", hosts[0], "bash", "-c", f"{hold} echo held; sleep 60"],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        time.sleep(0.3)
        # The other host is answered (a request without the token: 401, not 503).
        other = subprocess.run(["ip", "netns", "exec", hosts[1], "bash", "-c",
                                f"exec 3<>/dev/tcp/{here}/{port}; printf 'GET /status HTTP/1.0\\r\\n\\r\\n' >&3; "
                                "timeout 20 cat <&3"], capture_output=True, text=True, timeout=30)
        assert " 401 " in other.stdout.splitlines()[0], other.stdout[:300]
        # The holder's fourth is turned away, naming its address.
        fourth = subprocess.run(["ip", "netns", "exec", hosts[0], "bash", "-c",
                                 f"exec 3<>/dev/tcp/{here}/{port}; timeout 20 cat <&3"],
                                capture_output=True, text=True, timeout=30)
        assert "503" in fourth.stdout and "3 already open from host 10.215.77.2" in fourth.stdout, fourth.stdout[:300]
        # Every other host together is bounded too (a thread per connection, whatever the addresses).
        server._servers[-1].remote_total = 3
        bounded = subprocess.run(["ip", "netns", "exec", hosts[1], "bash", "-c",
                                  f"exec 3<>/dev/tcp/{here}/{port}; timeout 20 cat <&3"],
                                 capture_output=True, text=True, timeout=30)
        assert "3 already open from other hosts together" in bounded.stdout, bounded.stdout[:300]
        assert PoolClient(server.url).status()["draining"] is False  # the Unix socket is untouched
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
            holder.stdout.close()
        if server is not None:
            server.close()
        _drop_hosts(hosts)
