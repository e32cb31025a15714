"""PNG plots of RL pipeline runs: role sizes and throughput over time (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _smoothed(values: Sequence[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_roles(
    runs: dict[str, dict[str, Any]],
    path: str | Path,
    *,
    title: str,
    label: str,
    devices: int,
    window: int = 5,
) -> Path:
    """Two panels over time: rollout devices of each run (trainers = devices - rollout), and its
    throughput (trained sequences per second over the last `window` phases). ``runs`` maps a
    legend name to a run dict (``phases`` columns as from ``dra.rl.simulate`` or the live loop);
    ``label`` says what the figures are (simulated, measured)."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for name, run in runs.items():
        ph = run["phases"]
        t = [s + d for s, d in zip(ph["start_s"], ph["duration_s"])]
        top.step([0.0] + t, [ph["rollout"][0]] + list(ph["rollout"]), where="pre", label=name, linewidth=1.4)
        done = _smoothed([float(n) for n in ph["trained_sequences"]], window)
        spent = _smoothed(list(ph["duration_s"]), window)
        bottom.plot(t, [a / b if b > 0 else 0.0 for a, b in zip(done, spent)], label=name, linewidth=1.2)
        for i, a in enumerate(ph["action"]):
            if a != "hold":
                top.axvline(ph["start_s"][i], color="grey", linewidth=0.6, linestyle=":")
    top.set_ylabel(f"rollout devices (of {devices})")
    top.set_ylim(0, devices)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="best")
    bottom.set_ylabel(f"samples/s ({window}-phase window)")
    bottom.set_xlabel("time (s)")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"{title} [{label}]")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_simulation(doc: dict[str, Any], folder: str | Path) -> list[Path]:
    """Role sizes and throughput over time of the dynamic run next to the best static split,
    the oracle and colocated time sharing, for one ``dra.rl.simulate`` result."""
    st = doc["settings"]
    best = doc["statics"][doc["best_static"]]
    runs = {
        "dynamic (stage balance)": doc["dynamic"],
        f"best static ({best['rollout']} rollout)": best,
        "oracle (per-phase best)": doc["oracle"],
    }
    name = st["scenario"] or "custom"
    source = st["length_source"].replace("AzureLLMInferenceTrace_", "azure ").replace(".csv:GeneratedTokens", "")
    title = f"RL pipeline {name}: {source}, drift x{st['workload']['drift_final_scale']:g}, {st['pipeline']}"
    path = Path(folder) / f"rl-{name}-roles.png"
    return [plot_roles(runs, path, title=title, label="simulated", devices=st["devices"])]


def plot_rewards(runs: dict[str, dict[str, Any]], seed_runs: list[dict[str, Any]], path: Path, window: int = 1) -> Path:
    """Mean reward per step of every run (measured), averaged over `window` steps: the schedules'
    curves should lie on each other."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    every = [*runs.items(), *((r["name"], r) for r in seed_runs)]
    longest = max((len(r["rewards"]) for _, r in every), default=0)
    window = max(1, min(window, longest))  # the mean a short run can have (a 1-step run: none)
    for name, r in every:
        style = {"linewidth": 2.2, "color": "black"} if name == "dynamic" else {"linewidth": 0.9, "alpha": 0.7}
        if len(r["rewards"]) < 20:
            style["marker"] = "o"  # a curve of one point draws no line
        ax.plot(range(len(r["rewards"])), _smoothed(r["rewards"], window), label=name, **style)
        if window > 1 and "exact" in r:
            ax.plot(range(len(r["exact"])), _smoothed(r["exact"], window), label=f"{name}: exact answers", linestyle="--", **style)
    ax.set_xlabel("step (batch generated)")
    ax.set_ylabel("mean reward of the batch" + (f" (mean of the last {window} steps)" if window > 1 else ""))
    ax.set_title("live GRPO: reward per step [measured]")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_pipeline(doc: dict[str, Any], folder: str | Path) -> list[Path]:
    """Two PNGs of one ``dra.rl.simulate_pipeline`` result (simulated): the rollout devices over
    time of the policy (with each planner), the oracle and the best static split
    (``rl-<scenario>-roles.png``), and every static split in each pipeline against the policy,
    the look-ahead planner, the oracle and colocated time sharing
    (``rl-<scenario>-static-vs-dynamic.png``)."""
    plt = _pyplot()
    st = doc["settings"]
    name = st["scenario"] or "custom"
    devices = st["devices"]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    best = doc["barrier_free"][doc["best_barrier_free"]]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    lines = [("stage balance (in-step moves)", doc["dynamic"], {"linewidth": 1.0})]
    if doc.get("dynamic_lookahead") and doc["dynamic"]["name"] != "dynamic_lookahead":
        lines.append(("look-ahead planner", doc["dynamic_lookahead"], {"linewidth": 0.8, "alpha": 0.8}))
    lines.append(("oracle_within_step", doc["oracle_within_step"], {"linewidth": 0.8, "alpha": 0.7}))
    for label, run, style in lines:
        r = run["roles"]
        ax.step(list(r["t"]) + [run["total_s"]], list(r["rollout"]) + [r["rollout"][-1]], where="post", label=label, **style)
    ax.hlines(best["rollout"], 0, best["total_s"], colors="black", linestyles="--", linewidth=1.2,
              label=f"best static split ({best['rollout']} rollout, no barrier)")
    ax.set_ylim(0, devices)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"rollout devices (of {devices})")
    ax.set_title(f"RL pipeline {name}: roles over time [simulated]")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    roles = folder / f"rl-{name}-roles.png"
    fig.savefig(roles, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    splits = [r["rollout"] for r in doc["barrier_free"]]
    width = 0.27
    for i, (label, runs) in enumerate((("one-step-off, no barrier", doc["barrier_free"]), ("one-step-off, per-phase barrier", doc["barrier"]),
                                       ("synchronous", doc["synchronous"]))):
        ax.bar([x + (i - 1) * width for x in splits], [r["total_s"] for r in runs], width, label=f"static: {label}")
    levels = [("stage balance (in-step moves)", doc["dynamic"], "black", "-")]
    if doc.get("dynamic_lookahead") and doc["dynamic"]["name"] != "dynamic_lookahead":
        levels.append(("look-ahead planner", doc["dynamic_lookahead"], "purple", ":"))
    levels += [("oracle_within_step", doc["oracle_within_step"], "green", "--"), ("colocated time sharing", doc["colocated"], "grey", "--")]
    for label, run, color, style in levels:
        ax.axhline(run["total_s"], color=color, linewidth=2.2 if style == ":" else 1.3, linestyle=style, label=label)
    ax.set_xticks(splits)
    ax.set_xticklabels([f"{r}/{devices - r}" for r in splits])
    ax.set_xlabel("static split (rollout / train devices)")
    ax.set_ylabel("total time (s)")
    ax.set_ylim(0, 2.0 * best["total_s"])
    ax.set_title(f"RL pipeline {name}: static splits vs dynamic [simulated]")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    bars = folder / f"rl-{name}-static-vs-dynamic.png"
    fig.savefig(bars, dpi=120)
    plt.close(fig)
    return [roles, bars]
