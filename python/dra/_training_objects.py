"""What an elastic job trains with, checked before anything joins a world: the model, its
optimizer and scheduler, and the ``extra_state`` objects that travel with them. A bad one is
refused naming the argument and the fix. Then, while it trains, the watchers of what the script
does with them: another optimizer stepping the model, a scheduler built later, a buffer assigned
anew, the optimizer's steps counted."""

from __future__ import annotations

import weakref
from typing import Any


def check_training_objects(model: Any, optimizer: Any, scheduler: Any) -> None:
    """What an elastic job trains with, checked before anything joins a world: a module, an
    optimizer of its parameters, and (optional) a scheduler of that optimizer."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}; "
                         "dra.elastic.init(model, optimizer, sampler) takes the module first")
    wrapped = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    for name, sub in model.named_modules():
        if isinstance(sub, wrapped):
            # torch's reducer would all-reduce on the process group of the launch: after the first
            # change of the world it waited there for the script's timeout (30 min by default).
            where = "model" if not name else f"model.{name}"
            raise ValueError(
                f"{where}: is a torch.nn.parallel.{type(sub).__name__}, whose gradient reduction runs on the world "
                "it was made for and hangs once the elastic world changes; give dra the module it wraps "
                f"({where}.module): dra reduces the gradients itself")
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
    check_model_parameters(model)
    if scheduler is None and has_unshared_scheduler(optimizer):
        raise ValueError(unshared_scheduler_message(optimizer))
    others = schedulers_besides(optimizer, scheduler)
    if others:
        raise ValueError(unshared_scheduler_message(optimizer, type(others[0]).__name__, given=scheduler is not None))
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


def check_model_parameters(model: Any) -> None:
    """What dra cannot reduce or hand over, named before anything joins a world: a parameter of a
    lazy module not initialised yet (its shape is unknown, so no signature can be compared and no
    state sent), and an embedding with sparse gradients (the reduction is dense)."""
    import torch
    from torch.nn.parameter import UninitializedTensorMixin

    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if isinstance(t, UninitializedTensorMixin):
            raise ValueError(
                f"model: '{name}' is not initialised yet (a lazy module such as nn.LazyLinear takes its shape at its "
                "first forward); run one forward pass before dra.elastic.init / DistributedDataParallel, as torch's "
                "DDP requires (e.g. `with torch.no_grad(): model(example_batch)`), on every process")
    for name, m in model.named_modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            raise ValueError(
                f"model: '{name or type(m).__name__}' ({type(m).__name__}) has sparse=True: its gradient is sparse, and "
                "dra reduces dense gradients only; build it with sparse=False (with an optimizer for dense gradients: "
                "Adam instead of SparseAdam)")


def has_unshared_scheduler(optimizer: Any) -> bool:
    """Whether a torch LR scheduler was built on ``optimizer`` in this process (torch's schedulers
    wrap the optimizer's ``step`` and mark the wrapper)."""
    return bool(getattr(getattr(optimizer, "step", None), "_wrapped_by_lr_sched", False))


def schedulers_besides(optimizer: Any, given: Any) -> list[Any]:
    """The torch LR schedulers alive in this process that hold ``optimizer``, other than ``given``
    and the schedulers it chains (SequentialLR, ChainedScheduler). Finds those that leave no mark
    on the optimizer (ReduceLROnPlateau steps on a metric and does not wrap ``optimizer.step``).
    Looks through the referrers of the optimizer once (at init: a scan of the live objects)."""
    import gc

    import torch

    kinds = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    mine = {id(given)} | {id(s) for s in (getattr(given, "_schedulers", None) or [])}
    found: dict[int, Any] = {}
    for holder in gc.get_referrers(optimizer):
        # The scheduler itself (its attributes kept inline, Python 3.11+) or its __dict__.
        owners = [holder] if isinstance(holder, kinds) else gc.get_referrers(holder) if isinstance(holder, dict) else []
        for owner in owners:
            if isinstance(owner, kinds) and getattr(owner, "optimizer", None) is optimizer and id(owner) not in mine:
                found[id(owner)] = owner
    return list(found.values())


def unshared_scheduler_message(optimizer: Any, kind: str = "", given: bool = False) -> str:
    fix = ("dra takes one scheduler: combine them into one (torch.optim.lr_scheduler.SequentialLR for one after "
           "the other, as torch's SWA recipe switches to SWALR; ChainedScheduler for both at once) and pass that "
           "as scheduler=" if given else
           "Build it before dra.elastic.init / DistributedDataParallel and pass it as scheduler= "
           "(DistributedDataParallel(model, optimizer, sampler, scheduler=scheduler))")
    return (f"scheduler: an LR scheduler{f' ({kind})' if kind else ''} steps the optimizer ({type(optimizer).__name__}) "
            f"but was not given to dra{' (another one was)' if given else ''}: its "
            "position would not travel to a process that joins, whose learning rate would then differ from the "
            f"world's (the ranks' parameters diverge after a grow). {fix}; step it with ctl.scheduler.step() "
            "(docs/guide/compatibility.md, \"Limits of the drop-in\")")


# ---- watchers: what the script does with its training objects once training runs --------------------


def count_optimizer_step(ref: weakref.ref[Any], *_: Any) -> None:
    ctl = ref()
    if ctl is not None:
        ctl._optimizer_steps += 1
        ctl._in_optimizer_step = False
        restore_dropped_grads(ctl)  # the step of a failed reduction is over (it changed nothing)


def optimizer_step_begins(ref: weakref.ref[Any], *_: Any) -> None:
    """Inside the optimizer's step: a backward there is its closure's (LBFGS re-evaluates it)."""
    ctl = ref()
    if ctl is not None:
        ctl._in_optimizer_step = True


_watched: list[weakref.ref[Any]] = []


def watch_other_optimizers(controller: Any, model: Any, optimizer: Any) -> None:
    """Only the optimizer given to the controller travels with the state (to joiners, and from the
    new rank 0 after a fault). Another optimizer stepping the model's parameters (a GAN's second
    Adam) keeps a state of its own on each process: a joiner's starts empty, and the ranks' updates
    diverge silently after the first grow. Refused at its first step, before it updates anything."""
    import torch

    controller._model_params = {id(p): name for name, p in model.named_parameters()}
    controller._given_optimizer = weakref.ref(optimizer)
    controller._given_groups = [len(g["params"]) for g in optimizer.param_groups]
    controller._foreign_checked = weakref.WeakKeyDictionary()
    _watched[:] = [r for r in _watched if r() is not None] + [weakref.ref(controller)]
    if getattr(torch.optim.Optimizer, "_dra_watches_steps", False):
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_check_foreign_optimizer)
    torch.optim.Optimizer._dra_watches_steps = True


