"""
The exactly-once sampler and the state provider of the elastic world.
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['JobControl', 'LATE_UID_BASE', 'Sampler', 'StateProvider', 'signature_mismatch']
class Sampler:
    """
    Exactly-once sample order over a changing world (C++).
    """
    def __init__(self, dataset_size: typing.SupportsInt | typing.SupportsIndex, global_batch: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex = 0, drop_last: bool = False, shuffle: bool = True) -> None:
        ...
    def commit(self, steps: typing.SupportsInt | typing.SupportsIndex = 1) -> None:
        """
        The current step's samples are consumed (steps: that many consecutive steps, accumulated batches).
        """
    def indices(self) -> numpy.typing.NDArray[numpy.int64]:
        ...
    def indices_at(self, cursor: typing.SupportsInt | typing.SupportsIndex, world: typing.SupportsInt | typing.SupportsIndex, rank: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.int64]:
        """
        A rank's sample ids for the step starting at cursor.
        """
    def next_epoch(self) -> None:
        ...
    def order(self) -> numpy.typing.NDArray[numpy.int64]:
        ...
    def position(self) -> dict:
        ...
    def set_position(self, epoch: typing.SupportsInt | typing.SupportsIndex, cursor: typing.SupportsInt | typing.SupportsIndex, global_batch: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def set_world(self, world: typing.SupportsInt | typing.SupportsIndex, rank: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def share_range(self) -> tuple[int, int]:
        ...
    def step_indices(self) -> numpy.typing.NDArray[numpy.int64]:
        ...
    def step_range(self) -> tuple[int, int]:
        ...
    @property
    def cursor(self) -> int:
        ...
    @property
    def dataset_size(self) -> int:
        ...
    @property
    def drop_last(self) -> bool:
        ...
    @property
    def epoch(self) -> int:
        ...
    @property
    def epoch_size(self) -> int:
        ...
    @property
    def exhausted(self) -> bool:
        ...
    @property
    def global_batch(self) -> int:
        ...
    @global_batch.setter
    def global_batch(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def seed(self) -> int:
        ...
    @property
    def shuffle(self) -> bool:
        ...
    @property
    def steps_left(self) -> int:
        ...
    @property
    def world(self) -> int:
        ...
class StateProvider:
    """
    Base of a state provider written in Python (signature, collect, prepare, load, scale_learning_rate).
    """
    def __init__(self) -> None:
        ...
class JobControl:
    """
    An outside actor's handle on a running elastic job (a launcher, a device pool, an RL coordinator): the store keys of the contract (docs/guide/elastic.md, "Driving a job from outside"), written and read in one place.
    """
    def __init__(self, address: str, job: str, restart: typing.SupportsInt | typing.SupportsIndex = 0, timeout_s: typing.SupportsFloat | typing.SupportsIndex = 30.0) -> None:
        """
        Connects to the job's store at host:port; keys under dra/<job>/<restart>.
        """
    def checked_in(self, uid: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        Whether process `uid` checked in (its options are in the store): a founding process that exits before it did leaves the others waiting for it.
        """
    def claim_late_uid(self) -> int:
        """
        A late joiner's uid (start it with DRA_JOIN=1 and DRA_JOIN_UID).
        """
    def done(self) -> bool:
        """
        Whether the job finished.
        """
    def final_members(self) -> list[int] | None:
        """
        The uids of the world that finished the job (a list), or None while it runs.
        """
    def report(self) -> typing.Any:
        """
        The leader's latest report (a dict), or None before the first.
        """
    def set_capacity(self, min_size: typing.SupportsInt | typing.SupportsIndex, max_size: typing.SupportsInt | typing.SupportsIndex, leave: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = []) -> None:
        """
        The job's size bounds (0: none) and the uids that must leave now.
        """
    def started(self) -> bool:
        """
        Whether the job's processes formed their dra world (a dra job, which survives a worker's death).
        """
    def stopped_at(self) -> int | None:
        """
        The step at which a stop request ended the job's training (an int), or None.
        """
    @property
    def address(self) -> str:
        ...
    @property
    def prefix(self) -> str:
        ...
def signature_mismatch(world: collections.abc.Sequence[tuple[str, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], str]], joiner: collections.abc.Sequence[tuple[str, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], str]]) -> typing.Any:
    """
    First difference between two model signatures, or None.
    """
LATE_UID_BASE: int = 10000
