"""The pool against an outside attacker and a careless user who never saw the code (a review that
found each of these): every test runs a real pool with real launchers and processes, no mocks.
The attacks of the user ``nobody`` through the API are tests/python/test_pool_security.py."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher runs as root only in a pool run by root")


def declared(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def _events(state: Path) -> list[dict]:
    return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]


@as_root
def test_a_root_job_in_a_directory_others_write_runs_none_of_their_modules(tmp_path: Path) -> None:
    """A root job started from a directory anyone may write to (/tmp, say): its launcher ran
    ``python -m dra run`` there and the fork server ``python -m dra.pool._zygote``, and ``-m`` puts
    the working directory first on sys.path, so an ``argparse/`` or ``torch/`` planted there by
    another user ran as root. The pool's own processes now start without it (``-P``); a worker run
    with ``-m`` still finds the job's modules there, as ``python -m`` does."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    marker = tmp_path / "pwned"
    for module in ("argparse", "torch", "numpy"):
        (shared / module).mkdir()
        (shared / module / "__init__.py").write_text(
            f"open({str(marker)!r}, 'a').write(__name__ + ' as uid %d\\n' % __import__('os').getuid())\n"
            "raise SystemExit('planted module ran')\n")
    (shared / "jobmod.py").write_text("print('jobmod ran')\n")
    script = tmp_path / "job.py"
    script.write_text("import argparse\nprint('script ran; argparse from', argparse.__file__)\n")
    state = tmp_path / "state"
    svc = PoolService(declared(2), state, heartbeat_timeout_s=5.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    logs = tmp_path / "logs"
    try:
        client.submit({"name": "plain", "cwd": str(shared), "log": str(logs), "command": ["true"]})
        client.submit({"name": "script", "cwd": str(shared), "log": str(logs), "command": [sys.executable, str(script)]})
        client.submit({"name": "module", "cwd": str(shared), "log": str(logs), "preload": ["json"],
                       "command": [sys.executable, "-m", "jobmod"]})
        states = client.wait(["plain", "script", "module"], timeout_s=120)
    finally:
        server.close()
    launcher_logs = {n: (state / "logs" / f"{n}.launcher.log").read_text(errors="replace") for n in states}
    assert not marker.exists(), (marker.read_text(), launcher_logs)
    assert states == {"plain": "finished", "script": "finished", "module": "finished"}, (states, launcher_logs)
    out = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    assert "script ran; argparse from" in out and "jobmod ran" in out, out  # -m finds the job's module in its cwd
    assert str(shared / "argparse") not in out, out


def _trickle(connect, head: bytes, every_s: float, limit_s: float) -> float | None:
    """Sends ``head`` then one byte every ``every_s`` (never a whole request); the seconds after
    which the daemon closed the connection, None if it was still open after ``limit_s``."""

    s = connect()
    t0 = time.monotonic()
    try:
        s.sendall(head)
        s.settimeout(every_s)
        while time.monotonic() - t0 < limit_s:
            try:
                if s.recv(4096) == b"":
                    return time.monotonic() - t0
            except TimeoutError:
                pass
            try:
                s.sendall(b"a")
            except OSError:
                return time.monotonic() - t0
        return None
    finally:
        s.close()


def test_a_request_that_trickles_in_is_cut_off_at_its_deadline_and_not_acted_on(tmp_path: Path) -> None:
    """Slowloris: a connection that sends a byte every few seconds never stalls, so the handler's
    60 s timeout never dropped it, and 64 of them (TCP has one share for every caller, before the
    token) shut the operator out of TCP for as long as the attacker liked. A request must now
    arrive whole within ``request_s`` (60 s) of its connection; one that does not is closed, and
    what arrived of it is not acted on (a drain whose body was cut off drains nothing)."""
    svc = PoolService(declared(1), tmp_path / "state", scale_every_s=1000.0)
    token = "t" * 32
    server = PoolServer(svc, port=0, token=token, request_s=1.5, max_connections_per_peer=2).start()
    port = int(server.tcp_url.rsplit(":", 1)[1])
    try:
        def tcp() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=5)

        def unix() -> socket.socket:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(server.socket_path))
            return s

        cut = _trickle(tcp, b"GET /status HTTP/1.0\r\nX-Slow: ", 0.2, 10.0)
        assert cut is not None and cut < 6.0, cut
        cut = _trickle(unix, b"GET /status HTTP/1.0\r\nX-Slow: ", 0.2, 10.0)
        assert cut is not None and cut < 6.0, cut
        # The body of an operator's drain, a byte at a time: cut off, and the pool not drained.
        cut = _trickle(unix, b"POST /drain HTTP/1.0\r\nContent-Length: 60000\r\n\r\n{\"undo\": false", 0.2, 10.0)
        assert cut is not None and cut < 6.0, cut
        client = PoolClient(server.tcp_url, token=token)
        assert client.status()["draining"] is False
        assert PoolClient(server.url).status()["draining"] is False
    finally:
        server.close()
    events = _events(tmp_path / "state") if (tmp_path / "state" / "events.jsonl").exists() else []
    assert not [e for e in events if e["event"] in ("error", "drain")], events


