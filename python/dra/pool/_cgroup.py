"""Device slots of CPU cores, enforced with cgroups v1 (cpu quota, cpuset affinity, memory limit).

A slot is a cgroup per controller at ``/sys/fs/cgroup/<controller>/dra/<pool>/<slot>``: a hard CPU
quota (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), the CPU cores it may run on
(``cpuset.cpus``), and a memory limit (``memory.limit_in_bytes``). A lease on a slot is a child
cgroup ``lease-<id>`` with its share of the quota and memory, so a fraction is enforced too. The
slot's compute used is read from ``cpuacct.usage`` (nanoseconds, its leases included): utilisation
is measured, not modelled. Slots are created and removed by the pool.

A lease's ``cgroup.procs`` and ``tasks`` belong to the job's owner (cgroup delegation): its
workers, running as that user, enter their lease's cgroup themselves and cannot leave for any
cgroup they do not own. ``guarantee`` gives the pool's cgroups a large ``cpu.shares``, so under
contention a slot gets its quota before processes outside the pool do: a slot is a reservation,
not only a cap (the quota still caps it).

The pool's control plane (its jobs' launchers and their fork servers) runs in a cgroup of its own,
``dra/<pool>/control`` (cpu and cpuacct only: no quota, no cpuset, no memory limit), beside the
slots: with ``guarantee``, a launcher left in the root cgroup weighed 1024 against the pool's
262,144 and, with every core reserved by busy slots, waited a minute to start (measured: a job's
launcher ready 62 s after its launch on 2 cores and two busy 1-core slots). Inside the pool, each
slot weighs ``1024 x`` its cores and the control plane ``1024 x control_cpus``: under full
contention the control plane gets that share of the cores and the slots the rest, in proportion to
their quotas. Each job's launcher and fork server (and whatever they start before a worker enters
its lease) get a cgroup of their own under it, ``control/<launch id>`` (cpu, cpuacct, memory): they
weigh one process's CPU there (``cpu.shares`` 1024, as each of the daemon's threads does) and at
most ``launcher_memory_gb`` of memory, since a job's ``preload`` modules, its ``env``'s
``PYTHONPATH`` (a ``sitecustomize``) or its user site run its user's code in them; that cgroup is
emptied and removed when the launcher is gone.
"""

from __future__ import annotations

import math
import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dra.pool._state import exclusive_lock, release_lock

ROOT = Path(os.environ.get("DRA_CGROUP_ROOT", "/sys/fs/cgroup"))
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
#: Used where mounted and writable: a lease's ``pids.max`` goes to 0 before its processes are
#: killed, so none can fork a new one past the kill.
OPTIONAL_CONTROLLERS = ("pids",)
PERIOD_US = 100_000
#: The kernel's least CPU quota per period (``cpu.cfs_quota_us`` refuses less than 1 ms): a lease
#: whose share of its slot comes to less cannot be held to that share.
MIN_QUOTA_US = 1000
#: The least memory limit a lease may get (MiB): a Python process that imports torch and dra and
#: runs one step of a small model peaks at 160 MiB in a memory cgroup here (torch 2.13 CPU build,
#: warm page cache; at 128 MiB the kernel's OOM killer stops it while it imports torch), plus room
#: for the job's model and data.
MIN_LEASE_MEMORY_MB = 256
MAX_SHARES = 262_144  # the kernel's largest cpu.shares (v1)
#: The control plane's cgroup under ``dra/<pool>`` (no slot may take the name).
CONTROL = "control"
CONTROL_CONTROLLERS = ("cpu", "cpuacct")
#: A job's launcher's cgroup under the control plane's (``Slots.make_launcher``).
LAUNCHER_CONTROLLERS = ("cpu", "cpuacct", "memory")
#: Its default memory limit (GiB): a fork server that preloads torch and dra holds about 0.4 GiB.
LAUNCHER_MEMORY_GB = 4.0


