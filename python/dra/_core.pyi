"""Type stubs of dra._core, the compiled core: convergence signals, resize policies, the decision
engine, the elastic world's pure decisions, the simulator and the NCCL backend.

Config classes (EstimatorConfig, Constraints, ...) take keyword arguments only; unknown keywords
and invalid values raise ValueError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

import torch
from numpy import int64
from numpy.typing import NDArray


class DraError(RuntimeError):
    ...


class CommError(DraError):
    ...


class MembershipError(DraError):
    ...


class StateMismatchError(DraError):
    ...


class EstimatorConfig:
    """Settings of the convergence-signal estimator."""
    divergence_factor: float
    divergence_nonfinite_streak: int
    fast_relative_improvement: float
    gns_decay: float
    loss_decay: float
    plateau_exit_t_threshold: float
    plateau_patience: int
    plateau_relative_improvement: float
    plateau_t_threshold: float
    warmup_steps: int
    window: int
    def __init__(self, *, divergence_factor: float = ..., divergence_nonfinite_streak: int = ..., fast_relative_improvement: float = ..., gns_decay: float = ..., loss_decay: float = ..., plateau_exit_t_threshold: float = ..., plateau_patience: int = ..., plateau_relative_improvement: float = ..., plateau_t_threshold: float = ..., warmup_steps: int = ..., window: int = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class ConvergenceSignals:
    """What the estimator knows after its latest update."""
    @property
    def accepted(self) -> int: ...
    @property
    def best_loss(self) -> float: ...
    @property
    def best_smoothed_loss(self) -> float: ...
    @property
    def diverging(self) -> bool: ...
    @property
    def flat_streak(self) -> int: ...
    @property
    def gns(self) -> float:
        """Gradient noise scale B_simple = tr(Sigma)/|G|^2, in samples."""
    @property
    def gns_biased(self) -> bool: ...
    @property
    def gns_valid(self) -> bool: ...
    @property
    def grad_sqr(self) -> float: ...
    @property
    def grad_var(self) -> float: ...
    @property
    def has_validation(self) -> bool: ...
    @property
    def loss(self) -> float: ...
    @property
    def noise(self) -> float: ...
    @property
    def nonfinite_count(self) -> int: ...
    @property
    def nonfinite_streak(self) -> int: ...
    @property
    def nonpositive_count(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def plateau(self) -> bool: ...
    @property
    def progress_rate(self) -> float:
        """Slope of log(loss) per step."""
    @property
    def progress_rate_stderr(self) -> float: ...
    @property
    def relative_improvement(self) -> float: ...
    @property
    def smoothed_loss(self) -> float: ...
    @property
    def step(self) -> int: ...
    @property
    def validation_metric(self) -> float: ...
    def __repr__(self) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


class ConvergenceEstimator:
    """Streaming convergence-signal estimator: O(1), allocation-free per update."""
    @property
    def config(self) -> EstimatorConfig: ...
    @property
    def rejected_steps(self) -> int: ...
    @property
    def signals(self) -> ConvergenceSignals: ...
    def __init__(self, config: EstimatorConfig = ...) -> None: ...
    def update_gradients(self, small_sqr_norm: float, small_batch: float, big_sqr_norm: float, big_batch: float, biased: bool = False) -> bool:
        """Two-batch-size gradient square norms of one step (per-rank mean and all-reduced)."""
    def update_loss(self, step: int, loss: float) -> bool:
        """
        Feed the loss of `step`; returns False when the value was rejected (non-finite or step not increasing).
        """
    def update_validation(self, metric: float) -> bool: ...


class WorldState:
    """The job's world at a step boundary, as the leader sees it."""
    active: list[int]
    base_batch: float
    candidates: list[int]
    global_batch: float
    remaining_steps: int
    size: int
    step: int
    steps_since_resize: int
    def __init__(self) -> None: ...


class Capacity:
    """Devices the job could have now."""
    available: int
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(self, available: int) -> None: ...


class CostModel:
    """Measured resize cost and the horizon a resize must pay back over."""
    horizon_steps: float
    resize_cost_s: float
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(self, resize_cost_s: float, horizon_steps: float = 500.0) -> None: ...


