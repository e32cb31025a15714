"""
Test and benchmark bindings (not part of the user API).
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import torch
import typing
__all__: list[str] = ['NcclWorld', 'agree_after_failure', 'bench_engine_step_ns', 'bench_estimator_update_ns', 'bench_policy_decision_ns', 'epoch_order', 'handoff_sources', 'leader_of', 'next_members', 'noop', 'pick_joiners', 'pick_leavers', 'rank_mapping', 'rank_of', 'rank_share', 'read_store_value', 'step_batch', 'store_key_families', 'survivors']
class NcclWorld:
    """
    One process's NCCL world (dra's NCCL backend): rebuild() builds the communicator of an epoch; collectives run on the tensor's current CUDA stream.
    """
    def __init__(self, device: typing.SupportsInt | typing.SupportsIndex, store_host: str = '', store_port: typing.SupportsInt | typing.SupportsIndex = 0, store_server: bool = False, store_workers: typing.SupportsInt | typing.SupportsIndex = 0, timeout_s: typing.SupportsFloat | typing.SupportsIndex = 60.0, prefix: str = 'dra/nccl', capture_log: bool = False) -> None:
        ...
    def abort(self) -> None:
        """
        Abandons in-flight work (ncclCommAbort); never blocks.
        """
    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        ...
    def barrier(self) -> None:
        ...
    def broadcast(self, tensor: torch.Tensor, root: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def close(self) -> None:
        """
        Releases the communicator: finalize -> destroy, abort on failure.
        """
    def rebuild(self, epoch: typing.SupportsInt | typing.SupportsIndex, old_members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], new_members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], self_id: typing.SupportsInt | typing.SupportsIndex, abortive: bool = False, timeout_s: typing.SupportsFloat | typing.SupportsIndex | None = None, collective_timeout_s: typing.SupportsFloat | typing.SupportsIndex | None = None) -> str:
        """
        Builds the communicator of `new_members` for `epoch`; returns the path taken ('fresh_init', 'shrink', 'grow', 'keep' or 'leave'). `collective_timeout_s` bounds every operation afterwards (the watchdog's timeout; default: the rendezvous timeout).
        """
    def recv(self, tensor: torch.Tensor, src: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def send(self, tensor: torch.Tensor, dsts: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        Plain point-to-point: one ncclSend per destination in one group; returns when it completed.
        """
    def transfer_recv(self, tensors: collections.abc.Sequence[torch.Tensor], src: typing.SupportsInt | typing.SupportsIndex, chunk_mb: typing.SupportsFloat | typing.SupportsIndex = 16.0) -> None:
        ...
    def transfer_send(self, tensors: collections.abc.Sequence[torch.Tensor], dsts: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], chunk_mb: typing.SupportsFloat | typing.SupportsIndex = 16.0) -> None:
        """
        The state handoff's transfer (chunked, pipelined on its own stream) of `tensors` to `dsts`.
        """
    @property
    def active(self) -> bool:
        ...
    @property
    def emulated(self) -> bool:
        """
        Whether this is the emulated library (CPU tensors).
        """
    @property
    def epoch(self) -> int:
        ...
    @property
    def last_plan(self) -> dict:
        ...
    @property
    def log(self) -> list[str]:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def runtime_version(self) -> str:
        ...
    @property
    def size(self) -> int:
        ...
def agree_after_failure(host: str, port: typing.SupportsInt | typing.SupportsIndex, job: str, uid: typing.SupportsInt | typing.SupportsIndex, old_members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], holds_state: bool, window_ms: typing.SupportsInt | typing.SupportsIndex, stale_ms: typing.SupportsInt | typing.SupportsIndex) -> str:
    """
    One survivors' agreement after world epoch 1 by uid: 'members ...', 'elsewhere ...' (it holds no state and members that beat never came: it steps out) or 'handled: ...'.
    """
def bench_engine_step_ns(steps: typing.SupportsInt | typing.SupportsIndex = 1000000, decide_every: typing.SupportsInt | typing.SupportsIndex = 10) -> float:
    """
    Nanoseconds per ResizeEngine.step, timed in C++ (benchmark helper).
    """
def bench_estimator_update_ns(updates: typing.SupportsInt | typing.SupportsIndex = 1000000, with_gradients: bool = False) -> float:
    """
    Nanoseconds per ConvergenceEstimator update, timed in C++ (benchmark helper).
    """
def bench_policy_decision_ns(policy: str = 'convergence', decisions: typing.SupportsInt | typing.SupportsIndex = 100000) -> float:
    """
    Nanoseconds per ConstrainedPolicy.decide, timed in C++ (benchmark helper).
    """
def epoch_order(n: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.int64]:
    """
    The deterministic sample order of a data epoch (int64 array).
    """
def handoff_sources(new_members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], joined: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> list[int]:
    """
    New rank of the member that sends the state to each joiner (stayers share the work).
    """
def leader_of(members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> int:
    ...
def next_members(current: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], leave: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], join: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> list[int]:
    """
    Next epoch's members: stayers keep their order, joiners are appended.
    """
def noop() -> None:
    """
    A bare binding call that does nothing: the benchmark baseline for dra.step.
    """
def pick_joiners(members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], candidates: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], target: typing.SupportsInt | typing.SupportsIndex) -> list[int]:
    ...
def pick_leavers(members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], target: typing.SupportsInt | typing.SupportsIndex, prefer: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = []) -> list[int]:
    ...
def rank_mapping(old_members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], new_members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> list[int]:
    ...
def rank_of(members: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], uid: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Rank of uid in members, or -1.
    """
def rank_share(begin: typing.SupportsInt | typing.SupportsIndex, end: typing.SupportsInt | typing.SupportsIndex, world: typing.SupportsInt | typing.SupportsIndex, rank: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int]:
    """
    (begin, end) of one rank's share of a batch.
    """
def read_store_value(host: str, port: typing.SupportsInt | typing.SupportsIndex, job: str, family: str, value: bytes) -> str:
    """
    Writes value into the key of family (under the job prefix) as another client would, runs the protocol's readers of that key: 'read', 'ignored' (warned once) or 'handled: ...' (a dra error the protocol handles); anything else raises (a crash).
    """
def step_batch(cursor: typing.SupportsInt | typing.SupportsIndex, global_batch: typing.SupportsInt | typing.SupportsIndex, epoch_size: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int]:
    """
    (begin, end) of one step's samples.
    """
def store_key_families() -> list[str]:
    """
    The store keys the elastic protocol reads, one per family (the store fuzzer's keys).
    """
def survivors(current: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], alive: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> list[int]:
    ...
