"""Inside a worker started by ``dra run`` or a pool: what its lease says.

A training job needs nothing from this module to take part in a pool: its elastic controller
publishes the job's ``report`` (samples/s at every size it ran, the throughput fit, the size its
own policy wants) and follows the ``capacity`` the launcher writes (docs/guide/elastic.md).
"""

from __future__ import annotations

import os
from typing import Any


def lease() -> dict[str, Any]:
    """This worker's lease: id, device, share, enforcement ('cgroup', 'cuda_visible_devices', 'mps'
    or 'soft'); empty outside a pool. On a GPU fraction it also asks torch to keep to that share
    of the device's memory (soft)."""
    if "DRA_LEASE_ID" not in os.environ:
        return {}
    info = {"id": int(os.environ["DRA_LEASE_ID"]), "device": os.environ.get("DRA_DEVICE", ""),
            "share": float(os.environ.get("DRA_DEVICE_SHARE", "1")),
            "enforcement": os.environ.get("DRA_ENFORCEMENT", "soft")}
    fraction = os.environ.get("DRA_CUDA_MEMORY_FRACTION")
    if fraction:  # soft: the process is asked to keep to its share of the GPU's memory
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_per_process_memory_fraction(float(fraction))
                info["memory_fraction"] = float(fraction)
        except Exception:  # noqa: BLE001 - no CUDA torch: nothing to limit
            pass
    return info
