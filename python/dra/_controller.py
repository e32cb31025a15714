"""The per-process controller behind ``dra.step``.

In a plain process (no torch.distributed) the controller runs the decision engine on its own:
signals are estimated and the policy decides, but the world is this one process, so every
decision is "hold" unless a capacity above one is declared. Under torchrun, ``dra.elastic``
installs an elastic controller that acts on the decisions.
"""

from __future__ import annotations

import warnings
from typing import Any

from dra import _core

_FIELDS = {
    "estimator": _core.EstimatorConfig,
    "throughput": _core.ThroughputModelConfig,
    "limits": _core.Constraints,
    "convergence": _core.ConvergencePhaseConfig,
    "goodput": _core.GoodputConfig,
}


def make_engine_config(
    *,
    policy: str = "convergence",
    min_size: int = 1,
    max_size: int | None = None,
    decide_every: int = 10,
    resize_cost_s: float = 0.0,
    horizon_steps: float = 500.0,
    **sections: Any,
) -> _core.EngineConfig:
    """Builds an EngineConfig from keywords.

    ``sections`` may hold ``estimator``, ``throughput``, ``limits``, ``convergence`` and
    ``goodput``, each a config object or a dict of its keywords. Raises ValueError naming the
    offending option; nothing is built on error.
    """
    config = _core.EngineConfig()
    for name, value in sections.items():
        if name not in _FIELDS:
            raise ValueError(f"unknown option '{name}'; valid sections: {', '.join(sorted(_FIELDS))}")
        if isinstance(value, dict):
            value = _FIELDS[name](**value)
        setattr(config, name, value)
    limits = config.limits
    if "limits" not in sections or not isinstance(sections["limits"], _core.Constraints):
        limits.min_size = int(min_size)
        if max_size is not None:
            limits.max_size = int(max_size)
        config.limits = limits
    config.policy = policy
    config.decide_every = int(decide_every)
    costs = _core.CostModel(float(resize_cost_s), float(horizon_steps))
    config.costs = costs
    config.validate()
    return config


class StepStatus:
    """What ``dra.step`` returns: a live view of the controller after the step.

    The same object is returned every step (no allocation on the hot path); read it before the
    next call or copy what you need with ``to_dict()``.
    """

    __slots__ = ("_controller",)

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    @property
    def step(self) -> int:
        return self._controller.step_index

    @property
    def signals(self) -> _core.ConvergenceSignals:
        return self._controller.engine.signals

    @property
    def decision(self) -> _core.Decision:
        return self._controller.engine.status.last_decision

    @property
    def decided(self) -> bool:
        return self._controller.engine.status.decided

    @property
    def world_size(self) -> int:
        return self._controller.world_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "world_size": self.world_size,
            "decided": self.decided,
            "signals": self.signals.to_dict(),
            "decision": self.decision.to_dict(),
        }

    def __repr__(self) -> str:
        s = self.signals
        return (
            f"<StepStatus step={self.step} world={self.world_size} phase={s.phase} "
            f"loss~{s.smoothed_loss:.4g} decision={self.decision.action}>"
        )


