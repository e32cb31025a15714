"""An outside review's attacks on a pool run by root, as the unprivileged user ``nobody``, beyond
those of test_pool_security.py (docs/guide/pool-security.md says what each found)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_pool_security import as_root, with_nobody

from dra._core import pool as P
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService

_EVIL = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
/* Leaves a mark named after the effective uid of every process that loads it. */
__attribute__((constructor)) static void mark(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/loaded.%d", MARKS, (int)geteuid());
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}
"""


def _python_for(user: pwd.struct_passwd, base: Path) -> str:
    """An interpreter ``user`` can run with this package (this one, or the system's Python with
    this environment's packages, as the security check does)."""
    from dra_bench.pool_security import NoInterpreter, runs_python, shared_interpreter

    if not runs_python(user.pw_name, sys.executable):
        return sys.executable
    try:
        return str(shared_interpreter(user.pw_name, base))
    except NoInterpreter as e:
        pytest.skip(f"no interpreter the user {user.pw_name} can run: {e}")


@as_root
@with_nobody
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the preloaded library")
def test_a_jobs_env_never_reaches_a_process_the_pool_runs_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's ``env`` was the environment of the root process that starts its launcher
    (``python -I _isolate.py``, which drops to the job's user): ``LD_PRELOAD`` (or
    ``LD_LIBRARY_PATH``, ``GCONV_PATH``, ...) from any user's submission ran that user's code as
    root. The job's env now reaches its launcher only after the uid is dropped."""
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="dra-attack-", dir="/tmp"))
    server = None
    try:
        base.chmod(0o755)  # nobody reaches the interpreter, the socket and its own folder through it
        python = _python_for(nobody, base)
        work = base / "work"
        marks = work / "marks"
        marks.mkdir(parents=True)
        for p in (work, marks):
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        (work / "evil.c").write_text(_EVIL)
        r = subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKS="{marks}"', "-o", str(work / "evil.so"),
                            str(work / "evil.c")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        monkeypatch.setattr(sys, "executable", python)  # the launchers run the interpreter nobody can run
        state = base / "state"
        svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], state, scale_every_s=1000.0)
        server = PoolServer(svc, socket_path=base / "pool.sock").start()
        spec = {"name": "preload", "cwd": str(work), "log": str(work / "logs"), "zygote": False,
                "env": {"LD_PRELOAD": str(work / "evil.so")}, "command": ["/bin/true"]}
        (work / "spec.json").write_text(json.dumps(spec))
        setpriv = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]
        r = subprocess.run([*setpriv, python, "-m", "dra", "pool", "submit", "--pool", server.url, "--spec",
                            str(work / "spec.json")], capture_output=True, text=True, timeout=60, cwd=str(work),
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)})
        assert r.returncode == 0, r.stderr
        states = PoolClient(server.url).wait(["preload"], timeout_s=45)
        loaded = sorted(p.name for p in marks.iterdir())
        assert "loaded.0" not in loaded, f"the job's LD_PRELOAD ran as root: {loaded}"
        assert f"loaded.{nobody.pw_uid}" in loaded, (loaded, states)  # the job's own processes still get its env
        assert states == {"preload": "finished"}, states
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(base, ignore_errors=True)


