"""dra: grow and shrink a data-parallel training job in place, driven by how the model learns.

Single process::

    import dra
    for step, batch in enumerate(loader):
        loss = train_step(batch)
        status = dra.step(loss)

Under torchrun the same call drives the elastic world (see dra.elastic).
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the extension that links it)

from dra import _core
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
    ResizeEngine,
    ThroughputModel,
    ThroughputModelConfig,
    WorldState,
    adascale_gain,
    statistical_efficiency,
)
from dra._controller import Controller, StepStatus, default_controller, reset, step
from dra._info import build_info

__version__ = _core._build_info()["version"]

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
    "ResizeEngine",
    "StepStatus",
    "ThroughputModel",
    "ThroughputModelConfig",
    "WorldState",
    "__version__",
    "adascale_gain",
    "build_info",
    "default_controller",
    "reset",
    "statistical_efficiency",
    "step",
]
