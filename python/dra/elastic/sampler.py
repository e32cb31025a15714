"""ElasticSampler: exactly-once data over a world that changes size.

Each data epoch has one deterministic global order of the dataset's indices (seeded, identical on
every rank: ``dra._core.elastic.epoch_order``). An optimizer step consumes the next
``global_batch`` positions of that order from the *cursor*; each rank takes its contiguous share
of them (``rank_share``). The cursor moves only when a step commits (its gradients were reduced
over the whole world), so after any resize or crash the samples not yet consumed are simply
re-partitioned over the new world by the same two functions: nothing is skipped or repeated.
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
        self.dataset_size = int(dataset_size)
        self.global_batch = int(global_batch)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.cursor = 0
        self.world = 1
        self.rank = 0
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    # -- geometry ---------------------------------------------------------------------------
    @property
    def epoch_size(self) -> int:
        if self.drop_last:
            return self.dataset_size - self.dataset_size % self.global_batch
        return self.dataset_size

    def order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            self._order = _m.epoch_order(self.dataset_size, self.seed, self.epoch)
            self._order_epoch = self.epoch
        return self._order

    def step_range(self) -> tuple[int, int]:
        return _m.step_batch(self.cursor, self.global_batch, self.epoch_size)

    def share_range(self) -> tuple[int, int]:
        begin, end = self.step_range()
        return _m.rank_share(begin, end, self.world, self.rank)

    def indices(self) -> np.ndarray:
        """This rank's sample ids for the current step."""
        b, e = self.share_range()
        return self.order()[b:e]

    def step_indices(self) -> np.ndarray:
        """All ranks' sample ids of the current step (the global batch)."""
        b, e = self.step_range()
        return self.order()[b:e]

    @property
    def exhausted(self) -> bool:
        return self.cursor >= self.epoch_size

    # -- transitions (driven by the controller) ---------------------------------------------
    def set_world(self, world: int, rank: int) -> None:
        self.world, self.rank = int(world), int(rank)

    def commit(self) -> None:
        """The current step's samples are consumed."""
        self.cursor = self.step_range()[1]

    def next_epoch(self) -> None:
        self.epoch += 1
        self.cursor = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "global_batch": self.global_batch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler seed: world uses {state['seed']}, this process {self.seed}; pass the same seed")
        self.epoch, self.cursor, self.global_batch = int(state["epoch"]), int(state["cursor"]), int(state["global_batch"])

    def __iter__(self) -> Iterator[np.ndarray]:
        start_epoch = self.epoch
        while self.epoch == start_epoch and not self.exhausted:
            yield self.indices()

    def __len__(self) -> int:
        return max(0, -(-(self.epoch_size - self.cursor) // self.global_batch))