def available() -> str | None:
    """None when cgroups v1 slots can be made here, else the reason they cannot."""
    for c in CONTROLLERS:
        base = ROOT / c
        if not base.is_dir():
            return f"cgroup v1 controller '{c}' is not mounted at {base}"
        if not os.access(base, os.W_OK):
            return f"{base} is not writable (the pool needs root to create CPU slots)"
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read().strip()


@dataclass
class SlotSpec:
    """One CPU slot: ``cpus`` cores of quota on the cores in ``cpuset``, ``memory_gb`` of memory
    (None: no memory limit)."""

    id: str
    cpus: float
    cpuset: str
    memory_gb: float | None = None


def plan_slots(n: int, cores: list[int] | None = None, memory_gb: float | None = 2.0,
               cpus: float | None = None) -> list[SlotSpec]:
    """n slots on the machine's cores (or `cores`), slot i on core i mod cores. Each slot's quota is
    `cpus` cores when given (the RL loop's 0.2-core slots), else the cores divided evenly (4 slots
    on 2 cores: 0.5 CPU each, two per core; a slot of whole cores gets cores of its own).
    `memory_gb` None: no memory limit."""
    if n < 1:
        raise ValueError(f"slots: must be >= 1, got {n}")
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if cpus is not None and not 0.01 <= cpus <= len(cores):
        raise ValueError(f"cpus: a slot's quota must lie in [0.01, {len(cores)}] cores, got {cpus}")
    share = len(cores) / n if cpus is None else cpus
    out = []
    for i in range(n):
        if cpus is None and share >= 1.0:
            per = int(share)
            own = cores[i * per:(i + 1) * per] or [cores[i % len(cores)]]
        else:
            own = [cores[i % len(cores)]]
        out.append(SlotSpec(f"slot{i}", share, ",".join(str(c) for c in own), memory_gb))
    return out