def test_text_that_is_not_text_and_a_job_too_big_to_exec_are_refused_at_submission(tmp_path: Path) -> None:
    """JSON's "\\ud800" (a lone surrogate) is read as a Python string that has no UTF-8 form: in a
    command, a variable or a log path the job failed later with a launcher's one-line error, in a
    cwd the refusal named no field, in a device type the daemon answered 500 (the C++ binding
    refused it), and in a job class every scheduling tick logged an internal error. A variable or
    argument of more than 128 KiB (the kernel's MAX_ARG_STRLEN), or more than ARG_MAX of them, made
    the launcher die with a traceback ("Argument list too long") when it started the worker. Each
    is now a 400 naming the field, and nothing is kept or allocated."""
    svc = PoolService(declared(1), tmp_path / "state", scale_every_s=1000.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    base = {"name": "j", "cwd": str(tmp_path), "command": ["true"]}
    cases = {
        "command[1]": {"command": ["echo", "\ud800"]},
        "env.A": {"env": {"A": "x\udc80"}},
        "cwd": {"cwd": "/tmp/\ud800"},
        "log": {"log": str(tmp_path / "\ud800")},
        "device_type": {"device_type": "\ud800"},
        "job_class": {"job_class": "\ud800"},
    }
    try:
        for field, extra in cases.items():
            with pytest.raises(ValueError, match="^" + re.escape(field) + r": contains a lone surrogate \('\\ud[8c][0-9a-f]{2}'\) at character \d+"):
                client.submit({**base, **extra})
        with pytest.raises(ValueError, match=r"^env\.BIG: 200005 bytes; the kernel starts a program with at most 131071 "
                                             r"bytes in one argument or variable \(MAX_ARG_STRLEN\); pass large data in a file"):
            client.submit({**base, "env": {"BIG": "x" * 200000}})
        with pytest.raises(ValueError, match=r"^command\[1\]: 131073 bytes"):
            client.submit({**base, "command": ["echo", "y" * 131072]})
        with pytest.raises(ValueError, match=r"^env: the command and variables take \d+ bytes; the kernel starts a "
                                             r"program with at most \d+ \(ARG_MAX\)"):
            client.submit({**base, "env": {f"V{i}": "y" * 100000 for i in range(40)}})
        with pytest.raises(ValueError, match=r"^options: \d+ bytes"):
            client.submit({**base, "options": {"events_path": "/tmp/" + "e" * 140000}})
        assert client.status()["jobs"] == [] and not svc.book.all()  # nothing kept, nothing allocated
        client.submit({**base, "env": {"OK": "z" * 100000}})  # large but within the limits: it runs
        assert client.wait(["j"], timeout_s=120) == {"j": "finished"}
    finally:
        server.close()
    assert not [e for e in _events(tmp_path / "state") if e["event"] == "error"]


def test_a_command_that_is_a_directory_or_not_executable_says_so(tmp_path: Path) -> None:
    """A careless user's command: a directory, or a script without execute permission. The job
    failed with "exit code 127 (command not found)" and "[Errno 13] Permission denied": the program
    was found, and the directory was not named as such. Now 126 (found, cannot run, as a shell
    says) with the reason and the fix."""
    svc = PoolService(declared(2), tmp_path / "state", heartbeat_timeout_s=5.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    try:
        client.submit({"name": "dir", "cwd": str(tmp_path), "log": str(tmp_path / "logs"), "command": [str(tmp_path)]})
        client.submit({"name": "noexec", "cwd": str(tmp_path), "log": str(tmp_path / "logs"), "command": [str(script)]})
        assert client.wait(["dir", "noexec"], timeout_s=120) == {"dir": "failed", "noexec": "failed"}
        why = {j["name"]: j.get("reason", "") for j in client.status()["jobs"]}
    finally:
        server.close()
    assert "exit code 126 (command found but not executable)" in why["dir"], why
    assert f"{tmp_path} is a directory, not a program" in why["dir"], why
    assert f"{script} is not executable" in why["noexec"] and "chmod +x" in why["noexec"], why  # root too: no x bit


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_tcp_on_the_ipv6_loopback_serves_with_the_token(tmp_path: Path) -> None:
    """``--host ::1`` is one of the loopback names the pool accepts without --allow-remote, yet it
    failed to start: "host: cannot listen on ::1:0: Address family for hostname not supported"
    (the TCP server was IPv4 only)."""
    svc = PoolService(declared(1), tmp_path / "state", scale_every_s=1000.0)
    token = "t" * 32
    server = PoolServer(svc, host="::1", port=0, token=token).start()
    try:
        assert server.tcp_url is not None and server.tcp_url.startswith("http://[::1]:"), server.tcp_url
        assert PoolClient(server.tcp_url, token=token).status()["pool"] == svc.name
        with pytest.raises(PermissionError, match="^token: missing or wrong"):
            PoolClient(server.tcp_url, token="w" * 32).status()
    finally:
        server.close()


def test_a_client_that_hangs_up_before_its_answer_prints_no_traceback(tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """A caller that sends its request and resets the connection before reading the answer (a
    killed client, a port scanner): the daemon's write of the answer failed and socketserver
    printed a 30-line traceback to the daemon's output, once per such caller."""
    import struct

    svc = PoolService(declared(1), tmp_path / "state", scale_every_s=1000.0)
    server = PoolServer(svc, port=0, token="t" * 32).start()
    port = int(server.tcp_url.rsplit(":", 1)[1])
    try:
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
            s.sendall(b"GET /status HTTP/1.0\r\n\r\n")
            s.close()
        time.sleep(0.5)
        assert PoolClient(server.tcp_url, token="t" * 32).status()["pool"] == svc.name  # still serving
    finally:
        server.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[-2000:]


def test_methods_the_api_does_not_use_get_a_json_405(tmp_path: Path) -> None:
    """PUT, DELETE and PATCH got Python's HTML 501 page; now a JSON 405 naming the methods the API
    takes, after the token check like every other request (no token: 401)."""
    import urllib.error
    import urllib.request

    svc = PoolService(declared(1), tmp_path / "state", scale_every_s=1000.0)
    token = "t" * 32
    server = PoolServer(svc, port=0, token=token).start()
    try:
        for method in ("PUT", "DELETE", "PATCH"):
            for auth, code in ((f"Bearer {token}", 405), (None, 401)):
                req = urllib.request.Request(f"{server.tcp_url}/jobs/x", data=b"{}", method=method)
                if auth:
                    req.add_header("Authorization", auth)
                with pytest.raises(urllib.error.HTTPError) as err:
                    urllib.request.urlopen(req, timeout=10)
                assert err.value.code == code, (method, auth, err.value.code)
                body = json.loads(err.value.read())
                if code == 405:
                    assert body["error"].startswith(f"method: the pool's API takes GET and POST, not {method}")
    finally:
        server.close()


@pytest.mark.parametrize("field,value", [
    ("step", "12"), ("step", -1), ("step", 2**60), ("step", 3.5), ("samples_per_s", "fast"),
    ("samples_per_s", -2.0), ("global_batch", True), ("desired_size", "2"), ("loss", "low"),
    ("rates", {"two": 5.0}), ("rates", {"2": "5"}), ("rates", [1, 2]), ("rate_s", {"0": 1.0}),
    ("throughput", {"compute_fixed_s": "0.1"}), ("throughput", {"observations": 2.5}), ("policy", 3),
])
def test_a_malformed_report_is_dropped_naming_its_field_and_the_pool_scales_on(tmp_path: Path, field: str,
                                                                               value: object) -> None:
    # A job's report is its leader's store value, relayed by its launcher: any process of the job
    # can write it. A step or rate that was not a number failed every scaling pass of the pool
    # (float('12') works, float('fast') raises inside the tick), for every job: no job was grown,
    # shrunk or launched any more. Now the report is dropped with the field named, the call's
    # heartbeats still count, and the pool goes on scaling the others.
    svc = PoolService(declared(3), tmp_path / "state", launch_jobs=False, scale_every_s=1000.0)
    try:
        svc.submit({"name": "a", "min_size": 1, "max_size": 2})
        svc.tick()
        held = [lease.id for lease in svc.book.of_job("a")]
        good = {"step": 40, "samples_per_s": 100.0, "global_batch": 32, "loss": 0.7, "policy": "goodput",
                "desired_size": 2, "rates": {"1": 60.0, "2": 100.0}, "rate_s": {"1": 20.0, "2": 20.0},
                "throughput": {"compute_fixed_s": 0.01, "compute_per_sample_s": 0.001, "sync_fixed_s": 0.002,
                               "sync_per_rank_s": 0.0, "observations": 12}}
        assert "report_refused" not in svc.sync_request("a", {"heartbeats": held, "report": good})
        answer = svc.sync_request("a", {"heartbeats": held, "report": {**good, field: value}})
        assert answer["report_refused"].startswith(f"report.{field}"), answer
        assert svc.reports["a"]["step"] == 40  # the good report stands
        svc.submit({"name": "b", "min_size": 1, "max_size": 1})
        svc._scale(time.time())  # raised before, on every pass
        svc.tick()
        assert svc.book.count("b", False) == 1
        refused = [e for e in _events(tmp_path / "state") if e["event"] == "report_refused"]
        assert len(refused) == 1 and refused[0]["job"] == "a"
        svc.sync_request("a", {"heartbeats": held, "report": {**good, field: value}})  # the same problem again
        assert len([e for e in _events(tmp_path / "state") if e["event"] == "report_refused"]) == 1
    finally:
        svc.close()


def test_a_lock_file_removed_by_its_last_holder_is_never_held_twice(tmp_path: Path, monkeypatch) -> None:
    # release_lock removes the lock file (pools' name locks piled up in /run). A process that
    # opened the old file just before the holder let go then gets its flock on a file no path
    # names, while a third process locks the path's new file: two holders. exclusive_lock keeps a
    # lock only on the file the path names once it is held. The race is forced here: the holder
    # lets go between the taker's open and its flock.
    import fcntl

    from dra.pool import _state

    path = tmp_path / "name.lock"
    holder = _state.exclusive_lock(path, lambda pid: f"busy {pid}")
    real_flock, calls = fcntl.flock, []

    def flock_after_the_holder_let_go(fd: int, op: int) -> None:
        if not calls:
            _state.release_lock(path, holder)  # the file this fd opened is removed now
        calls.append(fd)
        real_flock(fd, op)

    monkeypatch.setattr(_state.fcntl, "flock", flock_after_the_holder_let_go)
    fd = _state.exclusive_lock(path, lambda pid: f"busy {pid}")
    monkeypatch.undo()
    assert len(calls) == 2  # the first lock was on the removed file: taken again on the new one
    held, named = os.fstat(fd), os.stat(path)
    assert (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
    with pytest.raises(ValueError, match=f"^busy {os.getpid()}$"):  # so another taker is refused
        _state.exclusive_lock(path, lambda pid: f"busy {pid}")
    _state.release_lock(path, fd)
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns")
def test_a_log_folder_the_jobs_user_cannot_own_is_refused_at_submission(tmp_path: Path) -> None:
    # The launcher refuses a log folder that is another user's, writable by others or a link (a
    # file planted there would take the job's output); that was said only when the job was
    # granted devices and launched, as a failed job. It is now refused at submission.
    svc = PoolService(declared(1), tmp_path / "state", scale_every_s=1000.0)
    try:
        theirs = tmp_path / "dra-logs"  # the default: <cwd>/dra-logs
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        with pytest.raises(ValueError, match=rf"^log: {theirs} is owned by uid 65534, not by this job's user"):
            svc.submit({"name": "a", "cwd": str(tmp_path), "command": ["true"]})
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        with pytest.raises(ValueError, match=r"is writable by others \(mode 777\)"):
            svc.submit({"name": "a", "cwd": str(tmp_path), "log": "shared", "command": ["true"]})
        (tmp_path / "link").symlink_to(tmp_path)
        with pytest.raises(ValueError, match=r"is a symbolic link or not a directory"):
            svc.submit({"name": "a", "cwd": str(tmp_path), "log": str(tmp_path / "link"), "command": ["true"]})
        assert svc.jobs == {}  # nothing was accepted
        svc.submit({"name": "a", "cwd": str(tmp_path), "log": "mine", "command": ["true"]})  # new: made 0700
    finally:
        svc.close()


def test_a_launcher_still_running_when_its_daemon_lets_go_of_it_warns_nothing(tmp_path: Path) -> None:
    """A daemon that closes leaves its jobs' launchers running (jobs outlive it). The launcher's
    Popen, dropped with the daemon while its process ran, warned "subprocess N is still running"
    (ResourceWarning) whenever the garbage collector reached it: in a fresh clone's suite it failed
    an unrelated test that ran then. The pool keeps each launcher it started until it has exited."""
    import gc
    import signal
    import warnings

    from dra.pool import _launchers
    from dra.pool._auth import owner_of

    ref = _launchers.start("x", "unix:/nonexistent", owner_of(os.getuid()), str(tmp_path), tmp_path / "x.log", {})
    pid = ref.pid
    try:
        assert ref.alive(), "the launcher ended before the daemon let go of it"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del ref
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    finally:
        os.killpg(pid, signal.SIGKILL)
        for p in [p for p in _launchers._started if p.pid == pid]:
            p.wait(timeout=30)
