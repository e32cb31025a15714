"""Test and benchmark helpers (not imported by ``import dra``).

- ``set_phase_hook(fn)``: ``fn(controller, phase)`` is called at "rebuild", "state_transfer" and
  "reshard" of every world change of controllers made afterwards, so tests can kill a process
  inside a resize for real.
- the elastic world's membership functions and a no-op binding call (dra.step's cost baseline),
  from ``dra._core._testing``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra._core._testing import (
    epoch_order,
    handoff_sources,
    leader_of,
    next_members,
    noop,
    pick_joiners,
    pick_leavers,
    rank_mapping,
    rank_of,
    rank_share,
    step_batch,
    survivors,
)

_phase_hook: Callable[[Any, str], None] | None = None


def set_phase_hook(hook: Callable[[Any, str], None] | None) -> None:
    """Installs (or with None removes) the world-change phase hook for controllers made afterwards."""
    global _phase_hook
    _phase_hook = hook


__all__ = [
    "epoch_order",
    "handoff_sources",
    "leader_of",
    "next_members",
    "noop",
    "pick_joiners",
    "pick_leavers",
    "rank_mapping",
    "rank_of",
    "rank_share",
    "set_phase_hook",
    "step_batch",
    "survivors",
]
