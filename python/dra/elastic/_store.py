"""``python -m dra.elastic store``: a dedicated c10d TCPStore for elastic jobs.

A job's processes coordinate through a c10d store: the one torchrun provides
(MASTER_ADDR/MASTER_PORT, hosted by the agent), one hosted by rank 0 when processes are started
by hand, or this dedicated one, which outlives any training process. The protocol over it is the
C++ controller's (src/elastic/controller.cpp).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist


def serve(port: int, host: str = "0.0.0.0") -> None:
    """Hosts a c10d TCPStore until killed (``python -m dra.elastic store --port P``)."""
    store = dist.TCPStore(host, int(port), None, True, timedelta(seconds=60), wait_for_workers=False)
    print(f"[dra] store listening on {host}:{store.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