@as_root
@with_nobody
def test_another_users_ended_job_keeps_its_name(tmp_path: Path) -> None:
    """Names are the pool's, not a user's: once root's job ended, nobody could submit a job of the
    same name, which erased root's record (its state, its reason) and stood in its place, so a
    script of root's waiting on that name read nobody's job. Only the owner or an operator may reuse
    an ended job's name now; nothing of the old record changes when another user tries."""
    from dra.pool._auth import Caller, Forbidden

    nobody = pwd.getpwnam("nobody")
    as_nobody = Caller(nobody.pw_uid, nobody.pw_gid, via="unix")
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0,
                      launch_jobs=False)
    try:
        svc.submit({"name": "nightly", "command": ["true"]})
        svc.cancel("nightly")
        with pytest.raises(Forbidden, match="^name: 'nightly' is the name of root's ended job; only its owner or an "
                                            "operator may reuse it"):
            svc.submit({"name": "nightly", "command": ["true"]}, as_nobody)
        job = svc.jobs["nightly"]
        assert job["state"] == "cancelled" and job["info"]["owner"]["user"] == "root", job
        assert [(j["name"], j["user"]) for j in svc.status()["jobs"]] == [("nightly", "root")]
        # Its owner's own ended job, and an operator, still may.
        svc.submit({"name": "mine", "command": ["true"]}, as_nobody)
        svc.cancel("mine", as_nobody)
        svc.submit({"name": "mine", "command": ["true"]}, as_nobody)
        svc.cancel("mine", as_nobody)
        svc.submit({"name": "mine", "command": ["true"]})
        assert svc.jobs["mine"]["info"]["owner"]["user"] == "root"
    finally:
        svc.close()
    events = [json.loads(x)["event"] for x in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
    assert events.count("reuse") == 2, events


@as_root
@with_nobody
def test_a_state_directory_or_token_file_another_user_controls_is_refused() -> None:
    """``dra pool serve`` made its state directory with ``mkdir -p`` and took one that was already
    there: a user who made it first (the default ``--state dra-pool`` from a root shell in /tmp, say)
    owned it, planted a token file whose token they knew, and over TCP submitted jobs as root. The
    state directory (and every directory and link on the way to it) must be root's or the daemon
    user's, none writable by others without the sticky bit, and a token file another user owns is
    refused; nothing is made or changed in a refused one."""
    from dra.pool import _auth

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="dra-attack-", dir="/tmp"))
    try:
        planted = base / "planted"
        planted.mkdir(mode=0o700)
        token = planted / "token"
        token.write_text("a token nobody chose and knows\n")
        token.chmod(0o600)
        for p in (planted, token):
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        with pytest.raises(ValueError, match=f"^token file: {token} belongs to uid {nobody.pw_uid}, not to this user"):
            _auth.load_token(token, create=True)
        devices = [P.Device(id="d0", type="cpu-slot", memory_gb=2.0)]
        for state, why in ((planted, f"{planted} belongs to uid {nobody.pw_uid}"),
                           (planted / "inner", f"{planted} belongs to uid {nobody.pw_uid}")):
            with pytest.raises(ValueError, match=f"^state: {state} is not safe for a pool's state: {why}"):
                PoolService(devices, state, scale_every_s=1000.0, launch_jobs=False)
        assert sorted(os.listdir(planted)) == ["token"] and (planted.stat().st_mode & 0o777) == 0o700
        link = base / "link"  # a link of nobody's to a directory of root's
        (base / "roots").mkdir(mode=0o700)
        link.symlink_to(base / "roots")
        os.chown(link, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        with pytest.raises(ValueError, match=f"^state: {link} is not safe .*: {link} belongs to uid {nobody.pw_uid}"):
            PoolService(devices, link, scale_every_s=1000.0, launch_jobs=False)
        assert ((base / "roots").stat().st_mode & 0o777) == 0o700 and not os.listdir(base / "roots")
        shared = base / "shared"
        shared.mkdir()
        shared.chmod(0o1777)  # like /tmp: anyone makes files in it
        with pytest.raises(ValueError, match=f"^state: {shared} is not safe .*: {shared} may be written by anyone"):
            PoolService(devices, shared, scale_every_s=1000.0, launch_jobs=False)
        open_dir = base / "open"
        open_dir.mkdir()
        open_dir.chmod(0o777)  # anyone could rename what is in it
        with pytest.raises(ValueError, match="may be written by anyone"):
            PoolService(devices, open_dir / "state", scale_every_s=1000.0, launch_jobs=False)
        assert not os.listdir(open_dir)
        # Under /tmp (sticky) a directory of root's own is fine.
        svc = PoolService(devices, shared.parent / "state", scale_every_s=1000.0, launch_jobs=False)
        svc.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@as_root
@with_nobody
def test_the_pool_tells_a_user_nothing_about_paths_it_cannot_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root looked at a submission's ``log`` folder (and, at launch, its ``cwd``) itself: its
    answers told apart a file, a folder and nothing at a path in a folder the user may not read
    (``log: /root/.bashrc is a symbolic link or not a directory``, ``/root/.cache is owned by uid
    0``, ``/root/.ssh`` accepted: there is none), an oracle for what /root holds. Now a path its
    user cannot reach gets the same answer whatever is there: the log folder is left to the
    launcher (which fails on it as the user), and the cwd is checked as the user at launch."""
    from dra.pool import _launchers
    from dra.pool._auth import Caller, owner_named

    nobody = pwd.getpwnam("nobody")
    as_nobody = Caller(nobody.pw_uid, nobody.pw_gid, via="unix")
    base = Path(tempfile.mkdtemp(prefix="dra-attack-", dir="/tmp"))
    try:
        base.chmod(0o755)
        monkeypatch.setattr(sys, "executable", _python_for(nobody, base))
        secret = base / "secret"  # root's, closed to others, like /root
        (secret / "a-folder").mkdir(parents=True)
        (secret / "a-file").write_text("x")
        secret.chmod(0o700)
        svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], base / "state", scale_every_s=1000.0)
        try:
            answers = {}
            for what in ("a-folder", "a-file", "nothing"):
                try:
                    answers[what] = svc.submit({"name": what, "command": ["true"], "cwd": "/tmp",
                                                "log": str(secret / what)}, as_nobody)["state"]
                except ValueError as e:
                    answers[what] = str(e)
            assert answers == {"a-folder": "waiting", "a-file": "waiting", "nothing": "waiting"}, answers
        finally:
            svc.close()
        owner = owner_named("nobody")
        for what in ("a-folder", "nothing"):
            with pytest.raises(FileNotFoundError, match=f"^cwd: '{secret / what}' is not a directory user nobody can "
                                                        r"enter \(any more\)$"):
                ref = _launchers.start(what, "unix:/nonexistent", owner, str(secret / what), base / f"{what}.log", {})
                ref.popen.wait(30)  # before the fix one started (and failed in _isolate)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@as_root
@with_nobody
def test_a_socket_in_a_folder_another_user_controls_is_refused() -> None:
    """The socket (``--socket``) could be put in any folder: a user who may write to it renames
    the pool's socket away and binds one of their own there, and the launchers a root pool starts
    (which read their job's spec, its command, from the pool) and its clients talk to that one; in
    a sticky folder (/tmp) they claim the path while the daemon is away, and the launchers of the
    jobs that run on meanwhile call them. Its folder is held to the state directory's rule now."""
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="dra-attack-", dir="/tmp"))
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], base / "state", scale_every_s=1000.0,
                      launch_jobs=False)
    try:
        theirs = base / "theirs"
        theirs.mkdir()
        os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
        shared = base / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        for sock, why in ((theirs / "pool.sock", f"{theirs} belongs to uid {nobody.pw_uid}"),
                          (shared / "pool.sock", f"{shared} may be written by anyone")):
            with pytest.raises(ValueError, match=f"^socket: {sock} is not safe for the pool's socket: {why}"):
                PoolServer(svc, socket_path=sock)
            assert not sock.exists()
        server = PoolServer(svc, socket_path=base / "ok.sock").start()  # root's folder under the sticky /tmp
        server.close()
    finally:
        svc.close()
        shutil.rmtree(base, ignore_errors=True)


