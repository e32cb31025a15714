"""
The device pool's core: inventory, requests, scheduler, leases, scaling.
"""
from __future__ import annotations
import collections.abc
import typing
__all__: list[str] = ['ArbiterConfig', 'ArbiterJob', 'AutoscalerConfig', 'ClusterArbiter', 'CompletionConfig', 'Device', 'GrantOrder', 'Inventory', 'JobEntry', 'Lease', 'LeaseBook', 'MAX_WORKERS', 'MIN_FRACTION', 'Plan', 'ReleaseOrder', 'ReplicaAutoscaler', 'Request', 'ScaleJob', 'Scheduler', 'SchedulerConfig', 'completion_weights', 'plan_sizes', 'priority_names', 'priority_weight']
class Device:
    """
    One device of the pool (a GPU, a MIG instance, a CPU slot).
    """
    id: str
    node: str
    type: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def __repr__(self) -> str:
        ...
    def validate(self) -> None:
        ...
    @property
    def compute(self) -> float:
        ...
    @compute.setter
    def compute(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def enforcement(self) -> str:
        """
        cgroup, cuda_visible_devices, mps or soft.
        """
    @enforcement.setter
    def enforcement(self, arg0: str) -> None:
        ...
    @property
    def group(self) -> int:
        """
        Locality island inside the node (same group = close).
        """
    @group.setter
    def group(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_gb(self) -> float:
        ...
    @memory_gb.setter
    def memory_gb(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class Inventory:
    """
    The pool's devices, in a fixed order.
    """
    @typing.overload
    def __init__(self) -> None:
        ...
    @typing.overload
    def __init__(self, devices: collections.abc.Sequence[Device]) -> None:
        ...
    def __len__(self) -> int:
        ...
    def add(self, device: Device) -> None:
        ...
    def at(self, id: str) -> Device:
        ...
    def contains(self, id: str) -> bool:
        ...
    def max_memory_gb(self, type: str) -> float:
        ...
    def remove_node(self, node: str) -> list[str]:
        """
        Removes a node's devices; returns their ids.
        """
    def types(self) -> list[str]:
        ...
    @property
    def devices(self) -> list[Device]:
        ...
class Request:
    """
    What a workload asks for; validate(inventory) names the field and the fix.
    """
    device_type: str
    elastic: bool
    gang: bool
    job: str
    kind: str
    priority: str
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def priority_level(self) -> int:
        ...
    def validate(self, inventory: Inventory) -> None:
        ...
    @property
    def fraction(self) -> float:
        ...
    @fraction.setter
    def fraction(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_size(self) -> int:
        ...
    @max_size.setter
    def max_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def memory_gb(self) -> float:
        ...
    @memory_gb.setter
    def memory_gb(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_size(self) -> int:
        ...
    @min_size.setter
    def min_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Lease:
    """
    A share of one device held by one worker of one job.
    """
    device: str
    job: str
    state: str
    def __init__(self) -> None:
        ...
    @property
    def granted_at(self) -> float:
        ...
    @granted_at.setter
    def granted_at(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def heartbeat_at(self) -> float:
        ...
    @heartbeat_at.setter
    def heartbeat_at(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def id(self) -> int:
        ...
    @id.setter
    def id(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def share(self) -> float:
        ...
    @share.setter
    def share(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class LeaseBook:
    """
    The leases handed out; ids never repeat.
    """
    def __init__(self) -> None:
        ...
    def __len__(self) -> int:
        ...
    def all(self) -> list[Lease]:
        ...
    def at(self, id: typing.SupportsInt | typing.SupportsIndex) -> Lease:
        ...
    def contains(self, id: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def count(self, job: str, include_releasing: bool = True) -> int:
        ...
    def expired(self, now: typing.SupportsFloat | typing.SupportsIndex, timeout_s: typing.SupportsFloat | typing.SupportsIndex) -> list[int]:
        ...
    def free_share(self, device: str) -> float:
        ...
    def grant(self, inventory: Inventory, job: str, device: str, share: typing.SupportsFloat | typing.SupportsIndex, now: typing.SupportsFloat | typing.SupportsIndex) -> Lease:
        ...
    def heartbeat(self, id: typing.SupportsInt | typing.SupportsIndex, now: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def mark_releasing(self, id: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def of_job(self, job: str) -> list[Lease]:
        ...
    def release(self, id: typing.SupportsInt | typing.SupportsIndex) -> Lease:
        ...
    def restore(self, lease: Lease) -> None:
        ...
    def set_next_id(self, id: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def next_id(self) -> int:
        ...
class JobEntry:
    """
    A job as the scheduler sees it.
    """
    request: Request
    def __init__(self, request: Request, submitted_at: typing.SupportsFloat | typing.SupportsIndex, order: typing.SupportsInt | typing.SupportsIndex, urgent_size: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    @property
    def order(self) -> int:
        ...
    @order.setter
    def order(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def submitted_at(self) -> float:
        ...
    @submitted_at.setter
    def submitted_at(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def urgent_size(self) -> int:
        """
        Inference whose SLO is at risk: the replicas it needs now, served before admission.
        """
    @urgent_size.setter
    def urgent_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class GrantOrder:
    @property
    def device(self) -> str:
        ...
    @property
    def job(self) -> str:
        ...
    @property
    def reason(self) -> str:
        ...
    @property
    def share(self) -> float:
        ...
class ReleaseOrder:
    @property
    def for_job(self) -> str:
        ...
    @property
    def job(self) -> str:
        ...
    @property
    def lease(self) -> int:
        ...
    @property
    def preemption(self) -> bool:
        ...
    @property
    def reason(self) -> str:
        ...
class Plan:
    """
    Grants and releases the scheduler asks for, and the jobs still waiting.
    """
    def empty(self) -> bool:
        ...
    @property
    def grants(self) -> list[GrantOrder]:
        ...
    @property
    def releases(self) -> list[ReleaseOrder]:
        ...
    @property
    def waiting(self) -> list[str]:
        ...
class SchedulerConfig:
    admit_to_request: bool
    preemption: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    @property
    def aging_s(self) -> float:
        ...
    @aging_s.setter
    def aging_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class Scheduler:
    """
    Deterministic placement, admission with priority/aging/preemption, resizing.
    """
    @staticmethod
    def free_shares(inventory: Inventory, book: LeaseBook) -> list[float]:
        ...
    def __init__(self, config: SchedulerConfig = ...) -> None:
        ...
    def admit(self, inventory: Inventory, jobs: collections.abc.Sequence[JobEntry], book: LeaseBook, now: typing.SupportsFloat | typing.SupportsIndex) -> Plan:
        ...
    def effective_priority(self, job: JobEntry, book: LeaseBook, now: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    def place(self, inventory: Inventory, request: Request, n: typing.SupportsInt | typing.SupportsIndex, free: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], near: collections.abc.Sequence[str]) -> list[str]:
        ...
    def resize(self, inventory: Inventory, jobs: collections.abc.Sequence[JobEntry], targets: collections.abc.Mapping[str, typing.SupportsInt | typing.SupportsIndex], book: LeaseBook, now: typing.SupportsFloat | typing.SupportsIndex) -> Plan:
        ...
class AutoscalerConfig:
    """
    Replica autoscaling with a hysteresis band.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    @property
    def down_delay_s(self) -> float:
        ...
    @down_delay_s.setter
    def down_delay_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def down_utilisation(self) -> float:
        ...
    @down_utilisation.setter
    def down_utilisation(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_replicas(self) -> int:
        ...
    @max_replicas.setter
    def max_replicas(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_replicas(self) -> int:
        ...
    @min_replicas.setter
    def min_replicas(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def peak_window_s(self) -> float:
        ...
    @peak_window_s.setter
    def peak_window_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def queue_per_replica(self) -> float:
        ...
    @queue_per_replica.setter
    def queue_per_replica(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def replica_rps(self) -> float:
        ...
    @replica_rps.setter
    def replica_rps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def target_utilisation(self) -> float:
        ...
    @target_utilisation.setter
    def target_utilisation(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def up_utilisation(self) -> float:
        ...
    @up_utilisation.setter
    def up_utilisation(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class ReplicaAutoscaler:
    def __init__(self, config: AutoscalerConfig) -> None:
        ...
    def forget_peaks(self) -> None:
        ...
    def mean_load(self, now: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    def peak_needed(self) -> float:
        ...
    def update(self, now: typing.SupportsFloat | typing.SupportsIndex, rate_rps: typing.SupportsFloat | typing.SupportsIndex, queue: typing.SupportsFloat | typing.SupportsIndex, current: typing.SupportsInt | typing.SupportsIndex, replica_rps: typing.SupportsFloat | typing.SupportsIndex = 0.0, serving: typing.SupportsInt | typing.SupportsIndex = -1) -> int:
        ...
class ScaleJob:
    """
    A running job as the scaler sees it.
    """
    elastic: bool
    job: str
    kind: str
    priority: str
    def __init__(self) -> None:
        ...
    @property
    def change_penalty(self) -> float:
        ...
    @change_penalty.setter
    def change_penalty(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def current(self) -> int:
        ...
    @current.setter
    def current(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_size(self) -> int:
        ...
    @max_size.setter
    def max_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_size(self) -> int:
        ...
    @min_size.setter
    def min_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def remaining_size_s(self) -> float:
        """
        Remaining work in seconds on one worker (the remaining-work estimator); < 0: unknown.
        """
    @remaining_size_s.setter
    def remaining_size_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def replicas_wanted(self) -> int:
        ...
    @replicas_wanted.setter
    def replicas_wanted(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def speedup(self) -> list[float]:
        ...
    @speedup.setter
    def speedup(self, arg0: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
class ArbiterConfig:
    """
    The cluster arbiter's objective (power mean).
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    @property
    def epsilon(self) -> float:
        ...
    @epsilon.setter
    def epsilon(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_moves(self) -> int:
        ...
    @max_moves.setter
    def max_moves(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def p(self) -> float:
        ...
    @p.setter
    def p(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class ArbiterJob:
    def __init__(self) -> None:
        ...
    @property
    def change_penalty(self) -> float:
        ...
    @change_penalty.setter
    def change_penalty(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def current(self) -> int:
        ...
    @current.setter
    def current(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_devices(self) -> int:
        ...
    @min_devices.setter
    def min_devices(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def presence(self) -> float:
        """
        Value of holding any device, added at every k >= 1 and never scaled by the change penalty.
        """
    @presence.setter
    def presence(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def speedup(self) -> list[float]:
        ...
    @speedup.setter
    def speedup(self, arg0: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
class ClusterArbiter:
    """
    include/dra/policy/cluster_arbiter.hpp (the simulator's).
    """
    def __init__(self, config: ArbiterConfig = ...) -> None:
        ...
    def allocate(self, jobs: collections.abc.Sequence[ArbiterJob], capacity: typing.SupportsInt | typing.SupportsIndex) -> list[int]:
        ...
class CompletionConfig:
    """
    How remaining work tilts the arbitration (convergence_aware's).
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def admission(self) -> float:
        """
        Value of holding any device (times the job's weight) under power > 0: waiting jobs start first.
        """
    @admission.setter
    def admission(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def exponent(self) -> float:
        ...
    @exponent.setter
    def exponent(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def power(self) -> float:
        ...
    @power.setter
    def power(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def tilt(self) -> float:
        ...
    @tilt.setter
    def tilt(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
def completion_weights(size: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], exponent: typing.SupportsFloat | typing.SupportsIndex) -> list[float]:
    """
    heSRPT weights by remaining size (largest first gets 1).
    """
def plan_sizes(jobs: collections.abc.Sequence[ScaleJob], capacity: typing.SupportsInt | typing.SupportsIndex, arbiter: ClusterArbiter, completion: CompletionConfig = None) -> dict[str, int]:
    """
    Wanted sizes per job: rigid jobs keep theirs, inference replicas first, the arbiter divides the rest (tilted by remaining work with `completion`).
    """
def priority_names() -> list[str]:
    ...
def priority_weight(priority: str) -> float:
    ...
MAX_WORKERS: int = 1000000
MIN_FRACTION: float = 0.01
