"""In-process fault specs, understood by the Python worker and the C++ example alike.

A spec is ``ACTION:WHERE:INDEX[:SECONDS]``; several are joined by commas (``DRA_FAULT_SPEC`` for
the Python worker, ``--test-fault`` for examples/cpp/elastic_train.cpp):

- ACTION: ``kill`` (SIGKILL of the process itself), ``sleep`` (stall for SECONDS: a slow peer),
  ``raise`` (an exception nobody catches: the process ends with it) or ``catch`` (an exception the
  training loop catches, skipping the rest of that step: at ``step`` the batch it was handed, at
  ``after_reduce`` the optimizer step and the step boundary, at ``after_update`` the step boundary);
- WHERE: ``rebuild``, ``state_transfer`` or ``reshard`` (a phase of a world change: INDEX counts
  this process's world changes from 0, its first one being the start or its admission), ``step``
  (the start of step INDEX, before the forward), ``after_reduce`` (step INDEX, after the gradient
  reduction and before the optimizer step) or ``after_update`` (step INDEX, after the optimizer step
  and before the step boundary).

The process writes a ``fault`` record before it acts.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIONS = ("kill", "sleep", "raise", "catch")
WHERE = ("rebuild", "state_transfer", "reshard", "step", "after_reduce", "after_update")


@dataclass
class FaultSpec:
    action: str
    where: str
    index: int
    seconds: float = 0.0
    fired: bool = False

    def __str__(self) -> str:
        return f"{self.action}:{self.where}:{self.index}" + (f":{self.seconds:g}" if self.action == "sleep" else "")


def parse_specs(text: str) -> list[FaultSpec]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4) or parts[0] not in ACTIONS or parts[1] not in WHERE:
            raise ValueError(
                f"fault spec: expected ACTION:WHERE:INDEX[:SECONDS] with ACTION in {ACTIONS} and WHERE in "
                f"{WHERE}, got '{item}'"
            )
        seconds = float(parts[3]) if len(parts) == 4 else 0.0
        if parts[0] == "sleep" and not seconds > 0:
            raise ValueError(f"fault spec: 'sleep' needs SECONDS > 0 (ACTION:WHERE:INDEX:SECONDS), got '{item}'")
        out.append(FaultSpec(parts[0], parts[1], int(parts[2]), seconds))
    return out


def rss_mb() -> float:
    """This process's resident memory now (Linux), in MiB."""
    import os

    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1048576.0
