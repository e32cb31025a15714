"""Build information: what this installation of dra contains."""

from __future__ import annotations

from typing import Any

import torch

from dra import _core


def build_info() -> dict[str, Any]:
    """dra version, torch versions (compiled against / running), compiler, compiled-in backends.

    ``backends["nccl"]`` is the NCCL version the backend was built against, or None when the
    NCCL backend is not compiled in. ``backends["nccl_runtime"]`` is the version of the libnccl
    the backend loads at run time (it decides which fast paths are used), or None when the
    backend is not compiled in or no libnccl can be loaded.
    """
    raw = _core._build_info()
    return {
        "version": raw["version"],
        "torch_version": torch.__version__,
        "torch_version_compiled": raw["torch_version_compiled"],
        "compiler": raw["compiler"],
        "backends": {"gloo": bool(raw["gloo"]), "nccl": raw["nccl"], "nccl_runtime": _nccl_runtime()},
        "registered_backends": list(_core.comm.backends()),
    }


def _nccl_runtime() -> str | None:
    # Loads libnccl on first use (dlopen), which is why it is not part of _build_info: that one
    # runs at import.
    probe = getattr(_core.comm, "nccl_runtime_version", None)
    return probe() if probe is not None else None
