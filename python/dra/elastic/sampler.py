"""Exactly-once data over a world that changes size.

Each data epoch has one deterministic global order of the dataset's indices (seeded, identical on
every rank, in C++ and Python). An optimizer step consumes the next ``global_batch`` positions of
that order from the *cursor*; each rank takes its contiguous share. The cursor moves only when a
step commits (its gradients were reduced over the whole world), so after any resize or crash the
samples not yet consumed are re-partitioned over the new world: nothing is skipped or repeated.

Two front ends over the C++ ``dra::elastic::elastic_sampler`` (include/dra/elastic/sampler.hpp):

- ``DistributedSampler(dataset, batch_size)``: the drop-in for ``torch.utils.data.
  DistributedSampler``. It takes the per-rank batch (as the DataLoader of a DDP script does) and
  is passed as the DataLoader's ``batch_sampler``; the global batch is ``batch_size x WORLD_SIZE``
  (the processes launched) and stays so across resizes.
- ``ElasticSampler(dataset_size, global_batch)``: the same, given the global batch.

Both yield this rank's indices step by step. With DataLoader workers the loader asks a few steps
ahead; each batch is computed from the world as it is when asked for, and tagged with the world
epoch and the position it assumes. A batch consumed after the world changed, or after a failed
step, no longer matches: the model wrapper trains on it locally but drops it (no reduction, no
commit), and the next batches are computed for the new world. At the end of an epoch, while
batches are still in flight, the iterator yields one-sample padding batches (dropped the same way)
instead of stopping, so that an epoch whose last steps a world change invalidated is still finished.

A training loop that skips a batch it was handed (an exception caught before backward, a
``continue``) holds one batch more in flight than the other ranks, and than it did at its previous
step: the check that rides with the step's reduction refuses that step on every rank (nothing is
applied or committed), this rank drops the batches it skipped, and the step is redone with the
same samples. The in-flight count is a loader's prefetch plus the batch in hand, the same on every
rank of a world whose ranks run the same loop.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dra._core import elastic as _m


class ElasticSampler:
    """Yields this rank's sample indices for each step (a batch sampler).

    Use as ``for indices in sampler:`` inside ``for epoch in ctl.epochs(n):``, or as the
    ``batch_sampler=`` of a ``DataLoader`` (workers allowed).
    """

    def __init__(
        self, dataset_size: int, global_batch: int, *, seed: int = 0, drop_last: bool = False, shuffle: bool = True
    ) -> None:
        for name, value, low in (("dataset_size", dataset_size, 1), ("global_batch", global_batch, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")
        self._native = _m.Sampler(int(dataset_size), int(global_batch), int(seed), bool(drop_last), bool(shuffle))
        self._controller: Any = None
        self._requested: int | None = None  # the data epoch the training loop asked for (set_epoch)
        self._reset_flight()

    def _reset_flight(self) -> None:
        # Batches handed out and not yet consumed: (world epoch, generation, cursor) they assume; None
        # for padding. A refused step starts a new generation: every batch in flight is stale.
        self._in_flight: collections.deque[tuple[int, int, int] | None] = collections.deque()
        self._generation = 0
        self._iterating = False
        self._depth_seen: int | None = None  # batches in flight at this iterator's previous reduced batch
        self._skipped_now = 0  # batches skipped before the one being stepped (this rank's own count)

    # -- geometry ---------------------------------------------------------------------------
    dataset_size = property(lambda self: self._native.dataset_size)
    seed = property(lambda self: self._native.seed)
    drop_last = property(lambda self: self._native.drop_last)
    shuffle = property(lambda self: self._native.shuffle)
    epoch = property(lambda self: self._native.epoch, doc="The data epoch the world is in.")
    cursor = property(lambda self: self._native.cursor, doc="Positions of this epoch's order already consumed.")
    world = property(lambda self: self._native.world)
    rank = property(lambda self: self._native.rank)
    epoch_size = property(lambda self: self._native.epoch_size)
    exhausted = property(lambda self: self._native.exhausted)
    global_batch = property(lambda self: self._native.global_batch, doc="Samples per step over the whole world.")

    def order(self) -> np.ndarray:
        return self._native.order()

    def indices(self) -> np.ndarray:
        """This rank's sample ids for the current step."""
        return self._native.indices()

    def step_indices(self) -> np.ndarray:
        """All ranks' sample ids of the current step (the global batch)."""
        return self._native.step_indices()

    def state_dict(self) -> dict[str, int]:
        """Where the data stands (epoch, cursor, global batch, seed): save it to restart a job."""
        return dict(self._native.position())

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._native.set_position(int(state["epoch"]), int(state["cursor"]), int(state["global_batch"]), int(state["seed"]))

    def set_epoch(self, epoch: int) -> None:
        """``DistributedSampler.set_epoch``: the training loop is at data epoch ``epoch``. The world
        moves there once the epochs before it are consumed; a joiner that calls it for an epoch the
        world has already finished iterates nothing."""
        self._requested = int(epoch)
        while self._native.epoch < epoch and self._native.exhausted:
            self._native.next_epoch()

    def __len__(self) -> int:
        """Steps left in the current data epoch (on a joiner too)."""
        return int(self._native.steps_left)

    def __iter__(self) -> Iterator[np.ndarray]:
        """This rank's indices for each step left in the current data epoch."""
        native, ctl = self._native, self._controller
        self._in_flight.clear()
        self._depth_seen = None
        self._iterating = True
        data_epoch = native.epoch
        if self._requested is not None and self._requested < data_epoch:
            return  # a joiner's loop passing epochs the world has already finished
        tag: tuple[int, int] | None = None
        base = ahead = world = rank = 0
        while True:
            if native.epoch != data_epoch or (ctl is not None and not ctl.is_member):
                return
            world_epoch = ctl.epoch if ctl is not None else 0
            now = (world_epoch, self._generation)
            if now != tag or (not self._in_flight and native.cursor != base + ahead * native.global_batch):
                # A new world, a refused step (or a failed one): restart the predictions from what is committed.
                tag, base, ahead, world, rank = now, native.cursor, 0, native.world, native.rank
            cursor = base + ahead * native.global_batch
            if cursor >= native.epoch_size:
                if not any(item is not None for item in self._in_flight):
                    return
                self._in_flight.append(None)
                yield native.order()[:1]  # padding while batches in flight may still be dropped
                continue
            ahead += 1
            self._in_flight.append((world_epoch, self._generation, cursor))
            yield native.indices_at(cursor, world, rank)

    # -- the controller's side -----------------------------------------------------------------
    def _follow(self, controller: Any) -> None:
        self._controller = controller

    def _current_is_fresh(self) -> bool:
        """Whether the batch being trained on is the one the world's current step needs."""
        if not self._in_flight:
            return True  # indices taken directly (sampler.indices()), not through the iterator
        head = self._in_flight[0]
        return head is not None and head == (self._controller.epoch, self._generation, self._native.cursor)

    def _batch_check(self) -> tuple[int, int]:
        """For the batch about to be reduced: the batches in flight (-1 without the iterator) and how
        many more than at this iterator's previous reduced batch (batches the loop skipped)."""
        if not self._iterating:
            return -1, 0
        depth = len(self._in_flight)
        skipped = depth - self._depth_seen if self._depth_seen is not None and depth > self._depth_seen else 0
        self._depth_seen = depth - skipped
        self._skipped_now = skipped
        return depth, skipped

    def _refused(self, excess: int) -> None:
        """The world refused the step: the batches this rank skipped (the oldest in flight, before
        the one in hand) are dropped, and every batch in flight is stale from now on."""
        for _ in range(min(excess, max(len(self._in_flight) - 1, 0))):
            self._in_flight.popleft()
        self._generation += 1
        self._depth_seen = None
        self._skipped_now = 0

    def _consumed(self) -> None:
        if self._in_flight:
            self._in_flight.popleft()

    def _start_at(self, epoch: int) -> None:
        """A job restarted at data epoch ``epoch`` (every process, before training)."""
        if epoch < 0:
            raise ValueError(f"start: must be >= 0, got {epoch}")
        if self._native.epoch < epoch and self._native.cursor == 0:
            position = self._native.position()
            self._native.set_position(epoch, 0, position["global_batch"], position["seed"])


