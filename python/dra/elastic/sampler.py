"""ElasticSampler: exactly-once data over a world that changes size.

Each data epoch has one deterministic global order of the dataset's indices (seeded, identical on
every rank, in C++ and Python). An optimizer step consumes the next ``global_batch`` positions of
that order from the *cursor*; each rank takes its contiguous share. The cursor moves only when a
step commits (its gradients were reduced over the whole world), so after any resize or crash the
samples not yet consumed are re-partitioned over the new world: nothing is skipped or repeated.

The sampler is the C++ ``dra::elastic::elastic_sampler`` (include/dra/elastic/sampler.hpp) that
the controller drives; this class adds Python iteration.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dra._core import elastic as _m


class ElasticSampler:
    """Yields this rank's sample indices for each step (a batch sampler).

    Use as ``for indices in sampler:`` inside ``for epoch in controller.epochs(n):``; or as
    ``batch_sampler=`` of a ``DataLoader`` with ``num_workers=0`` (the indices of a step are
    computed when the step starts, from the world as it is then).
    """

    def __init__(self, dataset_size: int, global_batch: int, *, seed: int = 0, drop_last: bool = False) -> None:
        if dataset_size < 1:
            raise ValueError(f"dataset_size: must be >= 1, got {dataset_size}")
        if global_batch < 1:
            raise ValueError(f"global_batch: must be >= 1, got {global_batch}")
        if seed < 0:
            raise ValueError(f"seed: must be >= 0, got {seed}")
        self._s = _m.Sampler(int(dataset_size), int(global_batch), int(seed), bool(drop_last))

    # -- geometry ---------------------------------------------------------------------------
    dataset_size = property(lambda self: self._s.dataset_size)
    seed = property(lambda self: self._s.seed)
    drop_last = property(lambda self: self._s.drop_last)
    epoch = property(lambda self: self._s.epoch)
    cursor = property(lambda self: self._s.cursor)
    world = property(lambda self: self._s.world)
    rank = property(lambda self: self._s.rank)
    epoch_size = property(lambda self: self._s.epoch_size)
    exhausted = property(lambda self: self._s.exhausted)

    @property
    def global_batch(self) -> int:
        return self._s.global_batch

    @global_batch.setter
    def global_batch(self, value: int) -> None:
        self._s.global_batch = int(value)

    def order(self) -> np.ndarray:
        return self._s.order()

    def step_range(self) -> tuple[int, int]:
        return self._s.step_range()

    def share_range(self) -> tuple[int, int]:
        return self._s.share_range()

    def indices(self) -> np.ndarray:
        """This rank's sample ids for the current step."""
        return self._s.indices()

    def step_indices(self) -> np.ndarray:
        """All ranks' sample ids of the current step (the global batch)."""
        return self._s.step_indices()

    # -- transitions (driven by the controller) ---------------------------------------------
    def set_world(self, world: int, rank: int) -> None:
        self._s.set_world(int(world), int(rank))

    def commit(self) -> None:
        """The current step's samples are consumed."""
        self._s.commit()

    def next_epoch(self) -> None:
        self._s.next_epoch()

    def state_dict(self) -> dict[str, int]:
        return dict(self._s.position())

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._s.set_position(int(state["epoch"]), int(state["cursor"]), int(state["global_batch"]), int(state["seed"]))

    def __iter__(self) -> Iterator[np.ndarray]:
        start_epoch = self.epoch
        while self._s.epoch == start_epoch and not self._s.exhausted:
            yield self._s.indices()

    def __len__(self) -> int:
        return self._s.steps_left
