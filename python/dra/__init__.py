"""dra: grow and shrink a data-parallel training job in place, driven by how the model learns.

One process::

    import dra
    for batch in loader:
        loss = train_step(batch)
        status = dra.step(loss)          # a StepStatus: signals, decision, world

Under torchrun the same call drives the elastic world (``dra.elastic.init``); ``dra.step``
returns the same StepStatus there.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the extension that links it)

from dra import _core
from dra._controller import Controller, StepStatus, default_controller, reset, step
from dra._core import (
    Capacity,
    ConstrainedPolicy,
    Constraints,
    ConvergenceEstimator,
    ConvergencePhaseConfig,
    ConvergencePhasePolicy,
    ConvergenceSignals,
    CostModel,
    Decision,
    DraError,
    EngineConfig,
    EstimatorConfig,
    GoodputConfig,
    GoodputPolicy,
    Options,
    RemainingWorkConfig,
    RemainingWorkEstimator,
    ResizeEngine,
    ThroughputModel,
    ThroughputModelConfig,
    WorkEstimate,
    WorldState,
    adascale_gain,
    gittins_size,
    statistical_efficiency,
)
from dra._info import build_info

__version__: str = _core._build_info()["version"]

__all__ = [
    "Capacity",
    "ConstrainedPolicy",
    "Constraints",
    "Controller",
    "ConvergenceEstimator",
    "ConvergencePhaseConfig",
    "ConvergencePhasePolicy",
    "ConvergenceSignals",
    "CostModel",
    "Decision",
    "DraError",
    "EngineConfig",
    "EstimatorConfig",
    "GoodputConfig",
    "GoodputPolicy",
    "Options",
    "RemainingWorkConfig",
    "RemainingWorkEstimator",
    "ResizeEngine",
    "StepStatus",
    "ThroughputModel",
    "ThroughputModelConfig",
    "WorkEstimate",
    "WorldState",
    "__version__",
    "adascale_gain",
    "build_info",
    "default_controller",
    "gittins_size",
    "reset",
    "statistical_efficiency",
    "step",
]
