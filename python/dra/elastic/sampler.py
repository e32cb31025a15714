"""Exactly-once data over a world that changes size.

Each data epoch has one deterministic global order of the dataset's indices (seeded, identical on
every rank). An optimizer step consumes the next ``global_batch`` positions of that order from the
*cursor*; each rank takes its share. The cursor moves only when a step commits (its gradients were
reduced over the whole world), so after any resize or crash the samples not yet consumed are
re-partitioned over the new world: nothing is skipped or repeated. The position lives in the C++
``dra::elastic::elastic_sampler`` (include/dra/elastic/sampler.hpp), which the controller moves
and hands to joiners.

Two front ends:

- ``DistributedSampler(dataset)``: the drop-in for ``torch.utils.data.DistributedSampler``. Used
  as torch's is (``DataLoader(dataset, batch_size=B, sampler=sampler)``, ``set_epoch``,
  ``loader.sampler``), it yields exactly what torch's yields in a fixed world: the order of
  ``torch.randperm`` seeded with ``seed + epoch`` and rank ``r`` of ``W`` taking every ``W``-th
  sample of each step (torch's strided split), so step ``k`` is the same ``B x W`` samples as under
  DDP. The global batch is ``B x WORLD_SIZE`` (the processes launched) and stays so when the world
  changes: each rank's share then grows or shrinks, inside (the DataLoader's batch sampler asks
  this sampler for each step's share). A sampler the controller does not follow (an eval or test
  loader's) is torch's sampler over the current world, epoch by epoch, and ends.
- ``ElasticSampler(dataset_size, global_batch)``: a batch sampler given the global batch (C++ order,
  contiguous shares), for ``DataLoader(batch_sampler=...)`` or ``for indices in sampler``.

With DataLoader workers the loader asks a few steps ahead; each batch is computed from the world as
it is when asked for, and tagged with the world epoch and the position it assumes. A batch consumed
after the world changed, or after a failed step, no longer matches: the model wrapper trains on it
locally but drops it (no reduction, no commit; ``ctl.batch_dropped`` tells user code), and the next
batches are computed for the new world. At the end of an epoch, while batches are still in flight,
the iterator yields padding batches of the usual size (dropped the same way) instead of stopping, so
that an epoch whose last steps a world change invalidated is still finished.

A loop that skips a batch it was handed (an exception caught before backward, a ``continue``, on
one rank or all) received more batches than it trained: the check riding with the step's reduction
refuses the step on every rank, the skipping ranks drop what they skipped, and the step is redone
with the same samples. Without a DataLoader, the batches in flight are compared across ranks.
"""

from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from dra._core import elastic as _m
from dra.elastic import _loader
from dra.elastic._following import end_if_finished, follow, followed


