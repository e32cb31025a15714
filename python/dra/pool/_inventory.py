"""Finding the pool's devices: a declared file, NVML GPUs, or CPU slots (cgroups).

``discover(spec)``: ``spec`` is ``"slots:N"`` (N CPU slots on this machine sharing its cores) or
``"slots:NxC"`` (N slots of C cores each), ``"nvml"`` (every GPU
NVML reports; MIG instances as their own devices), ``"auto"`` (NVML where it finds a GPU, else 4
CPU slots), or the path of a JSON file ``{"devices": [{"id", "type", "node", "group",
"memory_gb", "compute", "enforcement"}, ...]}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dra._core import pool as _p
from dra.pool import _cgroup


def from_file(path: str | Path) -> list[Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        raise ValueError(f"inventory file {path}: needs a JSON object with a 'devices' list")
    out = []
    for i, d in enumerate(data["devices"]):
        if not isinstance(d, dict):
            raise ValueError(f"inventory file {path}: devices[{i}] must be an object")
        try:
            out.append(_p.Device(**d))
        except (ValueError, TypeError) as e:
            raise ValueError(f"inventory file {path}: devices[{i}]: {e}") from None
    return out


def from_nvml() -> list[Any]:
    """GPUs (and MIG instances) through NVML; [] when NVML or a GPU is absent."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: no GPUs
        return []
    out = []
    node = os.uname().nodename
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
            kind = name.lower().replace(" ", "-")
            group = 0
            try:  # NUMA node as the locality island (NVLink topology is finer; PCIe root is coarser)
                group = int(pynvml.nvmlDeviceGetNumaNodeId(h))
            except Exception:  # noqa: BLE001
                pass
            migs = []
            try:
                if pynvml.nvmlDeviceGetMigMode(h)[0]:
                    for m in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                        try:
                            mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, m)
                        except Exception:  # noqa: BLE001
                            continue
                        mm = pynvml.nvmlDeviceGetMemoryInfo(mh).total / 2**30
                        migs.append(_p.Device(id=f"gpu{i}/mig{m}", type=f"{kind}-mig-{round(mm)}gb", node=node,
                                              group=group, memory_gb=mm, enforcement="cuda_visible_devices"))
            except Exception:  # noqa: BLE001 - MIG not supported
                pass
            if migs:
                out += migs
            else:
                out.append(_p.Device(id=f"gpu{i}", type=kind, node=node, group=group, memory_gb=mem,
                                     enforcement="cuda_visible_devices"))
    finally:
        pynvml.nvmlShutdown()
    return out


def slot_devices(specs: list[_cgroup.SlotSpec]) -> list[Any]:
    return [_p.Device(id=s.id, type="cpu-slot", node=os.uname().nodename, group=0, memory_gb=s.memory_gb,
                      compute=s.cpus, enforcement="cgroup") for s in specs]


def discover(spec: str, memory_gb: float = 2.0) -> tuple[list[Any], list[_cgroup.SlotSpec]]:
    """(devices, slot specs to create) for an inventory spec (see the module docstring)."""
    if spec.startswith("slots:"):
        n_text, _, cpus_text = spec.split(":", 1)[1].partition("x")
        try:
            n = int(n_text)
            cpus = float(cpus_text) if cpus_text else None
        except ValueError:
            raise ValueError(f"inventory: 'slots:N' or 'slots:NxC' needs an integer N (and C cores a slot), "
                             f"got '{spec}'") from None
        specs = _cgroup.plan_slots(n, memory_gb=memory_gb, cpus=cpus)
        return slot_devices(specs), specs
    if spec in ("nvml", "auto"):
        gpus = from_nvml()
        if gpus or spec == "nvml":
            if not gpus:
                raise ValueError("inventory: 'nvml' found no GPU (NVML or its Python binding pynvml is missing)")
            return gpus, []
        specs = _cgroup.plan_slots(4, memory_gb=memory_gb)
        return slot_devices(specs), specs
    if Path(spec).is_file():
        return from_file(spec), []
    raise ValueError(f"inventory: '{spec}' is neither 'slots:N', 'slots:NxC', 'nvml', 'auto', 'ray[:ADDRESS]' nor an "
                     "existing JSON file")
