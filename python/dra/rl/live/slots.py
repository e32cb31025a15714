"""Device slots with hard CPU quotas (cgroups v1), the smallest part the live RL loop needs.

A slot is a cgroup per controller at ``/sys/fs/cgroup/<controller>/dra/<pool>/<slot>``: a hard CPU
quota (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, so an idle slot's compute is never lent to
a busy one), the cores it may run on (``cpuset.cpus``), and its measured CPU time
(``cpuacct.usage``). The layout, names and calls (``plan_slots``, ``Slots``, ``paths``, ``join``,
``usage_s``, ``close``) follow the device pool's slot manager (issue 11, ``dra.pool._cgroup``),
so one can replace the other when both are merged; this copy has no memory limit and no leases.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(os.environ.get("DRA_CGROUP_ROOT", "/sys/fs/cgroup"))
CONTROLLERS = ("cpu", "cpuacct", "cpuset")
PERIOD_US = 100_000


def available() -> str | None:
    """None when cgroups v1 CPU slots can be made here, else the reason they cannot."""
    for c in CONTROLLERS:
        base = ROOT / c
        if not base.is_dir():
            return f"cgroup v1 controller '{c}' is not mounted at {base}"
        if not os.access(base, os.W_OK):
            return f"{base} is not writable (CPU slots need root)"
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read().strip()


@dataclass
class SlotSpec:
    """One CPU slot: a quota of ``cpus`` cores, on the cores listed in ``cpuset``."""

    id: str
    cpus: float
    cpuset: str


def plan_slots(n: int, cpus: float, cores: list[int] | None = None) -> list[SlotSpec]:
    """n slots of ``cpus`` cores of quota each; slot i runs on core i mod (number of cores)."""
    if n < 1:
        raise ValueError(f"slots: must be >= 1, got {n}")
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if not 0.01 <= cpus <= len(cores):
        raise ValueError(f"cpus: a slot's quota must lie in [0.01, {len(cores)}] cores, got {cpus}")
    return [SlotSpec(f"slot{i}", cpus, str(cores[i % len(cores)])) for i in range(n)]


class Slots:
    """Creates the cgroups of a set of CPU slots, measures them, and removes them."""

    def __init__(self, pool: str, specs: list[SlotSpec]) -> None:
        why = available()
        if why:
            raise RuntimeError(f"CPU slots are not possible here: {why}")
        self.pool = pool
        self.specs = {s.id: s for s in specs}
        self.mems = _read(ROOT / "cpuset" / "cpuset.mems") or "0"
        for c in CONTROLLERS:
            for rel in ("dra", f"dra/{pool}"):
                self._mkdir(ROOT / c / rel)
        for s in specs:
            rel = self._rel(s.id)
            for c in CONTROLLERS:
                self._mkdir(ROOT / c / rel)
            _write(ROOT / "cpuset" / rel / "cpuset.cpus", s.cpuset)
            _write(ROOT / "cpuset" / rel / "cpuset.mems", self.mems)
            _write(ROOT / "cpu" / rel / "cpu.cfs_period_us", str(PERIOD_US))
            _write(ROOT / "cpu" / rel / "cpu.cfs_quota_us", str(max(1000, int(s.cpus * PERIOD_US))))

    def _rel(self, slot: str) -> str:
        return f"dra/{self.pool}/{slot}"

    def _mkdir(self, path: Path) -> None:
        path.mkdir(exist_ok=True)
        if path.is_relative_to(ROOT / "cpuset"):  # a cpuset takes no task before it has cpus and mems
            for key in ("cpuset.cpus", "cpuset.mems"):
                if not _read(path / key):
                    _write(path / key, _read(path.parent / key))

    def paths(self, slot: str) -> list[str]:
        """The cgroup directories (one per controller) a process on this slot joins."""
        return [str(ROOT / c / self._rel(slot)) for c in CONTROLLERS]

    def quota_cpus(self, slot: str) -> float:
        rel = self._rel(slot)
        return int(_read(ROOT / "cpu" / rel / "cpu.cfs_quota_us")) / int(_read(ROOT / "cpu" / rel / "cpu.cfs_period_us"))

    def usage_s(self, slot: str) -> float:
        """CPU seconds the slot's processes have used since it was made."""
        return int(_read(ROOT / "cpuacct" / self._rel(slot) / "cpuacct.usage")) / 1e9

    def throttled_s(self, slot: str) -> float:
        """Seconds the slot's processes were held back by the quota (``cpu.stat`` throttled_time)."""
        for line in _read(ROOT / "cpu" / self._rel(slot) / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
        return 0.0

    def _remove(self, rel: str) -> None:
        for c in CONTROLLERS:
            d = ROOT / c / rel
            if not d.is_dir():
                continue
            for _ in range(100):
                for pid in _read(d / "cgroup.procs").split():
                    try:
                        _write(ROOT / c / "cgroup.procs", pid)  # anything left moves to the root
                    except OSError:
                        pass
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)

    def close(self) -> None:
        for s in self.specs:
            self._remove(self._rel(s))
        self._remove(f"dra/{self.pool}")


def join(paths: list[str], pid: int | None = None) -> None:
    """Moves a process (default: this one) into the given cgroups (one per controller)."""
    pid = os.getpid() if pid is None else pid
    for p in paths:
        _write(Path(p) / "cgroup.procs", str(pid))
