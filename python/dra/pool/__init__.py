"""A live shared device pool (docs/design/pool.md): request, schedule, allocate, scale, release.

- ``PoolService`` / ``make_service``: the pool (jobs, leases in SQLite, scheduling loop, events,
  metrics); ``PoolServer`` serves it over HTTP; ``PoolClient`` talks to it.
- ``Launcher`` (``dra run``): one worker per lease, each supervised on its own.
- ``job``: what a worker reads from its lease, and the report a job gives the pool.
- ``gantt``: devices over time, coloured by job (PNG).

CLI: ``dra pool serve | submit | status | cancel | drain`` and ``dra run``; see docs/guide/pool.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra.pool.client import PoolClient
    from dra.pool.factory import make_service
    from dra.pool.launcher import Launcher
    from dra.pool.server import PoolServer
    from dra.pool.service import PoolService, speedup_curve

__all__ = ["Launcher", "PoolClient", "PoolServer", "PoolService", "make_service", "speedup_curve"]

# Imported when first used: a job's launcher imports dra.pool.client alone, and must not pay for
# torch (which the scheduler's binding loads) before its workers' fork server is on its way.
_WHERE = {"Launcher": "dra.pool.launcher", "PoolClient": "dra.pool.client", "PoolServer": "dra.pool.server",
          "PoolService": "dra.pool.service", "make_service": "dra.pool.factory", "speedup_curve": "dra.pool.service"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dra.pool' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
