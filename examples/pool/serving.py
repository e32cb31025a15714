"""The main job's inference side and host watch (examples/pool/pool_at_work.py): the trace's
requests, the service's front end (a queue its replicas take requests from over a Unix socket),
latency percentiles, and the host's load average."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any


def load_trace(path: Path, duration_s: float, thin: int, ctx_div: int, gen_cap: int, minutes: float = 60.0,
               start_min: float = 0.0) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens / ctx_div, generated tokens) of every thin-th request in the
    trace's window [start_min, start_min + minutes), that window compressed into duration_s."""
    rows = list(csv.DictReader(open(path)))
    stamp = lambda s: datetime.fromisoformat(s[:26])  # noqa: E731 - microseconds: the first 26 characters
    t0 = stamp(rows[0]["TIMESTAMP"])
    lo, span = 60.0 * start_min, 60.0 * minutes
    window = [(t, r) for t, r in (((stamp(r["TIMESTAMP"]) - t0).total_seconds() - lo, r) for r in rows) if 0 <= t < span]
    return [(t / span * duration_s, max(1, int(r["ContextTokens"]) // ctx_div), min(gen_cap, int(r["GeneratedTokens"])))
            for t, r in window[::thin]]


class Frontend:
    """The inference service's front: replays the trace, queues requests, hands each to an idle
    replica, measures latency (arrival to answer). Replicas connect to its Unix socket (a private
    directory; a peer running as another user is turned away) and speak JSON lines; one that goes
    away has its request re-queued at the front."""

    def __init__(self, trace: list[tuple[float, int, int]], pool: Any, job: str, slo_s: float) -> None:
        self.trace = trace
        self.pool, self.job, self.slo_s = pool, job, slo_s
        self.dir = tempfile.mkdtemp(prefix="dra-serve-")  # 0700: only this user reaches the socket
        self.address = os.path.join(self.dir, "frontend.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.address)
        self.listener.listen(16)
        self.queue: deque[dict[str, Any]] = deque()
        self.cv = threading.Condition()
        self.latencies: list[float] = []
        self.late: list[tuple[float, float, int]] = []  # (arrival, latency, replicas then) of answers past the SLO
        self.compute: deque[float] = deque(maxlen=100)  # replicas' compute time per request (measured)
        self.arrivals: deque[float] = deque()
        self.replicas = 0
        self.refused = 0
        self.stopping = False
        self.done_replaying = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            if uid != os.geteuid():
                self.refused += 1
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
        conn.sendall((json.dumps(msg) + "\n").encode())

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            if not reader.readline(1 << 16):  # hello
                return
        except OSError:
            return
        with self.cv:
            self.replicas += 1
        try:
            while True:
                with self.cv:
                    while not self.queue and not self.stopping:
                        self.cv.wait(0.2)
                    if self.stopping:
                        try:
                            self._send(conn, {"stop": True})
                        except OSError:
                            pass
                        return
                    req = self.queue.popleft()
                try:
                    self._send(conn, {"id": req["id"], "ctx": req["ctx"], "gen": req["gen"]})
                    line = reader.readline(1 << 16)
                    if not line:
                        raise EOFError
                    answer = json.loads(line)
                except (EOFError, OSError, ValueError):
                    with self.cv:
                        self.queue.appendleft(req)
                        self.cv.notify()
                    return
                with self.cv:
                    self.latencies.append(time.time() - req["arrival"])
                    if self.latencies[-1] > self.slo_s:
                        self.late.append((req["arrival"], self.latencies[-1], self.replicas))
                    self.compute.append(float(answer["compute_s"]))
        finally:
            with self.cv:
                self.replicas -= 1
            conn.close()

    def replay(self, t0: float) -> None:
        for i, (at, ctx, gen) in enumerate(self.trace):
            delay = t0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            now = time.time()
            with self.cv:
                self.queue.append({"id": i, "ctx": ctx, "gen": gen, "arrival": now})
                self.arrivals.append(now)
                self.cv.notify()
        self.done_replaying = True

    def report_loop(self) -> None:
        while not self.stopping:
            now = time.time()
            with self.cv:
                # The rate over the last SLO (at least 0.5 s): a burst the SLO must absorb shows at
                # its height (over 2 s, 45 requests in 0.25 s read as half a replica's worth).
                span = max(0.5, self.slo_s)
                while self.arrivals and self.arrivals[0] < now - span:
                    self.arrivals.popleft()
                rate, queue = len(self.arrivals) / span, len(self.queue)
                # What one replica really serves now (slot quota and the machine's load included).
                per = len(self.compute) / sum(self.compute) if len(self.compute) >= 20 and sum(self.compute) > 0 else 0.0
            try:
                self.pool.report(self.job, {"rate_rps": rate, "queue": queue, "replicas_connected": self.replicas,
                                            "replica_rps": per})
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.25)

    def drained(self) -> bool:
        with self.cv:
            return self.done_replaying and not self.queue and len(self.latencies) >= len(self.trace)

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


class LoadSampler:
    """The host's load average (1 min) every second, to show beside the Gantt chart."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append((time.time(), os.getloadavg()[0]))

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        return self.samples

    @staticmethod
    def settle(limit_s: float) -> float:
        """Waits (at most limit_s) for the load average to fall below the core count, so that no
        mode starts on a host still busy with what ran before it; returns the load then."""
        end = time.time() + limit_s
        while os.getloadavg()[0] >= (os.cpu_count() or 1) and time.time() < end:
            time.sleep(1.0)
        return os.getloadavg()[0]
