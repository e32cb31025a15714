"""Which controller this process's samplers follow, and the end of a `range` epoch loop whose
process has nothing left to train (``dra.elastic.sampler``'s, kept apart)."""

from __future__ import annotations

import sys
import weakref
from typing import Any

#: The elastic controller of this process (the latest one that followed a sampler): the world an
#: eval loader's sampler splits its data over.
FOLLOWED: list[Any] = [None]


def follow(controller: Any) -> None:
    FOLLOWED[0] = weakref.ref(controller)


def followed() -> Any:
    ref = FOLLOWED[0]
    return ref() if ref is not None else None


def end_if_finished(sampler: Any, epoch: int | None) -> None:
    """This process's part in the job ended while a `range` epoch loop drives it: the job was
    stopped (SIGTERM under `dra run`), or it finished while this process stood by. Nothing is left
    to train, and the loop's per-epoch code (an epoch-numbered snapshot, say) must not run for an
    epoch cut short or never trained: the process ends here (exit 0; atexit handlers run), as
    soon as the loader asks for more. ``ctl.epochs()`` ends its loop instead, and the code after
    it runs (the final checkpoint)."""
    ctl = sampler._controller
    if ctl is None or ctl.role != "finished" or getattr(ctl, "_epochs_driven", False):
        return
    if not ctl.stopped and (ctl.rank >= 0 or (epoch is not None and epoch <= sampler._native.epoch)):
        return  # a normal end as a member (later passes yield nothing), or a loop still behind
    # step_index is this process's last step in a world: where it stood by, not where the job ended.
    why = (f"the job was stopped at step {ctl.step_index}" if ctl.stopped else
           f"the job finished while this process stood by (since its step {ctl.step_index})")
    print(f"[dra] {why}: process {ctl.uid} ends here (a range epoch loop; "
          "with ctl.epochs() the loop ends and the code after it runs)", file=sys.stderr, flush=True)
    raise SystemExit(0)
