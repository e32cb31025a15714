"""The pool's HTTP client (``PoolClient``): what the CLI, launchers and programs use to talk to a
daemon. Standard library only, and torch-free: a job's launcher imports it before anything heavy,
so that its workers' fork server (which imports torch) starts at once."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from dra.pool import _auth


class Superseded(RuntimeError):
    """A launcher that is not the job's own (HTTP 409): it stops."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


def default_url() -> str:
    """``$DRA_POOL``, else the socket of a pool served from this directory with the defaults."""
    return os.environ.get("DRA_POOL") or "unix:dra-pool/pool.sock"


class PoolClient:
    """Talks to a pool daemon at ``url``: ``unix:PATH`` (or a path) or ``http://host:port`` (with
    ``token``, default ``$DRA_POOL_TOKEN`` or the file ``$DRA_POOL_TOKEN_FILE``). ``timeout_s``: how
    long one call waits for the daemon's answer (a daemon on a loaded host can take seconds; the
    CLI waits as long). ``retry_s``: how long a call keeps retrying while the daemon is
    unreachable; 0 fails at once."""

    def __init__(self, url: str, timeout_s: float = 30.0, retry_s: float = 0.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        if self.url.startswith("http://"):
            hostport = self.url[len("http://"):].split("/")[0]
            host, _, port = hostport.rpartition(":")
            self._target: tuple[str, Any] = ("tcp", (host.strip("[]") or "127.0.0.1", int(port or 80)))
            if token is None and os.environ.get("DRA_POOL_TOKEN_FILE"):
                token = _auth.load_token(os.environ["DRA_POOL_TOKEN_FILE"])
            self.token = token or os.environ.get("DRA_POOL_TOKEN")
        elif self.url.startswith("https://"):
            raise ValueError("pool: https is not served; use the Unix socket, or http on loopback with a token")
        else:
            path = self.url[len("unix:"):] if self.url.startswith("unix:") else self.url
            self._target = ("unix", str(Path(path).absolute()))
            self.token = None

    def _connection(self) -> http.client.HTTPConnection:
        kind, where = self._target
        if kind == "unix":
            return _UnixConnection(where, self.timeout_s)
        return http.client.HTTPConnection(where[0], where[1], timeout=self.timeout_s)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, raw: bool = False) -> Any:
        deadline = time.monotonic() + self.retry_s
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        while True:
            conn = self._connection()
            try:
                try:
                    conn.request(method, path, body=data, headers=headers)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the daemon answered before it took everything (a refused request): read why
                r = conn.getresponse()
                text = r.read().decode()
                code = r.status
            except (ConnectionError, TimeoutError, OSError, http.client.HTTPException) as e:
                if time.monotonic() >= deadline:
                    if isinstance(e, TimeoutError):
                        raise ConnectionError(f"pool {self.url} did not answer within {self.timeout_s:g} s (the daemon "
                                              "is busy or stopped); try again, or check that it runs") from None
                    kind, where = self._target
                    hint = (f"no pool listens on the socket {where} (start one with `dra pool serve --state DIR`, "
                            "whose socket is DIR/pool.sock, or give its --pool unix:PATH or http://HOST:PORT; "
                            "DRA_POOL sets the default)" if kind == "unix" and isinstance(e, (FileNotFoundError,
                                                                                              ConnectionRefusedError))
                            else f"{e}; check that `dra pool serve` runs there")
                    raise ConnectionError(f"pool {self.url} unreachable: {hint}") from None
                time.sleep(0.2)
                continue
            finally:
                conn.close()
            if code == 200:
                return text if raw else json.loads(text)
            try:
                msg = json.loads(text).get("error", text)
            except (json.JSONDecodeError, AttributeError):
                msg = text
            if code == 503:  # this caller's connections are all in use: transient
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise ConnectionError(f"pool {self.url} refused the call: {msg}")
            if code in (400, 404):
                raise ValueError(msg)
            if code in (401, 403):
                raise PermissionError(msg)
            if code == 409:
                raise Superseded(msg)
            raise RuntimeError(f"pool {self.url}: {msg}")

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/jobs", spec)

    def cancel(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{name}/cancel", {})

    def drain(self, undo: bool = False) -> dict[str, Any]:
        return self._call("POST", "/drain", {"undo": undo})

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def metrics(self) -> str:
        return self._call("GET", "/metrics", raw=True)

    def schema(self) -> dict[str, Any]:
        return self._call("GET", "/schema")

    def job_spec(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{name}")

    def sync(self, name: str, heartbeats: list[int], released: list[int], report: dict[str, Any] | None = None,
             done: bool = False, failed: bool = False, reason: str | None = None,
             launcher: str | None = None, world: bool | None = None,
             exits: dict[int, int] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"heartbeats": heartbeats, "released": released, "report": report, "done": done,
                                "failed": failed}
        if exits:
            body["exits"] = {str(lid): code for lid, code in exits.items()}
        if world is not None:
            body["world"] = world
        if reason is not None:
            body["reason"] = reason
        if launcher is not None:
            body["launcher"] = launcher
        return self._call("POST", f"/jobs/{name}/sync", body)

    def report(self, name: str, report: dict[str, Any]) -> dict[str, Any]:
        """A service's own report (an inference frontend: rate_rps, queue) for the autoscaler."""
        return self._call("POST", f"/jobs/{name}/report", report)

    def wait(self, names: list[str], timeout_s: float, poll_s: float = 0.5) -> dict[str, str]:
        """Waits until the jobs ended (finished, failed, cancelled); their states."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = {j["name"]: j["state"] for j in self.status()["jobs"] if j["name"] in names}
            if all(s in ("finished", "failed", "cancelled") for s in states.values()) and len(states) == len(names):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs not done after {timeout_s:g} s: {states}")
            time.sleep(poll_s)
