"""The pool daemon's API (its client is ``dra.pool.client``, also importable from here): JSON over HTTP on a Unix socket (the default; the caller
is known from the socket's peer credentials) and, only when the operator asks, on TCP with a
token (bound to loopback unless the operator insists). The standard library only.

    POST /jobs                 submit a job spec            -> {"job", "state"}
    POST /jobs/<name>/cancel   cancel (owner or operator)   -> {"job", "state"}
    POST /jobs/<name>/sync     a launcher's heartbeat       -> {"state", "leases", "release", ...}
    POST /jobs/<name>/report   a service's load (rate_rps, queue) for its autoscaler
    GET  /jobs/<name>          the job's spec (owner or operator)
    POST /drain                accept no new job ({"undo": true}: accept again; operator)
    GET  /status               devices, leases, jobs (others' jobs without their spec or report)
    GET  /metrics              Prometheus text exposition
    GET  /schema               the job spec's JSON Schema

Answers: 400 {"error": "<field>: <problem>; <fix>"} for a bad request (the client raises
ValueError), 401 without a valid token on TCP, 403 when the caller may not (PermissionError), 404
for an unknown job (ValueError), 409 for a launcher that is not the job's (RuntimeError), 503 to
a peer with 64 connections already open (a peer: a user, or on TCP from another host its
address; 256 from other hosts together; the client retries for its ``retry_s``, then raises
ConnectionError). A whole request is read before it is answered; one stalled 60 s, or not whole
60 s after it connected (a byte at a time), is dropped.
Nothing in a request is unpickled or evaluated: bodies are JSON objects, checked field by field.
"""

from __future__ import annotations

import errno
import http.client
import http.server
import json
import os
import socket
import socketserver
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from dra.pool import _auth
from dra.pool._spec import schema
from dra.pool._state import control_problem
from dra.pool.client import PoolClient, Superseded, default_url  # noqa: F401 - also offered here, as before
from dra.pool.service import NoSuchJob, PoolService

MAX_BODY = 4 << 20  # bytes: a job spec or a launcher's sync is a few kB
PREAUTH_BODY = 64 << 10  # bytes read from a TCP caller without the token, to answer its 401 cleanly
LOOPBACK = ("127.0.0.1", "::1", "[::1]", "localhost")



