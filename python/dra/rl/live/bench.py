"""The live rows of ``python -m dra.bench rl --live`` (measured on this machine's quota-capped slots).

Every static split and the stage-balance policy run in the same benchmark run, on the same slot
processes, the same prompts and the same sampling noise (a hash of each sequence's identity), one
after the other, after a discarded warm-up run:

- ``rl_live_throughput``: the dynamic run's trained sequences per second against the best static
  split's (``best_static_split``: every split was run); extra fields give every split's figure,
  whether the dynamic run beat every one, and how far the reward curves differ;
- ``rl_switch_hidden_fraction``: the part of the dynamic run's switch costs that was hidden
  behind the other role's work (percent);
- ``rl_payback_steps``: the median over switches of the steps until the time saved, against the
  static run at the split the switch left (measured in the same benchmark run), covered the
  switch's exposed cost.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from dra.bench._report import result
from dra.rl.live.coordinator import LiveConfig, LiveRL, columns


def realised_payback(dynamic: dict[str, Any], statics: dict[int, dict[str, Any]]) -> list[float]:
    """Per switch: phases until the time saved against the static run at the split it left
    covers its exposed cost (inf: never, before the next switch or the end)."""
    out = []
    ph = dynamic["phases"]
    log = dynamic["switch_log"]
    for i, s in enumerate(log):
        first = s["phase"]
        end = log[i + 1]["phase"] if i + 1 < len(log) else len(ph)
        old = ph[first]["rollout"] - s["moved"] if s["direction"] == "to_rollout" else ph[first]["rollout"] + s["moved"]
        stay = statics.get(old)
        if stay is None:
            out.append(math.inf)
            continue
        saved = -s["exposed_s"]
        payback = math.inf
        for q in range(first, end):
            before = saved
            clean = ph[q]["duration_s"] - (s["exposed_s"] if q == first else 0.0)
            saved += stay["phases"][q]["duration_s"] - clean
            if saved >= 0.0:
                gain = saved - before
                payback = (q - first) + ((0.0 - before) / gain if gain > 0 else 1.0)
                break
        out.append(payback)
    return out


def live_rows(*, steps: int = 30, seeds: int = 1, plots: str | None = None, out_dir: str = "out/rl-live",
              config: LiveConfig | None = None, quiet: bool = False, reward_steps: int = 0) -> list[dict[str, Any]]:
    cfg = config or LiveConfig(steps=steps)
    cfg.steps = steps
    out = Path(out_dir)
    runs: dict[str, dict[str, Any]] = {}
    seed_runs: list[dict[str, Any]] = []
    with LiveRL(cfg, out, quiet=quiet) as live:
        warm = live.run_warmup()
        for r in range(1, cfg.slots):
            runs[f"static-{r}"] = live.run(f"static-{r}", r)
        runs["dynamic"] = live.run("dynamic", None)
        long_run = None
        if reward_steps > 0:  # does the reward rise? one longer run of the best split
            best_r = max((r for r in runs.values() if r["rollout"] is not None), key=lambda r: r["samples_per_s"])["rollout"]
            long_run = live.run(f"static-{best_r}-long", best_r, steps=reward_steps)
        params, quota = live.parameters, cfg.cpus_per_slot if live.slot_manager else None
        weights_group_s = live.weights_group_s
    statics = {run["rollout"]: run for run in runs.values() if run["rollout"] is not None}
    best = max(statics.values(), key=lambda r: r["samples_per_s"])
    dyn = runs["dynamic"]
    # Seed noise: the best split again under other seeds (other prompts and sampling noise).
    for s in range(1, seeds):
        seed_cfg = LiveConfig(**{**cfg.__dict__, "seed": cfg.seed + s})
        with LiveRL(seed_cfg, out, quiet=quiet) as live:  # the same pretrained start (cached in out/cache)
            live.run_warmup()
            seed_runs.append(live.run(f"static-{best['rollout']}-seed{s}", best["rollout"]))
    reward_gap = max(abs(a - b) for a, b in zip(dyn["rewards"], best["rewards"]))
    seed_gap = max((abs(a - b) for r in seed_runs for a, b in zip(r["rewards"], best["rewards"])), default=None)
    paybacks = realised_payback(dyn, statics)
    common = {
        "label": "measured",
        "setting": {"slots": cfg.slots, "cpus_per_slot": quota, "steps": steps, "prompts_per_step": cfg.prompts_per_step,
                    "group_size": cfg.group_size, "parameters": params, "length_scale": cfg.length_scale, "drift": cfg.drift,
                    "trace": cfg.trace, "weights_group_s": weights_group_s, "warmup_s": warm["total_s"]},
        "static_samples_per_s": {str(r): statics[r]["samples_per_s"] for r in sorted(statics)},
        "best_static_rollout": best["rollout"],
    }
    beat_all = all(dyn["samples_per_s"] > r["samples_per_s"] for r in statics.values())
    rows = [
        result("rl_live_throughput", dyn["samples_per_s"], "samples/s", ("best_static_split", best["samples_per_s"]),
               beats_every_static=beat_all, dynamic_switches=dyn["switches"],
               dynamic_mean_rollout=dyn["mean_rollout_devices"],
               reward_first_last={"dynamic": [dyn["rewards"][0], dyn["rewards"][-1]], "best_static": [best["rewards"][0], best["rewards"][-1]]},
               reward_curve_max_gap_vs_best_static=reward_gap, reward_curve_max_gap_other_seed=seed_gap,
               exactly_once=all(r["ledger"]["exactly_once"] for r in runs.values()),
               final_weights_identical=all(r.get("final_weights_identical", False) for r in runs.values()),
               goal="gain over every static split with the same reward curve", **common),
    ]
    hidden = dyn["hidden_fraction"]
    rows.append(result("rl_switch_hidden_fraction", 100.0 * hidden if hidden is not None else float("nan"), "%",
                       goal=">= 27 %", switches=dyn["switch_log"], **common))
    finite = [p for p in paybacks if math.isfinite(p)]
    rows.append(result("rl_payback_steps", statistics.median(paybacks) if paybacks else float("nan"), "steps",
                       goal="<= 11", per_switch=[p if math.isfinite(p) else None for p in paybacks],
                       paid_back=f"{len(finite)} of {len(paybacks)}", **common))
    if long_run is not None:
        rw = long_run["rewards"]
        k = max(1, len(rw) // 5)
        rows.append(result("rl_live_reward_trend", statistics.fmean(rw[-k:]), "reward", ("first_fifth", statistics.fmean(rw[:k])),
                           exact_first_last=[statistics.fmean(long_run["exact"][:k]), statistics.fmean(long_run["exact"][-k:])],
                           steps=len(rw), rollout=long_run["rollout"], rewards=rw, label="measured"))
    (out / "runs.json").write_text(json.dumps({"runs": runs, "seed_runs": seed_runs, "long_run": long_run}, indent=1, default=str))
    if plots:
        from dra.rl.plots import plot_roles

        title = f"live RL, {cfg.slots} slots x {quota} CPU" if quota else f"live RL, {cfg.slots} slots (no quota)"
        plot_roles({"dynamic (stage balance)": columns(dyn), f"best static ({best['rollout']} rollout)": columns(best)},
                   Path(plots) / "rl-live-roles.png", title=title, label="measured", devices=cfg.slots)
        plot_rewards(runs, seed_runs, Path(plots) / "rl-live-rewards.png")
    return rows


def plot_rewards(runs: dict[str, dict[str, Any]], seed_runs: list[dict[str, Any]], path: Path) -> Path:
    """Mean reward per step of every run (measured): the curves should lie on each other."""
    from dra.rl.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in [*runs.items(), *((r["name"], r) for r in seed_runs)]:
        style = {"linewidth": 2.2, "color": "black"} if name == "dynamic" else {"linewidth": 0.9, "alpha": 0.7}
        ax.plot(range(len(r["rewards"])), r["rewards"], label=name, **style)
    ax.set_xlabel("step (batch generated)")
    ax.set_ylabel("mean reward of the batch")
    ax.set_title("live GRPO: reward per step, every schedule [measured]")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
