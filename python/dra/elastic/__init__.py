"""Elastic data-parallel training: the world grows and shrinks in place (docs/design/elastic.md).

::

    import dra, dra.elastic as de
    sampler = de.DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_sampler=sampler.batches(32))
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


def init(model: Any, optimizer: Any, sampler: ElasticSampler, **options: Any) -> Controller:
    """Makes this process's elastic controller (``dra.Controller(model=..., ...)``) and installs it
    behind ``dra.step``. Processes with uid < ``start_size`` form the first world; the others
    wait here as candidates until the policy admits them or the job ends (with
    ``release="return"`` they return at once, released: ``ctl.rejoin()`` or ``ctl.try_join()``
    enters)."""
    return reset(Controller(model=model, optimizer=optimizer, sampler=sampler, **options))


def DistributedDataParallel(module: Any, optimizer: Any, sampler: ElasticSampler, **options: Any) -> Any:  # noqa: N802
    """Drop-in for ``torch.nn.parallel.DistributedDataParallel`` in an elastic job:
    ``init(module, optimizer, sampler, **options).model``. Like DDP's, the wrapper's ``.module`` is
    the model; its ``.controller`` is the process's dra.Controller (``.controller.rank``: the rank
    now)."""
    return init(module, optimizer, sampler, **options).model


__all__ = ["DistributedDataParallel", "DistributedSampler", "ElasticSampler", "init"]
