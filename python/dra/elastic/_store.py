"""The c10d store the elastic world coordinates through (DESIGN.md §3.3).

Either the TCPStore torchrun provides (MASTER_ADDR/MASTER_PORT) or a dedicated store process
started with ``python -m dra.elastic store --port P``. Every wait on it is bounded: a store that
cannot be reached raises TimeoutError naming the address; a store that goes away mid-job raises
``dra.MembershipError`` from the next store operation (never a hang).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from dra import _core


class StoreClient:
    """A TCPStore client plus the key namespace of one job, with bounded, JSON-valued operations."""

    def __init__(self, host: str, port: int, *, prefix: str, timeout_s: float, is_master: bool = False) -> None:
        self.host, self.port, self.timeout_s = host, int(port), float(timeout_s)
        self.address = f"{host}:{self.port}"
        deadline = time.monotonic() + self.timeout_s
        last: Exception | None = None
        # TCPStore's own connect loop honours `timeout`, but a refused connection on some builds
        # fails at once: retry until the deadline so a store that starts a moment later is found.
        while True:
            try:
                raw = dist.TCPStore(
                    host,
                    self.port,
                    None,
                    is_master,
                    timedelta(seconds=max(0.5, min(self.timeout_s, deadline - time.monotonic()))),
                    wait_for_workers=False,
                )
                break
            except Exception as err:  # noqa: BLE001 (torch raises several types here)
                last = err
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"dra: the store at {self.address} could not be reached within {self.timeout_s:g}s "
                        f"({type(last).__name__}: {str(last).splitlines()[0] if str(last) else ''}); check "
                        f"MASTER_ADDR/MASTER_PORT (or the address given to dra) and that the store process runs"
                    ) from None
                time.sleep(0.1)
        self.raw = raw
        self.raw.set_timeout(timedelta(seconds=self.timeout_s))
        self.prefix = prefix
        self.store = dist.PrefixStore(prefix, raw)

    # -- bounded primitives -------------------------------------------------------------------
    def _lost(self, err: Exception, what: str) -> Exception:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "timeout" in text.lower() or "timed out" in text.lower():
            return TimeoutError(f"dra: waiting for '{what}' on the store at {self.address} timed out ({text})")
        return _core.MembershipError(f"dra: the store at {self.address} failed during '{what}': {text}")

    def set(self, key: str, value: Any) -> None:
        try:
            self.store.set(key, json.dumps(value))
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def get(self, key: str, timeout_s: float | None = None) -> Any:
        """Blocks until `key` exists (at most timeout_s, default the store timeout)."""
        try:
            if timeout_s is not None:
                self.store.wait([key], timedelta(seconds=timeout_s))
            return json.loads(self.store.get(key))
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def try_get(self, key: str) -> Any | None:
        try:
            if not self.store.check([key]):
                return None
            return json.loads(self.store.get(key))
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def exists(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def add(self, key: str, amount: int) -> int:
        try:
            return int(self.store.add(key, amount))
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def claim(self, key: str, value: str) -> bool:
        """Atomically sets `key` to `value` unless it exists; True when this call set it."""
        try:
            got = self.store.compare_set(key, "", value)
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None
        return (got.decode() if isinstance(got, bytes) else str(got)) == value

    def delete(self, key: str) -> None:
        try:
            self.store.delete_key(key)
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def append_list(self, key: str, item: int) -> None:
        try:
            self.store.append(key, f"{item},")
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None

    def read_list(self, key: str) -> list[int]:
        try:
            if not self.store.check([key]):
                return []
            raw = self.store.get(key).decode()
        except Exception as err:  # noqa: BLE001
            raise self._lost(err, key) from None
        return [int(x) for x in raw.split(",") if x]


def store_address_from_env() -> tuple[str, int] | None:
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    return host, int(port)


def job_prefix() -> str:
    """Keys of one job (and of one torchrun restart) live under their own prefix."""
    run = os.environ.get("DRA_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or "job"
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"dra/{run}/{restart}/"


def serve(port: int, host: str = "0.0.0.0") -> None:
    """Hosts a c10d TCPStore until killed (``python -m dra.elastic store --port P``)."""
    store = dist.TCPStore(host, int(port), None, True, timedelta(seconds=60), wait_for_workers=False)
    print(f"[dra] store listening on {host}:{store.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
