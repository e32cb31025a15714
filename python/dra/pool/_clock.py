"""The pool's clock: wall time that does not step.

The daemon and its launchers time durations (heartbeat expiry, the silence limit, cooldowns,
re-plans, a launcher's shrink grace and outage limit) and also show times (events, ``dra pool
status``, the SQLite state). Read from ``time.time()``, every one of those durations moved when the
wall clock stepped (NTP correcting a drifted clock, a VM resumed, ``date -s``): an hour forward
made every lease look silent for an hour (the daemon killed healthy jobs' launchers as hung), an
hour back stopped its checks and re-plans for an hour. ``now()`` reads the wall clock once, when
this process first imports this module, and runs on by the monotonic clock from there: it looks
like wall time (epoch seconds, fit to show and store), is slewed with it by NTP, and never steps
inside one process. After a step it is off from the wall clock by the step until the process
restarts; a restarted daemon starts from the wall clock again and gives every lease a fresh
heartbeat timeout (service.py ``_restore``), so no expiry spans two processes.
"""

from __future__ import annotations

import time

_WALL_AT_START = time.time()
_MONOTONIC_AT_START = time.monotonic()


def now() -> float:
    """Seconds since the epoch as this process's wall clock read at its start, plus the monotonic
    time since: for every time the pool compares, stores or shows."""
    return _WALL_AT_START + (time.monotonic() - _MONOTONIC_AT_START)
