"""Ranks in network namespaces joined by rate-limited veth pairs, made and removed by the benchmark.

Topology: one hub namespace holding a switch; each rank gets its own namespace whose eth0 is one
end of a veth pair, the other end a port of the switch. Each port is shaped toward its rank with a
token bucket (tc tbf) at the given rate, so traffic between ranks crosses a real kernel TCP path at
the link's speed (with two ranks a ring all-reduce sends each rank's bytes to the other: every
byte crosses one shaped port). The bucket's burst is small (16 KiB by default: less than one
compressed step's payload), so that compressed traffic is shaped too (a bucket larger than a
step's payload lets it through at memory speed); tbf splits larger GSO packets to fit. `latency_ms` is added one way (twice that per round trip): by tc netem on each
rank's eth0 where the kernel has sch_netem (the switch is then a Linux bridge), else by a small
user-space switch that holds every frame that long (_delay_switch.c, compiled on first use with
the system's C compiler; it forwards frames with their offload metadata, so the kernel's TCP
segmentation and the ports' tbf work as with the bridge). `effective_mbit` measures what the link
carries (a loaded host cannot time a small bucket at 1 Gbit/s exactly). Addresses are in
10.213.<k>.0/24 inside these namespaces only; nothing is routed out of them. Needs root
(CAP_NET_ADMIN) and iproute2.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' (iproute2) not found"
    return True, ""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def netem_available() -> bool:
    """Whether this kernel has sch_netem (tried on a veth pair in a scratch namespace)."""
    ns = f"dra-probe-{uuid.uuid4().hex[:6]}"
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "root", "netem", "delay",
                            "1ms"], capture_output=True, text=True)
        return r.returncode == 0
    except subprocess.CalledProcessError:
        return False
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _realtime() -> list[str]:
    """The switch runs at a real-time priority where chrt exists: a loaded host must not slow the
    link (it only takes the CPU while frames flow)."""
    return ["chrt", "-f", "10"] if shutil.which("chrt") else []


def delay_switch_binary() -> Path:
    """_delay_switch.c compiled once per source version (cached under the temp directory)."""
    src = Path(__file__).with_name("_delay_switch.c")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"dra_delay_switch-{digest}"
    if not out.exists():
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            raise RuntimeError("the delay switch needs a C compiler (cc, gcc or clang) when the kernel lacks sch_netem")
        tmp = out.with_suffix(f".{os.getpid()}")
        subprocess.run([cc, "-O2", "-o", str(tmp), str(src)], check=True, capture_output=True, text=True)
        tmp.replace(out)
    return out


class RateLimitedLan:
    """`ranks` namespaces on a bridge, each port limited to `rate` (tc syntax: 100mbit, 1gbit)."""

    def __init__(self, ranks: int, rate: str, latency_ms: float = 20.0, burst_bytes: int = 16 * 1024,
                 subnet: int = 213) -> None:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"RateLimitedLan: {why}")
        if ranks < 1:
            raise ValueError(f"ranks: must be >= 1, got {ranks}")
        if not latency_ms >= 0:
            raise ValueError(f"latency_ms: must be >= 0, got {latency_ms}")
        if burst_bytes < 2 * 1514:
            raise ValueError(f"burst_bytes: must hold two full frames (>= 3028), got {burst_bytes}")
        self._bits_per_s(rate)
        self.ranks, self.rate, self.latency_ms, self.burst_bytes = ranks, rate, latency_ms, burst_bytes
        tag = uuid.uuid4().hex[:6]
        self.hub = f"dra-hub-{tag}"
        self.namespaces = [f"dra-r{i}-{tag}" for i in range(ranks)]
        self.addresses = [f"10.{subnet}.{int(tag[:2], 16)}.{i + 1}" for i in range(ranks)]
        self._tag = tag
        self._made: list[str] = []
        self.delay_method = "none"
        self._switch: subprocess.Popen | None = None
        self.effective_mbit: float | None = None

    def __enter__(self) -> RateLimitedLan:
        try:
            self._create()
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        use_netem = self.latency_ms > 0 and netem_available()
        self.delay_method = "netem" if use_netem else ("delay-switch" if self.latency_ms > 0 else "none")
        bridged = self.delay_method != "delay-switch"
        _run("ip", "netns", "add", self.hub)
        self._made.append(self.hub)
        if bridged:
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        tbf = ["tbf", "rate", self.rate, "burst", f"{self.burst_bytes}b", "latency", "100ms"]
        ports = []
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            hub_end, rank_end = f"h{i}-{self._tag}", f"r{i}-{self._tag}"
            ports.append(hub_end)
            _run("ip", "link", "add", hub_end, "type", "veth", "peer", "name", rank_end)
            _run("ip", "link", "set", hub_end, "netns", self.hub)
            _run("ip", "link", "set", rank_end, "netns", ns)
            _run("ip", "-n", ns, "link", "set", rank_end, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            if bridged:
                _run("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", hub_end, "up")
            if use_netem:  # its queue holds a bandwidth-delay product
                limit = str(max(1000, int(self._bits_per_s(self.rate) / 8 * self.latency_ms / 1000 / 1000) * 4))
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                     f"{self.latency_ms}ms", "limit", limit)
            _run("ip", "netns", "exec", self.hub, "tc", "qdisc", "add", "dev", hub_end, "root", *tbf)
        if self.delay_method == "delay-switch":
            binary = delay_switch_binary()
            self._switch = subprocess.Popen(
                ["ip", "netns", "exec", self.hub, *_realtime(), str(binary), str(int(self.latency_ms * 1000)), *ports],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = self._switch.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"delay switch did not start: {line} {self._switch.stderr.read()[-500:]}")

    def measure(self, seconds: float = 0.5) -> dict:
        """A TCP round trip and a bulk transfer (about `seconds` at the nominal rate) from rank 0 to
        rank 1: the link as it is."""
        megabytes = self._bits_per_s(self.rate) / 8 * seconds / 1e6
        server = subprocess.Popen(self.command(1, [sys.executable, "-c", _SERVER]), stdout=subprocess.PIPE, text=True)
        try:
            if server.stdout.readline().strip() != "up":
                raise RuntimeError("link check: the receiver did not start")
            client = subprocess.run(self.command(0, [sys.executable, "-c", _CLIENT, self.addresses[1],
                                                     str(int(megabytes * 1e6))]),
                                    capture_output=True, text=True, timeout=120, check=True)
            rtt_ms = float(client.stdout.split()[0])
            mbit = float(server.communicate(timeout=60)[0].split()[0])
        finally:
            if server.poll() is None:
                server.kill()
        self.effective_mbit = mbit
        return {"rtt_ms": rtt_ms, "effective_mbit": mbit, "rate": self.rate, "latency_ms": self.latency_ms,
                "burst_bytes": self.burst_bytes, "delay_method": self.delay_method}

    @staticmethod
    def _bits_per_s(rate: str) -> float:
        units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
        for suffix, scale in units.items():
            if rate.endswith(suffix):
                try:
                    return float(rate[: -len(suffix)]) * scale
                except ValueError:
                    break
        raise ValueError(f"rate '{rate}': use <number>gbit, mbit or kbit")

    def close(self) -> None:
        if self._switch is not None:
            self._switch.terminate()
            try:
                self._switch.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._switch.kill()
                self._switch.wait()
            for pipe in (self._switch.stdin, self._switch.stdout, self._switch.stderr):
                if pipe is not None:
                    pipe.close()
            self._switch = None
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def command(self, rank: int, argv: list[str]) -> list[str]:
        """argv run inside rank's namespace (with its own /sys/class/net)."""
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]


# The link check's two ends: 20 one-byte round trips (median, ms), then the receiver's rate (Mbit/s).
_SERVER = r"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 29998)); s.listen(1)
print("up", flush=True)
c, _ = s.accept()
for _ in range(20):
    c.sendall(c.recv(1))
n, t0 = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    t0 = t0 or time.perf_counter()
    n += len(b)
print(n * 8 / (time.perf_counter() - t0) / 1e6, flush=True)
"""
_CLIENT = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], 29998), timeout=60)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(20):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
print(sorted(rtts)[10] * 1000)
left = int(sys.argv[2])
while left > 0:
    c.sendall(b"0" * min(left, 1 << 20)); left -= 1 << 20
c.close()
"""