class Controller:
    """Single-process controller: estimator + throughput model + constrained policy."""

    def __init__(self, config: _core.EngineConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise ValueError("pass either an EngineConfig or keyword options, not both")
        self.engine = _core.ResizeEngine(config if config is not None else make_engine_config(**options))
        self._status = StepStatus(self)
        # Bound once: the per-step call is then one attribute load and one C++ call.
        self._advance = self.engine._advance

    @property
    def step_index(self) -> int:
        """Index of the latest step (the n-th call to ``step`` has index n - 1); -1 before the first."""
        return self.engine.last_step

    @property
    def world_size(self) -> int:
        return self.engine.world.size

    @property
    def signals(self) -> _core.ConvergenceSignals:
        return self.engine.signals

    def step(self, loss: Any, **signals: Any) -> StepStatus:
        """Feeds one training step. ``loss`` is a float or a 0-d tensor (read once, one sync).

        Optional keywords: ``small_sqr_norm``, ``small_batch``, ``big_sqr_norm``, ``big_batch``
        (two-batch gradient statistics), ``validation`` (a metric), ``step_time_s`` and
        ``sync_time_s`` (measured timing for the throughput model). A NaN/inf loss is counted and
        warned about once per streak; it never raises.
        """
        if type(loss) is not float:
            loss = _as_float(loss)
        if signals:
            signals = self._check_signals(signals)
        # One C++ call that returns the non-finite streak (0 when the loss counted).
        if self._advance(loss) == 1:
            _warn_nonfinite(loss, self.engine.last_step, stacklevel=4)
        if signals:
            self._extra(signals)
        return self._status

    _KNOWN_SIGNALS = frozenset(
        {"small_sqr_norm", "small_batch", "big_sqr_norm", "big_batch", "validation", "step_time_s", "sync_time_s"}
    )

    def _check_signals(self, signals: dict[str, Any]) -> dict[str, float]:
        # Checked and converted before the step is taken, so a bad call changes nothing.
        unknown = set(signals) - self._KNOWN_SIGNALS
        if unknown:
            raise ValueError(f"dra.step: unknown signal(s) {sorted(unknown)}; valid: {sorted(self._KNOWN_SIGNALS)}")
        grads = [signals.get(k) for k in ("small_sqr_norm", "small_batch", "big_sqr_norm", "big_batch")]
        if any(g is not None for g in grads) and any(g is None for g in grads):
            raise ValueError("dra.step: gradient statistics need all of small_sqr_norm, small_batch, big_sqr_norm, big_batch")
        return {k: _as_float(v) for k, v in signals.items() if v is not None}

    def _extra(self, signals: dict[str, float]) -> None:
        if "small_sqr_norm" in signals:
            self.engine.estimator.update_gradients(
                signals["small_sqr_norm"], signals["small_batch"], signals["big_sqr_norm"], signals["big_batch"]
            )
        if "validation" in signals:
            self.engine.estimator.update_validation(signals["validation"])
        if "step_time_s" in signals:
            world = self.engine.world
            self.engine.throughput.observe(
                world.size,
                world.global_batch / max(world.size, 1),
                signals["step_time_s"],
                signals.get("sync_time_s", 0.0),
            )


def _as_float(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    item = getattr(value, "item", None)
    shape = getattr(value, "shape", None)
    if item is None or shape is None:
        raise ValueError(f"dra.step: expected a float or a 0-d tensor, got {type(value).__name__}")
    if len(shape) != 0:
        raise ValueError(f"dra.step: expected a 0-d tensor, got shape {tuple(shape)}; pass loss.mean() or loss.sum()")
    # One .item(): the only device synchronisation of the call.
    return float(item())


def _warn_nonfinite(loss: float, index: int, stacklevel: int = 2) -> None:
    """Warns about the first non-finite loss of a streak (the estimator counts every one)."""
    warnings.warn(
        f"dra.step: non-finite loss {loss!r} at step {index} ignored "
        f"(counted in signals.nonfinite_count; warned once per streak)",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


_default: Controller | None = None


def _install(controller: Controller | None) -> None:
    """Points dra.step at `controller`: straight into its C++ engine for a plain Controller."""
    fast = controller is not None and type(controller).step is Controller.step
    _core._set_step_target(
        _step_slow,
        _warn_nonfinite,
        controller.engine if fast else None,  # type: ignore[union-attr]
        controller._status if fast else None,  # type: ignore[union-attr]
    )


def default_controller() -> Controller:
    """The process-wide controller that ``dra.step`` uses (created on first use)."""
    global _default
    if _default is None:
        _default = Controller()
        _install(_default)
    return _default


def reset(controller: Controller | None = None) -> Controller:
    """Replaces the process-wide controller (a fresh default one when None) and returns it."""
    global _default
    _default = controller if controller is not None else Controller()
    _install(_default)
    return _default


def _step_slow(loss: Any, **signals: Any) -> StepStatus:
    """dra.step for everything the C++ fast path does not take (tensors, keywords, other controllers)."""
    controller = _default
    if controller is None:
        controller = default_controller()
    if signals:
        return controller.step(loss, **signals)
    return controller.step(loss)


# dra.step: a C function. `dra.step(<float>)` on a plain Controller steps the C++ engine directly
# (no Python frame); every other call runs _step_slow above. Both behave identically.
step = _core._step
_install(None)