def _check_foreign_optimizer(optimizer: Any, *_: Any) -> None:
    for ref in _watched:
        ctl = ref()
        if ctl is None or ctl.role == "finished":
            continue
        if ctl._given_optimizer() is optimizer:
            # An LR scheduler built on it after dra.elastic.init (one built before is refused there):
            # refused before its first step changes anything, on every rank alike.
            if ctl.scheduler is None and has_unshared_scheduler(optimizer):
                raise RuntimeError("dra: " + unshared_scheduler_message(optimizer))
            groups = [len(g["params"]) for g in optimizer.param_groups]
            if groups != ctl._given_groups:
                raise RuntimeError(changed_groups_message(optimizer, ctl._given_groups, groups))
            continue
        names = ctl._foreign_checked.get(optimizer)
        if names is None:
            names = [ctl._model_params[id(p)] for g in optimizer.param_groups for p in g["params"] if id(p) in ctl._model_params]
            ctl._foreign_checked[optimizer] = names
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise RuntimeError(
                f"dra: an optimizer ({type(optimizer).__name__}) that is not the one given to dra.elastic.init steps the "
                f"model's parameters ({shown}); its state would not travel to processes that join or take over, so the "
                "ranks would diverge after a resize. Give dra one optimizer over every parameter, with a parameter "
                "group per part (torch.optim.Adam([{'params': G.parameters()}, {'params': D.parameters(), 'lr': ...}])): "
                "torch's optimizers skip parameters whose .grad is None, so one optimizer can step the parts apart "
                "(docs/guide/compatibility.md, \"Limits of the drop-in\")")


