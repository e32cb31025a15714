"""An outside docs audit (2026-12-05): what a user met following the guides.

- ``ElasticSampler`` iterated alone (``for idx in sampler``, or a plain ``DataLoader``'s
  ``batch_sampler=``) with no controller never ended: after the epoch it yielded padding batches
  forever. Outside a controller it is a plain batch sampler now: one pass over the data epoch in
  its documented order, then the end (docs/guide/elastic.md).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import dra.elastic as de

# A cap far above one epoch's steps: an iteration that never ends stops here and fails the test.
CAP = 1000


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


# -- ElasticSampler outside a controller ---------------------------------------------------------

def test_elastic_sampler_alone_yields_one_epoch_in_its_order_then_ends() -> None:
    ds = _dataset(10)
    sampler = de.ElasticSampler(len(ds), 4, seed=3)
    batches = [b.tolist() for b in itertools.islice(sampler, CAP)]
    assert [len(b) for b in batches] == [4, 4, 2] == [len(b) for b in batches[:len(sampler)]]
    flat = [i for b in batches for i in b]
    assert flat == sampler.order().tolist() and sorted(flat) == list(range(10))  # each sample once
    assert flat != list(range(10))  # shuffled with its seed ...
    assert [b.tolist() for b in de.ElasticSampler(10, 4, seed=3)] == batches  # ... deterministically
    # Iterated again without set_epoch: the same epoch again (torch's sampler repeats its order too).
    assert [b.tolist() for b in itertools.islice(sampler, CAP)] == batches
    sampler.set_epoch(1)
    again = [b.tolist() for b in itertools.islice(sampler, CAP)]
    assert len(again) == 3 and sorted(i for b in again for i in b) == list(range(10)) and again != batches
    assert sampler.epoch == 1 and sampler.cursor == 0
    # drop_last and shuffle=False as documented.
    assert [b.tolist() for b in itertools.islice(de.ElasticSampler(10, 4, drop_last=True, shuffle=False), CAP)] == [
        [0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("workers", [0, 2])
def test_elastic_sampler_in_a_plain_dataloader_ends_its_epoch(workers: int) -> None:
    ds = _dataset(23)
    sampler = de.ElasticSampler(len(ds), 5, seed=1)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=workers)
    assert len(loader) == 5
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = [y.tolist() for _, y in itertools.islice(loader, CAP)]
        assert [len(b) for b in seen] == [5, 5, 5, 5, 3]
        assert sorted(i for b in seen for i in b) == list(range(23))
        assert [i for b in seen for i in b] == sampler.order().tolist()


def test_elastic_sampler_restored_mid_epoch_yields_the_rest_of_it() -> None:
    trained = de.ElasticSampler(20, 6, seed=2)
    trained._native.commit()  # one step committed in a job, then saved
    resumed = de.ElasticSampler(20, 6, seed=2)
    resumed.load_state_dict(trained.state_dict())
    rest = [b.tolist() for b in itertools.islice(resumed, CAP)]
    assert [i for b in rest for i in b] == resumed.order()[6:].tolist() and len(rest) == len(resumed) == 3
