"""JSON-lines resize events and the live one-line status (rank 0)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


class EventLog:
    """Appends one JSON object per line; flushed per event so a crash loses nothing written."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def emit(self, event: dict[str, Any]) -> None:
        event = {"time": time.time(), **event}
        self.events.append(event)
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(event, sort_keys=True) + "\n")
        print("[dra] " + json.dumps(event, sort_keys=True), file=sys.stderr, flush=True)


class StatusLine:
    """``[dra] step 120 loss 0.4231 world 3 samples/s 5321`` every `every` steps."""

    def __init__(self, every: int) -> None:
        self.every = int(every)
        self._t = time.perf_counter()
        self._samples = 0

    def tick(self, step: int, loss: float, world: int, samples: int) -> None:
        if self.every <= 0:
            return
        self._samples += samples
        if step % self.every:
            return
        now = time.perf_counter()
        rate = self._samples / max(now - self._t, 1e-9)
        self._t, self._samples = now, 0
        print(f"[dra] step {step} loss {loss:.4f} world {world} samples/s {rate:.0f}", flush=True)
