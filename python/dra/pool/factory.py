"""``make_service``: a pool built from an inventory spec (local CPU slots with cgroups, declared
devices, or a Ray cluster's), its state directory locked and read before anything is made."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dra.pool import _cgroup, _inventory, _state
from dra.pool._state import StateDB, StateLock
from dra.pool.service import MODES, PoolService

__all__ = ["make_service"]


def make_service(inventory: str, state_dir: str | Path, *, mode: str = "dynamic", name: str = "pool",
                 memory_gb: float = 2.0, guarantee_slots: bool = True, control_cpus: float | None = 0.5,
                 launcher_memory_gb: float | None = _cgroup.LAUNCHER_MEMORY_GB, **options: Any) -> PoolService:
    """A pool from an inventory spec (see dra.pool._inventory.discover; ``ray`` or ``ray:ADDRESS``:
    a Ray cluster's devices, watched for nodes that leave or join); CPU slots get cgroups (with
    ``guarantee_slots``, a share that gives them their quota before processes outside the pool), and
    the daemon (this process, until the pool closes) and the jobs' launchers a cgroup beside them
    weighing ``control_cpus`` cores (None: none; see dra.pool._cgroup), in which each job's launcher
    has a cgroup of at most ``launcher_memory_gb`` (None: no limit). The
    state directory is locked and its database read before any cgroup is made, so a second daemon
    or a corrupt state fails without leaving anything behind."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got '{mode}'")
    _state.state_dir(state_dir)
    lock = StateLock(state_dir)  # fails now, before any cgroup exists, if another daemon holds it
    slots = None
    try:
        StateDB(Path(state_dir) / "pool.sqlite").close()
        if inventory == "ray" or inventory.startswith("ray:"):
            from dra.pool.ray_cluster import RayCluster

            address = inventory.split(":", 1)[1] if ":" in inventory else "auto"
            cluster = RayCluster(address)
            service = PoolService(cluster.devices(), state_dir, mode=mode, name=name, ray_address=address,
                                  state_lock=lock, **options)
            service.ray_watch = cluster.watch(service.remove_node, service.add_node, on_head=service.ray_head)
            service.node_check = cluster.node_gone
            return service
        devices, specs = _inventory.discover(inventory, memory_gb=memory_gb)
        if specs and memory_gb is not None and not (math.isfinite(memory_gb) and memory_gb * 1024 >= _cgroup.MIN_LEASE_MEMORY_MB):
            raise ValueError(f"slot memory: {memory_gb:g} GB a slot (--slot-memory-gb) is less than a worker needs to "
                             f"start ({_cgroup.MIN_LEASE_MEMORY_MB} MiB: a Python process with torch peaks at about "
                             f"160 MiB); give at least {_cgroup.MIN_LEASE_MEMORY_MB / 1024:g}")
        slots = _cgroup.Slots(name, specs, guarantee=guarantee_slots, control_cpus=control_cpus,
                              launcher_memory_gb=launcher_memory_gb) if specs else None
        if slots is not None:
            slots.enter_control()  # this process is the daemon: its API and loop weigh as the launchers do
        return PoolService(devices, state_dir, mode=mode, slots=slots, name=name, state_lock=lock, **options)
    except Exception:
        if slots is not None:
            slots.close()
        lock.release()
        raise