class ElasticSampler:
    """Yields this rank's sample indices for each step (a batch sampler).

    Use as ``for indices in sampler:`` inside ``for epoch in ctl.epochs(n):``, or as the
    ``batch_sampler=`` of a ``DataLoader`` (workers allowed). Outside a controller (none follows
    it) it is a plain batch sampler, as torch's ``DistributedSampler`` is in a world of one: one
    pass over the data epoch (its order: shuffled with ``seed``, ``drop_last`` as given), then the
    end; iterated again, the same epoch again; ``set_epoch(e)`` moves on to a later epoch ``e``.
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
        self._pass_steps: int | None = None  # steps left when the loader's current pass began
        self._pass_total = 0  # the same, kept after the pass ended (did it run to its end?)
        self._pass_token: object = None
        self._peeked, self._peeked_epoch = False, None  # a pass of a loop behind the world's (one batch); its epoch
        self._trained_epoch: int | None = None  # the data epoch of this process's last pass that trained
        self._delivered = self._handled = 0  # batches of this pass the loop received; of those, done with
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
        """The current data epoch's global order."""
        return self._native.order()

    def _share(self, cursor: int, world: int, rank: int) -> np.ndarray:
        """A rank's sample ids of the step that starts at ``cursor`` in a world of ``world``."""
        return self._native.indices_at(cursor, world, rank)

    def indices(self) -> np.ndarray:
        """This rank's sample ids for the current step."""
        return self._share(self._native.cursor, self._native.world, self._native.rank)

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
        moves there once the epochs before it are consumed (a fresh epoch that no step has touched
        moves at once: a job restarted from an epoch checkpoint); a loop that trained in the data
        epoch and left its loader early ends that epoch here (its remaining samples untrained, as
        with torch's sampler); a process whose loop is behind the world (a joiner, a standby
        admitted again) iterates nothing until its loop catches up."""
        epoch = int(epoch)
        end_if_finished(self, epoch)
        native, ctl = self._native, self._controller
        if ctl is not None:
            ctl._settle_missed_step()  # a step the last pass ended without calling dra.step for
        if (ctl is not None and ctl.is_member and self._requested is not None and epoch > max(self._requested, native.epoch)
                and self._trained_epoch == native.epoch and not native.exhausted and native.cursor > 0):
            # The loop trained in this data epoch and moves on before its end (a break, a zip with a
            # shorter loader): it ends here, as torch's sampler starts the next order (it went on
            # where the loop left it, and the epochs after it were skipped once it ended).
            ctl._leave_epoch_early()
        self._requested, self._fresh_request = epoch, True
        while native.epoch < epoch and native.exhausted:
            native.next_epoch()
        if native.epoch < epoch and native.cursor == 0:
            self._start_at(epoch)

    def _catching_up(self) -> bool:
        """Whether the loader's last pass was one of a loop behind the world, which trained nothing (a
        joiner's `range` loop walking the data epochs the world finished, a standby's admitted again
        walking to the one it trained in): the code after it (``scheduler.step()``) is not the world's,
        whose members ran it and whose state this process received. The epoch the world has just ended
        is not behind for a process that did not train in it (a joiner admitted at its last step)."""
        requested, native = self._requested, self._native
        if not self._peeked or requested is None:
            return False
        return requested < native.epoch or (requested == native.epoch and native.exhausted
                                             and self._trained_epoch == native.epoch)

    def __len__(self) -> int:
        """In a job, a whole data epoch's steps (torch's meaning), alike on every process in every world
        (during a pass a loader's follows the pass: _pass_length); alone, the steps it will yield."""
        return self._steps_left() if self._controller is None else self._epoch_steps

    def _steps_left(self) -> int:
        """Steps left in the data epoch (on a joiner too); a whole epoch's once it is exhausted."""
        return self._epoch_steps if self._native.exhausted else int(self._native.steps_left)

    _epoch_steps = property(lambda self: -(-int(self._native.epoch_size) // int(self._native.global_batch)),
                            doc="A whole data epoch's steps (the world's global batch each).")

    def __iter__(self) -> Iterator[np.ndarray]:
        """This rank's indices for each step left in the current data epoch."""
        return self._steps()

    def _steps(self) -> Iterator[np.ndarray]:
        """This rank's share of each step left in the data epoch, computed when the loader asks."""
        token = self._pass_token = object()
        # Again over the epoch the loop is in (no set_epoch since its last pass, not catching up).
        again, self._fresh_request = not getattr(self, "_fresh_request", True) and not self._catching_up(), False
        self._peeked = False
        self._delivered = self._handled = 0  # batches of this pass the loop has received; done with
        try:
            yield from self._pass(again)
        finally:
            if self._pass_token is token:  # not a newer pass's
                self._pass_steps = None

    def _pass(self, again: bool = False) -> Iterator[np.ndarray]:
        native, ctl = self._native, self._controller
        self._check_process()
        if ctl is None:
            yield from self._plain_pass()
            return
        if ctl is not None and ctl._micro_fresh:  # a window the last pass left open: trained again
            warnings.warn(f"dra: {ctl._micro_fresh} batch(es) accumulated under no_sync() were never followed by a "
                          "reducing backward before the loader's pass ended; they are trained again (close each "
                          "window with a backward outside no_sync(), the epoch's last batch included)", stacklevel=3)
            ctl._micro_fresh = 0
        ctl._settle_missed_step()  # before the in-flight batches of the last pass are forgotten
        self._in_flight.clear()
        self._depth_seen = None
        self._iterating = True
        self._pass_steps = self._pass_total = ElasticSampler._steps_left(self)
        end_if_finished(self, None)  # ctl is not None here (a plain pass returned above)
        data_epoch = native.epoch
        if ctl is not None and ctl.is_member and native.exhausted and self._requested is None:
            native.next_epoch()  # iterated again without set_epoch: the next pass over the data
            data_epoch = native.epoch
        if self._requested is not None and self._requested <= data_epoch and (
            self._requested < data_epoch or native.exhausted
        ):
            if again and self._requested == data_epoch and data_epoch in (self._trained_epoch, self._peeked_epoch):
                yield from self._replay(data_epoch)  # the loop goes over the epoch it trained again
                return
            # A loop behind the world (a joiner, or a peek before set_epoch): nothing to train, but one batch
            # of the usual size, dropped if trained, so that next(iter(loader)) sees what torch's would.
            self._in_flight.append(None)
            self._peeked, self._peeked_epoch = True, self._requested
            yield self._usual_batch()
            return
        self._trained_epoch = data_epoch
        tag: tuple[int, int] | None = None
        base = ahead = world = rank = 0
        while True:
            if ctl is not None and ctl.stopped and not getattr(ctl, "_epochs_driven", False):
                end_if_finished(self, None)  # a `range` loop after a stop: the process ends here
            if ctl is not None and not ctl.is_member:
                return
            world_epoch = ctl.epoch if ctl is not None else 0
            if native.epoch != data_epoch:
                # A member's data epoch moves only between passes. Mid-pass it moved because this
                # process took the world's position at a world change (a standby admitted again
                # while the world trained on into a later data epoch): the pass goes on in the
                # world's data epoch, so that the loop's body after the loader (an epoch's
                # validation, its collectives) runs where the other members run it.
                if ctl is None or tag is None or world_epoch == tag[0] or native.epoch < data_epoch:
                    return
                data_epoch = self._trained_epoch = native.epoch
            now = (world_epoch, self._generation)
            # Where the loop stands: what is committed, and the batches of an open accumulation window.
            held = native.cursor + (ctl._micro_fresh * native.global_batch if ctl is not None else 0)
            if now != tag or (not self._in_flight and held != base + ahead * native.global_batch):
                # A new world, a refused step (or a failed one): restart the predictions from what is committed.
                tag, base, ahead, world, rank = now, held, 0, native.world, native.rank
            cursor = base + ahead * native.global_batch
            if cursor >= native.epoch_size:
                if not any(item is not None for item in self._in_flight):
                    return
                self._in_flight.append(None)
                yield self._padding()  # padding while batches in flight may still be dropped
                continue
            ahead += 1
            self._in_flight.append((world_epoch, self._generation, cursor))
            yield self._share(cursor, world, rank)

    def _replay(self, epoch: int) -> Iterator[np.ndarray]:
        """Again over the data epoch this process trained, before the loop moves on (a training-set
        evaluation, ``update_bn(loader, model)``): this rank's shares for the world now, as torch's
        sampler yields them, dropped if trained (it yielded one peek batch, or under ``ctl.epochs``
        the next epoch's order, then padding for ever)."""
        native = self._native
        world, rank, batch = max(int(native.world), 1), int(native.rank), int(native.global_batch)
        for cursor in range(0, int(native.epoch_size), batch):
            if native.epoch != epoch:
                return
            share = self._share(cursor, world, rank)
            if len(share):
                self._in_flight.append(None)
                yield share

    def _plain_pass(self) -> Iterator[np.ndarray]:
        """Outside a controller (nothing commits, so in-flight bookkeeping and padding would never
        end it): each step left in the data epoch once, in its order; iterated again, the same."""
        native = self._native
        world, rank, batch = max(int(native.world), 1), int(native.rank), int(native.global_batch)
        for cursor in range(int(native.cursor), int(native.epoch_size), batch):
            yield self._share(cursor, world, rank)

    def _pass_length(self) -> int:
        """The loader's length during a pass: the batches the loop has received in it plus the
        steps after the one in hand (the steps it began with, as long as no step is redone; a
        failure's redone steps lengthen it, so `i + 1 == len(loader)` still finds the last one)."""
        head = self._in_flight[0] if self._in_flight else None
        if head is None or self._delivered == 0:
            return max(int(self._pass_steps or 0), self._delivered)
        native = self._native
        g = int(native.global_batch)
        after = max(0, int(native.epoch_size) - (head[2] + g))
        return self._delivered + -(-after // g)

    def _usual_batch(self) -> np.ndarray:
        """A batch of this rank's usual size (the first samples of the order)."""
        native = self._native
        world, rank = max(native.world, 1), native.rank
        share = native.global_batch // world + (1 if rank < native.global_batch % world else 0)
        return self.order()[:max(1, min(share, int(native.dataset_size)))]

    def _padding(self) -> np.ndarray:
        # Of the usual size, not one sample: a model with batch normalisation cannot train on a
        # batch of one (a ported script with DataLoader workers failed at its first epoch's end).
        return self._usual_batch()

    # -- the controller's side -----------------------------------------------------------------
    def _check_trainable(self) -> None:
        """Refuses what cannot be the training sampler, before the controller joins the world."""

    def _follow(self, controller: Any) -> None:
        self._controller = controller
        self._pid = os.getpid()
        follow(controller)

    def _check_process(self) -> None:
        """The sampler the controller follows hands out steps only in the training process: its
        position moves there, with each commit. A copy in another process (a DataLoader worker
        running an IterableDataset's ``__iter__`` over it) would never see a step commit and would
        hand out the same steps again and again (an epoch that never ends)."""
        if self._controller is None or getattr(self, "_pid", None) in (None, os.getpid()):
            return
        raise RuntimeError(
            f"dra: the elastic sampler the controller follows is iterated in process {os.getpid()}, not in the training "
            f"process {self._pid} (a DataLoader worker running an IterableDataset's __iter__ over it?); there its position "
            "never moves and it would yield the same steps forever. Give it to the DataLoader as batch_sampler= (or "
            "batch_size=B, sampler=...; the workers then load the samples), or iterate it with num_workers=0")

    def _current_is_fresh(self, ahead: int = 0) -> bool:
        """Whether the batch being trained on is the one the world's current step needs (``ahead``
        steps after it: the batches of a gradient-accumulation window trained so far)."""
        if not self._in_flight:
            return True  # indices taken directly (sampler.indices()), not through the iterator
        head = self._in_flight[0]
        cursor = self._native.cursor + ahead * self._native.global_batch
        return head is not None and head == (self._controller.epoch, self._generation, cursor)

    def _current_is_empty(self) -> bool:
        """Whether this rank's share of the batch being trained on (a fresh one) is empty: the
        loader then loaded a batch of the usual size in its place, which must add no gradient."""
        if not self._in_flight or self._in_flight[0] is None:
            return False
        native = self._native
        return len(self._share(self._in_flight[0][2], native.world, native.rank)) == 0

    def _batch_check(self) -> tuple[int, int]:
        """For the batch about to be reduced: the batches in flight (-1 without the iterator) and how
        many more than at this iterator's previous reduced batch (batches the loop skipped)."""
        if not self._iterating:
            return -1, 0
        depth = len(self._in_flight)
        if self._delivered:  # from a DataLoader: received before the one in hand and never trained
            skipped = max(0, self._delivered - 1 - self._handled)
        else:
            skipped = depth - self._depth_seen if self._depth_seen is not None and depth > self._depth_seen else 0
        self._depth_seen = depth - skipped
        self._skipped_now = skipped
        return depth, skipped

    def _refused(self, excess: int) -> None:
        """The world refused the step: the batches this rank skipped (the oldest in flight, before
        the one in hand) are dropped, and every batch in flight is stale from now on."""
        for _ in range(min(excess, max(len(self._in_flight) - 1, 0))):
            self._in_flight.popleft()
            self._handled += 1
        self._generation += 1
        self._depth_seen = None
        self._skipped_now = 0

    def _consumed(self, delivered: bool = True) -> None:
        """The batch at the head is done with (trained, or dropped; ``delivered``: the loop had it)."""
        if self._in_flight:
            self._in_flight.popleft()
        self._handled += int(delivered)

    def _start_at(self, epoch: int) -> None:
        """A job restarted at data epoch ``epoch`` (every process, before training)."""
        if epoch < 0:
            raise ValueError(f"start: must be >= 0, got {epoch}")
        if self._native.epoch < epoch and self._native.cursor == 0:
            position = self._native.position()
            self._native.set_position(epoch, 0, position["global_batch"], position["seed"])


class DistributedSampler(ElasticSampler):
    """Drop-in for ``torch.utils.data.DistributedSampler`` in an elastic job.

    Takes torch's arguments and is used as torch's is::

        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4)
        ...
        sampler.set_epoch(epoch)        # or loader.sampler.set_epoch(epoch)

    The sampler given to ``dra.elastic.init`` / ``DistributedDataParallel`` is followed by the
    controller: the DataLoader's batch sampler then takes each step's share from it (the global
    batch is ``batch_size x WORLD_SIZE``, the processes launched, kept when the world changes; in a
    fixed world every rank gets exactly torch's indices, step by step). Any other (an eval or test
    loader's) is torch's ``DistributedSampler`` over the world now (``num_replicas``/``rank`` given,
    else the controller's world, else ``WORLD_SIZE``/``RANK``), and its epochs end.
    ``batch_sampler=sampler.batches(32)`` is the same as ``batch_size=32, sampler=sampler``.
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
        try:
            self._dataset_size = len(dataset)
        except TypeError as e:
            raise ValueError(f"dataset: needs a length (a map-style dataset), got {type(dataset).__name__}") from e
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
        for name, value in (("num_replicas", num_replicas), ("rank", rank)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0):
                raise ValueError(f"{name}: must be an integer >= 0 or None, got {value!r}")
        if num_replicas is not None and rank is not None and rank >= num_replicas:
            raise ValueError(f"rank: must lie in [0, num_replicas={num_replicas}), got {rank}")
        if (num_replicas, rank) == _world_now():
            # The world as it is (a ported script's num_replicas=dist.get_world_size(),
            # rank=dist.get_rank()): followed as it changes. Kept as given, the split stayed the one
            # made then: after a shrink from 3 to 2, an eval loop covered 2/3 of its set, silently.
            num_replicas = rank = None
        self.dataset = dataset
        self._options = {"seed": int(seed), "drop_last": bool(drop_last), "shuffle": bool(shuffle)}
        self._fixed = (num_replicas, rank)  # torch's explicit split, for a sampler the controller does not follow
        self._torch_epoch = 0  # the latest set_epoch, for the torch order outside the controller
        self._controller = None
        self._requested = None
        self._reset_flight()
        self._orders: dict[int, np.ndarray] = {}
        self._loader_batches: set[int] = set()
        self.batch_size: int | None = None
        if batch_size is not None:
            self.batches(batch_size)

    def batches(self, batch_size: int) -> _loader.StepBatches:
        """The per-rank batch: returns a batch sampler over this sampler, for
        ``DataLoader(dataset, batch_sampler=sampler.batches(32))``."""
        self._bind_batch(batch_size)
        return _loader.StepBatches(self)

    def _bind_batch(self, batch_size: int, drop_last: bool = False) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size: the per-rank batch must be an integer >= 1, got {batch_size!r}")
        self._loader_batches.add(int(batch_size))
        if self.batch_size == int(batch_size) and not drop_last:
            return
        if self._controller is not None:
            if int(batch_size) != self.batch_size:
                raise ValueError(f"batch_size: fixed at {self.batch_size} once the controller follows this sampler, "
                                 f"got {batch_size}")
            return
        # The processes launched together (a replacement or a late joiner started by `dra run` or a
        # pool has a torch world of its own: DRA_UNIVERSE_SIZE names the launched one).
        name = "DRA_UNIVERSE_SIZE" if os.environ.get("DRA_UNIVERSE_SIZE") else "WORLD_SIZE"
        launched = os.environ.get(name, "1")
        if not launched.isdigit() or int(launched) < 1:
            raise ValueError(f"{name}: must be a positive integer, got {launched!r}")
        options = dict(self._options, drop_last=self._options["drop_last"] or drop_last)
        ElasticSampler.__init__(self, self._dataset_size, int(batch_size) * int(launched), **options)
        self._orders = {}
        self.batch_size = int(batch_size)

    def __getattr__(self, name: str) -> Any:
        if name == "_native":
            raise ValueError("DistributedSampler: its per-rank batch is unknown: no DataLoader(sampler=...) holds it (one made "
                             "later by a framework, an IterableDataset, a loop by hand). Make DataLoader(map-style dataset, "
                             "sampler=sampler, batch_size=B) before dra's wrap, or use sampler.batches(B) as batch_sampler=")
        raise AttributeError(name)

    # -- torch's order and split (the same samples per step as DDP in a fixed world) ---------------
    def order(self) -> np.ndarray:
        epoch = self._native.epoch
        if epoch not in self._orders:
            self._orders = {epoch: _torch_order(self._dataset_size, self._options["shuffle"], self.seed + epoch)}
        return self._orders[epoch]

    def _share(self, cursor: int, world: int, rank: int) -> np.ndarray:
        # Torch's split of a step: rank r takes positions r, r + W, ... of it; the share sizes are
        # the C++ sampler's (earlier ranks take the extra ones), so each rank's gradient weight holds.
        end = min(cursor + self._native.global_batch, self._native.epoch_size)
        return self.order()[np.arange(cursor + rank, end, world)]

    def step_indices(self) -> np.ndarray:
        cursor = self._native.cursor
        return self.order()[cursor:min(cursor + self._native.global_batch, self._native.epoch_size)]

    # -- torch's interface ----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """torch's ``set_epoch``. Followed by the controller: see ``ElasticSampler.set_epoch``."""
        self._torch_epoch = int(epoch)
        if self._controller is not None or self.batch_size is not None:
            super().set_epoch(epoch)
        else:
            self._requested = int(epoch)

    @property
    def num_replicas(self) -> int:
        """The ranks the data is split over now (the world's size when the controller follows)."""
        return int(self._native.world) if self._controller is not None else self._split()[0]

    @property
    def rank(self) -> int:  # type: ignore[override]
        return int(self._native.rank) if self._controller is not None else self._split()[1]

    @property
    def epoch(self) -> int:  # type: ignore[override]
        """The data epoch (the world's, when the controller follows; else the latest set_epoch)."""
        return int(self._native.epoch) if self._controller is not None else self._torch_epoch

    @property
    def num_samples(self) -> int:
        return len(self)

    @property
    def total_size(self) -> int:
        return self._torch_sampler().total_size if self._controller is None else int(self._native.epoch_size)

    def __len__(self) -> int:
        """Samples this rank takes in the epoch: torch's ``num_samples``; followed by the controller,
        this rank's share of a whole data epoch in the world as it is now."""
        if self._controller is None:
            return len(self._torch_sampler())
        native = self._native
        g, w, r = native.global_batch, max(native.world, 1), native.rank
        full, last = divmod(max(int(native.epoch_size), 0), g)
        per_full = g // w + (1 if r < g % w else 0)
        return full * per_full + last // w + (1 if r < last % w else 0)

    def __iter__(self) -> Iterator[int]:
        """torch's iteration: this rank's sample ids for the epoch. Followed by the controller, the
        shares of the steps left in the data epoch for the world now (the DataLoader's batch
        sampler asks step by step instead, following the world as it changes)."""
        if self._controller is None:
            return iter(self._torch_sampler())
        self._check_process()
        native = self._native
        cursors = range(native.cursor, native.epoch_size, native.global_batch)
        return (int(i) for c in cursors for i in self._share(c, native.world, native.rank))

    def _split(self) -> tuple[int, int]:
        """(num_replicas, rank) for torch's split outside the controller: the ones given, else the
        elastic world now (an eval loader in a job), else WORLD_SIZE/RANK."""
        given_world, given_rank = self._fixed
        world, rank = _world_now()
        world = given_world if given_world is not None else world
        rank = given_rank if given_rank is not None else min(rank, world - 1)
        return world, rank

    def _torch_sampler(self) -> Any:
        from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

        world, rank = self._split()
        s = TorchDistributedSampler(self.dataset, num_replicas=world, rank=rank, **self._options)
        s.set_epoch(self._torch_epoch)
        return s

    def _check_trainable(self) -> None:
        """Refuses what cannot be the training sampler, before the controller joins the world."""
        if self._fixed != (None, None):
            raise ValueError("num_replicas/rank: leave them None on the training sampler; the elastic world decides "
                             "both (ctl.world_size, ctl.rank)")
        if len(self._loader_batches) > 1:
            raise ValueError(f"batch_size: this sampler serves DataLoaders with different batch sizes "
                             f"{sorted(self._loader_batches)}; give the training loader a sampler of its own")

    def _follow(self, controller: Any) -> None:
        super()._follow(controller)
        if self._requested is not None:
            self.set_epoch(self._requested)  # set before the controller followed (a restarted job)


def _world_now() -> tuple[int, int]:
    """(size, rank) of the elastic world now (the controller this process follows), else of the
    processes launched (WORLD_SIZE/RANK)."""
    ctl = followed()
    if ctl is not None and ctl.rank >= 0:
        return int(ctl.world_size), int(ctl.rank)
    return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))


def _torch_order(n: int, shuffle: bool, seed: int) -> np.ndarray:
    """torch's DistributedSampler order of an epoch: randperm seeded with seed + epoch."""
    import torch

    if not shuffle:
        return np.arange(n, dtype=np.int64)
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).numpy()


_loader.install(ElasticSampler, DistributedSampler)
