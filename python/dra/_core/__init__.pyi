"""
dra's compiled core: signals, policies, the decision engine, the controller (the simulator is dra._sim).
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import torch
import typing
from . import elastic
from . import comm
from . import _testing
from . import pool
__all__: list[str] = ['BuildInfo', 'Capacity', 'CommError', 'ConstrainedPolicy', 'Constraints', 'Controller', 'ConvergenceAwareConfig', 'ConvergenceAwarePolicy', 'ConvergenceEstimator', 'ConvergencePhaseConfig', 'ConvergencePhasePolicy', 'ConvergenceSignals', 'CostModel', 'Decision', 'DeviceReadStats', 'DraError', 'EnergyChoice', 'EnergyInterval', 'EnergyMeter', 'EnergyObjective', 'EnergyPolicyConfig', 'EngineConfig', 'EngineStatus', 'EstimatorConfig', 'GenerationModel', 'GenerationModelConfig', 'GoodputConfig', 'GoodputPolicy', 'GradientCodec', 'HandoffStats', 'KnobSetting', 'MembershipError', 'Options', 'Policy', 'ProcessEnergy', 'QuantileSketch', 'QuantileSketchConfig', 'ReasoningLengths', 'RemainingWorkConfig', 'RemainingWorkEstimator', 'ResizeEngine', 'RiglMasks', 'RlCostModel', 'RlPhase', 'RlRoleSample', 'RlRun', 'RlSweep', 'RlSwitch', 'RlSwitchCostSplit', 'RlWorkload', 'StageBalanceConfig', 'StageBalancePolicy', 'StageDecision', 'StagePrediction', 'StateMismatchError', 'StepStatus', 'ThroughputModel', 'ThroughputModelConfig', 'ThroughputPredictor', 'WindowDecision', 'WorkEstimate', 'WorldState', 'adascale_gain', 'choose_setting', 'comm', 'cubic_sparsity', 'elastic', 'gittins_size', 'make_codec', 'next_sparsity', 'policy_registry', 'policy_sections', 'pool', 'process_cpu_seconds', 'rank_for_noise_scale', 'rigl_tie_seed', 'rigl_update', 'rigl_update_fraction', 'rl_draw_lengths', 'rl_read_lengths', 'rl_sim_events', 'rl_sim_sweep', 'statistical_efficiency', 'step']
class DraError(RuntimeError):
    """
    Base of every runtime failure raised by dra itself (a RuntimeError).
    """
class CommError(DraError):
    pass
class MembershipError(DraError):
    pass
class StateMismatchError(DraError):
    pass
class EstimatorConfig:
    """
    Settings of the convergence-signal estimator.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def divergence_factor(self) -> float:
        """
        Smoothed loss above this multiple of the best means diverging.
        """
    @divergence_factor.setter
    def divergence_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def divergence_nonfinite_streak(self) -> int:
        """
        Non-finite losses in a row that mean diverging.
        """
    @divergence_nonfinite_streak.setter
    def divergence_nonfinite_streak(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def fast_relative_improvement(self) -> float:
        """
        Improvement per window at or above which learning is 'fast'.
        """
    @fast_relative_improvement.setter
    def fast_relative_improvement(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def gns_decay(self) -> float:
        """
        EMA decay of the gradient-noise-scale moments.
        """
    @gns_decay.setter
    def gns_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def loss_decay(self) -> float:
        """
        EMA decay of the smoothed loss, in [0, 1).
        """
    @loss_decay.setter
    def loss_decay(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def outlier_factor(self) -> float:
        """
        A loss above this multiple of the smoothed loss enters the state clipped to it (robust update).
        """
    @outlier_factor.setter
    def outlier_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_exit_t_threshold(self) -> float:
        """
        Once on a plateau, it clears only when the slope is below -t * stderr (stricter than entry).
        """
    @plateau_exit_t_threshold.setter
    def plateau_exit_t_threshold(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_history_fraction(self) -> float:
        """
        Plateau also needs the loss to have improved by less than plateau_history_improvement since this fraction of the current step (default 0.25; 0: off, the windowed test alone).
        """
    @plateau_history_fraction.setter
    def plateau_history_fraction(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_history_improvement(self) -> float:
        """
        Relative improvement since plateau_history_fraction x step below which learning has stalled.
        """
    @plateau_history_improvement.setter
    def plateau_history_improvement(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_patience(self) -> int:
        """
        Flat updates in a row before plateau.
        """
    @plateau_patience.setter
    def plateau_patience(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_relative_improvement(self) -> float:
        """
        A window improving log-loss by less than this fraction counts as flat.
        """
    @plateau_relative_improvement.setter
    def plateau_relative_improvement(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_t_threshold(self) -> float:
        """
        A slope not below -t * stderr counts as flat.
        """
    @plateau_t_threshold.setter
    def plateau_t_threshold(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def spike_floor(self) -> float:
        """
        The least residual deviation (log-loss) the spike guard measures jumps against.
        """
    @spike_floor.setter
    def spike_floor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def spike_sigma(self) -> float:
        """
        A log-loss more than this many residual deviations (at least spike_floor) above the fitted trend enters the regression clipped to that bound (0: off).
        """
    @spike_sigma.setter
    def spike_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def warmup_steps(self) -> int:
        """
        Updates reported as warm-up.
        """
    @warmup_steps.setter
    def warmup_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def window(self) -> int:
        """
        Steps in the least-squares window of the progress rate.
        """
    @window.setter
    def window(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class ConvergenceSignals:
    """
    What the estimator knows after its latest update.
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def accepted(self) -> int:
        ...
    @property
    def best_loss(self) -> float:
        ...
    @property
    def best_smoothed_loss(self) -> float:
        ...
    @property
    def diverging(self) -> bool:
        ...
    @property
    def flat_streak(self) -> int:
        ...
    @property
    def gns(self) -> float:
        """
        Gradient noise scale B_simple = tr(Sigma)/|G|^2, in samples.
        """
    @property
    def gns_biased(self) -> bool:
        ...
    @property
    def gns_valid(self) -> bool:
        ...
    @property
    def grad_sqr(self) -> float:
        ...
    @property
    def grad_var(self) -> float:
        ...
    @property
    def has_validation(self) -> bool:
        ...
    @property
    def loss(self) -> float:
        ...
    @property
    def noise(self) -> float:
        ...
    @property
    def nonfinite_count(self) -> int:
        ...
    @property
    def nonfinite_streak(self) -> int:
        ...
    @property
    def nonpositive_count(self) -> int:
        ...
    @property
    def outlier_count(self) -> int:
        """
        Losses clipped to outlier_factor x the smoothed loss by the robust update.
        """
    @property
    def phase(self) -> str:
        ...
    @property
    def plateau(self) -> bool:
        ...
    @property
    def progress_rate(self) -> float:
        """
        Slope of log(loss) per step.
        """
    @property
    def progress_rate_stderr(self) -> float:
        ...
    @property
    def relative_improvement(self) -> float:
        ...
    @property
    def smoothed_loss(self) -> float:
        ...
    @property
    def spike_count(self) -> int:
        """
        Log-losses clipped to the trend's spike bound (spike_sigma) before the regression.
        """
    @property
    def step(self) -> int:
        ...
    @property
    def validation_metric(self) -> float:
        ...
class ConvergenceEstimator:
    """
    Streaming convergence-signal estimator: O(1), allocation-free per update.
    """
    def __init__(self, config: EstimatorConfig = ...) -> None:
        ...
    def update_gradients(self, small_sqr_norm: typing.SupportsFloat | typing.SupportsIndex, small_batch: typing.SupportsFloat | typing.SupportsIndex, big_sqr_norm: typing.SupportsFloat | typing.SupportsIndex, big_batch: typing.SupportsFloat | typing.SupportsIndex, biased: bool = False) -> bool:
        """
        Two-batch-size gradient square norms of one step (per-rank mean and all-reduced).
        """
    def update_loss(self, step: typing.SupportsInt | typing.SupportsIndex, loss: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        """
        Feed the loss of `step`; returns False when the value was rejected (non-finite or step not increasing).
        """
    def update_validation(self, metric: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        ...
    @property
    def config(self) -> EstimatorConfig:
        ...
    @property
    def rejected_steps(self) -> int:
        ...
    @property
    def signals(self) -> ConvergenceSignals:
        ...
class RemainingWorkConfig:
    """
    Settings of the remaining-work estimator.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def curve_sigma(self) -> float:
        ...
    @curve_sigma.setter
    def curve_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def declared_sigma(self) -> float:
        ...
    @declared_sigma.setter
    def declared_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_class_jobs(self) -> int:
        ...
    @min_class_jobs.setter
    def min_class_jobs(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_curve_points(self) -> int:
        ...
    @min_curve_points.setter
    def min_curve_points(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_sigma(self) -> float:
        ...
    @min_sigma.setter
    def min_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_count(self) -> float:
        ...
    @prior_count.setter
    def prior_count(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def tail_quantile(self) -> float:
        ...
    @tail_quantile.setter
    def tail_quantile(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def uninformed_sigma(self) -> float:
        ...
    @uninformed_sigma.setter
    def uninformed_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class WorkEstimate:
    """
    Remaining work as a distribution (the unit of the observations).
    """
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def beyond_cap(self) -> float:
        """
        At most this chance that the total runs past the cap (1 / (k + 1); 1: no cap).
        """
    @property
    def cap_log(self) -> float:
        """
        Log of the class's longest finished total, or of the declaration if larger (inf: no class history).
        """
    @property
    def mean(self) -> float:
        ...
    @property
    def median(self) -> float:
        ...
    @property
    def sources(self) -> str:
        ...
    @property
    def tail(self) -> float:
        """
        At the configured tail quantile (p90).
        """
    @property
    def total_log_mu(self) -> float:
        ...
    @property
    def total_log_sigma(self) -> float:
        ...
class RemainingWorkEstimator:
    """
    Remaining work from a declaration, progress, the loss curve and finished jobs of the same class (include/dra/signals/remaining_work.hpp).
    """
    def __init__(self, config: RemainingWorkConfig = ...) -> None:
        ...
    def completed(self) -> int:
        ...
    def estimate(self, job_class: str, done: typing.SupportsFloat | typing.SupportsIndex, declared: typing.SupportsFloat | typing.SupportsIndex = 0.0, curve: collections.abc.Sequence[tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]] = []) -> WorkEstimate:
        """
        Remaining work of a job that did `done` units, declared `declared` (0: nothing), with its loss curve [(done, loss), ...].
        """
    def record_completion(self, job_class: str, total: typing.SupportsFloat | typing.SupportsIndex, declared: typing.SupportsFloat | typing.SupportsIndex = 0.0, curve: collections.abc.Sequence[tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]] = []) -> None:
        """
        A job of this class finished after `total` units: it calibrates the sources for later jobs.
        """
    @property
    def config(self) -> RemainingWorkConfig:
        ...
class WorldState:
    """
    The job's world at a step boundary, as the leader sees it.
    """
    def __init__(self) -> None:
        ...
    @property
    def active(self) -> list[int]:
        ...
    @active.setter
    def active(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def base_batch(self) -> float:
        ...
    @base_batch.setter
    def base_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def candidates(self) -> list[int]:
        ...
    @candidates.setter
    def candidates(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def global_batch(self) -> float:
        ...
    @global_batch.setter
    def global_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def remaining_steps(self) -> int:
        ...
    @remaining_steps.setter
    def remaining_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def size(self) -> int:
        ...
    @size.setter
    def size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def step(self) -> int:
        ...
    @step.setter
    def step(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def steps_since_resize(self) -> int:
        ...
    @steps_since_resize.setter
    def steps_since_resize(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Capacity:
    """
    Devices the job could have now.
    """
    @typing.overload
    def __init__(self) -> None:
        ...
    @typing.overload
    def __init__(self, available: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def available(self) -> int:
        ...
    @available.setter
    def available(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def device_price(self) -> float:
        ...
    @device_price.setter
    def device_price(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class CostModel:
    """
    Measured resize cost and the horizon a resize must pay back over.
    """
    @typing.overload
    def __init__(self) -> None:
        ...
    @typing.overload
    def __init__(self, resize_cost_s: typing.SupportsFloat | typing.SupportsIndex, horizon_steps: typing.SupportsFloat | typing.SupportsIndex = 500.0) -> None:
        ...
    @property
    def horizon_steps(self) -> float:
        ...
    @horizon_steps.setter
    def horizon_steps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def resize_cost_s(self) -> float:
        ...
    @resize_cost_s.setter
    def resize_cost_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class Decision:
    """
    A resize decision: target size, who leaves, who joins, batch/LR scale, reason.
    """
    def __init__(self) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def action(self) -> str:
        ...
    @property
    def batch_scale(self) -> float:
        ...
    @property
    def join(self) -> list[int]:
        ...
    @property
    def leave(self) -> list[int]:
        ...
    @property
    def lr_scale(self) -> float:
        ...
    @property
    def members(self) -> list[int]:
        ...
    @property
    def policy(self) -> str:
        ...
    @property
    def predicted_speedup(self) -> float:
        ...
    @property
    def reason(self) -> str:
        ...
    @property
    def target_size(self) -> int:
        ...
class ThroughputPredictor:
    """
    Predicts seconds per step for a world size and per-rank batch.
    """
    def step_time_s(self, world_size: typing.SupportsInt | typing.SupportsIndex, per_rank_batch: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    def throughput(self, world_size: typing.SupportsInt | typing.SupportsIndex, per_rank_batch: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
class ThroughputModelConfig:
    """
    Priors and settings of the online throughput model.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def forgetting(self) -> float:
        ...
    @forgetting.setter
    def forgetting(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def gamma(self) -> float:
        ...
    @gamma.setter
    def gamma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_compute_fixed_s(self) -> float:
        ...
    @prior_compute_fixed_s.setter
    def prior_compute_fixed_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_compute_per_sample_s(self) -> float:
        ...
    @prior_compute_per_sample_s.setter
    def prior_compute_per_sample_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_sync_fixed_s(self) -> float:
        ...
    @prior_sync_fixed_s.setter
    def prior_sync_fixed_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_sync_per_rank_s(self) -> float:
        ...
    @prior_sync_per_rank_s.setter
    def prior_sync_per_rank_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_weight(self) -> float:
        ...
    @prior_weight.setter
    def prior_weight(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class ThroughputModel(ThroughputPredictor):
    """
    Pollux throughput model fitted online from measured steps.
    """
    def __init__(self, config: ThroughputModelConfig = ...) -> None:
        ...
    def compute_time_s(self, per_rank_batch: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    def observe(self, world_size: typing.SupportsInt | typing.SupportsIndex, per_rank_batch: typing.SupportsFloat | typing.SupportsIndex, step_time_s: typing.SupportsFloat | typing.SupportsIndex, sync_time_s: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        ...
    def sync_time_s(self, world_size: typing.SupportsInt | typing.SupportsIndex) -> float:
        ...
    @property
    def observations(self) -> int:
        ...
class Policy:
    """
    A resize policy (wrap it in ConstrainedPolicy to decide). Policies are C++: the classes are final, since the engine would never call a Python override (docs/guide/policy.md, 'Your own policy').
    """
    def __init__(self, *args, **kwargs) -> None:
        ...
    @property
    def name(self) -> str:
        ...
class GoodputConfig:
    """
    Settings of the goodput policy.
    """
    adapt_batch: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def max_per_rank_batch(self) -> float:
        ...
    @max_per_rank_batch.setter
    def max_per_rank_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_marginal_efficiency(self) -> float:
        ...
    @min_marginal_efficiency.setter
    def min_marginal_efficiency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_per_rank_batch(self) -> float:
        ...
    @min_per_rank_batch.setter
    def min_per_rank_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class GoodputPolicy(Policy):
    """
    Pollux-style: the size maximising throughput x statistical efficiency.
    """
    def __init__(self, config: GoodputConfig = ...) -> None:
        ...
class ConvergencePhaseConfig:
    """
    Settings of the convergence-phase policy.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def grow_step(self) -> int:
        ...
    @grow_step.setter
    def grow_step(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_parallel_efficiency(self) -> float:
        ...
    @min_parallel_efficiency.setter
    def min_parallel_efficiency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_size(self) -> int:
        ...
    @plateau_size.setter
    def plateau_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class ConvergencePhasePolicy(Policy):
    """
    Grow while learning is fast and scaling efficient; release on plateau; hold otherwise.
    """
    def __init__(self, config: ConvergencePhaseConfig = ...) -> None:
        ...
class ConvergenceAwareConfig:
    """
    Settings of the convergence-aware policy.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def batch_candidates(self) -> int:
        ...
    @batch_candidates.setter
    def batch_candidates(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_global_batch(self) -> float:
        ...
    @max_global_batch.setter
    def max_global_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_gain(self) -> float:
        ...
    @min_gain.setter
    def min_gain(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_per_rank_batch(self) -> float:
        ...
    @min_per_rank_batch.setter
    def min_per_rank_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def plateau_price(self) -> float:
        ...
    @plateau_price.setter
    def plateau_price(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def price_floor(self) -> float:
        ...
    @price_floor.setter
    def price_floor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class ConvergenceAwarePolicy(Policy):
    """
    Goodput over size and batch together, with a price per device.
    """
    def __init__(self, config: ConvergenceAwareConfig = ...) -> None:
        ...
class Constraints:
    """
    Limits around any policy: sizes, cooldown, hysteresis, amortisation.
    """
    amortise: bool
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def allows(self, size: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def validate(self) -> None:
        ...
    @property
    def allowed_sizes(self) -> list[int]:
        ...
    @allowed_sizes.setter
    def allowed_sizes(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def cooldown_steps(self) -> int:
        ...
    @cooldown_steps.setter
    def cooldown_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def hysteresis_decisions(self) -> int:
        ...
    @hysteresis_decisions.setter
    def hysteresis_decisions(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_change(self) -> int:
        ...
    @max_change.setter
    def max_change(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
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
class ConstrainedPolicy:
    """
    A policy inside constraints: the object that decides.
    """
    def __init__(self, policy: Policy, constraints: Constraints = ...) -> None:
        ...
    def decide(self, signals: ConvergenceSignals, world: WorldState, capacity: Capacity, costs: CostModel, throughput: ThroughputPredictor) -> Decision:
        ...
class EngineStatus:
    """
    Result of one engine step (a view, valid until the next step).
    """
    @property
    def decided(self) -> bool:
        ...
    @property
    def decisions(self) -> int:
        ...
    @property
    def last_decision(self) -> Decision:
        ...
    @property
    def step(self) -> int:
        ...
class EngineConfig:
    """
    Estimator, throughput model, policy and constraints of one job.
    """
    convergence: ConvergencePhaseConfig
    convergence_aware: ConvergenceAwareConfig
    costs: CostModel
    estimator: EstimatorConfig
    goodput: GoodputConfig
    limits: Constraints
    policy: str
    remaining_work: RemainingWorkConfig
    throughput: ThroughputModelConfig
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def decide_every(self) -> int:
        ...
    @decide_every.setter
    def decide_every(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def declared_steps(self) -> int:
        """
        The job's declared budget in steps (0: none); sets world.remaining_steps from the estimate.
        """
    @declared_steps.setter
    def declared_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def energy(self) -> EnergyPolicyConfig:
        """
        Settings of the energy policies.
        """
    @energy.setter
    def energy(self, arg0: EnergyPolicyConfig) -> None:
        ...
class ResizeEngine:
    """
    Per-job decision engine fed once per step.
    """
    def __init__(self, config: EngineConfig) -> None:
        ...
    def decide(self) -> Decision:
        ...
    def desired_size(self) -> int:
        """
        The size the policy would choose if every device it might want were free (what a job asks a pool for).
        """
    def observe(self, step: typing.SupportsInt | typing.SupportsIndex, loss: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        Feeds a step's loss without deciding (the members of a live world that are not the leader).
        """
    def resized(self, new_size: typing.SupportsInt | typing.SupportsIndex, new_global_batch: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def step(self, step: typing.SupportsInt | typing.SupportsIndex, loss: typing.SupportsFloat | typing.SupportsIndex) -> EngineStatus:
        ...
    @property
    def capacity(self) -> Capacity:
        ...
    @property
    def config(self) -> EngineConfig:
        ...
    @property
    def costs(self) -> CostModel:
        ...
    @property
    def estimator(self) -> ConvergenceEstimator:
        ...
    @property
    def last_step(self) -> int:
        """
        Step index of the latest step, -1 before the first.
        """
    @property
    def remaining(self) -> WorkEstimate:
        """
        The remaining-work estimate (steps) at the latest decision.
        """
    @property
    def signals(self) -> ConvergenceSignals:
        ...
    @property
    def status(self) -> EngineStatus:
        ...
    @property
    def throughput(self) -> ThroughputModel:
        ...
    @property
    def world(self) -> WorldState:
        ...
class BuildInfo:
    """
    What this build of the compiled part contains.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def compiler(self) -> str:
        ...
    @property
    def gloo(self) -> bool:
        ...
    @property
    def nccl(self) -> str | None:
        """
        The NCCL headers' version the backend was compiled against; None without the backend.
        """
    @property
    def torch_version_compiled(self) -> str:
        ...
    @property
    def version(self) -> str:
        ...
class Options:
    """
    The options of a dra.Controller, parsed and validated once (ValueError names the option).
    """
    @staticmethod
    def names() -> list[str]:
        """
        The option names dra.Controller takes.
        """
    def __init__(self, **kwargs) -> None:
        """
        Options(**options): unknown names and bad values raise ValueError.
        """
    @property
    def backend(self) -> str:
        ...
    @property
    def backend_address(self) -> str:
        ...
    @property
    def batch_mode(self) -> str:
        ...
    @property
    def capacity_poll_s(self) -> float:
        ...
    @property
    def chunk_mb(self) -> float:
        ...
    @property
    def compress(self) -> str:
        """
        Gradient codec of the bucketed reduction ('' : a plain all-reduce).
        """
    @property
    def engine(self) -> EngineConfig:
        ...
    @property
    def events_path(self) -> str:
        ...
    @property
    def fault_timeout_s(self) -> float:
        ...
    @property
    def handoff(self) -> str:
        ...
    @property
    def heal(self) -> bool:
        """
        After a fault, re-admit waiting processes up to the size the world had before it.
        """
    @property
    def max_resize_retries(self) -> int:
        ...
    @property
    def release(self) -> typing.Any:
        """
        'standby', 'exit' or 'return'; None: exit on a GPU backend (NCCL), else standby.
        """
    @property
    def resize_schedule(self) -> dict[int, int]:
        ...
    @property
    def sparsity(self) -> dict:
        """
        How the 'masked' codec's RigL masks move (a dict of the rigl_config fields).
        """
    @property
    def start_size(self) -> int:
        ...
    @property
    def status_every(self) -> int:
        ...
    @property
    def store_timeout_s(self) -> float:
        ...
    @property
    def verify(self) -> bool:
        ...
class StepStatus:
    """
    What dra.step returns, in one process and in an elastic world alike: the controller's status after the step (the same object every step: copy with to_dict()).
    """
    _dict_skip: typing.ClassVar[tuple] = ('exit_requested', 'released')
    def __repr__(self) -> str:
        ...
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def committed(self) -> bool:
        """
        This call committed a step (its update applied everywhere).
        """
    @property
    def decided(self) -> bool:
        """
        A decision was taken at this step.
        """
    @property
    def decision(self) -> Decision:
        """
        The latest decision.
        """
    @property
    def energy_job_j(self) -> float:
        """
        Energy of the world's processes since the job started (NaN alone).
        """
    @property
    def energy_source(self) -> str:
        """
        'measured' only when every process measured its energy, else 'estimated' ('' alone).
        """
    @property
    def energy_step_j(self) -> float:
        """
        Energy of the world's processes in the latest step whose figures arrived (one step late; NaN alone).
        """
    @property
    def epoch(self) -> int:
        """
        The world epoch (-1 outside a world).
        """
    @property
    def event(self) -> typing.Any:
        """
        The world change at this step boundary (a dict), or None.
        """
    @property
    def exit_requested(self) -> bool:
        ...
    @property
    def loss(self) -> float:
        """
        The world's mean loss of the latest step (an elastic world learns it one step late).
        """
    @property
    def rank(self) -> int:
        """
        This process's rank in the world now (-1 outside it).
        """
    @property
    def released(self) -> bool:
        """
        Released with release='return': out of the world until Controller.rejoin().
        """
    @property
    def signals(self) -> ConvergenceSignals:
        """
        The controller's convergence signals now.
        """
    @property
    def step(self) -> int:
        """
        Index of the latest committed step (-1 before the first).
        """
    @property
    def world_size(self) -> int:
        ...
class HandoffStats:
    """
    This process's latest state handoff.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def bytes(self) -> int:
        ...
    @property
    def deferred(self) -> bool:
        ...
    @property
    def deferred_bytes(self) -> int:
        ...
    @property
    def deferred_s(self) -> float:
        ...
    @property
    def skipped_bytes(self) -> int:
        ...
    @property
    def wait_s(self) -> float:
        ...
class ProcessEnergy:
    """
    This process's own energy.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def job_j(self) -> float:
        ...
    @property
    def reader(self) -> str:
        ...
    @property
    def scope(self) -> str:
        ...
    @property
    def source(self) -> str:
        ...
    @property
    def step_j(self) -> float:
        ...
class DeviceReadStats:
    """
    Host reads of device values.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def blocking_waits(self) -> int:
        ...
    @property
    def reads(self) -> int:
        ...
class Controller:
    """
    The controller of one process (C++); dra.Controller extends it.
    """
    @typing.overload
    def __init__(self, options: Options) -> None:
        ...
    @typing.overload
    def __init__(self, options: Options, state: elastic.StateProvider, sampler: elastic.Sampler, *, store_address: typing.Any = None, join: typing.Any = None, phase_hook: typing.Any = None) -> None:
        ...
    def _abandon(self, why: str) -> None:
        """
        This process leaves the job mid-training (an uncaught exception): peers fail at once and do not wait.
        """
    def _begin_reduction(self, params: collections.abc.Sequence[torch.Tensor], in_flight: typing.SupportsInt | typing.SupportsIndex = -1, skipped: typing.SupportsInt | typing.SupportsIndex = 0, micro: typing.SupportsInt | typing.SupportsIndex = 1, unused_to_none: bool = False) -> bool:
        """
        Bucketed reduction, at the first gradient of a step (False: nothing to reduce on this rank now); in_flight and skipped: the batches the sampler handed out and not stepped, and those skipped since the previous reduced batch (the job's exactly-once check); micro: the loader batches this gradient carries (accumulated under no_sync), whose commit consumes as many steps of the sampler; unused_to_none: a parameter no rank had a gradient for keeps none (DDP's find_unused_parameters).
        """
    def _catch_up_missed_step(self) -> bool:
        """
        The previous backward never reached dra.step: commit its step as the world did; the world then compares states at the next reduction (Gloo) or this rank takes the world's state again (NCCL). Returns whether a step was missed.
        """
    def _complete_handoff(self) -> None:
        """
        A deferred handoff's optimizer state has arrived and is loaded (before an optimizer step).
        """
    def _finish_reduction(self) -> bool:
        """
        End of backward: the remaining buckets, the gradients written back (False: the step failed).
        """
    def _gradient_ready(self, index: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        params[index]'s gradient is accumulated: its bucket is all-reduced once complete.
        """
    def _note_update_skipped(self) -> None:
        """
        This rank committed the previous step without its optimizer stepping: the world compares states at the next reduction (Gloo), identical ones go on and a differing one is taken again.
        """
    def _set_buffers(self, buffers: collections.abc.Sequence[torch.Tensor]) -> None:
        """
        The module's buffers, averaged over the world at every committed step before any decision (integers rounded); a failed all-reduce leaves them and fails the next step. Empty: not averaged.
        """
    def _set_window_open(self, open: bool) -> None:
        """
        An accumulation window without no_sync() is open at this step: a resize waits for a step that closes one (at most 64 steps).
        """
    def _skip_step(self) -> StepStatus:
        """
        A stale batch's step: neither reduced nor committed.
        """
    def _sparsity_masks(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """
        'masked': (parameter, mask) pairs, the mask as 1/0 on the parameter's device.
        """
    def _step(self, loss: typing.SupportsFloat | typing.SupportsIndex, **kwargs) -> StepStatus:
        """
        The C++ step (dra.Controller.step validates the loss first).
        """
    def _step_tensor(self, loss: torch.Tensor, **kwargs) -> StepStatus:
        """
        The C++ step with a 0-d tensor loss (a CUDA loss is read only where a decision needs it).
        """
    def finish(self) -> None:
        """
        End of training: members meet once more, the leader tells standbys to go.
        """
    def next_epoch(self, num_epochs: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def reduce_gradients(self, params: collections.abc.Sequence[torch.Tensor]) -> bool:
        """
        After backward: averages the gradients over the step's global batch (False: the step failed).
        """
    def registered_candidates(self) -> list[int]:
        ...
    def rejoin(self) -> bool:
        """
        A process released with release='return' asks to be admitted again; waits until it is (True) or the job ends (False).
        """
    def request_stop(self) -> None:
        """
        Asks the job to stop cleanly: every member ends training at the same step boundary (the step in hand is finished); the code after the loop runs. What SIGTERM does under `dra run`.
        """
    def resume_at(self, step_index: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Restarting a whole job from a checkpoint: the committed steps it had (every process, before the first step).
        """
    def state_digest(self) -> int:
        ...
    def try_join(self) -> bool:
        """
        rejoin() without waiting: True once admitted, False while waiting or when the job has ended.
        """
    @property
    def _refusal(self) -> typing.Any:
        """
        The latest step was refused (a rank did not train its batch; it is redone): step, reason, and the batches this rank holds beyond the world's. None otherwise.
        """
    @property
    def compression(self) -> typing.Any:
        """
        The gradient codec of the bucketed reduction (None without one): its spec, the bytes this rank handed to the communicator (payload) and what fp32 would have, their ratio, the residual it carries (error_feedback_norm1), the fraction of the sparsified weights pruned ('masked'; 0 otherwise) and the state every member shares (shared_state: equal on every rank).
        """
    @property
    def device_reads(self) -> dict:
        """
        Host reads of device values (decision steps only) and how many had to wait for the device.
        """
    @property
    def energy(self) -> typing.Any:
        """
        This process's own energy (None until it entered a world): the latest step, since it joined, the label and the reader. The world's figures are in status (energy_step_j, energy_job_j, energy_source).
        """
    @property
    def engine(self) -> ResizeEngine:
        ...
    @property
    def epoch(self) -> int:
        """
        The world epoch (a new one after every change).
        """
    @property
    def events(self) -> list:
        """
        Every event this process emitted (dicts), oldest first.
        """
    @property
    def failed(self) -> bool:
        """
        The current step's reduction failed: it will be redone.
        """
    @property
    def handoff(self) -> dict:
        """
        This process's latest state handoff: bytes moved at the change, bytes skipped (the joiner held them), bytes deferred, the deferred transfer's seconds and how long the optimizer step waited for it.
        """
    @property
    def is_leader(self) -> bool:
        """
        rank == 0: the world's leader now, or after the end the last world's leader.
        """
    @property
    def is_member(self) -> bool:
        """
        Takes part in training now (always true alone).
        """
    @property
    def last_digest(self) -> int | None:
        ...
    @property
    def last_event(self) -> typing.Any:
        ...
    @property
    def members(self) -> list[int]:
        ...
    @property
    def nonfinite_started(self) -> bool:
        """
        A streak of non-finite losses started in the latest step (device losses: when read).
        """
    @property
    def nonfinite_streak(self) -> int:
        ...
    @property
    def options(self) -> Options:
        ...
    @property
    def rank(self) -> int:
        """
        The rank in the world now (changes with resizes; -1 outside it). After the job finished: the rank in the last world, so that 'save on rank 0' after the loop works.
        """
    @property
    def resizes(self) -> int:
        ...
    @property
    def role(self) -> str:
        """
        'local', 'candidate', 'member', 'released', 'finished' or 'rejected'.
        """
    @property
    def signals(self) -> ConvergenceSignals:
        ...
    @property
    def start_size(self) -> int:
        ...
    @property
    def status(self) -> StepStatus:
        ...
    @property
    def step_index(self) -> int:
        """
        Committed steps so far.
        """
    @property
    def stop_requested(self) -> bool:
        ...
    @property
    def stopped(self) -> bool:
        """
        Training ended on a stop request.
        """
    @property
    def store_address(self) -> str:
        ...
    @property
    def uid(self) -> int:
        """
        The process's id for the job's life (RANK at launch, 10000+ for late joiners).
        """
    @property
    def universe_size(self) -> int:
        ...
    @property
    def world_size(self) -> int:
        ...
class QuantileSketchConfig:
    """
    Relative accuracy, value range and half-life of a quantile sketch.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def half_life(self) -> float:
        """
        Observations after which an observation's weight has halved; 0: no forgetting.
        """
    @half_life.setter
    def half_life(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_value(self) -> float:
        ...
    @max_value.setter
    def max_value(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_value(self) -> float:
        ...
    @min_value.setter
    def min_value(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def relative_accuracy(self) -> float:
        ...
    @relative_accuracy.setter
    def relative_accuracy(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class QuantileSketch:
    """
    Streaming quantiles with exponential forgetting (log-spaced bins, DDSketch-style).
    """
    def __init__(self, config: QuantileSketchConfig = ...) -> None:
        ...
    def add(self, value: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def expected_max_of(self, n: typing.SupportsFloat | typing.SupportsIndex) -> float:
        """
        Median of the longest of n draws: the quantile 0.5^(1/n).
        """
    def quantile(self, q: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    @property
    def clamped(self) -> int:
        ...
    @property
    def effective_count(self) -> float:
        ...
    @property
    def mean(self) -> float:
        ...
    @property
    def observations(self) -> int:
        ...
    @property
    def rejected(self) -> int:
        ...
    @property
    def second_moment(self) -> float:
        ...
class GenerationModelConfig:
    """
    Decode slots and priors of the generation model.
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def forgetting(self) -> float:
        ...
    @forgetting.setter
    def forgetting(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def kv_capacity_tokens(self) -> float:
        """
        Tokens of context one rollout device's KV cache holds (0: not limited).
        """
    @kv_capacity_tokens.setter
    def kv_capacity_tokens(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_concurrency(self) -> int:
        ...
    @max_concurrency.setter
    def max_concurrency(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_iteration_fixed_s(self) -> float:
        ...
    @prior_iteration_fixed_s.setter
    def prior_iteration_fixed_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_iteration_per_kilotoken_s(self) -> float:
        ...
    @prior_iteration_per_kilotoken_s.setter
    def prior_iteration_per_kilotoken_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_iteration_per_sequence_s(self) -> float:
        ...
    @prior_iteration_per_sequence_s.setter
    def prior_iteration_per_sequence_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prior_weight(self) -> float:
        ...
    @prior_weight.setter
    def prior_weight(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class StageBalanceConfig:
    """
    Devices, role minimums, pipeline, cooldown, hysteresis and payback of the stage-balance policy.
    """
    generation: GenerationModelConfig
    lengths: QuantileSketchConfig
    training: ThroughputModelConfig
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def batch_smoothing(self) -> float:
        """
        Weight of a new batch in the measured scale of the fresh-batch model.
        """
    @batch_smoothing.setter
    def batch_smoothing(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def cooldown_steps(self) -> int:
        ...
    @cooldown_steps.setter
    def cooldown_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def devices(self) -> int:
        ...
    @devices.setter
    def devices(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def expected_max(self) -> bool:
        """
        One-step-off objective: E[max(rollout, train)] over the batches' spread (True), or the max of the two means (False).
        """
    @expected_max.setter
    def expected_max(self, arg0: bool) -> None:
        ...
    @property
    def group_size(self) -> int:
        """
        Samples per prompt (GRPO's group): their lengths move together, so a step varies like sequences / group_size independent draws (1: independent).
        """
    @group_size.setter
    def group_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def hysteresis_decisions(self) -> int:
        ...
    @hysteresis_decisions.setter
    def hysteresis_decisions(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def lookahead_draws(self) -> int:
        """
        planner='lookahead': draws of the lengths not generated yet per decision.
        """
    @lookahead_draws.setter
    def lookahead_draws(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def lookahead_max_move(self) -> int:
        """
        planner='lookahead': most devices moved by one decision.
        """
    @lookahead_max_move.setter
    def lookahead_max_move(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def lookahead_terminal_steps(self) -> int:
        """
        planner='lookahead': more times a trial counts its split's last step (the value of a move after the horizon).
        """
    @lookahead_terminal_steps.setter
    def lookahead_terminal_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_move(self) -> int:
        ...
    @max_move.setter
    def max_move(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_payback_steps(self) -> float:
        ...
    @max_payback_steps.setter
    def max_payback_steps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_relative_gain(self) -> float:
        ...
    @min_relative_gain.setter
    def min_relative_gain(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_rollout(self) -> int:
        ...
    @min_rollout.setter
    def min_rollout(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def min_train(self) -> int:
        ...
    @min_train.setter
    def min_train(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def pipeline(self) -> str:
        """
        'one_step_off' (max of the stages) or 'synchronous' (their sum).
        """
    @pipeline.setter
    def pipeline(self, arg1: str) -> None:
        ...
    @property
    def planner(self) -> str:
        """
        How the dynamic run decides, live and in the event simulator: 'window' (decide_window) or 'lookahead' (StageBalancePolicy.plan on the leader's snapshot: trainer counts tried on the event model with the fitted costs and drawn lengths).
        """
    @planner.setter
    def planner(self, arg0: str) -> None:
        ...
    @property
    def prior_switch_cost_s(self) -> float:
        ...
    @prior_switch_cost_s.setter
    def prior_switch_cost_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def switch_cost_smoothing(self) -> float:
        ...
    @switch_cost_smoothing.setter
    def switch_cost_smoothing(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def weight_sync_smoothing(self) -> float:
        ...
    @weight_sync_smoothing.setter
    def weight_sync_smoothing(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class GenerationModel:
    """
    The decode-time fit of the stage-balance policy (generation_fit).
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def fixed_s(self) -> float:
        ...
    @property
    def observations(self) -> int:
        ...
    @property
    def per_kilotoken_s(self) -> float:
        ...
    @property
    def per_sequence_s(self) -> float:
        ...
class StagePrediction:
    """
    Predicted stage and step times of one split.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def rollout(self) -> int:
        ...
    @property
    def rollout_s(self) -> float:
        ...
    @property
    def rollout_sd_s(self) -> float:
        ...
    @property
    def step_s(self) -> float:
        ...
    @property
    def train(self) -> int:
        ...
    @property
    def train_s(self) -> float:
        ...
    @property
    def train_sd_s(self) -> float:
        ...
    @property
    def weight_sync_s(self) -> float:
        ...
class StageDecision:
    """
    A stage-balance decision and what it predicts.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def action(self) -> str:
        ...
    @property
    def current(self) -> StagePrediction:
        ...
    @property
    def moved(self) -> int:
        ...
    @property
    def payback_steps(self) -> float | None:
        ...
    @property
    def reason(self) -> str:
        ...
    @property
    def rollout(self) -> int:
        ...
    @property
    def switch_cost_s(self) -> float:
        ...
    @property
    def target(self) -> StagePrediction:
        ...
    @property
    def train(self) -> int:
        ...
class RlPhase:
    """
    One phase of a simulated RL run.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def action(self) -> str:
        ...
    @property
    def duration_s(self) -> float:
        ...
    @property
    def idle_device_s(self) -> float:
        ...
    @property
    def longest(self) -> float:
        ...
    @property
    def mean_length(self) -> float:
        ...
    @property
    def phase(self) -> int:
        ...
    @property
    def predicted_s(self) -> float:
        ...
    @property
    def rollout(self) -> int:
        ...
    @property
    def rollout_s(self) -> float:
        ...
    @property
    def start_s(self) -> float:
        ...
    @property
    def switch_exposed_s(self) -> float:
        ...
    @property
    def switch_total_s(self) -> float:
        ...
    @property
    def train(self) -> int:
        ...
    @property
    def train_s(self) -> float:
        ...
    @property
    def trained_sequences(self) -> int:
        ...
class RlSwitchCostSplit:
    """
    A switch's cost by part (seconds).
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def agree_s(self) -> float:
        ...
    @property
    def optimizer_s(self) -> float:
        ...
    @property
    def rebuild_s(self) -> float:
        ...
    @property
    def rollout_start_s(self) -> float:
        ...
    @property
    def weights_s(self) -> float:
        ...
class RlSwitch:
    """
    One switch of a simulated RL run.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def cost_split(self) -> RlSwitchCostSplit:
        ...
    @property
    def direction(self) -> str:
        ...
    @property
    def exposed_s(self) -> float:
        ...
    @property
    def hidden_s(self) -> float:
        ...
    @property
    def moved(self) -> int:
        ...
    @property
    def payback_steps(self) -> float | None:
        ...
    @property
    def phase(self) -> int:
        ...
    @property
    def predicted_payback_steps(self) -> float | None:
        ...
    @property
    def reason(self) -> str:
        ...
    @property
    def total_s(self) -> float:
        ...
class RlRun:
    """
    One schedule of a simulated RL run: totals, phases, switches.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def bubble_fraction(self) -> float:
        ...
    @property
    def exactly_once(self) -> bool:
        ...
    @property
    def generated_sequences(self) -> int:
        ...
    @property
    def generated_tokens_per_s(self) -> float:
        ...
    @property
    def hidden_fraction(self) -> float:
        ...
    @property
    def mean_rollout_devices(self) -> float:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def phases(self) -> dict:
        """
        The phases as columns.
        """
    @property
    def roles(self) -> dict:
        """
        Devices per role over time, as columns.
        """
    @property
    def rollout(self) -> int:
        ...
    @property
    def rollout_share(self) -> float:
        ...
    @property
    def samples_per_s(self) -> float:
        ...
    @property
    def steps(self) -> int:
        ...
    @property
    def switch_exposed_s(self) -> float:
        ...
    @property
    def switch_log(self) -> list[RlSwitch]:
        ...
    @property
    def switch_total_s(self) -> float:
        ...
    @property
    def switches(self) -> int:
        ...
    @property
    def tail_share(self) -> float:
        ...
    @property
    def total_s(self) -> float:
        ...
    @property
    def trained_sequences(self) -> int:
        ...
class RlRoleSample:
    """
    Devices per role at one time of an event-simulated run.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def moving(self) -> int:
        ...
    @property
    def rollout(self) -> int:
        ...
    @property
    def t(self) -> float:
        ...
    @property
    def train(self) -> int:
        ...
class WindowDecision:
    """
    A stage-balance decision at a trainers' boundary.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def action(self) -> str:
        ...
    @property
    def moved(self) -> int:
        ...
    @property
    def payback_steps(self) -> float | None:
        ...
    @property
    def predicted_current_s(self) -> float:
        ...
    @property
    def predicted_target_s(self) -> float:
        ...
    @property
    def reason(self) -> str:
        ...
    @property
    def switch_cost_s(self) -> float:
        ...
    @property
    def train(self) -> int:
        ...
    @property
    def wait_s(self) -> float:
        ...
class RlSweep:
    """
    Every static split, the policy, the oracle and colocation.
    """
    def to_dict(self) -> dict:
        """
        Every property as a plain dict (nested results as dicts), e.g. for json.dumps.
        """
    @property
    def best_static(self) -> int:
        ...
    @property
    def colocated(self) -> RlRun:
        ...
    @property
    def dynamic(self) -> RlRun:
        ...
    @property
    def length_source(self) -> str:
        ...
    @property
    def oracle(self) -> RlRun:
        ...
    @property
    def statics(self) -> list[RlRun]:
        ...
class StageBalancePolicy:
    """
    How many devices generate and how many train, and when moving one pays (RL post-training).
    """
    def __init__(self, config: StageBalanceConfig = ...) -> None:
        ...
    def decide(self, rollout: typing.SupportsInt | typing.SupportsIndex, train: typing.SupportsInt | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex, steps_since_switch: typing.SupportsInt | typing.SupportsIndex, remaining_steps: typing.SupportsInt | typing.SupportsIndex = -1, sequences_per_step: typing.SupportsInt | typing.SupportsIndex = 1) -> dict:
        """
        One decision at a step boundary (feed every one, in order).
        """
    def decide_window(self, *, rollout: typing.SupportsInt | typing.SupportsIndex, train: typing.SupportsInt | typing.SupportsIndex, idle_rollout: typing.SupportsInt | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex, remaining_steps: typing.SupportsInt | typing.SupportsIndex = -1, sequences_per_step: typing.SupportsInt | typing.SupportsIndex = 1, updates_per_step: typing.SupportsInt | typing.SupportsIndex = 1, updates_left: typing.SupportsInt | typing.SupportsIndex = 1, wait_complete: bool = True, wait_queued: typing.SupportsInt | typing.SupportsIndex = 0, wait_in_flight: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex] = [], next_exists: bool = True, next_queued: typing.SupportsInt | typing.SupportsIndex = 0, next_in_flight: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex] = []) -> dict:
        """
        One decision at a boundary of the trainers' world without a per-phase barrier: in a step's window (updates_left == updates_per_step) or between two updates. Feed every one, in order.
        """
    def observe_batch(self, rollout: typing.SupportsFloat | typing.SupportsIndex, sequences: typing.SupportsInt | typing.SupportsIndex, seconds: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        """
        A batch generated in `seconds` (first handed out to last finished) on `rollout` devices on average; False when ignored.
        """
    def observe_decode(self, concurrency: typing.SupportsInt | typing.SupportsIndex, context_tokens: typing.SupportsFloat | typing.SupportsIndex, iterations: typing.SupportsFloat | typing.SupportsIndex, seconds: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        """
        Measured decode iterations of one rollout device; False when ignored.
        """
    def observe_engine_start(self, seconds: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        A rollout engine started on a device that left the trainers.
        """
    def observe_generation(self, prompt_tokens: typing.SupportsFloat | typing.SupportsIndex, generated_tokens: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        One finished generation.
        """
    def observe_switch(self, direction: str, exposed_s: typing.SupportsFloat | typing.SupportsIndex) -> None:
        """
        A measured switch: the seconds it lengthened its step.
        """
    def observe_train(self, devices: typing.SupportsInt | typing.SupportsIndex, tokens_per_device: typing.SupportsFloat | typing.SupportsIndex, step_s: typing.SupportsFloat | typing.SupportsIndex, sync_s: typing.SupportsFloat | typing.SupportsIndex) -> bool:
        """
        One measured training step; False when ignored.
        """
    def observe_weight_sync(self, seconds: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def plan(self, snapshot: dict) -> dict:
        """
        The look-ahead planner on a leader's view of its pipeline (include/dra/rl/snapshot.hpp): every trainer count within lookahead_max_move tried on the event model with the costs fitted here (lookahead_draws draws of the lengths not generated yet); returns {'trainers', 'leave', 'join', 'reason'} (slots that leave the trainers / join them; both empty: hold). The simulator's planner='lookahead' runs the same call on its own state. Keys: now_s, seed, steps, prompts_per_step, group_size, updates_per_step, prompt_tokens, max_generation_tokens, max_concurrency, [kv_capacity_tokens, kv_watermark, kv_reserve_ratio, horizon_windows], step, [update, training], published, [trainers_free_s], members (the trainers' slots, leader first), slots (per slot: role 'rollout'/'train'/'starting', version, clock_s, in_flight [(id, generated[, admitted_at])], waiting [(id, generated)]), batches (from `step` on: open, opened_s, complete_s, rollout_at_open, remaining, queued: per slot, ids), lengths (per batch, per sequence: the finished length, 0 if not finished), [last_switch: agree_s, rebuild_s, weights_s, optimizer_s]. A sequence's id is batch * sequences_per_step + prompt * group_size + sample.
        """
    def predict(self, rollout: typing.SupportsInt | typing.SupportsIndex, sequences: typing.SupportsInt | typing.SupportsIndex) -> dict:
        ...
    def predict_all(self, sequences: typing.SupportsInt | typing.SupportsIndex) -> list:
        ...
    def switch_cost_s(self, direction: str) -> float:
        ...
    def token_cost_s(self) -> float:
        """
        Decode seconds per token at the observed operating point.
        """
    @property
    def config(self) -> StageBalanceConfig:
        ...
    @property
    def generation_fit(self) -> dict:
        ...
    @property
    def lengths(self) -> QuantileSketch:
        ...
    @property
    def weight_sync_s(self) -> float:
        ...
class ReasoningLengths:
    """
    Parametric reasoning-length generations: log-normal per prompt, hard prompts, correlated GRPO groups (data/rl-lengths/README.md).
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def group_sigma(self) -> float:
        ...
    @group_sigma.setter
    def group_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def median_tokens(self) -> float:
        ...
    @median_tokens.setter
    def median_tokens(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prompt_sigma(self) -> float:
        ...
    @prompt_sigma.setter
    def prompt_sigma(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def tail_factor(self) -> float:
        ...
    @tail_factor.setter
    def tail_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def tail_weight(self) -> float:
        ...
    @tail_weight.setter
    def tail_weight(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class RlWorkload:
    """
    Steps, batch, prompt tokens, length scale/drift/limit and seed of a simulated RL run.
    """
    reasoning: ReasoningLengths
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def drift_final_scale(self) -> float:
        ...
    @drift_final_scale.setter
    def drift_final_scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def group_size(self) -> int:
        ...
    @group_size.setter
    def group_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def length_scale(self) -> float:
        ...
    @length_scale.setter
    def length_scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def lengths(self) -> str:
        """
        'trace' (lengths drawn from the given distribution) or 'reasoning' (the parametric model).
        """
    @lengths.setter
    def lengths(self, arg1: str) -> None:
        ...
    @property
    def max_generation_tokens(self) -> float:
        ...
    @max_generation_tokens.setter
    def max_generation_tokens(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prompt_tokens(self) -> float:
        ...
    @prompt_tokens.setter
    def prompt_tokens(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def prompts_per_step(self) -> int:
        ...
    @prompts_per_step.setter
    def prompts_per_step(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def seed(self) -> int:
        ...
    @seed.setter
    def seed(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def steps(self) -> int:
        ...
    @steps.setter
    def steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def updates_per_step(self) -> int:
        """
        Optimizer steps per training step (mini-batches; event simulator).
        """
    @updates_per_step.setter
    def updates_per_step(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class RlCostModel:
    """
    The RL simulator's ground-truth costs (seconds).
    """
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def colocated_switch_s(self) -> float:
        ...
    @colocated_switch_s.setter
    def colocated_switch_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def decode_fixed_s(self) -> float:
        ...
    @decode_fixed_s.setter
    def decode_fixed_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def decode_per_kilotoken_s(self) -> float:
        ...
    @decode_per_kilotoken_s.setter
    def decode_per_kilotoken_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def decode_per_sequence_s(self) -> float:
        ...
    @decode_per_sequence_s.setter
    def decode_per_sequence_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def kv_capacity_tokens(self) -> float:
        """
        KV-cache budget of a rollout device, tokens of context (0: unlimited).
        """
    @kv_capacity_tokens.setter
    def kv_capacity_tokens(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def kv_reserve_ratio(self) -> float:
        """
        Admission reserves this fraction of a sequence's remaining limit (0: vLLM-like greedy).
        """
    @kv_reserve_ratio.setter
    def kv_reserve_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def kv_watermark(self) -> float:
        ...
    @kv_watermark.setter
    def kv_watermark(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_concurrency(self) -> int:
        ...
    @max_concurrency.setter
    def max_concurrency(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def prefill_per_kilotoken_s(self) -> float:
        ...
    @prefill_per_kilotoken_s.setter
    def prefill_per_kilotoken_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def rollout_start_s(self) -> float:
        ...
    @rollout_start_s.setter
    def rollout_start_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def switch_agree_s(self) -> float:
        ...
    @switch_agree_s.setter
    def switch_agree_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def switch_optimizer_s(self) -> float:
        ...
    @switch_optimizer_s.setter
    def switch_optimizer_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def switch_rebuild_s(self) -> float:
        ...
    @switch_rebuild_s.setter
    def switch_rebuild_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def switch_weights_s(self) -> float:
        ...
    @switch_weights_s.setter
    def switch_weights_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def sync_fixed_s(self) -> float:
        ...
    @sync_fixed_s.setter
    def sync_fixed_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def sync_per_rank_s(self) -> float:
        ...
    @sync_per_rank_s.setter
    def sync_per_rank_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def train_fixed_s(self) -> float:
        ...
    @train_fixed_s.setter
    def train_fixed_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def train_per_token_s(self) -> float:
        ...
    @train_per_token_s.setter
    def train_per_token_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def weight_load_s(self) -> float:
        ...
    @weight_load_s.setter
    def weight_load_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def weight_sync_s(self) -> float:
        ...
    @weight_sync_s.setter
    def weight_sync_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class EnergyInterval:
    """
    Energy of one step or of the whole job, with its source.
    """
    def __repr__(self) -> str:
        ...
    @property
    def joules(self) -> float:
        ...
    @property
    def seconds(self) -> float:
        ...
    @property
    def source(self) -> str:
        ...
    @property
    def watts(self) -> float:
        ...
class EnergyMeter:
    """
    Per-step and per-job energy: NVML where a GPU counter can be read, RAPL where present, else CPU-seconds x watts_per_core (estimated). `notes` says why a better reader was not used.
    """
    def __init__(self, nvml_library: str = 'libnvidia-ml.so.1', rapl_root: str = '/sys/class/powercap', watts_per_core: typing.SupportsFloat | typing.SupportsIndex = 10.0, try_nvml: bool = True, try_rapl: bool = True) -> None:
        ...
    def mark(self) -> EnergyInterval:
        """
        Closes the current step now and returns its energy.
        """
    def restart(self) -> None:
        ...
    @property
    def job(self) -> EnergyInterval:
        ...
    @property
    def last_step(self) -> EnergyInterval:
        ...
    @property
    def notes(self) -> list[str]:
        ...
    @property
    def reader(self) -> str:
        ...
    @property
    def scope(self) -> str:
        ...
    @property
    def source(self) -> str:
        ...
    @property
    def steps(self) -> int:
        ...
class KnobSetting:
    """
    A point of the energy policies' knob space.
    """
    def __init__(self, world_size: typing.SupportsInt | typing.SupportsIndex = 1, global_batch: typing.SupportsFloat | typing.SupportsIndex = 0.0, sparsity: typing.SupportsFloat | typing.SupportsIndex = 0.0, compression_rank: typing.SupportsInt | typing.SupportsIndex = 0, power_limit_w: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> None:
        ...
    @property
    def compression_rank(self) -> int:
        ...
    @compression_rank.setter
    def compression_rank(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def global_batch(self) -> float:
        ...
    @global_batch.setter
    def global_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def power_limit_w(self) -> float:
        ...
    @power_limit_w.setter
    def power_limit_w(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def sparsity(self) -> float:
        ...
    @sparsity.setter
    def sparsity(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def world_size(self) -> int:
        ...
    @world_size.setter
    def world_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class EnergyObjective:
    """
    kind: 'min_energy_deadline', 'energy_delay', 'zeus_cost' or 'energy_budget'.
    """
    def __init__(self, kind: str = 'zeus_cost', eta: typing.SupportsFloat | typing.SupportsIndex = 0.5, deadline_s: typing.SupportsFloat | typing.SupportsIndex = ..., budget_j: typing.SupportsFloat | typing.SupportsIndex = ...) -> None:
        ...
    def zeus_cost(self, energy_j: typing.SupportsFloat | typing.SupportsIndex, time_s: typing.SupportsFloat | typing.SupportsIndex, max_power_w: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    @property
    def budget_j(self) -> float:
        ...
    @property
    def deadline_s(self) -> float:
        ...
    @property
    def eta(self) -> float:
        ...
    @property
    def kind(self) -> str:
        ...
class EnergyPolicyConfig:
    """
    Settings of the energy policies (EngineConfig.energy); the objective's kind comes from EngineConfig.policy.
    """
    adapt_batch: bool
    objective: EnergyObjective
    def __init__(self, **kwargs) -> None:
        """
        Keyword construction; unknown keywords and invalid values raise ValueError.
        """
    def validate(self) -> None:
        ...
    @property
    def job_budget_j(self) -> float:
        ...
    @job_budget_j.setter
    def job_budget_j(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def job_deadline_s(self) -> float:
        ...
    @job_deadline_s.setter
    def job_deadline_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_per_rank_batch(self) -> float:
        ...
    @max_per_rank_batch.setter
    def max_per_rank_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def max_watts_per_device(self) -> float:
        ...
    @max_watts_per_device.setter
    def max_watts_per_device(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_per_rank_batch(self) -> float:
        ...
    @min_per_rank_batch.setter
    def min_per_rank_batch(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def watts_per_device(self) -> float:
        ...
    @watts_per_device.setter
    def watts_per_device(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class EnergyChoice:
    @property
    def constraint_met(self) -> bool:
        ...
    @property
    def energy_j(self) -> float:
        ...
    @property
    def index(self) -> int:
        ...
    @property
    def reason(self) -> str:
        ...
    @property
    def setting(self) -> KnobSetting:
        ...
    @property
    def time_s(self) -> float:
        ...
class GradientCodec:
    """
    A gradient compression codec (make one with make_codec). reduce() turns a list of float32 arrays into their (approximate) mean over the world, in place.
    """
    def clear_error_feedback(self) -> None:
        ...
    def load_state(self, arg0: bytes) -> None:
        ...
    def reduce(self, grads: collections.abc.Sequence[numpy.ndarray], world: typing.Any, weights: typing.Any = None, exact: typing.Any = None) -> None:
        """
        Reduces the gradients in place; `weights` (the parameters' values, one array or None per gradient) are read by the 'masked' codec on its mask-update steps; `exact` (a float32 array) is summed over the world in place, uncompressed, riding the codec's first all-reduce.
        """
    def reset_bytes(self) -> None:
        ...
    def save_state(self, with_error_feedback: bool = True) -> bytes:
        """
        State as bytes; without error feedback: only what every rank shares (what joiners receive).
        """
    def set_phase(self, arg0: str) -> None:
        """
        'masked': the convergence phase this rank proposes the next sparsity from.
        """
    def set_rank(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def bytes_dense(self) -> int:
        """
        Bytes an fp32 all-reduce of the same tensors would have handed over.
        """
    @property
    def bytes_sent(self) -> int:
        """
        Bytes this rank handed to the collective (payload, before the transport's own framing).
        """
    @property
    def masks(self) -> list:
        """
        'masked': each tensor's mask (uint8, 1 active), None for a dense one; empty before the first reduce.
        """
    @property
    def name(self) -> str:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def sparsity(self) -> float:
        """
        'masked': the fraction of the sparsified tensors' entries pruned now (0 for other codecs).
        """
    @property
    def steps(self) -> int:
        ...
    @property
    def update_next(self) -> bool:
        """
        'masked': the next reduce() updates the masks (the dense gradient travels).
        """
class RiglMasks:
    """
    RigL masks of a list of tensors (those with 2+ dimensions are sparsified), their schedule and update: the one implementation dra.compress.DynamicSparsifier and the 'masked' codec share.
    """
    def __init__(self, seed: typing.SupportsInt | typing.SupportsIndex = 0, **kwargs) -> None:
        """
        RiglMasks(seed=0, **options): options as dra.Controller's `sparsity`.
        """
    def fit(self, shapes: collections.abc.Sequence[collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]]) -> None:
        """
        Sizes the masks on first use (all active).
        """
    def mask(self, tensor: typing.SupportsInt | typing.SupportsIndex) -> numpy.ndarray:
        ...
    def sparse_fraction(self) -> float:
        ...
    def sparsified(self, tensor: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def target(self, step: typing.SupportsInt | typing.SupportsIndex, phase: str) -> float:
        """
        The next target: the cubic ramp, or the phase rule under the ceiling learned from divergence.
        """
    def update(self, step: typing.SupportsInt | typing.SupportsIndex, target: typing.SupportsFloat | typing.SupportsIndex, weights: collections.abc.Sequence[typing.Any], grads: collections.abc.Sequence[typing.Any]) -> tuple[int, int, int]:
        """
        RigL's update of every sparsified tensor (grads: the dense, world-averaged gradients); returns (dropped, regrown, active).
        """
    def update_due(self, step: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        Whether the step after `step` completed ones updates the masks.
        """
    @property
    def ceiling(self) -> float:
        """
        The phase rule's cap: max_sparsity until a rise was followed by divergence.
        """
    @property
    def sparsity(self) -> float:
        """
        The target of the latest update.
        """
def _build_info() -> dict:
    ...
def _environment_options() -> typing.Any:
    """
    DRA_OPTIONS as a dict of options (checked in C++: ValueError names DRA_OPTIONS or the option).
    """
def _set_step_target(slow: typing.Any, warn: typing.Any, controller: typing.Any) -> None:
    """
    Internal: where dra.step goes (set by dra.reset / dra.default_controller).
    """
def _sigterm_ends_forked_children() -> None:
    """
    Called right after signal.signal(SIGTERM, handler): that handler runs in this process, and a process forked from it ends at SIGTERM (the default action), whatever it is doing.
    """
def adascale_gain(noise_scale: typing.SupportsFloat | typing.SupportsIndex, valid: bool, global_batch: typing.SupportsFloat | typing.SupportsIndex, base_batch: typing.SupportsFloat | typing.SupportsIndex) -> float:
    """
    AdaScale learning-rate gain for global batch M.
    """
def choose_setting(objective: EnergyObjective, candidates: collections.abc.Sequence[KnobSetting], time_s: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], energy_j: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], max_power_w: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> EnergyChoice:
    """
    dra's energy chooser (the one the live energy policies use) over predicted candidates. Non-finite predictions are skipped.
    """
def cubic_sparsity(step: typing.SupportsInt | typing.SupportsIndex, start: typing.SupportsInt | typing.SupportsIndex, steps: typing.SupportsInt | typing.SupportsIndex, final_sparsity: typing.SupportsFloat | typing.SupportsIndex) -> float:
    """
    Zhu & Gupta's gradual schedule.
    """
def gittins_size(estimate: WorkEstimate, done: typing.SupportsFloat | typing.SupportsIndex) -> float:
    """
    The size a job counts as when ranked shortest-first under uncertainty (1 / its Gittins index).
    """
def make_codec(spec: str, seed: typing.SupportsInt | typing.SupportsIndex = 0, sparsity: dict = {}) -> GradientCodec:
    """
    fp32, fp16, bf16, powersgd:<rank>, topk:<fraction>, random:<keep fraction>, masked[:<max sparsity>] (`sparsity`: the RigL options, as dra.Controller's).
    """
def next_sparsity(current: typing.SupportsFloat | typing.SupportsIndex, phase: str, max_sparsity: typing.SupportsFloat | typing.SupportsIndex = 0.9, step_up: typing.SupportsFloat | typing.SupportsIndex = 0.2, step_down: typing.SupportsFloat | typing.SupportsIndex = 0.3) -> float:
    ...
def policy_registry() -> list:
    """
    Every policy by name: its settings section (None: none), whether the live engine runs it, how the simulator schedules it (None: not simulated), how its system changes devices (in_place or restart) and a one-line summary, in the order reports list them.
    """
def policy_sections() -> list[str]:
    """
    Names of the policy settings sections (options of dra.Controller, members of EngineConfig).
    """
def process_cpu_seconds() -> float:
    """
    Busy CPU seconds of this process and its waited-for children.
    """
def rank_for_noise_scale(gns: typing.SupportsFloat | typing.SupportsIndex, valid: bool, global_batch: typing.SupportsFloat | typing.SupportsIndex, min_rank: typing.SupportsInt | typing.SupportsIndex = 1, max_rank: typing.SupportsInt | typing.SupportsIndex = 8) -> int:
    ...
def rigl_tie_seed(seed: typing.SupportsInt | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex, tensor: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def rigl_update(mask: numpy.ndarray, weights: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], grads: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], sparsity: typing.SupportsFloat | typing.SupportsIndex, update_fraction: typing.SupportsFloat | typing.SupportsIndex, tie_seed: typing.SupportsInt | typing.SupportsIndex = 0) -> tuple[int, int, int]:
    """
    RigL's mask update in place (uint8 mask; grads: the dense gradient); returns (dropped, regrown, active). Ties are broken by keys drawn from tie_seed (rigl_tie_seed), the same on every rank.
    """
def rigl_update_fraction(alpha: typing.SupportsFloat | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex, end_step: typing.SupportsInt | typing.SupportsIndex) -> float:
    ...
def rl_draw_lengths(workload: RlWorkload = ..., lengths: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex] = []) -> list[list[float]]:
    """
    Every step's generation lengths as the simulators draw them (a group's samples adjacent).
    """
def rl_read_lengths(path: str, column: str = 'GeneratedTokens') -> list[float]:
    """
    One numeric column of a CSV (default: the Azure trace's GeneratedTokens); errors name file, line and column.
    """
def rl_sim_events(lengths: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], source: str, devices: typing.SupportsInt | typing.SupportsIndex = 8, workload: RlWorkload = ..., costs: RlCostModel = ..., policy: StageBalanceConfig = ..., initial_rollout: typing.SupportsInt | typing.SupportsIndex = 0, oracle_lookahead: typing.SupportsInt | typing.SupportsIndex = 2, progress: collections.abc.Callable[[int, int], None] = None, lookahead_samples: typing.SupportsInt | typing.SupportsIndex = 0) -> dict:
    """
    The event simulator: every static split one-step-off without and with the per-phase barrier and synchronous, the stage-balance policy moving devices inside a step, the within-step oracle and colocated time sharing, on the same lengths; with lookahead_samples > 0 also the references oracle_within_step_paid, lookahead_sampled and lookahead_sampled_independent.
    """
def rl_sim_sweep(lengths: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], source: str, devices: typing.SupportsInt | typing.SupportsIndex = 8, pipeline: str = 'one_step_off', workload: RlWorkload = ..., costs: RlCostModel = ..., policy: StageBalanceConfig = ..., initial_rollout: typing.SupportsInt | typing.SupportsIndex = 0, progress: collections.abc.Callable[[int, int], None] = None) -> dict:
    """
    Every static split, the stage-balance policy, the per-phase oracle and colocated time sharing on the same lengths.
    """
def statistical_efficiency(noise_scale: typing.SupportsFloat | typing.SupportsIndex, valid: bool, global_batch: typing.SupportsFloat | typing.SupportsIndex, base_batch: typing.SupportsFloat | typing.SupportsIndex) -> float:
    """
    (B + M0) / (B + M): efficiency of global batch M relative to M0.
    """
def step(loss, **signals):
    """
    One training step: feeds the loss (a float or a 0-d tensor) and optional signals to the
    process's controller and returns its StepStatus (the same object every step). A NaN/inf loss is
    counted and warned about once per streak (RuntimeWarning), never raised. Bad values and unknown
    keywords raise ValueError naming dra.step and the value.
    """