def test_one_user_cannot_fill_the_pools_state_folder(tmp_path: Path) -> None:
    """Flooding: 300 submissions of nobody's with 1.5 MB of env each grew pool.sqlite by 450 MB in
    4 s; nothing bounded what one user's jobs keep. Now one job's spec, one user's jobs not ended and
    one user's jobs on record are bounded (refused by name, nothing recorded); operators are not."""
    from dra.pool._auth import Caller, Forbidden
    from dra.pool._quota import UserLimits

    nobody = pwd.getpwnam("nobody")
    as_nobody = Caller(nobody.pw_uid, nobody.pw_gid, via="unix")
    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0,
                      launch_jobs=False, user_limits=UserLimits(spec_bytes=4096, active=3, kept=5))
    try:
        with pytest.raises(Forbidden, match=r"^spec: \d+ bytes as JSON; this pool keeps at most 4096 per job; pass "
                                            "large data in a file"):
            svc.submit({"name": "big", "command": ["true"], "env": {"BLOB": "x" * 8000}}, as_nobody)
        for i in range(3):
            svc.submit({"name": f"n{i}", "command": ["true"]}, as_nobody)
        with pytest.raises(Forbidden, match=r"^name: nobody has 3 jobs waiting or running, the most this pool takes "
                                            r"from one user \(3\); submit again once some have ended"):
            svc.submit({"name": "n3", "command": ["true"]}, as_nobody)
        svc.submit({"name": "r0", "command": ["true"]})  # root, an operator: not bounded
        for i in range(3):
            svc.cancel(f"n{i}", as_nobody)
        svc.submit({"name": "n3", "command": ["true"]}, as_nobody)
        svc.submit({"name": "n4", "command": ["true"]}, as_nobody)
        svc.submit({"name": "n1", "command": ["true"]}, as_nobody)  # an ended job's name: its record is replaced
        # At 5 on record the oldest ended (n0) is forgotten for the next: a user at the bound was
        # refused for good (the long-run review). Records stay bounded all the same.
        svc.cancel("n1", as_nobody)
        svc.submit({"name": "n5", "command": ["true"]}, as_nobody)
        assert sorted(n for n, j in svc.jobs.items() if j["info"]["owner"]["user"] == "nobody") == \
            ["n1", "n2", "n3", "n4", "n5"]
        assert "big" not in svc.jobs and "n0" not in [j["name"] for j in svc.db.jobs()]
        events = [json.loads(x) for x in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]
        assert [e["job"] for e in events if e["event"] == "forget"] == ["n0"]
        with pytest.raises(Forbidden, match=r"^name: nobody has 3 jobs waiting or running"):
            svc.submit({"name": "n6", "command": ["true"]}, as_nobody)
    finally:
        svc.close()
    with pytest.raises(ValueError, match=r"^user_limits.active: must be an integer >= 1, got 0"):
        UserLimits(active=0)


