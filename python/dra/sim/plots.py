"""PNG plots of simulator results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(policy: str) -> dict[str, Any]:
    """An oracle_* line is dashed and grey, its legend saying what it is (not one of dra's results)."""
    return {"linestyle": "--", "color": "dimgrey"} if policy.startswith("oracle_") else {}


def _name(policy: str) -> str:
    return f"{policy} (oracle reference)" if policy.startswith("oracle_") else policy


def _moving_mean(y: Any, width: int) -> Any:
    """Mean over a centred window of ``width`` points, over the points there are at the ends (zero
    padding pulled both ends towards 0: a dip that is not in the data)."""
    import numpy as np

    kernel = np.ones(width)
    return np.convolve(y, kernel, mode="same") / np.convolve(np.ones(len(y)), kernel, mode="same")


def _declarations_tag(doc: dict[str, Any]) -> tuple[str, str]:
    """File-name tag and title text of a replay's declarations (empty when exact)."""
    d = doc.get("declarations") or {}
    if d.get("from_file"):
        return "-declfile", ", declarations from the file"
    if not (d.get("sigma") or d.get("none_share") or d.get("early_stop_share")):
        return "", ""
    return (f"-decl{d['sigma']:g}-{d['none_share']:g}-{d['early_stop_share']:g}",
            f", declared x exp({d['sigma']:g} z), {d['none_share']:.0%} none, {d['early_stop_share']:.0%} stop early")


def plot_replay(doc: dict[str, Any], folder: str | Path, label: str | None = None) -> list[Path]:
    """JCT distribution (CDF), devices allocated over time, and utilisation over time, per policy.
    Files are named ``<label>-<cost>-*.png``; the label defaults to the workload's name and load."""
    import numpy as np

    plt = _pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = doc["workload"]
    label = label or (f"{name}-load{doc['load']}" if doc.get("load") else name)
    system = doc.get("cost_mode", "same") == "system"
    cost = doc["reallocation_cost_s"]
    cost_tag = "system" if system else f"cost{cost:g}"
    cost_text = "each mechanism's own reallocation cost" if system else f"reallocation cost {cost:g} s"
    decl_tag, decl_text = _declarations_tag(doc)
    cost_tag += decl_tag
    cost_text += (f", load {doc['load']}x" if doc.get("load") else "") + decl_text
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in doc["policies"]:
        jcts = np.sort([j["jct_s"] for j in doc["jobs"] if j["policy"] == p and j["jct_s"] is not None])
        if len(jcts):
            ax.plot(jcts / 3600.0, np.arange(1, len(jcts) + 1) / len(jcts), label=f"{_name(p)} (avg {jcts.mean():.0f} s)",
                    **_style(p))
    for p, v in doc.get("published_avg_jct_s", {}).items():
        ax.axvline(v / 3600.0, linestyle=":", linewidth=1, color="grey")
        # Above the legend's corner (at the foot, the legend covered them).
        ax.text(v / 3600.0, 0.3, f" {p} published avg", rotation=90, fontsize=7, color="grey", va="bottom")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"{name}: JCT distribution (simulated, {cost_text})")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    path = folder / f"{label}-{cost_tag}-jct.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    capacity = doc["cluster"]["nodes"] * doc["cluster"]["devices_per_node"]
    for key, ylabel, suffix in (
        ("allocated", "devices allocated", "devices"),
        # The tables' cluster utilisation: busy (computing and synchronising) device time.
        ("busy_fraction", "cluster utilisation (busy device-time / capacity,\n10-interval moving mean)", "utilisation"),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for p, tl in doc["timelines"].items():
            t = np.asarray(tl["time_s"]) / 3600.0
            y = np.asarray(tl[key], dtype=float)
            if key == "busy_fraction" and len(y) > 10:
                y = _moving_mean(y, 10)
            ax.plot(t, y, label=_name(p), linewidth=1, **_style(p))
        if key == "allocated":
            ax.axhline(capacity, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel("time (h)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name}: {suffix} over time (simulated, {cost_text})")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = folder / f"{label}-{cost_tag}-{suffix}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_study(doc: dict[str, Any], folder: str | Path) -> list[Path]:
    """Distribution of per-run training time and GPU-hours relative to the static request, per policy
    (the static baselines in hindsight included). Needs the per-job records (not ``--no-jobs``)."""
    import numpy as np

    plt = _pyplot()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for j in doc["jobs"]:
        j = dict(j)
        s, c = j.get("start_s"), j.get("completion_s")
        j["training_time_s"] = c - s if s is not None and c is not None else None
        by.setdefault(j["policy"], {})[j["run"]] = j
    if not by:
        return []
    static = by["static_request"]
    written: list[Path] = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for p, runs in by.items():
        if p == "static_request" or "@" in p:  # the superseded target rule's rows: in the tables, not drawn
            continue
        ratio_t = [runs[i]["training_time_s"] / static[i]["training_time_s"] for i in runs if runs[i]["training_time_s"] and static[i]["training_time_s"]]
        ratio_g = [runs[i]["gpu_seconds"] / static[i]["gpu_seconds"] for i in runs if static[i]["gpu_seconds"]]
        bins = np.linspace(0, 2.5, 51)
        # An oracle reference as an outline, the policies filled.
        look = {"histtype": "step", "linestyle": "--", "color": "dimgrey"} if p.startswith("oracle_") else {"alpha": 0.5}
        axes[0].hist(np.clip(ratio_t, 0, 2.5), bins=bins, label=f"{_name(p)} (mean {np.mean(ratio_t):.3f})", **look)
        axes[1].hist(np.clip(ratio_g, 0, 2.5), bins=bins, label=f"{_name(p)} (mean {np.mean(ratio_g):.3f})", **look)
    for ax, what in zip(axes, ("training time", "GPU-hours")):
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(f"{what} / static_request {what}")
        ax.set_ylabel("runs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    c = doc.get("conditions", {})
    shared = "shared cluster" if doc.get("shared_cluster") else "each run alone"
    perturbed = str(c.get("requests", "")).startswith("perturbed")
    sigma = c.get("declared_sigma") or 0.0
    fig.suptitle(
        f"Study (simulated): {doc['runs']} runs, seed {doc['seed']}, {'perturbed (untuned)' if perturbed else 'tuned'} "
        f"requests, quota {doc['quota_scale']:g}x, resize cost {doc['reallocation_cost_s']:g} s, {shared}"
        + (f", declared x exp({sigma:g} z)" if sigma else "")
    )
    # Every condition the title names is in the name: a perturbed study no longer overwrote a tuned one.
    tag = ("-shared" if doc.get("shared_cluster") else "") + ("-perturbed" if perturbed else "")
    tag += f"-quota{doc['quota_scale']:g}-cost{doc['reallocation_cost_s']:g}" + (f"-sigma{sigma:g}" if sigma else "")
    group = re.search(r"groups of (\d+) runs", str(c.get("cluster", "")))
    gns = c.get("gns_estimate_sigma", 0.2)
    tag += ((f"-groups{group.group(1)}" if group else "") + ("-nonoise" if c.get("noise") is False else "")
            + (f"-gns{gns:g}" if gns != 0.2 else "") + ("-oldtarget" if "earlier rule" in str(c.get("target_rule")) else ""))
    path = folder / f"study-{doc['runs']}-seed{doc['seed']}{tag}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written
