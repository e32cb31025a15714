"""The figures of ``python -m dra.bench step``: per launch and across launches, the report rows and
the printed breakdown (see :mod:`dra_bench.step_overhead`)."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

from dra_bench._report import result
from dra_bench._step_config import COMPARISONS, GOAL_PCT, PHASES, VARIANTS


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def _pooled(run: dict, variant: str, key: str, phase: str | None = None) -> list[float]:
    values: list[float] = []
    for rnd in run["rounds"]:
        v = rnd["variants"][variant]
        values += v["phases_s"][phase] if phase else v[key]
    return values


def _bootstrap_median_ci(values: list[float], rng: random.Random, n: int = 2000) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def _launch_figures(ranks: list[dict]) -> dict[str, Any]:
    """One launch: rank 0's statistics per variant, the ratios of dra to plain and to bare."""
    r0 = ranks[0]
    row: dict[str, Any] = {}
    for v in VARIANTS:
        steps, cpus = _pooled(r0, v, "step_s"), _pooled(r0, v, "cpu_s")
        row[v] = {
            "median_s": statistics.median(steps),
            "p10_s": _quantile(steps, 0.10),
            "mean_s": statistics.fmean(steps),
            "cpu_median_s": statistics.median(cpus),
            "phases_median_s": {ph: statistics.median(_pooled(r0, v, "", ph)) for ph in PHASES},
            "steps": len(steps),
        }
    for key, (var, base) in COMPARISONS.items():
        d, b = row[var], row[base]
        # Paired: the steps of one iteration ran back to back, under the same load.
        diffs = [x - y for rnd in r0["rounds"] for x, y in zip(rnd["variants"][var]["step_s"], rnd["variants"][base]["step_s"])]
        row[key] = {
            "ratio": d["median_s"] / b["median_s"],
            "ratio_p10": d["p10_s"] / b["p10_s"],
            "ratio_mean": d["mean_s"] / b["mean_s"],
            "ratio_cpu": d["cpu_median_s"] / b["cpu_median_s"],
            "ratio_paired": 1.0 + statistics.median(diffs) / b["median_s"],
            "round_ratios": [
                statistics.median(rnd["variants"][var]["step_s"]) / statistics.median(rnd["variants"][base]["step_s"])
                for rnd in r0["rounds"]
            ],
            "per_rank": [statistics.median(_pooled(r, var, "step_s")) / statistics.median(_pooled(r, base, "step_s")) for r in ranks],
        }
    calls = _pooled(r0, "dra", "", "dra_step")
    row["dra_step_mean_s"] = statistics.fmean(calls)
    row["dra_step_p90_s"] = _quantile(calls, 0.90)
    others = [t for r in ranks[1:] for t in _pooled(r, "dra", "", "dra_step")]
    row["dra_step_other_ranks_median_s"] = statistics.median(others) if others else None
    row["allreduce_flat_s"] = statistics.median(r0["allreduce_flat_s"])
    row["grad_numel"] = r0["grad_numel"]
    row["decide_every"] = r0["decide_every"]
    return row


def _analyse(launches: list[list[dict]]) -> dict[str, Any]:
    """Across launches: medians of the per-launch figures, spread of the ratios, breakdown."""
    per_launch = [_launch_figures(ranks) for ranks in launches]

    def med(f) -> float:
        return statistics.median(f(r) for r in per_launch)

    out: dict[str, Any] = {"per_launch": per_launch}
    for key in COMPARISONS:
        ratios = [r[key]["ratio"] for r in per_launch]
        rounds = [x for r in per_launch for x in r[key]["round_ratios"]]
        out[key] = {
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_ci95_rounds": list(_bootstrap_median_ci(rounds, random.Random(0))),
            "per_launch": ratios,
            "per_rank": [r[key]["per_rank"] for r in per_launch],
            **{k: med(lambda r, k=k, key=key: r[key][k]) for k in ("ratio_p10", "ratio_mean", "ratio_cpu", "ratio_paired")},
        }
    for v in VARIANTS:
        out[v] = {k: med(lambda r, v=v, k=k: r[v][k]) for k in ("median_s", "p10_s", "mean_s", "cpu_median_s")}
        out[v]["phases"] = {ph: med(lambda r, v=v, ph=ph: r[v]["phases_median_s"][ph]) for ph in PHASES}
    others = [r["dra_step_other_ranks_median_s"] for r in per_launch if r["dra_step_other_ranks_median_s"] is not None]
    out.update(
        dra_step_mean_s=med(lambda r: r["dra_step_mean_s"]),
        dra_step_p90_s=med(lambda r: r["dra_step_p90_s"]),
        dra_step_other_ranks_s=statistics.median(others) if others else None,
        allreduce_flat_s=med(lambda r: r["allreduce_flat_s"]),
        grad_numel=per_launch[0]["grad_numel"],
        decide_every=per_launch[0]["decide_every"],
        steps_per_variant=sum(r["dra"]["steps"] for r in per_launch),
    )
    return out


def _overhead_row(name: str, key: str, a: dict[str, Any], config: dict[str, Any], note: str) -> dict[str, Any]:
    c = a[key]
    return result(
        name, 100.0 * (c["ratio"] - 1.0), "%",
        goal_pct=GOAL_PCT,
        ratio_median=c["ratio"], ratio_min=c["ratio_min"], ratio_max=c["ratio_max"], ratio_ci95_rounds=c["ratio_ci95_rounds"],
        per_launch_ratios=c["per_launch"], per_rank_ratios=c["per_rank"],
        p10_pct=100.0 * (c["ratio_p10"] - 1.0),
        paired_pct=100.0 * (c["ratio_paired"] - 1.0),
        mean_based_pct=100.0 * (c["ratio_mean"] - 1.0),
        cpu_time_pct=100.0 * (c["ratio_cpu"] - 1.0),
        steps_per_variant=a["steps_per_variant"],
        note=note + "; value: median over launches of (median step / median baseline step) - 1, rank 0; spread: min/max over "
        "launches and a bootstrap 95% CI of the median per-round ratio; p10: 10th percentiles; paired: median of the "
        "back-to-back step differences; mean_based: means (carry periodic costs); cpu: process CPU time",
        **config,
    )


