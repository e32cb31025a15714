"""Build information: what this installation of dra contains."""

from __future__ import annotations

from typing import Any

import torch

from dra import _core


def build_info() -> dict[str, Any]:
    """dra version, torch versions (compiled against / running), compiler, compiled-in backends.

    ``backends["nccl"]`` is the NCCL version the backend was built against, or None when the
    NCCL backend is not compiled in.
    """
    raw = _core._build_info()
    return {
        "version": raw["version"],
        "torch_version": torch.__version__,
        "torch_version_compiled": raw["torch_version_compiled"],
        "compiler": raw["compiler"],
        "backends": {"gloo": bool(raw["gloo"]), "nccl": raw["nccl"]},
    }
