"""Ranks in network namespaces joined by rate-limited veth pairs, made and removed by the benchmark.

Topology: one hub namespace holding a Linux bridge; each rank gets its own namespace whose eth0
is one end of a veth pair, the other end attached to the bridge. Both ends are shaped with a token
bucket (tc tbf) at the given rate (a switch port that is `rate` each way), so traffic between ranks crosses a
real kernel TCP path at the link's speed. Addresses are in 10.213.<k>.0/24 inside these
namespaces only; nothing is routed out of them. Needs root (CAP_NET_ADMIN) and iproute2.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' (iproute2) not found"
    return True, ""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class RateLimitedLan:
    """`ranks` namespaces on a bridge, each port limited to `rate` (tc syntax: 100mbit, 1gbit)."""

    def __init__(self, ranks: int, rate: str, subnet: int = 213) -> None:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"RateLimitedLan: {why}")
        if ranks < 1:
            raise ValueError(f"ranks: must be >= 1, got {ranks}")
        self.ranks, self.rate = ranks, rate
        tag = uuid.uuid4().hex[:6]
        self.hub = f"dra-hub-{tag}"
        self.namespaces = [f"dra-r{i}-{tag}" for i in range(ranks)]
        self.addresses = [f"10.{subnet}.{int(tag[:2], 16)}.{i + 1}" for i in range(ranks)]
        self._tag = tag
        self._made: list[str] = []

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
        _run("ip", "netns", "add", self.hub)
        self._made.append(self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            _run("ip", "netns", "add", ns)
            self._made.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            hub_end, rank_end = f"h{i}-{self._tag}", f"r{i}-{self._tag}"
            _run("ip", "link", "add", hub_end, "type", "veth", "peer", "name", rank_end)
            _run("ip", "link", "set", hub_end, "netns", self.hub)
            _run("ip", "link", "set", rank_end, "netns", ns)
            _run("ip", "-n", ns, "link", "set", rank_end, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0")
            _run("ip", "-n", self.hub, "link", "set", hub_end, "up")
            for where, dev in ((ns, "eth0"), (self.hub, hub_end)):
                _run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                     "rate", self.rate, "burst", f"{self._burst_bytes()}b", "latency", "100ms")

    def _burst_bytes(self) -> int:
        """5 ms of the rate, and never below 128 KiB: veth hands tbf GSO packets of up to 64 KiB, and
        a bucket smaller than a packet would drop it."""
        units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
        for suffix, scale in units.items():
            if self.rate.endswith(suffix):
                bits = float(self.rate[: -len(suffix)]) * scale
                return max(128 * 1024, int(bits / 8 * 0.005))
        raise ValueError(f"rate '{self.rate}': use <number>gbit, mbit or kbit")

    def close(self) -> None:
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    def command(self, rank: int, argv: list[str]) -> list[str]:
        """argv run inside rank's namespace (with its own /sys/class/net)."""
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]
