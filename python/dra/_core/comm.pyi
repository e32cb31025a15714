"""
Communicator backends.
"""
from __future__ import annotations
import typing
__all__: list[str] = ['backends', 'nccl_compiled', 'nccl_load_error', 'nccl_runtime_version']
def backends() -> list[str]:
    """
    Names of the registered backends (what Controller(backend=...) takes).
    """
def nccl_load_error() -> str:
    """
    Why libnccl could not be loaded ('' when it loaded).
    """
def nccl_runtime_version() -> typing.Any:
    """
    Version of the libnccl the NCCL backend loads (dlopen on first use), or None when none loads.
    """
nccl_compiled: bool = True
