"""The live rows of ``python -m dra.bench rl --live`` (measured on this machine's quota-capped slots).

Every static split and the stage-balance policy run in the same benchmark run, on the same slot
processes, the same prompts and the same sampling noise (a hash of each sequence's identity),
after a discarded warm-up run, in rounds of a fresh seeded order each; each schedule's figure is
the median over the rounds:

- ``rl_live_throughput``: the dynamic run's trained sequences per second against the best static
  split's (``best_static_split``: every split was run); extra fields give every split's figure,
  whether the dynamic run beat every one, and how far the reward curves differ;
- ``rl_switch_hidden_fraction``: the part of the switch costs that was hidden behind the other
  role's work (percent), over the dynamic runs' switches and those of ``switch_runs`` runs of the
  best split with a scheduled switch away from it and back (both directions, measured even when
  the policy, rightly, does not switch; the two are also given apart);
- ``rl_payback_steps``: the median over switches of the steps until the time saved, against the
  static run at the split the switch left (measured in the same benchmark run), covered the
  switch's exposed cost.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dra.rl.live.accounting import columns
from dra.rl.live.config import LiveConfig
from dra.rl.live.coordinator import LiveRL
from dra.rl.plots import plot_rewards
from dra_bench._report import result


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


def live_rows(*, steps: int = 12, rounds: int = 3, seeds: int = 1, plots: str | None = None, out_dir: str = "out/rl-live",
              config: LiveConfig | None = None, quiet: bool = False, reward_steps: int = 0,
              switch_runs: int = 0) -> list[dict[str, Any]]:
    """Every static split and the dynamic policy, `rounds` times each, in rounds of a fresh seeded
    order each (the machine is shared: its load drifts over minutes, so a schedule's figure is the
    median of its rounds, and each round compares the schedules side by side)."""
    cfg = config or LiveConfig(steps=steps)
    cfg.steps = steps
    out = Path(out_dir)
    schedules: list[tuple[str, int | None]] = [(f"static-{r}", r) for r in range(1, cfg.slots)] + [("dynamic", None)]
    rounds_runs: list[dict[str, dict[str, Any]]] = []
    seed_runs: list[dict[str, Any]] = []
    long_run = None
    with LiveRL(cfg, out, quiet=quiet) as live:
        warm = live.run_warmup()
        for k in range(rounds):
            # A fresh (seeded) order each round: a rotation would give every schedule the same
            # predecessor in every round, and the run before a run affects it (measured: with a
            # rotation, the dynamic run that held 4/4 beat the 4/4 runs in 6 of 6 rounds).
            order = list(schedules)
            random.Random(1000 * cfg.seed + k).shuffle(order)
            this: dict[str, dict[str, Any]] = {}
            for name, r in order:
                run = live.run(name, r)
                run["round"] = k
                this[name] = run
            rounds_runs.append(this)
        medians = {name: statistics.median(rr[name]["samples_per_s"] for rr in rounds_runs) for name, _ in schedules}
        best_name = max((n for n, r in schedules if r is not None), key=lambda n: medians[n])
        best_r = int(best_name.split("-")[1])
        # Both directions' switch costs at the real setting: away from the best split a third of the
        # way in, back two thirds of the way in (a switch the policy would not make; only its cost
        # and how much of it was hidden are used).
        away = best_r + 1 if best_r + 1 < cfg.slots else best_r - 1
        first_at, back_at = max(2, steps // 3), max(3, (2 * steps) // 3)
        switched_runs = [live.run(f"switched-{i}", best_r, schedule={first_at: away, back_at: best_r}) for i in range(switch_runs)
                         if back_at <= steps]
        if reward_steps > 0:  # does the reward rise? one longer run of the best split
            long_run = live.run(f"{best_name}-long", best_r, steps=reward_steps)
        params, quota = live.parameters, cfg.cpus_per_slot if live.slot_manager else None
        weights_group_s = live.weights_group_s
    # Seed noise: the best split again under other seeds (other prompts and sampling noise).
    for s in range(1, seeds):
        seed_cfg = LiveConfig(**{**cfg.__dict__, "seed": cfg.seed + s})
        with LiveRL(seed_cfg, out, quiet=quiet) as live:  # the same pretrained start (cached in out/cache)
            live.run_warmup()
            seed_runs.append(live.run(f"{best_name}-seed{s}", best_r))
    first = rounds_runs[0]
    dyn0, best0 = first["dynamic"], first[best_name]
    reward_gap = max(abs(a - b) for a, b in zip(dyn0["rewards"], best0["rewards"]))
    seed_gap = max((abs(a - b) for r in seed_runs for a, b in zip(r["rewards"], best0["rewards"])), default=None)
    dyn_runs = [rr["dynamic"] for rr in rounds_runs]
    paybacks = [p for rr in rounds_runs
                for p in realised_payback(rr["dynamic"], {r["rollout"]: r for r in rr.values() if r["rollout"] is not None})]
    per_round_ratio = [rr["dynamic"]["samples_per_s"] / rr[best_name]["samples_per_s"] for rr in rounds_runs]
    common = {
        "label": "measured",
        "setting": {"slots": cfg.slots, "cpus_per_slot": quota, "steps": steps, "rounds": rounds, "prompts_per_step": cfg.prompts_per_step,
                    "group_size": cfg.group_size, "parameters": params, "length_scale": cfg.length_scale, "drift": cfg.drift,
                    "trace": cfg.trace, "weights_group_s": weights_group_s, "warmup_s": warm["total_s"]},
        "median_samples_per_s": medians,
        "per_round": [{n: {"samples_per_s": r["samples_per_s"], "load_average": r.get("load_average")} for n, r in rr.items()}
                      for rr in rounds_runs],
        "best_static": best_name,
    }
    def hidden(runs: list[dict[str, Any]]) -> float | None:
        tot = sum(r["switch_total_s"] for r in runs)
        return 100.0 * (1.0 - sum(r["switch_exposed_s"] for r in runs) / tot) if tot > 0 else None

    all_hidden = hidden(dyn_runs + switched_runs)
    rows = [
        result("rl_live_throughput", medians["dynamic"], "samples/s", ("best_static_split", medians[best_name]),
               beats_every_static=all(medians["dynamic"] > medians[n] for n, r in schedules if r is not None),
               dynamic_over_best_static_per_round=per_round_ratio,
               dynamic_switches=[r["switches"] for r in dyn_runs],
               dynamic_mean_rollout=[r["mean_rollout_devices"] for r in dyn_runs],
               reward_first_last={"dynamic": [dyn0["rewards"][0], dyn0["rewards"][-1]], best_name: [best0["rewards"][0], best0["rewards"][-1]]},
               reward_curve_max_gap_vs_best_static=reward_gap, reward_curve_max_gap_other_seed=seed_gap,
               exactly_once=all(r["ledger"]["exactly_once"] for rr in rounds_runs for r in rr.values()),
               final_weights_identical=all(r.get("final_weights_identical", False) for rr in rounds_runs for r in rr.values()),
               goal="gain over every static split with the same reward curve", **common),
        result("rl_switch_hidden_fraction", all_hidden if all_hidden is not None else float("nan"), "%",
               goal=">= 27 %", dynamic_hidden=hidden(dyn_runs), scheduled_hidden=hidden(switched_runs),
               switches=[s for r in dyn_runs for s in r["switch_log"]],
               scheduled_switches=[s for r in switched_runs for s in r["switch_log"]],
               scheduled_runs_samples_per_s=[r["samples_per_s"] for r in switched_runs], **common),
    ]
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
    (out / "runs.json").write_text(json.dumps({"rounds": rounds_runs, "seed_runs": seed_runs, "long_run": long_run,
                                               "switched_runs": switched_runs}, indent=1, default=str))
    if plots:
        from dra.rl.plots import plot_roles

        title = f"live RL, {cfg.slots} slots x {quota} CPU" if quota else f"live RL, {cfg.slots} slots (no quota)"
        plot_roles({"dynamic (stage balance)": columns(dyn0), f"best static ({best_r} rollout)": columns(best0)},
                   Path(plots) / "rl-live-roles.png", title=title + " (round 1)", label="measured", devices=cfg.slots)
        plot_rewards(first, seed_runs + ([long_run] if long_run else []), Path(plots) / "rl-live-rewards.png")
    return rows


def live_pipeline_rows(*, steps: int = 12, rounds: int = 3, plots: str | None = None, out_dir: str = "out/rl-live-longgen",
                       config: LiveConfig | None = None, quiet: bool = False) -> list[dict[str, Any]]:
    """The pipeline without a per-phase barrier on the calibrated long-generation task (measured):
    every static split, the stage-balance policy moving slots inside a step, and an A/A control
    (the middle split twice), in rounds of a fresh seeded order each.

    - ``rl_live_throughput_longgen``: the dynamic run's trained sequences per second against the
      best static split's (medians over the rounds), with each round's gain over that round's best
      static run next to the round's A/A spread (the goal: a larger gain in every round);
    - ``rl_live_throughput_longgen_lookahead``: the same for the look-ahead planner
      (``planner="lookahead"``: StageBalancePolicy.plan on the leader's snapshot), run in the same
      rounds beside the configured planner (when that is "window");
    - ``rl_live_aa_spread``: the largest A/A spread of a round, |a - b| / mean(a, b)."""
    cfg = config or LiveConfig(steps=steps, trace="reasoning", drift=2.0, updates_per_step=4)
    cfg.steps = steps
    out = Path(out_dir)
    aa = cfg.slots // 2
    dynamics = {"dynamic": None}
    if cfg.policy.get("planner", "window") != "lookahead":
        dynamics["dynamic-lookahead"] = {**cfg.policy, "planner": "lookahead"}
    schedules: list[tuple[str, int | None]] = ([(f"static-{r}", r) for r in range(1, cfg.slots)] + [(d, None) for d in dynamics]
                                               + [(f"static-{aa}-aa", aa)])
    rounds_runs: list[dict[str, dict[str, Any]]] = []
    with LiveRL(cfg, out, quiet=quiet) as live:
        warm = live.run_pipeline("warmup", aa, steps=2)
        for k in range(rounds):
            order = list(schedules)
            random.Random(1000 * cfg.seed + k).shuffle(order)
            this: dict[str, dict[str, Any]] = {}
            for name, r in order:
                run = live.run_pipeline(name, r, policy=dynamics.get(name))
                run["round"] = k
                this[name] = run
            rounds_runs.append(this)
        params, quota = live.parameters, cfg.cpus_per_slot if live.slot_manager else None
    statics = [n for n, r in schedules if r is not None and not n.endswith("-aa")]
    medians = {name: statistics.median(rr[name]["samples_per_s"] for rr in rounds_runs) for name, _ in schedules}
    best_name = max(statics, key=lambda n: medians[n])
    per_round = []
    for rr in rounds_runs:
        best_round = max(rr[n]["samples_per_s"] for n in statics)
        a, b = rr[f"static-{aa}"]["samples_per_s"], rr[f"static-{aa}-aa"]["samples_per_s"]
        spread = abs(a - b) / (0.5 * (a + b))
        gain = rr["dynamic"]["samples_per_s"] / best_round - 1.0
        gains = {d: rr[d]["samples_per_s"] / best_round - 1.0 for d in dynamics}
        per_round.append({"gain_over_best_static_of_round": gain, "aa_spread": spread, "gain_exceeds_aa": gain > spread,
                          "gains": gains, "gains_exceed_aa": {d: g > spread for d, g in gains.items()},
                          "samples_per_s": {n: r["samples_per_s"] for n, r in rr.items()},
                          "dynamic_switches": rr["dynamic"]["switches"], "dynamic_mean_rollout": rr["dynamic"]["mean_rollout_devices"],
                          "load_average": {n: r.get("load_average") for n, r in rr.items()}})
    first = rounds_runs[0]
    dyn0, best0 = first["dynamic"], first[best_name]
    reward_gap = max(abs(x - y) for x, y in zip(dyn0["rewards"], best0["rewards"]))
    aa_gap = max(abs(x - y) for x, y in zip(first[f"static-{aa}"]["rewards"], first[f"static-{aa}-aa"]["rewards"]))
    common = {
        "label": "measured",
        "setting": {"slots": cfg.slots, "cpus_per_slot": quota, "steps": steps, "rounds": rounds, "prompts_per_step": cfg.prompts_per_step,
                    "group_size": cfg.group_size, "updates_per_step": cfg.updates_per_step, "parameters": params, "trace": cfg.trace,
                    "growth": cfg.drift, "pipeline": "one-step-off, no per-phase barrier", "warmup_s": warm["total_s"],
                    "model": asdict(cfg.model), "pretrain_steps": cfg.pretrain_steps, "rollout_slots": cfg.rollout_slots},
        "median_samples_per_s": medians,
        "per_round": per_round,
        "best_static": best_name,
        "aa_pair": [f"static-{aa}", f"static-{aa}-aa"],
    }
    rows = [
        result("rl_live_throughput_longgen", medians["dynamic"], "samples/s", ("best_static_split", medians[best_name]),
               goal="a gain over every static split larger than the A/A spread in every round",
               goal_met=all(p["gain_exceeds_aa"] for p in per_round),
               beats_every_static_median=all(medians["dynamic"] > medians[n] for n in statics),
               reward_curve_max_gap_vs_best_static=reward_gap, reward_curve_max_gap_aa=aa_gap,
               exactly_once=all(r["ledger"]["exactly_once"] for rr in rounds_runs for r in rr.values()),
               final_weights_identical=all(r.get("final_weights_identical", False) for rr in rounds_runs for r in rr.values()),
               switches=[s for rr in rounds_runs for s in rr["dynamic"]["switch_log"]], **common),
    ]
    if "dynamic-lookahead" in dynamics:
        rows.append(result("rl_live_throughput_longgen_lookahead", medians["dynamic-lookahead"], "samples/s",
                           ("best_static_split", medians[best_name]),
                           goal="a gain over every static split larger than the A/A spread in every round",
                           goal_met=all(p["gains_exceed_aa"]["dynamic-lookahead"] for p in per_round),
                           beats_every_static_median=all(medians["dynamic-lookahead"] > medians[n] for n in statics),
                           per_round_gain=[p["gains"]["dynamic-lookahead"] for p in per_round],
                           planner_ms_median=statistics.median([d["plan_ms"] for rr in rounds_runs
                                                                for d in rr["dynamic-lookahead"]["decisions"] if "plan_ms" in d] or [0.0]),
                           switches=[s for rr in rounds_runs for s in rr["dynamic-lookahead"]["switch_log"]], **common))
    rows += [
        result("rl_live_aa_spread", max(p["aa_spread"] for p in per_round), "fraction",
               per_round_spread=[p["aa_spread"] for p in per_round], **common),
    ]
    (out / "runs.json").write_text(json.dumps({"rounds": rounds_runs}, indent=1, default=str))
    if plots:
        from dra.rl.plots import plot_rewards, plot_roles

        title = f"live RL, long generations, {cfg.slots} slots x {quota} CPU" if quota else f"live RL, long generations, {cfg.slots} slots"
        plot_roles({"dynamic (stage balance, in-step)": columns(dyn0), f"best static ({best0['rollout']} rollout)": columns(best0)},
                   Path(plots) / "rl-live-longgen-roles.png", title=title + " (round 1)", label="measured", devices=cfg.slots)
        plot_rewards({"dynamic": dyn0, best_name: best0, f"static-{aa}-aa": first[f"static-{aa}-aa"]}, [],
                     Path(plots) / "rl-live-longgen-rewards.png")
    return rows
