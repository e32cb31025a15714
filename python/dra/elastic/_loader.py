"""torch's DataLoader over dra's elastic samplers: the batch sampler that takes each step's share
from the world as it is when the loader asks, the loader's length during a pass, and (in a job
that accumulates gradients) batches a world change made stale dropped before the loop sees them.
Installed once, at import of dra.elastic (sampler.py calls ``install`` with its classes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dra.elastic._following import followed

#: The sampler classes (dra.elastic.sampler's, given to install: that module imports this one).
_classes: dict[str, Any] = {}


class StepBatches:
    """``sampler.batches(B)``: the per-step shares of a DistributedSampler as a batch sampler."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.batch_size = sampler.batch_size
        self.drop_last = sampler._options["drop_last"]

    def __iter__(self) -> Iterator[list[int]]:
        return _batches(self.sampler, self.batch_size or 1, self.drop_last)

    def __len__(self) -> int:
        return _num_batches(self.sampler, self.batch_size or 1, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


def _batches(sampler: Any, batch_size: int, drop_last: bool) -> Iterator[list[int]]:
    if sampler._controller is not None:
        return (b.tolist() for b in sampler._steps())
    ids = list(sampler)  # outside the controller: torch's per-rank list, batched as torch's BatchSampler does
    stop = len(ids) - len(ids) % batch_size if drop_last else len(ids)
    return (ids[i:i + batch_size] for i in range(0, stop, batch_size))


def _num_batches(sampler: Any, batch_size: int, drop_last: bool) -> int:
    if sampler._controller is not None:
        # During a pass, the steps it began with (as torch's length stays put while a loop runs:
        # `i + 1 == len(loader)` finds the pass's last batch); between passes, the steps left.
        if sampler._pass_steps is not None:
            return sampler._pass_length()
        return _classes["elastic"].__len__(sampler)
    n = len(sampler)
    return n // batch_size if drop_last else -(-n // batch_size)


def install(elastic: type, distributed: type) -> None:
    """torch's DataLoader with ``batch_size=B, sampler=<our DistributedSampler>`` builds a
    ``BatchSampler`` that groups the sampler's ids by B. For the sampler the controller follows,
    each step's share must come from the world as it is when the loader asks (it changes size with
    the world), so a BatchSampler over it takes the shares from the sampler; over anything else it
    is torch's, unchanged. Done once, at import of dra.elastic; so is the loader iterator's part
    (_patch_loader_iterator)."""
    from torch.utils.data import BatchSampler

    _classes.update(elastic=elastic, distributed=distributed)

    if getattr(BatchSampler, "_dra_follows_elastic_samplers", False):
        return
    torch_init, torch_iter, torch_len = BatchSampler.__init__, BatchSampler.__iter__, BatchSampler.__len__

    def __init__(self: Any, sampler: Any, batch_size: int, drop_last: bool) -> None:  # noqa: N807
        torch_init(self, sampler, batch_size, drop_last)
        if isinstance(sampler, _classes["distributed"]):
            sampler._bind_batch(batch_size, drop_last)

    def __iter__(self: Any) -> Iterator[list[int]]:  # noqa: N807
        if isinstance(self.sampler, _classes["distributed"]) and self.sampler._controller is not None:
            return _batches(self.sampler, self.batch_size, self.drop_last)
        return torch_iter(self)

    def __len__(self: Any) -> int:  # noqa: N807
        if isinstance(self.sampler, _classes["distributed"]) and self.sampler._controller is not None:
            return _num_batches(self.sampler, self.batch_size, self.drop_last)
        return torch_len(self)

    BatchSampler.__init__ = __init__
    BatchSampler.__iter__ = __iter__
    BatchSampler.__len__ = __len__
    BatchSampler._dra_follows_elastic_samplers = True
    _patch_loader_iterator()
    _patch_torch_sampler()


def _patch_torch_sampler() -> None:
    """torch's own DistributedSampler (an eval loader's a ported script kept) splits its dataset
    over the ``num_replicas`` it was made with. Once the elastic world has another size, its ranks
    cover part of the dataset (after a shrink from 3 to 2, two thirds of a validation set, every
    epoch, silently) or some of it twice. Said once per sampler as it is iterated in a job;
    dra's DistributedSampler splits over the world as it is."""
    import warnings

    from torch.utils.data.distributed import DistributedSampler

    if getattr(DistributedSampler, "_dra_says_split", False):
        return
    torch_iter = DistributedSampler.__iter__

    def __iter__(self: Any) -> Any:  # noqa: N807
        ctl = followed()
        if (ctl is not None and ctl.is_member and ctl.rank >= 0 and self.num_replicas > 1
                and self.num_replicas != ctl.world_size and not getattr(self, "_dra_said", False)):
            self._dra_said = True
            warnings.warn(
                f"dra: torch's DistributedSampler over {type(self.dataset).__name__} splits it over "
                f"num_replicas={self.num_replicas} processes (this one rank {self.rank}), but the elastic world now has "
                f"{ctl.world_size}: its ranks cover part of the dataset, or some of it twice, and a metric all-reduced "
                "over them is not the whole set's. Use dra.elastic.DistributedSampler (the same arguments), which "
                "splits over the world as it is (docs/guide/elastic.md)", RuntimeWarning, stacklevel=2)
        return torch_iter(self)

    DistributedSampler.__iter__ = __iter__
    DistributedSampler._dra_says_split = True


def _elastic_sampler_of(index_sampler: Any) -> Any:
    """The followed elastic sampler behind a DataLoader's batch sampler, if any: its own, or one a
    few wrappers down (``.sampler``, ``.batch_sampler``: accelerate's BatchSamplerShard over torch's
    BatchSampler over it; ``.dataset._sampler``: Lightning's DistributedSamplerWrapper, which
    Fabric's setup_dataloaders puts over it)."""
    seen, todo = 0, [index_sampler]
    while todo and seen < 8:
        candidate, seen = todo.pop(0), seen + 1
        if isinstance(candidate, _classes["elastic"]) and candidate._controller is not None:
            return candidate
        inner = [getattr(candidate, name, None) for name in ("sampler", "batch_sampler", "_sampler")]
        if hasattr(candidate, "num_replicas"):  # a DistributedSampler over a dataset made of a sampler
            inner.append(getattr(candidate, "dataset", None))
        todo += [c for c in inner if c is not None and c is not candidate]
    return None


def _refuse_own_batching(index_sampler: Any) -> None:
    """A batch sampler of the script's own over the training sampler (a bucketing one: fairseq's,
    ESPnet's, ``group_by_length``) takes the sampler's ids for the world at its pass's start and
    batches them itself: after a world change its batches were trained as fresh ones, samples twice
    and others never, and the ranks parted. Refused at the pass's first batch, naming the fix."""
    from torch.utils.data import BatchSampler

    sampler = _elastic_sampler_of(index_sampler)
    if sampler is not None and type(sampler).__iter__ not in (_classes["elastic"].__iter__,
                                                               _classes["distributed"].__iter__):
        # A subclass's own __iter__ (a filter, a curriculum order, repeat factors) is never called:
        # dra draws each step's share itself. It trained every sample, the filtered ones too.
        raise RuntimeError(
            f"dra: the training sampler's class {type(sampler).__module__}.{type(sampler).__qualname__} overrides "
            "__iter__, which dra never calls: each step's share is drawn from the sampler's order for the world at "
            "that step, so a filter, a reordering or repeats written there would be silently ignored. Filter the "
            "dataset instead (torch.utils.data.Subset of the ids to keep; repeats as repeated ids), or order it "
            "through the sampler's seed and shuffle (docs/guide/compatibility.md, \"Limits of the drop-in\")")
    if sampler is None or index_sampler is sampler or type(index_sampler) is StepBatches:
        return  # dra's own: sampler.batches(B)
    if isinstance(index_sampler, BatchSampler) and type(index_sampler).__iter__ is BatchSampler.__iter__:
        if index_sampler.sampler is sampler:
            return  # torch's, which dra drives step by step
        # An index sampler between torch's BatchSampler and dra's shards dra's share again:
        # Fabric's setup_dataloaders trained half of each rank's share (24 of 48 samples, exit 0)
        # and crashed inside Lightning at the next epoch.
        between = index_sampler.sampler
        what = ("splits what it gets again: each rank would train part of its share, and the rest never"
                if hasattr(between, "num_replicas") else
                "hands its indices on: dra cannot draw each step's share for the world as it is through it")
        raise RuntimeError(
            f"dra: the DataLoader's sampler ({type(between).__module__}.{type(between).__qualname__}) draws from dra's "
            f"training sampler and {what}. Give the DataLoader dra's sampler itself (sampler=, with batch_size=B). "
            "Lightning Fabric: leave "
            "the training DataLoader out of fabric.setup_dataloaders, or call it with use_distributed_sampler=False "
            "(docs/guide/compatibility.md, \"Frameworks\")")
    raise RuntimeError(
        f"dra: the DataLoader's batch sampler ({type(index_sampler).__module__}.{type(index_sampler).__qualname__}) "
        "makes its batches from dra's training sampler itself: they are drawn for the world as it was when its pass "
        "began and cannot follow a world change (after a grow its ranks trained samples twice and others never). "
        "Give the DataLoader dra's sampler with batch_size=B (torch's BatchSampler, which dra drives step by step), "
        "or sampler.batches(B) as batch_sampler=: a batch sampler of your own (bucketing by length) cannot draw from "
        "it, nor can one that shards it again (accelerate's BatchSamplerShard: leave the training DataLoader out of "
        "accelerator.prepare; transformers.Trainer: return that DataLoader from get_train_dataloader) "
        "(docs/guide/compatibility.md, \"Limits of the drop-in\")")


def _patch_loader_iterator() -> None:
    """In a job that accumulates gradients (no_sync), a batch the loader prefetched for a world
    that has changed since, or a padding batch, is dropped before the loop sees it: the loop's
    own counters (``(i + 1) % accum``, ``i + 1 == len(loader)``) then count only batches that
    train, alike on every rank and on a joiner. Without accumulation such batches reach the loop
    and are dropped after their backward (``ctl.batch_dropped``), as before."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    if getattr(_BaseDataLoaderIter, "_dra_drops_stale_batches", False):
        return
    torch_next = _BaseDataLoaderIter.__next__
    torch_next_index = _BaseDataLoaderIter._next_index

    def _next_index(self: Any) -> Any:
        # A rank whose share of a step is empty (the epoch's last step has fewer samples than the
        # world has ranks) still takes part in the step's reduction, weighing zero. torch's fetch
        # cannot load an empty batch (default_collate raises IndexError on []), so the loader loads
        # a batch of the usual size instead: its gradient and loss weigh zero (the weight is the
        # rank's share of the step's samples), so it trains nothing.
        if not getattr(self, "_dra_batching_checked", False):
            self._dra_batching_checked = True
            _refuse_own_batching(getattr(self, "_index_sampler", None))
        index = torch_next_index(self)
        if hasattr(index, "__len__") and len(index) == 0:
            sampler = _elastic_sampler_of(getattr(self, "_index_sampler", None))
            if sampler is not None:
                return sampler._usual_batch().tolist()
        return index

    def __next__(self: Any) -> Any:  # noqa: N807
        while True:
            data = torch_next(self)
            sampler = _elastic_sampler_of(getattr(self, "_index_sampler", None))
            if sampler is None:
                return data
            ctl = sampler._controller
            if ctl is not None and ctl.role == "finished" and (ctl.rank < 0 or ctl.stopped):
                # The job ended while this process stood by (or was stopped): a batch the loader's
                # workers prefetched before the end must not reach the loop, whose forward may hold
                # a collective (a mixture of experts' load-balancing all_reduce failed and the
                # process exited 1 after the job had finished). The pass ends here, as it does
                # without workers.
                raise StopIteration
            if (not getattr(ctl, "_accumulates", False) or sampler._peeked or not ctl.is_member
                    or sampler._current_is_fresh(ctl._micro_fresh)):
                sampler._delivered += 1
                return data
            sampler._consumed(delivered=False)  # stale or padding: never trained, nor seen by the loop

    _BaseDataLoaderIter.__next__ = __next__
    _BaseDataLoaderIter._next_index = _next_index
    _BaseDataLoaderIter._dra_drops_stale_batches = True