def _state_unwritable(e: BaseException) -> bool:
    """A full or read-only state folder: SQLite's "database or disk is full" / "attempt to write a
    readonly database", or the OSError of a file write."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
    text = str(e)
    return type(e).__name__ == "OperationalError" and ("disk is full" in text or "readonly database" in text)

class _ClientGone(Exception):
    """The client stopped sending mid-request: there is no one to answer."""


class _Handler(BaseHTTPRequestHandler):
    server: Any
    timeout = 60.0  # s: a client that connects and then stalls gives its thread back

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self, trusted: bool) -> None:
        """Reads the declared body, whatever the route: a daemon that answered before reading it
        (a cancel needs none) would close on bytes still coming, and the client would see a broken
        pipe instead of the answer. Bounded by MAX_BODY (PREAUTH_BODY for a TCP caller without the
        token) and by the handler's timeout."""
        self._raw = b""
        limit = MAX_BODY if trusted else PREAUTH_BODY
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ValueError("body: Content-Length is not a number") from None
        if n < 0 or n > limit:
            if not trusted:
                raise _ClientGone  # a large body without the token: closed unread and unanswered
            raise ValueError(f"body: {n} bytes; the pool reads 0 to {limit}; send a smaller request")
        if n:
            try:
                self._raw = self.rfile.read(n)
            except OSError:  # a client stalled past the handler's timeout, or reset
                raise _ClientGone from None
            if len(self._raw) < n:  # it hung up mid-body
                raise _ClientGone

    def _body(self) -> dict[str, Any]:
        if not self._raw:
            return {}
        try:
            value = json.loads(self._raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"body: not JSON ({e}); send a JSON object") from None
        except RecursionError:
            raise ValueError("body: nested too deeply to read; send a flat JSON object (a job spec nests 3 levels)") from None
        if not isinstance(value, dict):
            raise ValueError("body: must be a JSON object")
        return value

    def _trusted(self) -> bool:
        """The Unix socket (the kernel says who connected), or TCP with the pool's token."""
        if self.server.dra_token is None:
            return True
        given = self.headers.get("Authorization", "")
        token = given[len("Bearer "):] if given.startswith("Bearer ") else None
        return _auth.token_matches(token, self.server.dra_token)

    def _caller(self, trusted: bool) -> _auth.Caller:
        if self.server.dra_token is None:
            return _auth.peer_credentials(self.request)
        if not trusted:
            raise _auth.Unauthenticated("token: missing or wrong; give the pool's token (--token-file or "
                                        "DRA_POOL_TOKEN), or use the pool's Unix socket")
        # From this host: its socket's user; from another (--allow-remote only): the operator.
        return _auth.tcp_caller(self.request, remote=self.server.dra_remote)

    def _route(self, method: str) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        s: PoolService = self.server.dra_service
        try:
            trusted = self._trusted()
            self._read_body(trusted)  # refused or not, the request is read before it is answered
            if not self.server.request_read(self.request):
                raise _ClientGone  # cut off at the request's deadline: a partial request is not acted on
            caller = self._caller(trusted)
            if method == "GET" and parts == ["status"]:
                return self._send(200, s.status(caller))
            if method == "GET" and parts == ["metrics"]:
                return self._send(200, s.metrics(caller), "text/plain; version=0.0.4")
            if method == "GET" and parts == ["schema"]:
                return self._send(200, schema())
            if method == "GET" and len(parts) == 2 and parts[0] == "jobs":
                return self._send(200, s.job_spec(parts[1], caller))
            if method == "POST" and parts == ["jobs"]:
                return self._send(200, s.submit(self._body(), caller))
            if method == "POST" and parts == ["drain"]:
                undo = self._body().get("undo", False)
                if not isinstance(undo, bool):
                    raise ValueError("undo: must be true or false")
                return self._send(200, s.undrain(caller) if undo else s.drain(caller))
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "cancel":
                return self._send(200, s.cancel(parts[1], caller))
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "report":
                return self._send(200, s.set_report(parts[1], self._body(), caller))
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "sync":
                return self._send(200, s.sync_request(parts[1], self._body(), caller))
            if method not in ("GET", "POST"):
                return self._send(405, {"error": f"method: the pool's API takes GET and POST, not {method}; "
                                                 "see docs/guide/pool.md for its routes"})
            return self._send(404, {"error": f"path: no route {method} {self.path}"})
        except _ClientGone:
            self.close_connection = True
            return None
        except NoSuchJob as e:
            return self._send(404, {"error": str(e)})
        except ValueError as e:
            return self._send(400, {"error": str(e)})
        except _auth.Unauthenticated as e:
            return self._send(401, {"error": str(e)})
        except _auth.Forbidden as e:
            return self._send(403, {"error": str(e)})
        except Superseded as e:
            return self._send(409, {"error": str(e)})
        except Exception as e:  # noqa: BLE001 - the daemon answers, whatever went wrong; details go to its log
            s.internal_error("api", e)
            if _state_unwritable(e):  # the events could not say it either: the answer does
                return self._send(507, {"error": f"the pool's state folder {s.state_dir} cannot be written ({e}): "
                                                 "nothing was changed; running jobs go on; free space there and retry"})
            return self._send(500, {"error": f"internal error ({type(e).__name__}); see the pool's events"})

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    # Other methods get a JSON answer too (the base class answered them with an HTML 501 page).
    def do_PUT(self) -> None:  # noqa: N802
        self._route("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._route("PATCH")


class _BoundedThreads(socketserver.ThreadingMixIn):
    """A thread per connection, at most ``per_peer`` at once from one peer: a Unix socket's user
    (the kernel says who); on TCP, where nobody is known before the token, a caller on loopback is
    its user (the kernel's socket table) and one on another host its address (``remote_total``
    from other hosts together).
    A caller who opens connections and stalls them ties up its own share (each is dropped after
    the handler's timeout), never the threads that answer other users or the jobs' launchers,
    which call on the Unix socket as their owners."""

    daemon_threads = True
    # The listen backlog (socketserver's default is 5): one user's processes calling in a loop
    # kept it full, so everyone else's connect failed at once (EAGAIN), root's and the launchers'
    # included. Connections wait their turn in the kernel's queue now, answered in order.
    request_queue_size = 1024
    per_peer = 64
    # Other hosts (--allow-remote) are counted per address, and all of them together at most this
    # many: a thread each, however many addresses a caller has.
    remote_total = 256
    request_s = 60.0  # the most a request may take to arrive whole, however it trickles

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: dict[str, int] = {}  # connections being answered, per peer
        self._open_lock = threading.Lock()
        # Connections whose request has not arrived whole yet, and when each must have: the
        # handler's timeout drops one that stalls, but one that sends a byte every minute never
        # stalls (slowloris), and 64 of those held TCP (one share for all) for as long as they liked.
        self._reading: dict[Any, float] = {}
        self._late: set[Any] = set()  # cut off: what arrived of them is not acted on
        self._reaper_stop = threading.Event()
        super().__init__(*args, **kwargs)  # a bind that fails calls server_close: the above exists
        threading.Thread(target=self._reap, name="dra-pool-reaper", daemon=True).start()

    def _reap(self) -> None:
        while not self._reaper_stop.wait(min(1.0, self.request_s / 4)):
            now = time.monotonic()
            with self._open_lock:
                late = [r for r, t in self._reading.items() if t < now]
                for r in late:
                    del self._reading[r]
                    self._late.add(r)
            for r in late:
                try:
                    r.shutdown(socket.SHUT_RDWR)  # its handler's read ends; the handler finishes
                except OSError:
                    pass

    def request_read(self, request: Any) -> bool:
        """The handler read the whole request: answering it is not bounded by ``request_s``. False
        when the request was cut off at its deadline (what the handler read of it is incomplete)."""
        with self._open_lock:
            self._reading.pop(request, None)
            return request not in self._late

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-answer (a reset, a connection cut off at its deadline) is no error of
        the daemon's: nothing is printed. Anything else is the base class's traceback."""
        import sys

        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)  # type: ignore[misc]

    def server_close(self) -> None:
        self._reaper_stop.set()
        super().server_close()  # type: ignore[misc]

    def _peer(self, request: socket.socket) -> str:
        return "tcp"

    def _remote_open(self) -> int:
        return sum(n for k, n in self._open.items() if k.startswith("host "))

    def process_request(self, request: Any, client_address: Any) -> None:
        key = self._peer(request)
        with self._open_lock:
            if self._open.get(key, 0) >= self.per_peer:
                busy = f"{self.per_peer} already open from {key}"
            elif key.startswith("host ") and self._remote_open() >= self.remote_total:
                busy = f"{self.remote_total} already open from other hosts together"
            else:
                busy = ""
                self._open[key] = self._open.get(key, 0) + 1
        if busy:
            body = json.dumps({"error": f"connections: {busy}; close some (each "
                                        "is answered and closed; a stalled one is dropped after "
                                        f"{_Handler.timeout:g} s) and try again"}).encode()
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)
            return

        with self._open_lock:
            self._reading[request] = time.monotonic() + self.request_s

        def run() -> None:
            try:
                self.process_request_thread(request, client_address)
            finally:
                with self._open_lock:
                    self._open[key] -= 1
                    self._reading.pop(request, None)
                    self._late.discard(request)

        threading.Thread(target=run, name="dra-pool-call", daemon=True).start()


class _UnixServer(_BoundedThreads, socketserver.UnixStreamServer):
    def _peer(self, request: socket.socket) -> str:
        return f"uid {_auth.peer_credentials(request).uid}"


class _TcpServer(_BoundedThreads, http.server.HTTPServer):
    def _peer(self, request: socket.socket) -> str:
        # A caller on this host's loopback is counted as its user (the kernel's socket table says
        # whose): 64 connections held by a user without the token turned the operator's TCP calls
        # away while TCP had one share. Another host (--allow-remote) is counted by its address:
        # one share for all of them let one host without the token turn every other host away.
        uid = _auth.tcp_peer_uid(request)
        if uid is not None:
            return f"uid {uid}"
        try:
            return f"host {request.getpeername()[0]}"
        except OSError:  # gone already: its call ends at the first read
            return "host ?"


class _TcpServer6(_TcpServer):
    address_family = socket.AF_INET6


def _bind_unix(path: Path) -> _UnixServer:
    """The socket file: a stale one (nobody listening) is replaced, a live one refused."""
    if len(os.fsencode(str(path))) > 107:
        raise ValueError(f"socket: {path} is longer than a Unix socket path may be (107 bytes); give a shorter "
                         "--socket path")
    problem = control_problem(path.parent)
    if problem:
        raise ValueError(f"socket: {path} is not safe for the pool's socket: {problem}; whoever controls its folder "
                         "could put a socket of their own in its place, and the pool's clients and its jobs' launchers "
                         "(which take their jobs' commands from it) would talk to theirs; give --socket a path in a "
                         "folder only root or this user may write (the default, <state>/pool.sock, is one)")
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ValueError(f"socket: {path} exists and is not a socket; remove it or give another --socket")
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
            raise ValueError(f"socket: a pool already listens on {path}; stop it or give another --socket")
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink()
        finally:
            probe.close()
    server = _UnixServer(str(path), _Handler, bind_and_activate=False)
    old = os.umask(0o177)  # no window in which the socket is open to others with wrong rights
    try:
        server.server_bind()
    except OSError as e:
        server.server_close()
        raise ValueError(f"socket: cannot create {path} ({e.strerror or e}); give a --socket path in an existing "
                         "folder this user may write") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o666)  # anyone may connect; the peer credentials decide what they may do
    server.server_activate()
    return server


class PoolServer:
    """Serves a PoolService on its Unix socket (default ``<state>/pool.sock``) and, when ``port``
    is given (0: any free port), on TCP at ``host`` with ``token``. A non-loopback ``host`` needs
    ``allow_remote`` (the CLI prints a warning). Everything is bound before the service starts, so
    a port in use fails before any cgroup is made (``bind`` without a service, ``attach`` later)."""

    def __init__(self, service: PoolService | None = None, *, socket_path: str | Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None, token: str | None = None,
                 allow_remote: bool = False, max_connections_per_peer: int = 64, request_s: float = 60.0) -> None:
        if not isinstance(max_connections_per_peer, int) or max_connections_per_peer < 1:
            raise ValueError(f"max_connections_per_peer: {max_connections_per_peer!r}; give an integer >= 1")
        if not isinstance(request_s, (int, float)) or not 0 < request_s < float("inf"):
            raise ValueError(f"request_s: {request_s!r}; give a finite number of seconds > 0")
        if socket_path is None:
            if service is None:
                raise ValueError("socket: give a socket path or a service (whose state directory holds it)")
            socket_path = service.state_dir / "pool.sock"
        self.socket_path = Path(socket_path).absolute()
        self.url = f"unix:{self.socket_path}"
        self.tcp_url: str | None = None
        self._servers: list[Any] = []
        if port is not None:
            if token is None:
                raise ValueError("token: TCP needs a token (--token-file); without one use the Unix socket")
            if host not in LOOPBACK and not allow_remote:
                raise ValueError(f"host: {host} is reachable from other machines; the pool binds to loopback "
                                 "unless told --allow-remote (then anyone with the token runs jobs here)")
            try:
                # An IPv6 address (``::1``, one of the loopback names) needs an IPv6 socket: the
                # default family refused it ("Address family for hostname not supported").
                tcp = (_TcpServer6 if ":" in host else _TcpServer)((host.strip("[]"), port), _Handler)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ValueError(f"port: {host}:{port} is in use (another pool or program listens there); "
                                     "stop it or give another --port") from None
                raise ValueError(f"host: cannot listen on {host}:{port}: {e.strerror}") from None
            tcp.dra_token, tcp.dra_remote = token, allow_remote
            self._servers.append(tcp)
            self.tcp_url = f"http://{'[' + host.strip('[]') + ']' if ':' in host else host}:{tcp.server_address[1]}"
        try:
            unix = _bind_unix(self.socket_path)
        except Exception:
            for srv in self._servers:
                srv.server_close()
            raise
        unix.dra_token = None
        self._servers.insert(0, unix)
        for srv in self._servers:
            srv.per_peer = max_connections_per_peer
            srv.request_s = float(request_s)
        self.service: PoolService | None = None
        self._threads: list[threading.Thread] = []
        if service is not None:
            self.attach(service)

    def attach(self, service: PoolService) -> PoolServer:
        self.service = service
        for srv in self._servers:
            srv.dra_service = service
        service.url = self.url  # launchers reach the pool on its Unix socket
        return self

    def start(self) -> PoolServer:
        assert self.service is not None, "attach a service first"
        for srv in self._servers:
            t = threading.Thread(target=srv.serve_forever, name="dra-pool-api", daemon=True)
            t.start()
            self._threads.append(t)
        self.service.start()
        return self

    def close(self, remove_slots: bool = True, wait_s: float = 10.0) -> None:
        """Stops serving and closes the service. First, for up to wait_s, it answers while the
        launchers of ended and cancelled jobs call in and exit (PoolService.wait_exiting)."""
        if self.service is not None:
            self.service.stop()  # nothing granted or launched from now on; syncs are still answered
            self.service.wait_exiting(wait_s)  # while the API answers: a cancelled job's launcher hears it
        for srv in self._servers:
            if self._threads:
                srv.shutdown()
            srv.server_close()
        self.socket_path.unlink(missing_ok=True)
        if self.service is not None:
            self.service.close(remove_slots=remove_slots, wait_s=0.0)