class Slots:
    """Creates, enforces and removes the cgroups of a pool's CPU slots."""

    def __init__(self, pool: str, specs: list[SlotSpec], guarantee: bool = False,
                 control_cpus: float | None = None, launcher_memory_gb: float | None = LAUNCHER_MEMORY_GB) -> None:
        why = available()
        if why:
            raise RuntimeError(f"CPU slots are not possible here: {why}")
        if not isinstance(pool, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", pool):
            raise ValueError(f"name: {pool!r} cannot name the pool's cgroups (dra/<name>); use 1-64 letters, digits, "
                             "'_', '.' or '-', not starting with '.' or '-'")
        if control_cpus is not None and not (isinstance(control_cpus, (int, float)) and 0.01 <= control_cpus <= 64):
            raise ValueError(f"control_cpus: the control plane's share must lie in [0.01, 64] cores, got {control_cpus!r}")
        if launcher_memory_gb is not None and not (isinstance(launcher_memory_gb, (int, float))
                                                   and 0.25 <= launcher_memory_gb < float("inf")):
            raise ValueError(f"launcher memory: {launcher_memory_gb!r} GB; a job's launcher and fork server need at "
                             "least 0.25 (--launcher-memory-gb; 0: no limit)")
        self.launcher_memory_gb = launcher_memory_gb
        if any(s.id == CONTROL for s in specs):
            raise ValueError(f"slots: a slot may not be named '{CONTROL}' (the pool's control-plane cgroup); rename it")
        self.pool = pool
        self.controllers = CONTROLLERS + tuple(c for c in OPTIONAL_CONTROLLERS
                                               if (ROOT / c).is_dir() and os.access(ROOT / c, os.W_OK))
        #: Killed leases whose processes outlived the kill (uninterruptible sleep): their cgroups
        #: stay, limits and all, until ``reap`` finds them empty.
        self.lingering: set[str] = set()
        self._lock = _name_lock(pool)
        self.specs = {s.id: s for s in specs}
        self.mems = _read(ROOT / "cpuset" / "cpuset.mems") or "0"
        for c in self.controllers:
            self._mkdir(ROOT / c / "dra")
            self._mkdir(ROOT / c / "dra" / pool)
        if guarantee:
            for rel in ("dra", f"dra/{pool}"):
                _write(ROOT / "cpu" / rel / "cpu.shares", str(MAX_SHARES))
        for s in specs:
            self._make(self._rel(s.id), s.cpus, s.cpuset, s.memory_gb)
            if control_cpus is not None:
                _write(ROOT / "cpu" / self._rel(s.id) / "cpu.shares", str(_shares(s.cpus)))
        #: The control plane's cgroups (one per controller; empty without ``control_cpus``).
        self.control: list[str] = []
        self._came_from: dict[str, Path] = {}  # enter_control(): where this process was, per controller
        if control_cpus is not None:
            for c in CONTROL_CONTROLLERS:
                (ROOT / c / self._rel(CONTROL)).mkdir(exist_ok=True)
                self.control.append(str(ROOT / c / self._rel(CONTROL)))
            _write(ROOT / "cpu" / self._rel(CONTROL) / "cpu.shares", str(_shares(control_cpus)))

    # -- paths -----------------------------------------------------------------------------------
    def _rel(self, slot: str, lease: int | None = None) -> str:
        rel = f"dra/{self.pool}/{slot}"
        return rel if lease is None else f"{rel}/lease-{lease}"

    def paths(self, slot: str, lease: int | None = None) -> list[str]:
        """The cgroup directories (one per controller) a worker on this slot/lease joins."""
        rel = self._rel(slot, lease)
        return [str(ROOT / c / rel) for c in self.controllers]

    def _mkdir(self, path: Path) -> None:
        path.mkdir(exist_ok=True)
        if path.is_relative_to(ROOT / "cpuset"):  # a cpuset takes no task before it has cpus and mems
            for key in ("cpuset.cpus", "cpuset.mems"):
                if not _read(path / key):
                    _write(path / key, _read(path.parent / key))

    def _make(self, rel: str, cpus: float, cpuset: str, memory_gb: float | None) -> None:
        for c in self.controllers:
            (ROOT / c / rel).mkdir(exist_ok=True)
        _write(ROOT / "cpuset" / rel / "cpuset.cpus", cpuset)
        _write(ROOT / "cpuset" / rel / "cpuset.mems", self.mems)
        _write(ROOT / "cpu" / rel / "cpu.cfs_period_us", str(PERIOD_US))
        _write(ROOT / "cpu" / rel / "cpu.cfs_quota_us", str(max(1000, int(cpus * PERIOD_US))))
        if memory_gb is not None:
            _write(ROOT / "memory" / rel / "memory.limit_in_bytes", str(int(memory_gb * 2**30)))

    def has(self, slot: str) -> bool:
        return slot in self.specs

    def lease_limits_problem(self, slot: str, share: float, memory_gb: float = 0.0) -> str | None:
        """Why a lease of ``share`` of this slot could not hold a worker (``fraction: ...; fix``),
        or None: its CPU quota below the kernel's least (``MIN_QUOTA_US``), its memory limit below
        ``MIN_LEASE_MEMORY_MB`` or below the ``memory_gb`` the job asks for."""
        s = self.specs[slot]
        quota_us = s.cpus * share * PERIOD_US
        if quota_us < MIN_QUOTA_US:
            least = _round_up(MIN_QUOTA_US / (s.cpus * PERIOD_US))
            return (f"fraction: {share:g} of {slot} ({s.cpus:g} cores) is a CPU quota of {quota_us / 1000:.3g} ms per "
                    f"{PERIOD_US // 1000} ms, less than the kernel's least ({MIN_QUOTA_US // 1000} ms, cpu.cfs_quota_us); "
                    f"ask for a fraction >= {least:g}")
        if s.memory_gb is None:
            return None
        need_mb = max(MIN_LEASE_MEMORY_MB, memory_gb * 1024)
        have_mb = s.memory_gb * share * 1024
        if have_mb + 1e-6 < need_mb:
            why = (f"the {memory_gb:g} GB its memory_gb asks for" if memory_gb * 1024 > MIN_LEASE_MEMORY_MB else
                   f"the {MIN_LEASE_MEMORY_MB} MiB a worker needs to start (a Python process with torch peaks at about "
                   "160 MiB; the kernel's OOM killer would stop it)")
            least = _round_up(need_mb / (s.memory_gb * 1024))
            fix = (f"ask for a fraction >= {least:g}" if least <= 1 else
                   f"no share of {slot} is enough: its operator must give the slots more memory (--slot-memory-gb)")
            return (f"fraction: {share:g} of {slot} is a memory limit of {have_mb:.3g} MiB ({share:g} x "
                    f"{s.memory_gb:g} GB), less than {why}; {fix}")
        return None

    # -- leases ----------------------------------------------------------------------------------
    def make_lease(self, slot: str, lease: int, share: float, owner_uid: int | None = None) -> list[str]:
        """A child cgroup for one lease with its share of the slot's quota and memory; its
        processes files belong to ``owner_uid`` (the job's user), who may move its own processes
        in. Its limits stay root's."""
        s = self.specs[slot]
        memory = None if s.memory_gb is None else s.memory_gb * share
        rel = self._rel(slot, lease)
        self._make(rel, s.cpus * share, s.cpuset, memory)
        if owner_uid is not None and owner_uid != os.geteuid():
            for c in self.controllers:
                for f in ("cgroup.procs", "tasks"):
                    os.chown(ROOT / c / rel / f, owner_uid, -1)
        return self.paths(slot, lease)

    def remove_lease(self, slot: str, lease: int, kill: bool = False) -> bool:
        """Removes a lease's cgroup; ``kill``: its processes are killed first (no compute without a
        lease), else they move to the root cgroup. A killed lease's processes are never moved out:
        one that outlives the kill (in an uninterruptible sleep, where SIGKILL waits) keeps the
        lease's cgroups and limits until ``reap`` finds them empty. False when that happened."""
        rel = self._rel(slot, lease)
        if not kill:
            self._remove(rel)
            return True
        if (ROOT / "pids" / rel).is_dir():
            try:
                _write(ROOT / "pids" / rel / "pids.max", "0")  # no new process from here on
            except OSError:
                pass
        for _ in range(50):
            if not self._kill(rel):
                break
            time.sleep(0.01)
        if self._remove(rel, evict=False, wait_s=0.5):
            return True
        self.lingering.add(rel)
        return False

    def reap(self) -> list[str]:
        """Kills what is still inside the lingering leases and removes those now empty; returns
        the ones removed (the pool calls it on every tick)."""
        gone = []
        for rel in sorted(self.lingering):
            self._kill(rel)
            if self._remove(rel, evict=False, wait_s=0.0):
                gone.append(rel)
                self.lingering.discard(rel)
        return gone

    def _kill(self, rel: str) -> bool:
        """SIGKILL to every process in the cgroups ``rel``; False when there was none."""
        pids = {int(p) for c in self.controllers if (ROOT / c / rel).is_dir()
                for p in _read(ROOT / c / rel / "cgroup.procs").split()}
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return bool(pids)

    # -- accounting ------------------------------------------------------------------------------
    def usage_s(self, slot: str) -> float:
        """CPU seconds the slot (its leases included) has used since it was made."""
        return int(_read(ROOT / "cpuacct" / self._rel(slot) / "cpuacct.usage")) / 1e9

    def lease_usage_s(self, slot: str, lease: int) -> float | None:
        """CPU seconds one lease's processes have used (None once its cgroup is gone): what the
        job that held it used of the slot."""
        try:
            return int(_read(ROOT / "cpuacct" / self._rel(slot, lease) / "cpuacct.usage")) / 1e9
        except (OSError, ValueError):
            return None

    def lease_memory(self, slot: str, lease: int) -> dict[str, int] | None:
        """A lease's memory cgroup: its limit and what it refused (``memory_state``)."""
        return memory_state(ROOT / "memory" / self._rel(slot, lease))

    def quota_cpus(self, slot: str) -> float:
        """The slot's hard CPU quota in cores (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``)."""
        rel = self._rel(slot)
        return int(_read(ROOT / "cpu" / rel / "cpu.cfs_quota_us")) / int(_read(ROOT / "cpu" / rel / "cpu.cfs_period_us"))

    def throttled_s(self, slot: str) -> float:
        """Seconds the slot's processes were held back by the quota (``cpu.stat`` throttled_time)."""
        for line in _read(ROOT / "cpu" / self._rel(slot) / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
        return 0.0

    def throttling(self, slot: str) -> tuple[int, int]:
        """(enforcement periods, periods in which the quota held the slot back): how often the
        quota binds (``cpu.stat``)."""
        stat = dict(line.split(" ", 1) for line in _read(ROOT / "cpu" / self._rel(slot) / "cpu.stat").splitlines())
        return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))

    def usage_all(self) -> dict[str, float]:
        return {s: self.usage_s(s) for s in self.specs}

    def make_launcher(self, launch_id: str) -> list[str]:
        """The cgroups (one per controller) of a job's launcher about to start, under the control
        plane's; [] without a control plane. Root keeps them: the launcher's user cannot move its
        processes out of them but into its own leases."""
        if not self.control:
            return []
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", launch_id):
            raise ValueError(f"launch id: {launch_id!r} cannot name a cgroup")
        rel = f"{self._rel(CONTROL)}/{launch_id}"
        for c in LAUNCHER_CONTROLLERS:
            (ROOT / c / self._rel(CONTROL)).mkdir(exist_ok=True)  # memory has no control-plane limit of its own
            (ROOT / c / rel).mkdir(exist_ok=True)
        if self.launcher_memory_gb is not None:
            _write(ROOT / "memory" / rel / "memory.limit_in_bytes", str(int(self.launcher_memory_gb * 2**30)))
        return [str(ROOT / c / rel) for c in LAUNCHER_CONTROLLERS]

    def launcher_ids(self) -> list[str]:
        """The launch ids that have a launcher cgroup now (``make_launcher``)."""
        found: set[str] = set()
        for c in LAUNCHER_CONTROLLERS:
            d = ROOT / c / self._rel(CONTROL)
            if d.is_dir():
                found.update(p.name for p in d.iterdir() if p.is_dir())
        return sorted(found)

    def remove_launcher(self, launch_id: str) -> bool:
        """Kills what is left in a launcher's cgroups (its launcher gone: a fork server, what the
        job's own code started there) and removes them; one that cannot be removed yet lingers
        (``reap``). False then."""
        rel = f"{self._rel(CONTROL)}/{launch_id}"
        self._kill(rel)
        if self._remove(rel, evict=False, wait_s=0.1):  # the pool's loop waits meanwhile
            return True
        self.lingering.add(rel)
        return False

    def enter_control(self) -> None:
        """Moves this process (the daemon: its API, its loop, the launchers it starts from now on)
        into the control plane's cgroups; ``close`` moves it back where it was."""
        if not self.control:
            return
        own = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(","):
                own[c] = path
        for c in CONTROL_CONTROLLERS:
            self._came_from.setdefault(c, ROOT / c / own.get(c, "/").lstrip("/"))
        join(self.control)

    def leave_control(self) -> None:
        """Moves this process back where it was before ``enter_control`` (the root cgroup where that
        is gone); the launchers stay."""
        for c, back in self._came_from.items():
            try:
                _write((back if back.is_dir() else ROOT / c) / "cgroup.procs", str(os.getpid()))
            except OSError:
                pass  # removing the control cgroup moves it to the root cgroup
        self._came_from.clear()

    def control_usage_s(self) -> float | None:
        """CPU seconds the control plane (launchers, fork servers) used; None without its cgroup."""
        if not self.control:
            return None
        return int(_read(ROOT / "cpuacct" / self._rel(CONTROL) / "cpuacct.usage")) / 1e9

    # -- teardown --------------------------------------------------------------------------------
    def _remove(self, rel: str, evict: bool = True, wait_s: float = 1.0, deadline: float | None = None) -> bool:
        """Removes the cgroups ``rel`` (children first), retrying for ``wait_s``; ``evict``:
        processes still inside move to the root cgroup first, else a cgroup with processes stays.
        True when all are gone."""
        deadline = time.monotonic() + wait_s if deadline is None else deadline
        removed = True
        for c in self.controllers:
            d = ROOT / c / rel
            if not d.is_dir():
                continue
            for child in sorted(p for p in d.iterdir() if p.is_dir()):
                removed = self._remove(str(child.relative_to(ROOT / c)), evict, deadline=deadline) and removed
            while True:
                if evict:
                    for pid in _read(d / "cgroup.procs").split():
                        try:
                            _write(ROOT / c / "cgroup.procs", pid)
                        except OSError:
                            pass
                try:
                    d.rmdir()
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        removed = False
                        break
                    time.sleep(0.02)
        return removed

    def close(self) -> None:
        """Removes the pool's cgroups; a lingering lease (``remove_lease``) and the slot and pool
        cgroups above it stay, with their limits, rather than free its processes."""
        self.reap()
        self.leave_control()  # the daemon out of the control plane first
        for s in self.specs:
            if not any(rel.startswith(self._rel(s) + "/") for rel in self.lingering):
                self._remove(self._rel(s))
        if not self.lingering:
            self._remove(f"dra/{self.pool}")
        if self._lock is not None:
            release_lock(_name_lock_path(self.pool), self._lock)  # no lock file left behind in /run
            self._lock = None


