"""What dra reads and sets of a torch process group: its backend as ``init_process_group`` and
``new_group`` take it, and its timeout."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def backend_config(dist: Any, group: Any) -> str:
    """The group's backend as init_process_group takes it ('gloo', 'nccl', 'cpu:gloo,cuda:nccl')."""
    config = str(dist.distributed_c10d._world.pg_backend_config.get(group) or dist.get_backend(group))
    names = set(backend_names(config))
    # One backend for every device ('gloo' is kept as 'cpu:gloo,cuda:gloo'): given as the script gave it.
    return names.pop() if len(names) == 1 else config


def backend_names(config: str) -> list[str]:
    return [part.split(":")[-1].strip().lower() for part in config.split(",") if part.strip()]


def backends_of(group: Any) -> list[Any]:
    import torch

    out = []
    for device in ("cpu", "cuda", "xpu"):
        try:
            out.append(group._get_backend(torch.device(device)))
        except Exception:  # noqa: BLE001, S112 - no backend for that device
            continue
    return out


def timeout_of(group: Any) -> timedelta | None:
    """The timeout the script gave its group (None: torch's default)."""
    for backend in backends_of(group):
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
    return None


def set_timeout(group: Any, timeout: timedelta) -> None:
    for backend in backends_of(group):
        setter = getattr(backend, "_set_default_timeout", None)
        if setter is not None:
            setter(timeout)
