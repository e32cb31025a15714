"""A live shared device pool (docs/design/pool.md): request, schedule, allocate, scale, release.

- ``PoolService`` / ``make_service``: the pool (jobs, leases in SQLite, scheduling loop, events,
  metrics); ``PoolServer`` serves it over HTTP; ``PoolClient`` talks to it.
- ``Launcher`` (``dra run``): one worker per lease, each supervised on its own.
- ``job``: what a worker reads from its lease, and the report a job gives the pool.
- ``gantt``: devices over time, coloured by job (PNG).

CLI: ``dra pool serve | submit | status | cancel | drain`` and ``dra run``; see docs/guide/pool.md.
"""

from __future__ import annotations

from dra.pool.factory import make_service
from dra.pool.launcher import Launcher
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService, speedup_curve

__all__ = ["Launcher", "PoolClient", "PoolServer", "PoolService", "make_service", "speedup_curve"]
