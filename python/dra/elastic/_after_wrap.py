"""What a script (or a framework: accelerate, transformers.Trainer, Lightning) does with torch
after dra's wrap that cannot follow the elastic world, refused while a dra wrapper trains, naming
the fix (both found by an outside review):

- torch's own DistributedDataParallel around a model dra already reduces (accelerate's
  ``prepare(model)``, Trainer, Lightning's DDP strategy). Its reducer keeps the process group it
  was made on: after a grow the joiner's parameters parted from the world's at every step,
  silently, and a kill -9 killed every survivor in torch's backward.
- ``torch.distributed.init_process_group`` first called after the wrap (``TrainingArguments`` or
  Lightning's ``fit`` made it lazily) in a world other than the launch's: its rendezvous waited for
  the processes standing by inside dra, a hang without a message."""

from __future__ import annotations

import os
import weakref
from typing import Any

#: The dra wrappers of this process (``ElasticDataParallel``), weakly.
_WRAPPERS: weakref.WeakSet[Any] = weakref.WeakSet()


def watch(wrapper: Any) -> None:
    """Refuse torch's DDP over ``wrapper`` or its module from now on (patches torch's DDP once)."""
    _WRAPPERS.add(wrapper)
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    if getattr(TorchDDP, "_dra_refuses_over_elastic", False):
        return
    torch_init = TorchDDP.__init__

    def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        _refuse_over_elastic(module)
        torch_init(self, module, *args, **kwargs)

    TorchDDP.__init__ = __init__
    TorchDDP._dra_refuses_over_elastic = True
    _guard_init_process_group()


def torch_init_process_group(dist: Any) -> Any:
    """torch's own ``init_process_group`` (dra's re-creations of the default group call it)."""
    return getattr(dist.init_process_group, "_dra_torch", dist.init_process_group)


def _guard_init_process_group() -> None:
    import torch.distributed as dist

    if not dist.is_available() or hasattr(dist.init_process_group, "_dra_torch"):
        return
    torch_init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        _refuse_late_init()
        return torch_init(*args, **kwargs)

    init_process_group.__doc__, init_process_group._dra_torch = torch_init.__doc__, torch_init  # type: ignore[attr-defined]
    dist.init_process_group = dist.distributed_c10d.init_process_group = init_process_group


def _live_wrappers() -> list[Any]:
    """The dra wrappers whose controllers still train (not finished, not released)."""
    return [w for w in list(_WRAPPERS) if getattr(w, "controller", None) is not None
            and getattr(w.controller, "role", "") not in ("finished", "released")]


def _refuse_late_init() -> None:
    if "WORLD_SIZE" not in os.environ:
        return  # not launched as a world (torch's own arguments say which)
    launched, rank = int(os.environ["WORLD_SIZE"] or 0), int(os.environ.get("RANK", "-1") or -1)
    for ctl in (w.controller for w in _live_wrappers()):
        if ctl.is_member and int(ctl.world_size) == launched and int(ctl.rank) == rank:
            continue  # the launch's world as launched: torch's rendezvous meets every member
        raise RuntimeError(
            f"dra: torch.distributed.init_process_group is called after dra's wrap, in a world of {ctl.world_size} "
            f"(this process rank {ctl.rank}) where {launched} processes were launched as rank {rank}: its rendezvous "
            "would wait for every process launched, and those standing by wait inside dra (a hang). Call it before "
            "dra's wrap: init_process_group('gloo') first in the script, or make the object that calls it "
            "(transformers.TrainingArguments, accelerate.Accelerator) before; dra makes torch's default group "
            "follow the elastic world from then on (docs/guide/compatibility.md, \"Frameworks\")")


def _refuse_over_elastic(module: Any) -> None:
    for wrapper in _live_wrappers():
        reduced = {id(p) for p in wrapper.module.parameters()}
        inside = any(m is wrapper for m in module.modules())
        if inside or any(id(p) in reduced for p in module.parameters()):
            what = "dra's wrapper" if inside else "the model dra's wrapper reduces"
            raise RuntimeError(
                f"dra: torch.nn.parallel.DistributedDataParallel is being made around {what} "
                f"({type(module).__name__}): dra reduces its gradients over the elastic world, and torch's reducer "
                "would reduce them again on the process group of the world it was made in, which a resize does not "
                "change (a joiner's parameters part from the world's; a lost process kills the others). Leave the "
                "model to dra: accelerate, prepare only the optimizer (accelerator.prepare(opt); the scheduler goes to "
                "dra as scheduler=), not the model or the training DataLoader; Lightning Fabric, set up only the "
                "optimizer (fabric.setup_optimizers(opt)) and accumulate with dra's model.no_sync(); "
                "transformers.Trainer and Lightning's DDP strategy wrap the model themselves and cannot train "
                "elastically (docs/guide/compatibility.md, \"Frameworks\")")
