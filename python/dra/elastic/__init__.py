"""Elastic data-parallel training: the world grows and shrinks in place (docs/design/elastic.md).

::

    import dra, dra.elastic as de
    sampler = de.DistributedSampler(dataset)               # torch's, exactly-once over a changing world
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    ctl = de.init(model, optimizer, sampler, policy="convergence")
    for epoch in ctl.epochs(10):
        for x, y in loader:
            loss = loss_fn(ctl.model(x), y)
            ctl.optimizer.zero_grad(); loss.backward(); ctl.optimizer.step()
            dra.step(loss)

The protocol is the C++ controller (``dra.Controller``); docs/guide/elastic.md is the guide.
"""

from __future__ import annotations

from typing import Any

from dra._controller import Controller, reset
from dra.elastic.sampler import DistributedSampler, ElasticSampler

__all__ = ["DistributedDataParallel", "DistributedSampler", "ElasticSampler", "init"]


def init(model: Any, optimizer: Any, sampler: ElasticSampler, **options: Any) -> Controller:
    """Makes this process's elastic controller (``dra.Controller(model=..., ...)``) and installs it
    behind ``dra.step``. Processes with uid < ``start_size`` form the first world; the others
    wait here as candidates until the policy admits them or the job ends (with
    ``release="return"`` they return at once, released: ``ctl.rejoin()`` or ``ctl.try_join()``
    enters)."""
    return reset(Controller(model=model, optimizer=optimizer, sampler=sampler, **options))


def DistributedDataParallel(  # noqa: N802
    module: Any,
    optimizer: Any,
    sampler: ElasticSampler,
    *,
    device_ids: Any = None,
    output_device: Any = None,
    dim: int = 0,
    broadcast_buffers: bool = True,
    process_group: Any = None,
    bucket_cap_mb: Any = None,
    find_unused_parameters: bool = False,
    gradient_as_bucket_view: bool = False,
    static_graph: bool = False,
    **options: Any,
) -> Any:
    """Drop-in for ``torch.nn.parallel.DistributedDataParallel`` in an elastic job:
    ``init(module, optimizer, sampler, **options).model``. Like DDP's, the wrapper's ``.module`` is
    the model; its ``.controller`` is the process's dra.Controller (``.controller.is_leader``:
    rank 0 of the world now).

    torch's keywords are taken so that a ported call only gains the optimizer and the sampler:
    ``device_ids``/``output_device`` (the model is already on its device, as DDP wants it),
    ``gradient_as_bucket_view``, ``static_graph`` and ``bucket_cap_mb`` change nothing (buckets
    are dra's own); ``find_unused_parameters`` is DDP's: True, a parameter no rank had a gradient
    for on a step keeps none (the optimizer skips it, as in one process); False, it gets a zero
    gradient (DDP would raise; dra goes on);
    ``broadcast_buffers`` (True, as DDP's): the module's buffers (BatchNorm's running statistics)
    become the world's mean at every committed step, so every rank holds the same state; False:
    each rank's follow its own batches (they still travel with the state at every world change).
    ``process_group`` must be None or a group over every rank (``dist.group.WORLD``, a
    ``dist.new_group()``): the elastic world is the group, and such a group follows it; ``dim``
    must be 0. Gradient
    accumulation is DDP's: ``with model.no_sync():`` around every backward of a window but the
    last (docs/guide/elastic.md, "Gradient accumulation")."""
    if process_group is not None:
        _check_whole_world(process_group)
    if dim != 0:
        raise ValueError(f"dim: only 0 (the batch dimension) is supported, got {dim}")
    if device_ids is not None and (not isinstance(device_ids, (list, tuple)) or len(device_ids) > 1):
        raise ValueError(f"device_ids: one device at most (one per process, as DDP wants), got {device_ids!r}")
    del output_device, bucket_cap_mb, gradient_as_bucket_view, static_graph
    return init(module, optimizer, sampler, broadcast_buffers=broadcast_buffers,
                find_unused_parameters=find_unused_parameters, **options).model


def _check_whole_world(group: Any) -> None:
    """A ``process_group`` given to the DDP drop-in: one over every rank of torch's default group
    is the world dra trains over (it follows the world with it); any other is refused."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError("process_group: leave it None (no torch default group is initialised); the elastic world "
                         "is the group")
    ranks, size = dist.get_process_group_ranks(group), dist.get_world_size()
    if sorted(ranks) != list(range(size)):
        raise ValueError(f"process_group: a group over ranks {sorted(ranks)} of {size}; dra trains over the whole "
                         "elastic world (it changes with resizes): leave it None or give a group over every rank")

