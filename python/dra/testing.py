"""Test and benchmark helpers (not imported by ``import dra``).

- ``set_phase_hook(fn)``: ``fn(controller, phase)`` is called at "rebuild", "state_transfer" and
  "reshard" of every world change of controllers made afterwards, so tests can kill a process
  inside a resize for real, and at "reduced", once a step's gradient reduction has finished on
  this process. An exception ``fn`` raises fails that phase on this process alone (at "reduced":
  a reduction that finished on the other members and failed here, as a time-out on its last
  receive does).
- the elastic world's membership functions and a no-op binding call (dra.step's cost baseline),
  from ``dra._core._testing``.
- ``tagged_processes(name, value)``: the live processes whose environment holds ``name=value``;
  ``kill_tagged(name, value)`` sends them SIGKILL.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
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
    "tagged_processes",
    "kill_tagged",
]


def tagged_processes(name: str, value: str) -> list[int]:
    """Live processes (zombies left out) whose environment holds ``name=value``: what a test or a
    benchmark started, found again whoever launched them (torchrun and `dra run` start their
    workers in sessions of their own; forked children inherit the tag)."""
    needle, found = f"{name}={value}".encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and (
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return found


def kill_tagged(name: str, value: str) -> list[int]:
    """SIGKILL to every live process ``tagged_processes`` finds (what a test left running);
    returns their pids."""
    pids = tagged_processes(name, value)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