def _shares(cpus: float) -> int:
    """``cpu.shares`` for ``cpus`` cores of weight (1024 a core), within the kernel's bounds."""
    return max(2, min(MAX_SHARES, round(1024 * cpus)))


def _round_up(x: float) -> float:
    """``x`` rounded up to three decimals (a fraction to suggest that is surely enough)."""
    return math.ceil(x * 1000 - 1e-9) / 1000


def _name_lock_path(pool: str) -> Path:
    folder = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    return folder / f"dra-pool-{pool}.lock"


def _name_lock(pool: str) -> int:
    """An exclusive flock on the pool name (a file in /run, else the temporary folder), held for
    the Slots' life: two daemons with one name would share dra/<name> and the one that stops would
    remove the other's cgroups under its running jobs."""
    return exclusive_lock(_name_lock_path(pool),
                          lambda pid: f"name: a pool named {pool!r} is running (daemon pid {pid}) and owns the "
                                      f"cgroups dra/{pool}; give this pool another --name")


def memory_state(path: str | Path) -> dict[str, int] | None:
    """A memory cgroup's limit and what it refused (cgroups v1; readable by anyone): ``limit``,
    ``max_usage`` (bytes), ``failcnt`` (charges refused at the limit) and ``oom_kills``
    (processes the kernel's OOM killer stopped for this cgroup, ``memory.oom_control``). None
    when it cannot be read (gone, or not a memory cgroup)."""
    p = Path(path)
    try:
        oom = dict(line.split(" ", 1) for line in _read(p / "memory.oom_control").splitlines())
        return {"limit": int(_read(p / "memory.limit_in_bytes")), "max_usage": int(_read(p / "memory.max_usage_in_bytes")),
                "failcnt": int(_read(p / "memory.failcnt")), "oom_kills": int(oom.get("oom_kill", 0))}
    except (OSError, ValueError):
        return None


def memory_cgroup(paths: list[str]) -> str | None:
    """The memory controller's directory among a lease's cgroups (``DRA_CGROUPS``)."""
    return next((p for p in paths if os.path.exists(os.path.join(p, "memory.limit_in_bytes"))), None)


def own_memory_cgroup() -> str | None:
    """This process's memory cgroup directory (cgroups v1), None where there is none to read."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return str(ROOT / "memory" / path.lstrip("/"))
    except (OSError, ValueError):
        pass
    return None


def join(paths: list[str], pid: int | None = None) -> None:
    """Moves a process (default: this one) into the given cgroups (one per controller)."""
    pid = os.getpid() if pid is None else pid
    for p in paths:
        _write(Path(p) / "cgroup.procs", str(pid))