def _rows(model: str, nproc: int, a: dict[str, Any], spec: dict[str, int]) -> list[dict[str, Any]]:
    tag = f"{model}_n{nproc}"
    ph = {v: a[v]["phases"] for v in VARIANTS}
    config = {"model": model, "world_size": nproc, "grad_numel": a["grad_numel"], "decide_every": a["decide_every"],
              "hidden": spec["hidden"], "depth": spec["depth"], "global_batch": spec["global_batch"]}
    sync = {v: ph[v]["backward"] - ph["local"]["backward"] for v in ("plain", "dra", "bare")}
    rows = [
        result(f"step_time_plain_ddp_{tag}", a["plain"]["median_s"], "s", p10_s=a["plain"]["p10_s"], mean_s=a["plain"]["mean_s"],
               note="median per-step time, torch DDP over Gloo", **config),
        result(f"step_time_dra_{tag}", a["dra"]["median_s"], "s", ("plain_ddp", a["plain"]["median_s"]),
               p10_s=a["dra"]["p10_s"], mean_s=a["dra"]["mean_s"],
               note="median per-step time, dra elastic controller (static world)", **config),
        _overhead_row(f"step_overhead_{tag}", "vs_plain", a, config, "dra vs torch DDP (the goal: < 1 %)"),
        _overhead_row(f"step_noise_aa_{tag}", "aa", a, config,
                      "A/A control: the same DDP job twice in the same processes; its 'overhead' is the measurement's scatter"),
        result(f"step_time_bare_{tag}", a["bare"]["median_s"], "s", p10_s=a["bare"]["p10_s"], mean_s=a["bare"]["mean_s"],
               note="median per-step time, one hand-written flat Gloo all-reduce after backward", **config),
        _overhead_row(f"step_overhead_vs_bare_{tag}", "vs_bare", a, config, "dra vs the hand-written flat all-reduce (dra's own cost)"),
        result(f"step_time_local_{tag}", a["local"]["median_s"], "s", note="same model and per-rank batch, no communication", **config),
        result(f"dra_step_call_{tag}", ph["dra"]["dra_step"], "s", mean_s=a["dra_step_mean_s"], p90_s=a["dra_step_p90_s"],
               other_ranks_median_s=a["dra_step_other_ranks_s"],
               note="time inside dra.step(loss) per step, rank 0 (the leader, which also decides every decide_every steps)"),
        result(f"grad_sync_dra_{tag}", sync["dra"], "s", ("plain_ddp", sync["plain"]), bare_s=sync["bare"],
               note="backward with the gradient reduction minus the local backward: dra's gradient hook + flat all-reduce, "
               "vs DDP's reducer; bare_s: the hand-written flat all-reduce"),
        result(f"allreduce_flat_{tag}", a["allreduce_flat_s"], "s", note="one Gloo all-reduce of the gradients' size (the floor)"),
        result(f"step_cpu_dra_{tag}", a["dra"]["cpu_median_s"], "s", ("plain_ddp", a["plain"]["cpu_median_s"]),
               bare_s=a["bare"]["cpu_median_s"], note="process CPU time per step (all threads), median"),
    ]
    rows[2]["breakdown_median_s"] = ph
    return rows


def _print_breakdown(model: str, nproc: int, a: dict[str, Any]) -> None:
    print(f"[step] {model}, {nproc} processes: phases (rank 0, median ms)", flush=True)
    print(f"    {'variant':<7} " + " ".join(f"{p:>10}" for p in PHASES) + f" {'step':>10} {'p10':>8} {'cpu':>8}")
    for v in VARIANTS:
        ph = a[v]["phases"]
        print(f"    {v:<7} " + " ".join(f"{1e3 * ph[p]:>10.3f}" for p in PHASES)
              + f" {1e3 * a[v]['median_s']:>10.3f} {1e3 * a[v]['p10_s']:>8.3f} {1e3 * a[v]['cpu_median_s']:>8.3f}")
    for key, (var, base) in COMPARISONS.items():
        c = a[key]
        lo, hi = c["ratio_ci95_rounds"]
        print(f"    {var}/{base} = {c['ratio']:.4f} (launches {c['ratio_min']:.4f}..{c['ratio_max']:.4f}; rounds CI95 {lo:.4f}..{hi:.4f}); "
              f"p10 {c['ratio_p10']:.4f}; paired {c['ratio_paired']:.4f}; mean {c['ratio_mean']:.4f}; CPU {c['ratio_cpu']:.4f}")
    other = a["dra_step_other_ranks_s"]
    print(f"    dra.step: rank 0 median {1e6 * a['dra']['phases']['dra_step']:.1f} us, p90 {1e6 * a['dra_step_p90_s']:.1f} us, "
          f"mean {1e6 * a['dra_step_mean_s']:.1f} us" + (f"; other ranks median {1e6 * other:.1f} us" if other is not None else "")
          + f"; flat all-reduce of {a['grad_numel']} floats {1e3 * a['allreduce_flat_s']:.3f} ms", flush=True)
