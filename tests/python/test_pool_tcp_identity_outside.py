"""Who a TCP caller is (an outside review of a pool run by root for several users, 2026-12-08):
a local user who held the pool's token was root over TCP (her jobs ran as root, she cancelled
another user's job, submitted as another user, and the events said root did it). A caller from
this host is now the user that owns its socket (the kernel's socket table); the token only lets it
in. Also: the reasons' "(uid 0)" (a dra member id, read as root), "root or root", and a cwd the
user may enter but not write (its default log folder failed later, named relatively)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_pool_security import as_root, with_nobody

from dra._core import pool as P
from dra.pool import _auth
from dra.pool.launcher import Launcher
from dra.pool.service import PoolService

TOKEN = "t" * 32


def _devices(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def _events(svc: PoolService) -> list[dict[str, Any]]:
    return [json.loads(x) for x in svc.events_path.read_text().splitlines() if x.strip()]


def _curl_as_nobody(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One call to the pool over TCP with the token, from a process of the user nobody."""
    cmd = ["curl", "-s", "-m", "20", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {TOKEN}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    r = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=30, cwd="/", user=65534, group=65534,
                       extra_groups=[])
    text, _, code = r.stdout.rpartition("\n")
    assert code.isdigit(), (r.stdout, r.stderr)
    return int(code), json.loads(text) if text.strip() else {}


@as_root
@with_nobody
@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl to call as another user")
def test_a_local_tcp_caller_with_the_token_acts_as_itself_not_as_the_operator(tmp_path: Path) -> None:
    from dra.pool.server import PoolClient, PoolServer

    svc = PoolService(_devices(2), tmp_path / "state", launch_jobs=False)
    server = PoolServer(svc, port=0, token=TOKEN).start()
    try:
        url = server.tcp_url
        svc.submit({"name": "rootjob", "min_size": 1, "max_size": 1})  # the operator's job
        code, answer = _curl_as_nobody(f"{url}/jobs", {"name": "mine", "min_size": 1, "max_size": 1})
        assert code == 200, answer
        assert svc.jobs["mine"]["info"]["owner"]["uid"] == 65534  # it runs as nobody, not as root
        code, answer = _curl_as_nobody(f"{url}/jobs/rootjob/cancel", {})
        assert code == 403 and "belongs to root; nobody may not cancel it" in answer["error"], answer
        assert svc.jobs["rootjob"]["state"] == "waiting"
        code, answer = _curl_as_nobody(f"{url}/jobs", {"name": "asroot", "user": "root", "min_size": 1,
                                                       "max_size": 1})
        assert code == 403 and answer["error"].startswith("user: only an operator may submit"), answer
        code, answer = _curl_as_nobody(f"{url}/drain", {})
        assert code == 403, answer
        assert answer["error"] == "pool: only an operator (root) may drain the pool; nobody is not one"  # root once
        code, answer = _curl_as_nobody(f"{url}/jobs/mine/cancel", {})  # its own job: yes
        assert code == 200, answer
        root = PoolClient(url, token=TOKEN)  # root over TCP stays the operator
        root.drain()
        root.drain(undo=True)
        root.cancel("rootjob")
        events = _events(svc)
        submit = next(e for e in events if e["event"] == "submit" and e["job"] == "mine")
        assert submit["user"] == "nobody" and submit["by"] == "nobody", submit
        assert next(e for e in events if e["event"] == "submit" and e["job"] == "rootjob")["by"] == "root"
        assert [(e["job"], e["by"]) for e in events if e["event"] == "cancel"] == [("mine", "nobody"), ("rootjob", "root")]
        assert [e["by"] for e in events if e["event"] in ("drain", "undrain")] == ["root", "root"]
    finally:
        server.close()


def test_a_closed_sockets_lingering_row_names_nobody() -> None:
    """The socket table keeps a closed connection's row while TCP ends (uid 0 or no inode): a
    caller that sent its request and closed must not be taken for root."""
    with socket.socket() as lsn:
        lsn.bind(("127.0.0.1", 0))
        lsn.listen()
        cli = socket.create_connection(lsn.getsockname())
        srv, _ = lsn.accept()
        with srv:
            assert _auth.tcp_peer_uid(srv) == os.geteuid()
            assert _auth.tcp_caller(srv).via == "tcp"
            cli.close()
            assert _auth.tcp_peer_uid(srv) is None
            with pytest.raises(_auth.Unauthenticated, match="cannot tell which user of this host"):
                _auth.tcp_caller(srv)  # never taken for a remote caller (the operator)


class _Peer:
    def __init__(self, host: str) -> None:
        self.host = host

    def getpeername(self) -> tuple[str, int]:
        return (self.host, 40000)


def test_a_remote_token_holder_is_the_operator_and_named_by_its_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_auth, "tcp_peer_uid", lambda sock: None)
    remote = _auth.tcp_caller(_Peer("192.0.2.7"))  # type: ignore[arg-type]  # TEST-NET-1: never this host's
    assert remote.operator and remote.via == "token" and remote.by() == "token from 192.0.2.7"
    remote = _auth.tcp_caller(_Peer("::ffff:192.0.2.7"))  # type: ignore[arg-type]
    assert remote.by() == "token from 192.0.2.7"
    for local in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        with pytest.raises(_auth.Unauthenticated):
            _auth.tcp_caller(_Peer(local))  # type: ignore[arg-type]
    # A pool that does not allow remote callers refuses every caller its socket table does not show
    # (a container on this host, this host's link-local address): none is taken for the operator.
    with pytest.raises(_auth.Unauthenticated):
        _auth.tcp_caller(_Peer("192.0.2.7"), remote=False)  # type: ignore[arg-type]


def test_a_workers_reason_names_its_member_id_not_a_uid(tmp_path: Path) -> None:
    w = {"fenced": None, "memory": [], "asked": None, "lease": 5, "uid": 0, "log": tmp_path / "none.log"}
    why = Launcher._exit_why(None, w, 2)  # type: ignore[arg-type]
    assert why.startswith("worker on lease 5 (member 0): exit code 2"), why
    assert "uid" not in why


@as_root
@with_nobody
def test_a_cwd_the_user_may_enter_but_not_write_is_refused_naming_the_log_folder(tmp_path: Path) -> None:
    svc = PoolService(_devices(1), tmp_path / "state", scale_every_s=1000.0)
    svc._runs_python.add(65534)  # the interpreter probe is another test's (this Python may be under /root)
    nobody = _auth.owner_of(65534)
    shared = Path(tempfile.mkdtemp(prefix="dra-cwd-"))  # under /tmp: nobody may reach it
    try:
        shared.chmod(0o755)  # root's: nobody may enter, not write
        with pytest.raises(ValueError, match=rf"^log: {nobody.user} cannot make the job's log folder "
                                             rf"{shared}/dra-logs \({shared} is not a folder"):
            svc.submit({"name": "a", "user": nobody.user, "cwd": str(shared), "command": ["true"]})
        assert "a" not in svc.jobs
        os.chown(shared, 65534, 65534)  # now nobody's: accepted
        svc.submit({"name": "a", "user": nobody.user, "cwd": str(shared), "command": ["true"]})
        assert svc.jobs["a"]["state"] == "waiting"
    finally:
        svc.close()
        shutil.rmtree(shared, ignore_errors=True)