class Decision:
    """A resize decision: target size, who leaves, who joins, batch/LR scale, reason."""
    @property
    def action(self) -> str: ...
    @property
    def batch_scale(self) -> float: ...
    @property
    def join(self) -> list[int]: ...
    @property
    def leave(self) -> list[int]: ...
    @property
    def lr_scale(self) -> float: ...
    @property
    def policy(self) -> str: ...
    @property
    def predicted_speedup(self) -> float: ...
    @property
    def reason(self) -> str: ...
    @property
    def target_size(self) -> int: ...
    def __init__(self) -> None: ...
    def __repr__(self) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


class ThroughputPredictor:
    """Predicts seconds per step for a world size and per-rank batch."""
    def step_time_s(self, world_size: int, per_rank_batch: float) -> float: ...
    def throughput(self, world_size: int, per_rank_batch: float) -> float: ...


class ThroughputModelConfig:
    """Priors and settings of the online throughput model."""
    forgetting: float
    gamma: float
    prior_compute_fixed_s: float
    prior_compute_per_sample_s: float
    prior_sync_fixed_s: float
    prior_sync_per_rank_s: float
    prior_weight: float
    def __init__(self, *, forgetting: float = ..., gamma: float = ..., prior_compute_fixed_s: float = ..., prior_compute_per_sample_s: float = ..., prior_sync_fixed_s: float = ..., prior_sync_per_rank_s: float = ..., prior_weight: float = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class ThroughputModel(ThroughputPredictor):
    """Pollux throughput model fitted online from measured steps."""
    @property
    def observations(self) -> int: ...
    def __init__(self, config: ThroughputModelConfig = ...) -> None: ...
    def compute_time_s(self, per_rank_batch: float) -> float: ...
    def observe(self, world_size: int, per_rank_batch: float, step_time_s: float, sync_time_s: float) -> bool: ...
    def sync_time_s(self, world_size: int) -> float: ...


class Policy:
    """A resize policy (wrap it in ConstrainedPolicy to decide)."""
    @property
    def name(self) -> str: ...


class GoodputConfig:
    """Settings of the goodput policy."""
    adapt_batch: bool
    max_per_rank_batch: float
    min_marginal_efficiency: float
    min_per_rank_batch: float
    def __init__(self, *, adapt_batch: bool = ..., max_per_rank_batch: float = ..., min_marginal_efficiency: float = ..., min_per_rank_batch: float = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class GoodputPolicy(Policy):
    """Pollux-style: the size maximising throughput x statistical efficiency."""
    def __init__(self, config: GoodputConfig = ...) -> None: ...


class ConvergencePhaseConfig:
    """Settings of the convergence-phase policy."""
    grow_step: int
    min_parallel_efficiency: float
    plateau_size: int
    def __init__(self, *, grow_step: int = ..., min_parallel_efficiency: float = ..., plateau_size: int = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class ConvergencePhasePolicy(Policy):
    """Grow while learning is fast and scaling efficient; release on plateau; hold otherwise."""
    def __init__(self, config: ConvergencePhaseConfig = ...) -> None: ...


class Constraints:
    """Limits around any policy: sizes, cooldown, hysteresis, amortisation."""
    allowed_sizes: list[int]
    amortise: bool
    cooldown_steps: int
    hysteresis_decisions: int
    max_change: int
    max_size: int
    min_size: int
    def __init__(self, *, allowed_sizes: list[int] = ..., amortise: bool = ..., cooldown_steps: int = ..., hysteresis_decisions: int = ..., max_change: int = ..., max_size: int = ..., min_size: int = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def allows(self, size: int) -> bool: ...
    def validate(self) -> None: ...


class ConstrainedPolicy:
    """A policy inside constraints: the object that decides."""
    def __init__(self, policy: Policy, constraints: Constraints = ...) -> None: ...
    def decide(self, signals: ConvergenceSignals, world: WorldState, capacity: Capacity, costs: CostModel, throughput: ThroughputPredictor) -> Decision: ...


class StepStatus:
    """Result of one engine step (a view, valid until the next step)."""
    @property
    def decided(self) -> bool: ...
    @property
    def decisions(self) -> int: ...
    @property
    def last_decision(self) -> Decision: ...
    @property
    def step(self) -> int: ...


class EngineConfig:
    """Estimator, throughput model, policy and constraints of one job."""
    convergence: ConvergencePhaseConfig
    costs: CostModel
    decide_every: int
    estimator: EstimatorConfig
    goodput: GoodputConfig
    limits: Constraints
    policy: str
    throughput: ThroughputModelConfig
    def __init__(self, *, convergence: ConvergencePhaseConfig = ..., costs: CostModel = ..., decide_every: int = ..., estimator: EstimatorConfig = ..., goodput: GoodputConfig = ..., limits: Constraints = ..., policy: str = ..., throughput: ThroughputModelConfig = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class ResizeEngine:
    """Per-job decision engine fed once per step."""
    @property
    def capacity(self) -> Capacity: ...
    @property
    def config(self) -> EngineConfig: ...
    @property
    def costs(self) -> CostModel: ...
    @property
    def estimator(self) -> ConvergenceEstimator: ...
    @property
    def last_step(self) -> int:
        """Step index of the latest step, -1 before the first."""
    @property
    def signals(self) -> ConvergenceSignals: ...
    @property
    def status(self) -> StepStatus: ...
    @property
    def throughput(self) -> ThroughputModel: ...
    @property
    def world(self) -> WorldState: ...
    def __init__(self, config: EngineConfig) -> None: ...
    def _advance(self, loss: float) -> int:
        """
        One step at the next index, returning the non-finite streak (0: the loss was accepted; 1: a streak of non-finite losses starts, warn once). Returns a plain int, so no view object is built.
        """
    def decide(self) -> Decision: ...
    def resized(self, new_size: int, new_global_batch: float) -> None: ...
    def step(self, step: int, loss: float) -> StepStatus: ...


class SimProfiles:
    """Measured application profiles (a traces/ directory) for the simulator."""
    def __init__(self, traces_dir: str) -> None: ...
    def best_metric(self, application: str, batch: float, epochs: int) -> float:
        """Best validation metric over the first `epochs` epochs at total batch `batch`."""
    def grad_stats(self, application: str, batch: float, epoch: int) -> tuple[float, float]: ...
    def info(self, application: str) -> dict[str, Any]: ...
    def names(self) -> list[str]: ...
    def progress_at(self, application: str, epoch: int) -> float: ...
    def throughput(self, application: str, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time) interpolated at a placement (devices per node) and local batch."""


class NcclWorld:
    """
    One process's NCCL world (dra's NCCL backend): rebuild() builds the communicator of an epoch; collectives run on the tensor's current CUDA stream.
    """
    @property
    def active(self) -> bool: ...
    @property
    def epoch(self) -> int: ...
    @property
    def last_plan(self) -> dict[str, Any]: ...
    @property
    def log(self) -> list[str]: ...
    @property
    def rank(self) -> int: ...
    @property
    def runtime_version(self) -> str: ...
    @property
    def size(self) -> int: ...
    def __init__(self, device: int, store_host: str = '', store_port: int = 0, store_server: bool = False, store_workers: int = 0, timeout_s: float = 60.0, prefix: str = 'dra/nccl', capture_log: bool = False) -> None: ...
    def abort(self) -> None:
        """Abandons in-flight work (ncclCommAbort); never blocks."""
    def all_reduce_sum(self, tensor: torch.Tensor) -> None: ...
    def barrier(self) -> None: ...
    def broadcast(self, tensor: torch.Tensor, root: int) -> None: ...
    def close(self) -> None:
        """Releases the communicator: finalize -> destroy, abort on failure."""
    def rebuild(self, epoch: int, old_members: Sequence[int], new_members: Sequence[int], self_id: int, abortive: bool = False, timeout_s: float | None = None) -> str:
        """
        Builds the communicator of `new_members` for `epoch`; returns the path taken ('fresh_init', 'shrink', 'grow', 'keep' or 'leave').
        """


def _bench_engine_step_ns(steps: int = 1000000, decide_every: int = 10) -> float:
    """Nanoseconds per ResizeEngine.step, timed in C++ (benchmark helper)."""


def _bench_estimator_update_ns(updates: int = 1000000, with_gradients: bool = False) -> float:
    """Nanoseconds per ConvergenceEstimator update, timed in C++ (benchmark helper)."""


def _bench_policy_decision_ns(policy: str = 'convergence', decisions: int = 100000) -> float:
    """Nanoseconds per ConstrainedPolicy.decide, timed in C++ (benchmark helper)."""


def _build_info() -> dict[str, Any]: ...


def _nccl_load_error() -> str:
    """Why libnccl could not be loaded ('' when it loaded)."""


def _nccl_runtime_version() -> Any:
    """Version of the libnccl the NCCL backend loads (dlopen on first use), or None when none loads."""


def _noop() -> None:
    """A bare binding call that does nothing: the benchmark baseline for dra.step."""


def _set_step_target(
    slow: Callable[..., Any], warn: Callable[[float, int], None], engine: ResizeEngine | None, status: Any
) -> None:
    """Internal: where dra.step goes (set by dra.reset / dra.default_controller)."""


def _step(loss: float | torch.Tensor, **signals: Any) -> Any:
    """The C function behind ``dra.step`` (returns ``dra.StepStatus``); see ``dra.step``."""


def adascale_gain(noise_scale: float, valid: bool, global_batch: float, base_batch: float) -> float:
    """AdaScale learning-rate gain for global batch M."""


def sim_read_workload(path: str, profiles: SimProfiles | None = None) -> list[Any]:
    """
    Reads a workload CSV (name,time,application,num_replicas,batch_size) into job dicts; errors name file, line, column.
    """


def sim_run(profiles: SimProfiles, jobs: list[Any], policy: str, reallocation_cost_s: float = 30.0, interval_s: float = 60.0, nodes: int = 16, devices_per_node: int = 4, quota_scale: float = 0.0, record_timeline: bool = True, exploration_limit: bool = False, progress: Callable[[float, int, int], bool] | None = None) -> dict[str, Any]:
    """Simulates jobs (dicts as from sim_read_workload) on a cluster under one policy; returns a result dict."""


def sim_study(profiles: SimProfiles, pool: list[Any], runs: int, seed: int, policies: Sequence[str], reallocation_cost_s: float = 1.0, quota_scale: float = 2.0, interval_s: float = 60.0, noise: bool = True, progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """Generates `runs` jobs from the request pool (seeded) and simulates each alone under every policy."""


def statistical_efficiency(noise_scale: float, valid: bool, global_batch: float, base_batch: float) -> float:
    """(B + M0) / (B + M): efficiency of global batch M relative to M0."""


class _ElasticSampler:
    """Exactly-once sample order over a changing world (C++ ``elastic_sampler``)."""
    def __init__(self, dataset_size: int, global_batch: int, seed: int = 0, drop_last: bool = False) -> None: ...
    dataset_size: int
    global_batch: int
    seed: int
    drop_last: bool
    epoch: int
    cursor: int
    world: int
    rank: int
    epoch_size: int
    exhausted: bool
    steps_left: int
    def step_range(self) -> tuple[int, int]: ...
    def share_range(self) -> tuple[int, int]: ...
    def order(self) -> NDArray[int64]: ...
    def indices(self) -> NDArray[int64]: ...
    def step_indices(self) -> NDArray[int64]: ...
    def set_world(self, world: int, rank: int) -> None: ...
    def commit(self) -> None: ...
    def next_epoch(self) -> None: ...
    def position(self) -> dict[str, int]: ...
    def set_position(self, epoch: int, cursor: int, global_batch: int, seed: int) -> None: ...


class _ElasticStateProvider:
    """Base of a state provider written in Python: subclasses implement signature(), collect(),
    prepare(manifest), load(manifest, tensors) and scale_learning_rate(factor)."""
    def __init__(self) -> None: ...


class _ElasticStepResult:
    committed: bool
    step: int
    loss: float
    event: str
    exit_requested: bool


class _ElasticController:
    """The elastic controller (C++ ``dra::elastic::controller``): the whole protocol of an elastic world."""
    def __init__(self, engine: EngineConfig, state: _ElasticStateProvider, sampler: _ElasticSampler, *,
                 start_size: int = -1, release: str = "standby", batch_mode: str = "fixed", decide_every: int = 10,
                 schedule: dict[int, int] = ..., fault_timeout_s: float = 3.0, store_timeout_s: float = 30.0,
                 chunk_mb: float = 16.0, verify: bool = False, events_path: str = "", status_every: int = 0,
                 max_resize_retries: int = 3, config_fingerprint: str = "",
                 phase_hook: Callable[[Any, str], None] | None = None, store_host: str | None = None,
                 store_port: int | None = None, join: bool | None = None, host_store: bool | None = None) -> None: ...
    def reduce_gradients(self, params: Sequence[Any]) -> bool: ...
    def step(self, loss: float) -> _ElasticStepResult: ...
    def next_epoch(self, num_epochs: int) -> bool: ...
    def finish(self) -> None: ...
    def registered_candidates(self) -> list[int]: ...
    def state_digest(self) -> int: ...
    role: str
    is_member: bool
    failed: bool
    uid: int
    rank: int
    world_size: int
    epoch: int
    step_index: int
    resizes: int
    universe_size: int
    start_size: int
    members: list[int]
    last_digest: int | None
    last_event: str
    events: list[str]
    last_loss: float
    store_address: str
    num_epochs: int
    engine: ResizeEngine


class _ElasticModule:
    """Membership and data-partition decisions of the elastic world (the ``elastic`` submodule),
    and the elastic controller itself."""
    Sampler: type[_ElasticSampler]
    StateProvider: type[_ElasticStateProvider]
    StepResult: type[_ElasticStepResult]
    Controller: type[_ElasticController]
    @staticmethod
    def handoff_sources(new_members: Sequence[int], joined: Sequence[int]) -> list[int]:
        """New rank of the member that sends the state to each joiner (stayers share the work)."""
    @staticmethod
    def signature_mismatch(world: Sequence[Any], joiner: Sequence[Any]) -> str | None:
        """First difference between two model signatures, or None."""
    @staticmethod
    def epoch_order(n: int, seed: int, epoch: int) -> NDArray[int64]:
        """The deterministic sample order of a data epoch (int64 array)."""
    @staticmethod
    def leader_of(members: Sequence[int]) -> int: ...
    @staticmethod
    def next_members(current: Sequence[int], leave: Sequence[int], join: Sequence[int]) -> list[int]:
        """Next epoch's members: stayers keep their order, joiners are appended."""
    @staticmethod
    def pick_joiners(members: Sequence[int], candidates: Sequence[int], target: int) -> list[int]: ...
    @staticmethod
    def pick_leavers(members: Sequence[int], target: int) -> list[int]: ...
    @staticmethod
    def rank_mapping(old_members: Sequence[int], new_members: Sequence[int]) -> list[int]: ...
    @staticmethod
    def rank_of(members: Sequence[int], uid: int) -> int:
        """Rank of uid in members, or -1."""
    @staticmethod
    def rank_share(begin: int, end: int, world: int, rank: int) -> tuple[int, int]:
        """(begin, end) of one rank's share of a batch."""
    @staticmethod
    def step_batch(cursor: int, global_batch: int, epoch_size: int) -> tuple[int, int]:
        """(begin, end) of one step's samples."""
    @staticmethod
    def survivors(current: Sequence[int], alive: Sequence[int]) -> list[int]: ...


elastic: _ElasticModule
_nccl_compiled: bool
sim_in_place_resize_cost_stand_in_s: float
sim_policy_names: list[str]


# ---- issue 12: RL stage balance and pipeline simulator (python/rl_py.cpp) -----------------------

class QuantileSketchConfig:
    """Relative accuracy, value range and half-life of a quantile sketch."""
    half_life: float
    max_value: float
    min_value: float
    relative_accuracy: float
    def __init__(self, *, half_life: float = ..., max_value: float = ..., min_value: float = ..., relative_accuracy: float = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class QuantileSketch:
    """Streaming quantiles with exponential forgetting (log-spaced bins, DDSketch-style)."""
    def __init__(self, config: QuantileSketchConfig = ...) -> None: ...
    def add(self, value: float) -> None: ...
    def quantile(self, q: float) -> float: ...
    def expected_max_of(self, n: float) -> float:
        """Median of the longest of n draws: the quantile 0.5^(1/n)."""
    @property
    def mean(self) -> float: ...
    @property
    def second_moment(self) -> float: ...
    @property
    def effective_count(self) -> float: ...
    @property
    def observations(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def clamped(self) -> int: ...


class GenerationModelConfig:
    """Decode slots and priors of the generation model."""
    forgetting: float
    max_concurrency: int
    prior_iteration_fixed_s: float
    prior_iteration_per_kilotoken_s: float
    prior_iteration_per_sequence_s: float
    prior_weight: float
    def __init__(self, *, forgetting: float = ..., max_concurrency: int = ..., prior_iteration_fixed_s: float = ..., prior_iteration_per_kilotoken_s: float = ..., prior_iteration_per_sequence_s: float = ..., prior_weight: float = ...) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class StageBalanceConfig:
    """Devices, role minimums, pipeline, cooldown, hysteresis and payback of the stage-balance policy."""
    cooldown_steps: int
    devices: int
    generation: GenerationModelConfig
    hysteresis_decisions: int
    lengths: QuantileSketchConfig
    max_move: int
    max_payback_steps: float
    min_relative_gain: float
    min_rollout: int
    min_train: int
    pipeline: str
    prior_switch_cost_s: float
    switch_cost_smoothing: float
    training: ThroughputModelConfig
    weight_sync_smoothing: float
    def __init__(self, **options: Any) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class StageBalancePolicy:
    """How many devices generate and how many train, and when moving one pays (RL post-training)."""
    def __init__(self, config: StageBalanceConfig = ...) -> None: ...
    @property
    def config(self) -> StageBalanceConfig: ...
    def observe_generation(self, prompt_tokens: float, generated_tokens: float) -> None:
        """One finished generation."""
    def observe_decode(self, concurrency: int, context_tokens: float, iterations: float, seconds: float) -> bool:
        """Measured decode iterations of one rollout device; False when ignored."""
    def observe_train(self, devices: int, tokens_per_device: float, step_s: float, sync_s: float) -> bool:
        """One measured training step; False when ignored."""
    def observe_weight_sync(self, seconds: float) -> None: ...
    def observe_switch(self, direction: str, exposed_s: float) -> None:
        """A measured switch: the seconds it lengthened its step."""
    def switch_cost_s(self, direction: str) -> float: ...
    def predict(self, rollout: int, sequences: int) -> dict[str, Any]: ...
    def predict_all(self, sequences: int) -> list[dict[str, Any]]: ...
    def decide(self, rollout: int, train: int, step: int, steps_since_switch: int, remaining_steps: int = ..., sequences_per_step: int = ...) -> dict[str, Any]:
        """One decision at a step boundary (feed every one, in order)."""
    @property
    def lengths(self) -> QuantileSketch: ...
    @property
    def weight_sync_s(self) -> float: ...
    @property
    def generation_fit(self) -> dict[str, float]: ...


class RlWorkload:
    """Steps, batch, prompt tokens, length scale/drift/limit and seed of a simulated RL run."""
    drift_final_scale: float
    group_size: int
    length_scale: float
    max_generation_tokens: float
    prompt_tokens: float
    prompts_per_step: int
    seed: int
    steps: int
    def __init__(self, **options: Any) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


class RlCostModel:
    """The RL simulator's ground-truth costs (seconds)."""
    colocated_switch_s: float
    decode_fixed_s: float
    decode_per_kilotoken_s: float
    decode_per_sequence_s: float
    max_concurrency: int
    rollout_start_s: float
    switch_agree_s: float
    switch_optimizer_s: float
    switch_rebuild_s: float
    switch_weights_s: float
    sync_fixed_s: float
    sync_per_rank_s: float
    train_fixed_s: float
    train_per_token_s: float
    weight_sync_s: float
    def __init__(self, **options: Any) -> None:
        """Keyword construction; unknown keywords and invalid values raise ValueError."""
    def validate(self) -> None: ...


def rl_read_lengths(path: str, column: str = ...) -> list[float]:
    """One numeric column of a CSV (default: the Azure trace's GeneratedTokens); errors name file, line and column."""


def rl_sim_sweep(lengths: Sequence[float], source: str, devices: int = ..., pipeline: str = ..., workload: RlWorkload = ..., costs: RlCostModel = ..., policy: StageBalanceConfig = ..., initial_rollout: int = ..., progress: Callable[[int, int], None] | None = ...) -> dict[str, Any]:
    """Every static split, the stage-balance policy, the per-phase oracle and colocated time sharing on the same lengths."""

# ---- end issue 12 -----------------------------------------------------------------------------------