def test_the_pool_keeps_a_bounded_number_of_ended_jobs_and_forgets_the_oldest(tmp_path: Path) -> None:
    """Every ended job was kept for good, an operator's too: the scheduling tick and every status
    call went through them all (20,000: 11 % of a core idle, 268 ms a status). Past ``ended`` the
    oldest are forgotten, record and launcher log."""
    from dra.pool._quota import UserLimits

    svc = PoolService([P.Device(id="d0", type="cpu-slot", memory_gb=2.0)], tmp_path / "state", scale_every_s=1000.0,
                      launch_jobs=False, user_limits=UserLimits(ended=2))
    try:
        for i in range(4):
            svc.submit({"name": f"e{i}", "command": ["true"]})
            (svc.logs_dir / f"e{i}.launcher.log").write_text("its log\n")
            svc.cancel(f"e{i}")
        svc.submit({"name": "live", "command": ["true"]})
        assert sorted(svc.jobs) == ["e2", "e3", "live"], sorted(svc.jobs)
        assert sorted(j["name"] for j in svc.db.jobs()) == ["e2", "e3", "live"]
        assert not (svc.logs_dir / "e0.launcher.log").exists() and (svc.logs_dir / "e3.launcher.log").exists()
    finally:
        svc.close()
    with pytest.raises(ValueError, match=r"^user_limits.ended: must be an integer >= 1, got 0"):
        UserLimits(ended=0)


_CALL_IN_A_LOOP = r"""
import socket, sys, time
path, end = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(b"GET /status HTTP/1.0\r\n\r\n")
            while s.recv(65536):
                pass
    except OSError:
        time.sleep(0.001)
"""


@as_root
@with_nobody
def test_one_users_calls_in_a_loop_do_not_shut_others_out_of_the_api() -> None:
    """Twelve of nobody's processes calling GET /status in a loop (each one call at a time, well
    within the 64 connections a user may hold) kept the socket's listen backlog (5, socketserver's
    default) full: root's calls failed with EAGAIN ('unreachable') for as long as it lasted, and so
    would the launchers' heartbeats. Connections now wait their turn in a deep backlog."""
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="dra-attack-", dir="/tmp"))
    server, procs = None, []
    try:
        base.chmod(0o755)
        (base / "loop.py").write_text(_CALL_IN_A_LOOP)
        (base / "loop.py").chmod(0o644)
        svc = PoolService([P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(4)], base / "state",
                          launch_jobs=False)
        for i in range(50):  # a status of some size to answer
            svc.submit({"name": f"j{i}", "min_size": 1, "max_size": 1})
        server = PoolServer(svc, socket_path=base / "pool.sock").start()
        setpriv = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]
        procs = [subprocess.Popen([*setpriv, sys.executable, "-I", str(base / "loop.py"), str(base / "pool.sock"), "8"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(12)]
        time.sleep(1.0)
        client = PoolClient(server.url, retry_s=0.0)
        took = []
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            t = time.monotonic()
            client.status()  # raised ConnectionError ('Resource temporarily unavailable') before
            took.append(time.monotonic() - t)
            time.sleep(0.05)
        assert all(p.poll() is None for p in procs), "the loops ended early: the test proves nothing"
        assert max(took) < 3.0, took
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if server is not None:
            server.close()
        shutil.rmtree(base, ignore_errors=True)
