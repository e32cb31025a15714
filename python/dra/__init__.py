"""dra: grow and shrink a data-parallel training job in place, driven by how the model learns.

One process::

    import dra
    for batch in loader:
        loss = train_step(batch)
        status = dra.step(loss)          # a StepStatus: signals, decision, world

Under torchrun the same call drives the elastic world (``dra.elastic.init``); ``dra.step``
returns the same StepStatus there.

``import dra`` itself loads nothing heavy: the compiled core (``dra._core``, which links libtorch)
and torch load on first use of a name below, so ``dra.sim`` and ``dra-sim`` (on the torch-free
``dra._sim``) start without torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from dra._sim import version as __version__


class _TorchBeforeCore:
    """Imports torch before ``dra._core`` however the latter is imported (the extension links
    libtorch, whose libraries torch's import loads)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "dra._core" and "dra._core" not in sys.modules:
            import torch  # noqa: F401

            _offer_pip_nccl()
        return None


def _offer_pip_nccl() -> None:
    """Names the NCCL of a pip wheel (``nvidia-nccl-cu13``/``-cu12``, in this interpreter's
    site-packages) to the NCCL backend as a candidate after the loader's own search (DRA_NCCL_LIBRARY,
    then ``libnccl.so.2`` as torch or the system loaded it): found by the module's location, nothing
    imported. A wheel of dra built elsewhere knows no other path to it."""
    import importlib.util
    import os

    if os.environ.get("DRA_NCCL_PIP_LIBRARY"):
        return
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return
    for folder in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(folder, "lib", "libnccl.so.2")
        if os.path.isfile(lib):
            os.environ["DRA_NCCL_PIP_LIBRARY"] = lib
            return


if _TorchBeforeCore not in sys.meta_path:
    sys.meta_path.insert(0, _TorchBeforeCore)

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
_CONTROLLER_NAMES = frozenset({"Controller", "StepStatus", "default_controller", "reset", "step"})
# Every other public name is the compiled core's.
_CORE_NAMES = frozenset(__all__) - _CONTROLLER_NAMES - {"__version__", "build_info"}


def __getattr__(name: str) -> Any:
    # `from dra import _core` asks for the attribute first, so it lands here too.
    if name == "_core":
        return importlib.import_module("dra._core")
    if name in _CORE_NAMES:
        value = getattr(importlib.import_module("dra._core"), name)
    elif name in _CONTROLLER_NAMES:
        value = getattr(importlib.import_module("dra._controller"), name)
    elif name == "build_info":
        value = importlib.import_module("dra._info").build_info
    else:
        raise AttributeError(f"module 'dra' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
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
        ResizeEngine,
        ThroughputModel,
        ThroughputModelConfig,
        WorldState,
        adascale_gain,
        statistical_efficiency,
    )
    from dra._info import build_info