def changed_groups_message(optimizer: Any, before: list[int], now: list[int]) -> str:
    return (f"dra: the optimizer's ({type(optimizer).__name__}) parameter groups changed after dra.elastic.init "
            f"(parameters per group {before}, now {now}: optimizer.add_param_group mid-run?): a process that joins "
            "builds the optimizer its script builds at the start, so the world's optimizer state would not load "
            "there. Give the optimizer every group before dra.elastic.init / DistributedDataParallel: a part trained "
            "from step N on is in its own group from the start and frozen (requires_grad_(False); torch's optimizers "
            "skip parameters whose .grad is None) until step N, or has lr 0 in its group until then "
            "(docs/guide/compatibility.md, \"Limits of the drop-in\")")


_buffer_watchers: list[weakref.ref[Any]] = []


def watch_buffer_assignments(controller: Any) -> None:
    """A buffer assigned anew (``module.name = tensor`` for a registered buffer goes through
    ``register_buffer``) marks the buffers the controller averages as stale: they are taken again
    from the model at the next step. Before, the controller kept averaging the replaced tensor, and
    each rank's new one followed its own batches: the ranks' states drifted apart. torch's global
    buffer registration hook (torch 2.1, as the gradient hooks the model wrapper uses) costs
    nothing per step."""
    import torch

    _buffer_watchers[:] = [r for r in _buffer_watchers if r() is not None] + [weakref.ref(controller)]
    if getattr(torch.nn.Module, "_dra_watches_buffers", False):
        return
    torch.nn.modules.module.register_module_buffer_registration_hook(_buffer_assigned)
    torch.nn.Module._dra_watches_buffers = True


def _buffer_assigned(*_: Any) -> None:
    for ref in _buffer_watchers:
        ctl = ref()
        if ctl is not None and getattr(ctl, "_buffer_model", None) is not None:
            ctl._buffers_stale = True


_module_watchers: list[weakref.ref[Any]] = []


def watch_module_changes(controller: Any) -> None:
    """A module or parameter registered anywhere (``model.fc = nn.Linear(...)`` registers the new
    Linear's parameters, then the Linear) marks the controller's model for a look at its next
    forward or backward: a parameter that was not there at init is refused by name (the model
    wrapper's _check_parameters_unchanged). Before, it trained unreduced, each rank with its own
    gradient (the ranks diverged silently). torch's global registration hooks cost nothing per step."""
    import torch
    from torch.nn.modules import module

    controller._modules_changed = False
    _module_watchers[:] = [r for r in _module_watchers if r() is not None] + [weakref.ref(controller)]
    if getattr(torch.nn.Module, "_dra_watches_modules", False):
        return
    module.register_module_parameter_registration_hook(_module_changed)
    module.register_module_module_registration_hook(_module_changed)
    torch.nn.Module._dra_watches_modules = True


def _module_changed(*_: Any) -> None:
    for ref in _module_watchers:
        ctl = ref()
        if ctl is not None:
            ctl._modules_changed = True


def check_no_new_buffers(ctl: Any) -> None:
    """A buffer the model did not have at init (registered in a forward: a running statistic
    sized at the first batch): the founders averaged it, and every process that joined later
    (its model, as its script builds it, lacks it) died at the handoff, so the world stayed
    smaller for the rest of the job. Refused at the step, on every rank alike."""
    new = sorted({n for n, b in ctl._buffer_model.named_buffers() if b is not None} - ctl._buffer_names)
    if new:
        ctl._buffers_stale = True  # refused again at the next step
        shown = ", ".join(f"'{n}'" for n in new[:3]) + (f" and {len(new) - 3} more" if len(new) > 3 else "")
        raise RuntimeError(
            f"dra: the model has buffer(s) {shown} it did not have at dra.elastic.init / DistributedDataParallel "
            "(registered in a forward after the wrap?): a process that joins builds the model its script builds "
            "at the start, without them, and could not take the world's state. Create every buffer before the "
            "wrap: run one forward first (`with torch.no_grad(): model(example_batch)`), as for lazy modules, or "
            "register it in __init__ with its size (docs/guide/compatibility.md)")

def restore_dropped_grads(ctl: Any) -> None:
    """After the optimizer's step of a step whose reduction failed (skipped by ctl.optimizer, a
    no-op for a raw optimizer: the gradients were taken away), each parameter that held a
    gradient tensor holds a zero one, as after an applied step and zero_grad(set_to_none=False);
    set_to_none=True then makes it None as usual. Fresh tensors: a reducer rebuilt for the new
    world may reuse the old ones' memory."""
    import torch

    dropped, ctl._grads_dropped = ctl._grads_dropped, []
    for p in dropped:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
