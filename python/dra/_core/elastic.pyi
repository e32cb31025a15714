"""
The exactly-once sampler and the state provider of the elastic world.
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['Sampler', 'StateProvider', 'signature_mismatch']
class Sampler:
    """
    Exactly-once sample order over a changing world (C++).
    """
    def __init__(self, dataset_size: typing.SupportsInt | typing.SupportsIndex, global_batch: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex = 0, drop_last: bool = False, shuffle: bool = True) -> None:
        ...
    def commit(self) -> None:
        ...
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
def signature_mismatch(world: collections.abc.Sequence[tuple[str, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], str]], joiner: collections.abc.Sequence[tuple[str, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], str]]) -> typing.Any:
    """
    First difference between two model signatures, or None.
    """
