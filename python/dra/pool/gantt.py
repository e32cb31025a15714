"""Gantt plot of a pool's events (PNG): devices over time, one colour per job (the same in every
chart drawn with the same job list), a lease held drawn light and its worker running drawn solid,
each job's arrival marked, and the host's load under it when given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra.pool import _events


def intervals(events: list[dict[str, Any]]) -> list[tuple[str, str, float, float]]:
    """(device, job, start, end) of every lease, from grant to release (open leases end at the
    last event)."""
    return [(d, j, s, e) for d, j, s, e, _ in leases(events)]


def leases(events: list[dict[str, Any]]) -> list[tuple[str, str, float, float, float | None]]:
    """(device, job, granted, released, worker started or None) of every lease."""
    open_: dict[int, list[Any]] = {}
    out = []
    end = max((e["time"] for e in events), default=0.0)
    first = min((e["time"] for e in events), default=0.0)
    for e in events:
        kind = e.get("event")
        if kind == "grant":
            open_[e["lease"]] = [e["device"], e["job"], e["time"], None]
        elif kind == "worker_start" and e.get("lease") in open_:
            open_[e["lease"]][3] = open_[e["lease"]][3] or e["time"]
        elif kind == "release" and e.get("lease") in open_:
            d, j, t, w = open_.pop(e["lease"])
            out.append((d, j, t, e["time"], w))
        elif kind == "release" and "device" in e:  # granted before the oldest kept events file
            out.append((e["device"], e["job"], first, e["time"], None))
    out += [(d, j, t, end, w) for d, j, t, w in open_.values()]
    return out


def job_colours(jobs: list[str]) -> dict[str, Any]:
    """One colour per job, by its place in ``jobs`` (give every chart the same list)."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {j: cmap(i % 10) for i, j in enumerate(jobs)}


def plot(events_path: str | Path, png: str | Path, title: str = "device pool", t0: float | None = None,
         devices: list[str] | None = None, jobs: list[str] | None = None,
         load: list[tuple[float, float]] | None = None, cores: int | None = None,
         late: list[float] | None = None) -> Path:
    """``jobs``: the colour order (default: by first grant); ``load``: (time, host load) samples
    drawn under the chart, against ``cores``; ``late``: arrival times of requests answered past
    their SLO, marked along the chart's foot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    events = list(_events.read(events_path))  # the rotated files too, oldest first
    spans = leases(events)
    t0 = min((e["time"] for e in events), default=0.0) if t0 is None else t0
    devs = devices or sorted({d for d, *_ in spans})
    order = jobs or sorted({j for _, j, *_ in spans}, key=lambda j: min(s for _, jj, s, *_ in spans if jj == j))
    colour = job_colours(order + sorted({j for _, j, *_ in spans} - set(order)))
    rows = 2 if load else 1
    fig, axes = plt.subplots(rows, 1, figsize=(11, 1.6 + 0.5 * len(devs) + (1.6 if load else 0)), sharex=True,
                             gridspec_kw={"height_ratios": [max(2, len(devs)), 2][:rows]}, squeeze=False)
    ax = axes[0][0]
    for d, j, s, e, w in spans:
        if d not in devs:
            continue
        y = devs.index(d)
        ax.barh(y, e - s, left=s - t0, color=colour[j], alpha=0.3, edgecolor="white", height=0.8)  # lease held
        if w is not None:
            ax.barh(y, e - w, left=w - t0, color=colour[j], edgecolor="white", height=0.8)  # worker running
    arrivals = [(e["time"], e["job"]) for e in events if e.get("event") == "submit"]
    for t, j in arrivals:
        ax.plot(t - t0, len(devs) - 0.35, marker="v", color=colour.get(j, "black"), markersize=8, clip_on=False)
    for t in late or []:
        ax.plot(t - t0, -0.45, marker="x", color="red", markersize=6, clip_on=False)
    ax.set_yticks(range(len(devs)), devs)
    ax.set_ylim(-0.6, len(devs) - 0.2)
    ax.set_title(title)
    handles: list[Any] = [Patch(color=colour[j], label=j) for j in colour if any(j == jj for _, jj, *_ in spans)
                          or any(j == jj for _, jj in arrivals)]
    handles += [Patch(facecolor="grey", alpha=0.3, label="lease held"), Patch(facecolor="grey", label="worker running"),
                Line2D([], [], marker="v", color="grey", linestyle="", label="arrival")]
    if late:
        handles.append(Line2D([], [], marker="x", color="red", linestyle="", label=f"past the SLO ({len(late)})"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if load:
        lx = axes[1][0]
        lx.plot([t - t0 for t, _ in load], [v for _, v in load], color="black", linewidth=1)
        if cores:
            lx.axhline(cores, color="grey", linestyle="--", linewidth=0.8, label=f"{cores} cores")
            lx.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        lx.set_ylabel("host load")
        lx.set_ylim(bottom=0)
    axes[-1][0].set_xlabel("time (s)")
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