class DistributedSampler(ElasticSampler):
    """Drop-in for ``torch.utils.data.DistributedSampler`` in an elastic job.

    ``DistributedSampler(dataset, shuffle=True, seed=0, drop_last=False)`` takes the same arguments
    as torch's (``num_replicas`` and ``rank`` must stay None: the world decides them). Give the
    DataLoader the per-rank batch through it::

        loader = DataLoader(dataset, batch_sampler=sampler.batches(32), num_workers=4)

    replaces ``DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4)``. The global
    batch is ``batch_size x WORLD_SIZE`` (the processes launched), as in the DDP run it replaces,
    and stays so when the world changes (each rank's share then grows or shrinks). ``set_epoch``
    and ``len`` work as in torch (``len`` is the steps left, so a joiner's loader has the right
    length); DataLoader workers are fine.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        batch_size: int | None = None,
    ) -> None:
        if num_replicas is not None or rank is not None:
            raise ValueError("num_replicas/rank: leave them None; an elastic world decides both (ctl.world_size, ctl.rank)")
        try:
            self._dataset_size = len(dataset)
        except TypeError as e:
            raise ValueError(f"dataset: needs a length (a map-style dataset), got {type(dataset).__name__}") from e
        self._options = {"seed": seed, "drop_last": drop_last, "shuffle": shuffle}
        self._controller = None
        self._requested = None
        self._reset_flight()
        self.batch_size: int | None = None
        if batch_size is not None:
            self.batches(batch_size)

    def batches(self, batch_size: int) -> DistributedSampler:
        """Sets the per-rank batch and returns the sampler, for ``DataLoader(batch_sampler=...)``."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: the per-rank batch must be an integer >= 1, got {batch_size!r}")
        if self._controller is not None and int(batch_size) != self.batch_size:
            raise ValueError("batch_size: fixed once the controller follows this sampler")
        launched = os.environ.get("WORLD_SIZE", "1")
        if not launched.isdigit() or int(launched) < 1:
            raise ValueError(f"WORLD_SIZE: must be a positive integer, got {launched!r}")
        ElasticSampler.__init__(self, self._dataset_size, int(batch_size) * int(launched), **self._options)
        self.batch_size = int(batch_size)
        return self

    def __getattr__(self, name: str) -> Any:
        if name == "_native":
            raise ValueError("DistributedSampler: give it the per-rank batch first (sampler.batches(batch_size))")
        raise AttributeError(name)
