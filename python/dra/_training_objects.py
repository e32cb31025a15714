"""What an elastic job trains with, checked before anything joins a world: the model, its
optimizer and scheduler, and the ``extra_state`` objects that travel with them. A bad one is
refused naming the argument and the fix."""

from __future__ import annotations

from typing import Any


def check_training_objects(model: Any, optimizer: Any, scheduler: Any) -> None:
    """What an elastic job trains with, checked before anything joins a world: a module, an
    optimizer of its parameters, and (optional) a scheduler of that optimizer."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}; "
                         "dra.elastic.init(model, optimizer, sampler) takes the module first")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__} {optimizer!r:.60}; "
            "dra.elastic.init(model, optimizer, sampler) and dra.elastic.DistributedDataParallel(module, optimizer, "
            "sampler, device_ids=...) take the optimizer second (where torch's DDP takes device_ids)")
    owned = {id(p) for p in model.parameters()}
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    if stepped and not any(id(p) in owned for p in stepped):
        raise ValueError("optimizer: none of its parameters belongs to the model; build it from model.parameters() "
                         "of the module given to dra.elastic.init (before wrapping)")
    if scheduler is None:
        return
    missing = [n for n in ("step", "state_dict", "load_state_dict") if not callable(getattr(scheduler, n, None))]
    if missing or isinstance(scheduler, (torch.optim.Optimizer, torch.nn.Module)):
        raise ValueError(f"scheduler: expected an LR scheduler (torch.optim.lr_scheduler.*), got "
                         f"{type(scheduler).__name__}" + (f" without {', '.join(missing)}" if missing else "") +
                         "; pass scheduler=None when there is none")
    owner = getattr(scheduler, "optimizer", None)
    if owner is not None and owner is not optimizer:
        raise ValueError("scheduler: it schedules another optimizer than the one given; build it from the same "
                         "optimizer object")


def check_extra_state(extra_state: Any, model: Any, optimizer: Any, scheduler: Any) -> None:
    """``extra_state``: named objects whose state travels with the training state (a GradScaler, an
    EMA's AveragedModel), each with ``state_dict()`` and ``load_state_dict()``."""
    if extra_state is None:
        return
    if not isinstance(extra_state, dict):
        raise ValueError(f"extra_state: expected a dict of name -> object with state_dict() and load_state_dict(), "
                         f"got {type(extra_state).__name__}")
    for name, obj in extra_state.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"extra_state: names must be non-empty strings, got {name!r}")
        missing = [n for n in ("state_dict", "load_state_dict") if not callable(getattr(obj, n, None))]
        if missing:
            raise ValueError(f"extra_state['{name}']: {type(obj).__name__} has no {' or '.join(missing)}; give an "
                             "object whose state_dict() and load_state_dict() hold its state")
        if obj is model or obj is optimizer or (scheduler is not None and obj is scheduler):
            raise ValueError(f"extra_state['{name}']: the model, optimizer and scheduler travel already; leave it out")
