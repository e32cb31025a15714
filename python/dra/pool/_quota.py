"""Per-user bounds on what a pool keeps for its users' jobs.

Any local user may submit, and everything a submission holds is kept in the state folder: without
bounds one user could fill it (300 submissions with 1.5 MB of ``env`` each grew ``pool.sqlite`` by
450 MB in 4 s) and every user's running jobs would then lose their records. Three bounds, each
refused at submission with the limit, the count and the fix, nothing recorded
(docs/guide/pool-security.md, "Flooding"):

- ``spec_bytes``: one job's stored spec (its command, env, options, ...) as JSON;
- ``active``: one user's jobs not ended (waiting or running);
- ``kept``: one user's jobs on record, ended ones included: past it the user's oldest ended jobs
  are forgotten (dra.pool._records), and only ``kept`` jobs not ended are refused;
- ``ended``: everyone's ended jobs on record (operators' too), the oldest forgotten past it.

An operator (root, or the pool's own user) is not bounded: their submissions are trusted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class UserLimits:
    spec_bytes: int = 64 << 10
    active: int = 100
    kept: int = 1000
    ended: int = 10_000  # ended jobs kept in all, everyone's (operators' too): the oldest are forgotten
    # The highest priority class a user who is not an operator may submit: a class above preempts
    # everyone's jobs (any user's `critical` sleep took another user's slot within 30 s).
    priority: str = "normal"

    def __post_init__(self) -> None:
        for name in ("spec_bytes", "active", "kept", "ended"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"user_limits.{name}: must be an integer >= 1, got {value!r}")
        if self.priority not in PRIORITIES:
            raise ValueError(f"user_limits.priority: must be one of {', '.join(PRIORITIES)}, got {self.priority!r}")


PRIORITIES = ("low", "normal", "high", "critical")


def priority_problem(priority: str, limits: UserLimits) -> str | None:
    """Why a user who is not an operator may not submit at ``priority`` (None when they may)."""
    if PRIORITIES.index(priority) <= PRIORITIES.index(limits.priority):
        return None
    return (f"priority: only an operator may submit '{priority}' jobs here (users: up to '{limits.priority}', "
            "set by the operator with --user-priority); submit at that class or lower, or ask the operator")


def spec_problem(stored: dict[str, Any], limits: UserLimits) -> str | None:
    """Why a job's spec is too large to keep (None when it is not)."""
    n = len(json.dumps(stored).encode())
    if n <= limits.spec_bytes:
        return None
    return (f"spec: {n} bytes as JSON; this pool keeps at most {limits.spec_bytes} per job; pass large data in a file "
            "(or through the job's cwd) instead of its env or command")


def count_problem(owned: Iterable[dict[str, Any]], ended: Iterable[str], replacing: bool, user: str,
                  limits: UserLimits) -> str | None:
    """Why one more job of `user` (whose jobs on record are `owned`) is refused (None when it is
    not); `replacing`: the new job takes the name of one of them that ended."""
    states = [j["state"] for j in owned]
    active = sum(1 for s in states if s not in ended)
    if active >= limits.active:
        return (f"name: {user} has {active} jobs waiting or running, the most this pool takes from one user "
                f"({limits.active}); submit again once some have ended, or ask its operator (dra pool serve "
                "--max-active-per-user)")
    if not replacing and active >= limits.kept:  # ended ones are forgotten to make room (to_forget)
        return (f"name: {user} has {active} jobs waiting or running, as many as this pool keeps for one user "
                f"({limits.kept}); submit again once some have ended, or ask its operator (dra pool serve "
                "--max-kept-per-user)")
    return None


def to_forget(jobs: list[dict[str, Any]], ended: Iterable[str], bound: int, skip: set[str] = frozenset(),
              adding: bool = True) -> list[str]:
    """The oldest ended of ``jobs`` (by submission order) to forget so that at most ``bound`` stay:
    of them all with one job more (``adding``), or of the ended ones alone. ``skip``: already going."""
    ended = tuple(ended)
    stay = [j for j in jobs if j["name"] not in skip]
    done = sorted((j for j in stay if j["state"] in ended), key=lambda j: j["order"])
    over = (len(stay) + 1 if adding else len(done)) - bound
    return [j["name"] for j in done[:max(0, over)]]
