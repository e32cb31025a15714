"""Device slots with hard CPU quotas (cgroups v1) for the live RL loop: the device pool's slot
manager (``dra.pool._cgroup``: a cgroup per controller at ``/sys/fs/cgroup/<controller>/dra/<pool>/<slot>``
with a hard CPU quota, so an idle slot's compute is never lent to a busy one, pinned cores and
measured CPU time), planned as ``n`` slots of a given quota each and no memory limit.
"""

from __future__ import annotations

import os

from dra.pool._cgroup import Slots, SlotSpec, available, join

__all__ = ["Slots", "SlotSpec", "available", "join", "plan_slots"]


def plan_slots(n: int, cpus: float, cores: list[int] | None = None) -> list[SlotSpec]:
    """n slots of ``cpus`` cores of quota each; slot i runs on core i mod (number of cores)."""
    if n < 1:
        raise ValueError(f"slots: must be >= 1, got {n}")
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if not 0.01 <= cpus <= len(cores):
        raise ValueError(f"cpus: a slot's quota must lie in [0.01, {len(cores)}] cores, got {cpus}")
    return [SlotSpec(f"slot{i}", cpus, str(cores[i % len(cores)])) for i in range(n)]
