"""Elastic data-parallel world: grow and shrink in place under torchrun (DESIGN.md §3.3).

::

    import dra, dra.elastic as de
    sampler = de.ElasticSampler(len(dataset), global_batch=64, seed=0)
    ctl = de.init(model, optimizer, sampler, scheduler=sched, policy="convergence",
                  min_size=1, max_size=4, start_size=2, release="standby")
    for epoch in ctl.epochs(10):
        for idx in sampler:
            loss = loss_fn(ctl.model(x[idx]), y[idx])
            optimizer.zero_grad(); loss.backward(); optimizer.step(); sched.step()
            dra.step(loss)

The protocol is the C++ ``dra::elastic::controller`` (the same one LibTorch trainers use);
see docs/elastic.md.
"""

from __future__ import annotations

from dra.elastic._store import serve
from dra.elastic.controller import ElasticController, ElasticDataParallel, ElasticStepStatus, init
from dra.elastic.sampler import ElasticSampler

__all__ = [
    "ElasticController",
    "ElasticDataParallel",
    "ElasticSampler",
    "ElasticStepStatus",
    "init",
    "serve",
]
