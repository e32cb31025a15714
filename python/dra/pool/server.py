"""The pool daemon's HTTP interface (loopback by default) and its client.

JSON over HTTP (the standard library's ThreadingHTTPServer and urllib: no extra dependency):

    POST /jobs                 submit a job spec            -> {"job", "state"}
    POST /jobs/<name>/cancel   cancel                       -> {"job", "state"}
    POST /jobs/<name>/sync     a launcher's heartbeat       -> {"state", "leases", "release", ...}
    POST /jobs/<name>/report   a service's load (rate_rps, queue) for its autoscaler
    GET  /jobs/<name>          the job's spec
    POST /drain                accept no new job
    GET  /status               devices, leases, jobs, counters
    GET  /metrics              Prometheus text exposition

A bad request answers 400 with {"error": "<field>: <problem and fix>"}; the client raises it as
ValueError.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dra.pool.service import PoolService


class _Handler(BaseHTTPRequestHandler):
    service: PoolService  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return {}
        value = json.loads(self.rfile.read(n))
        if not isinstance(value, dict):
            raise ValueError("body: must be a JSON object")
        return value

    def _route(self, method: str) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        s = self.service
        try:
            if method == "GET" and parts == ["status"]:
                return self._send(200, s.status())
            if method == "GET" and parts == ["metrics"]:
                return self._send(200, s.metrics(), "text/plain; version=0.0.4")
            if method == "GET" and len(parts) == 2 and parts[0] == "jobs":
                return self._send(200, s.job_spec(parts[1]))
            if method == "POST" and parts == ["jobs"]:
                return self._send(200, s.submit(self._body()))
            if method == "POST" and parts == ["drain"]:
                return self._send(200, s.drain())
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "cancel":
                return self._send(200, s.cancel(parts[1]))
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "report":
                return self._send(200, s.set_report(parts[1], self._body()))
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "sync":
                b = self._body()
                return self._send(200, s.sync(parts[1], [int(x) for x in b.get("heartbeats", [])],
                                              [int(x) for x in b.get("released", [])], b.get("report"),
                                              bool(b.get("done")), bool(b.get("failed"))))
            return self._send(404, {"error": f"path: no route {method} {self.path}"})
        except ValueError as e:
            return self._send(400, {"error": str(e)})
        except Exception as e:  # noqa: BLE001 - the daemon answers, whatever went wrong
            return self._send(500, {"error": f"{type(e).__name__}: {e}"})

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")


class PoolServer:
    """Serves a PoolService on host:port (port 0: any free port) in a background thread."""

    def __init__(self, service: PoolService, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = type("Handler", (_Handler,), {"service": service})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.service = service
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        service.url = self.url
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="dra-pool-http", daemon=True)

    def start(self) -> PoolServer:
        self._thread.start()
        self.service.start()
        return self

    def close(self, remove_slots: bool = True) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.service.close(remove_slots=remove_slots)


class PoolClient:
    """Talks to a pool daemon. ``retry_s``: how long a call keeps retrying while the daemon is
    unreachable (a restarting daemon); 0 fails at once."""

    def __init__(self, url: str, timeout_s: float = 5.0, retry_s: float = 0.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry_s = retry_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, raw: bool = False) -> Any:
        deadline = time.monotonic() + self.retry_s
        data = None if body is None else json.dumps(body).encode()
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    text = r.read().decode()
                return text if raw else json.loads(text)
            except urllib.error.HTTPError as e:
                try:
                    msg = json.loads(e.read().decode()).get("error", str(e))
                except Exception:  # noqa: BLE001
                    msg = str(e)
                if e.code == 400:
                    raise ValueError(msg) from None
                raise RuntimeError(f"pool {self.url}: {msg}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"pool {self.url} unreachable: {e}") from None
                time.sleep(0.2)

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/jobs", spec)

    def cancel(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{name}/cancel", {})

    def drain(self) -> dict[str, Any]:
        return self._call("POST", "/drain", {})

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def metrics(self) -> str:
        return self._call("GET", "/metrics", raw=True)

    def job_spec(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/jobs/{name}")

    def sync(self, name: str, heartbeats: list[int], released: list[int], report: dict[str, Any] | None = None,
             done: bool = False, failed: bool = False) -> dict[str, Any]:
        return self._call("POST", f"/jobs/{name}/sync", {"heartbeats": heartbeats, "released": released,
                                                         "report": report, "done": done, "failed": failed})

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
