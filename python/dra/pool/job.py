"""Inside a worker started by ``dra run`` or a pool: what the lease says, and the job's report.

``lease()`` reads the lease's environment. ``Reporter`` writes the job's ``report`` key (the
contract between a running elastic job and the pool, docs/guide/pool.md) from the leader at most once a
second: the world size, samples/s, and the samples/s measured at every size the job ran (the
pool fits its speedup curve to them). Once the elastic controller writes the report itself
(announced by the lead), a job needs no Reporter.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def lease() -> dict[str, Any]:
    """This worker's lease: id, device, share, enforcement ('cgroup', 'cuda_visible_devices', 'mps'
    or 'soft'); empty outside a pool."""
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


class Reporter:
    """Writes ``dra/<job>/0/report`` from the leader (rank 0) at most every ``every_s``."""

    def __init__(self, controller: Any, every_s: float = 1.0, **extra: Any) -> None:
        self.ctl = controller
        self.every_s = every_s
        self.extra = extra
        self.job = os.environ.get("DRA_JOB_ID", "job")
        self.rates: dict[int, list[float]] = {}
        self._store: Any = None
        self._t0 = time.perf_counter()
        self._samples = 0
        self._world = 0
        self._last = 0.0

    def _connect(self) -> Any:
        if self._store is None:
            addr = os.environ.get("DRA_STORE")
            if not addr:
                return None
            import torch.distributed as dist
            from datetime import timedelta

            host, port = addr.rsplit(":", 1)
            self._store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=10))
        return self._store

    def step(self, samples: int, **fields: Any) -> None:
        """Call after each committed step with the step's global samples."""
        now = time.perf_counter()
        world = int(self.ctl.world_size)
        if world != self._world:  # a new size: its rate is measured afresh
            self._world, self._t0, self._samples = world, now, 0
        self._samples += samples
        if self.ctl.rank != 0 or now - self._last < self.every_s:
            return
        self._last = now
        elapsed = now - self._t0
        if elapsed >= 0.5 and self._samples > 0:
            self.rates.setdefault(world, []).append(self._samples / elapsed)
        rates = {str(k): sorted(v)[len(v) // 2] for k, v in self.rates.items()}
        report = {"time": time.time(), "step": int(self.ctl.step_index), "world": world,
                  "members": list(self.ctl.members), "samples_per_s": rates.get(str(world), 0.0), "rates": rates,
                  **self.extra, **fields}
        try:
            store = self._connect()
            if store is not None:
                store.set(f"dra/{self.job}/0/report", json.dumps(report))  # the contract's spelling
        except Exception:  # noqa: BLE001 - a report is best effort
            pass

    def set(self, **fields: Any) -> None:
        self.extra.update(fields)


def write_report(report: dict[str, Any]) -> None:
    """Writes a report for a job that is not an elastic training job (an inference service)."""
    addr = os.environ.get("DRA_STORE")
    if not addr:
        return
    import torch.distributed as dist
    from datetime import timedelta

    host, port = addr.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=10))
    store.set(f"dra/{os.environ.get('DRA_JOB_ID', 'job')}/0/report", json.dumps({"time": time.time(), **report}))
