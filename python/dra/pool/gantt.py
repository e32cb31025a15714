"""Gantt plot of a pool's events: devices over time, coloured by job (PNG)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def intervals(events: list[dict[str, Any]]) -> list[tuple[str, str, float, float]]:
    """(device, job, start, end) of every lease, from grant to release (open leases end at the
    last event)."""
    open_: dict[int, tuple[str, str, float]] = {}
    out = []
    end = max((e["time"] for e in events), default=0.0)
    for e in events:
        if e.get("event") == "grant":
            open_[e["lease"]] = (e["device"], e["job"], e["time"])
        elif e.get("event") == "release" and e.get("lease") in open_:
            d, j, t = open_.pop(e["lease"])
            out.append((d, j, t, e["time"]))
    out += [(d, j, t, end) for d, j, t in open_.values()]
    return out


def plot(events_path: str | Path, png: str | Path, title: str = "device pool", t0: float | None = None,
         devices: list[str] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [json.loads(line) for line in Path(events_path).read_text().splitlines() if line.strip()]
    spans = intervals(events)
    t0 = min((e["time"] for e in events), default=0.0) if t0 is None else t0
    devs = devices or sorted({d for d, *_ in spans})
    jobs = sorted({j for _, j, *_ in spans}, key=lambda j: min(s for _, jj, s, _ in spans if jj == j))
    cmap = plt.get_cmap("tab10")
    colour = {j: cmap(i % 10) for i, j in enumerate(jobs)}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(devs)))
    for d, j, s, e in spans:
        if d in devs:
            ax.barh(devs.index(d), e - s, left=s - t0, color=colour[j], edgecolor="white", height=0.8)
    ax.set_yticks(range(len(devs)), devs)
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    ax.legend(handles=[matplotlib.patches.Patch(color=colour[j], label=j) for j in jobs], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
