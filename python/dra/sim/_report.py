"""Markdown tables of a replay and of a study."""

from __future__ import annotations

import math
from typing import Any


def _fmt(v: Any, spec: str = ".0f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


def _pct(d: dict[str, Any] | None, pct: bool = True) -> str:
    if not d:
        return "-"
    k = 100.0
    unit = " %" if pct else " pt"
    est = d["estimate"]
    if est is None or not math.isfinite(est):
        return "-"
    if d.get("ci95") is None:
        return f"{est * k:+.1f}{unit}"
    return f"{est * k:+.1f}{unit} [{d['ci95'][0] * k:+.1f}, {d['ci95'][1] * k:+.1f}]"


def _cost_label(doc: dict[str, Any]) -> str:
    """How reallocations were charged: one cost for all, or each system's own (system view)."""
    if doc.get("cost_mode", "same") == "same":
        return f"reallocation cost {doc['reallocation_cost_s']:g} s, every policy"
    each = ", ".join(f"{p} {c:g} s" for p, c in doc["reallocation_cost_s_by_policy"].items())
    launch = doc.get("launch_cost_s")
    first = f"; every job's first start {launch:g} s, whatever its system" if launch is not None else ""
    return f"system view, each mechanism's own cost per change: {each}{first}"


def unfinished_note(doc: dict[str, Any]) -> str:
    """A warning when some policy left jobs (a study: runs) unfinished at the simulation's horizon
    ("" when none): its figures then cover the finished ones only, a different set for each policy."""
    study = "shared_cluster" in doc
    unit = "runs" if study else "jobs"
    short = {p: a for p, a in doc["policies"].items() if a.get("unfinished")}
    if not short:
        return ""
    each = ", ".join(f"{p} {a['unfinished']} of {a[unit]}" for p, a in short.items())
    horizon = max(a["end_s"] for a in short.values()) / 86400.0
    if not study:
        figures = "Averages, p99 and makespan"
        fix = f"Give the cluster more devices (--nodes, --devices-per-node) or a lighter workload{_cost_hint(doc, short)}"
    else:
        figures = "Means, medians and p99"
        fix = ("Give each shared cluster fewer runs (--jobs-per-cluster) or a lighter request pool (--workloads)"
               if doc["shared_cluster"] else "Give the runs a lighter request pool (--workloads)")
    return (f"**Warning: {unit} unfinished at the horizon** ({each}; the simulation stops 30 days after the first "
            f"arrival, here at day {horizon:.1f}). {figures} cover each policy's finished {unit} only, "
            f"so they are not comparable across policies; the paired changes (vs) use the {unit} finished under both. "
            f"{fix}.")


def _cost_hint(doc: dict[str, Any], short: dict[str, Any]) -> str:
    """The cost as a cause too, when a policy that left jobs unfinished paid at least an interval per change."""
    costs = doc.get("reallocation_cost_s_by_policy") or {}
    interval = doc.get("interval_s") or 60.0
    big = sorted({c for p, c in costs.items() if p in short and c >= interval})
    if not big:
        return ""
    return (f", or a smaller --reallocation-cost ({', '.join(f'{c:g}' for c in big)} s per change here, at least the "
            f"{interval:g} s between decisions)")


def markdown_replay(doc: dict[str, Any]) -> str:
    published = doc.get("published_avg_jct_s", {})
    load = f", load {doc['load']}x" if doc.get("load") else ""
    lines = [
        f"### {doc['workload']}{load} ({_cost_label(doc)}; simulated)",
        "",
        "| policy | finished | avg JCT (s) | p99 JCT (s) | makespan (s) | GPU-hours | utilisation (busy/held) | cluster util. | final metric | reallocations | JCT vs pollux | p99 vs pollux | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, a in doc["policies"].items():
        vs = a.get("vs", {}).get("pollux", {})
        bound = f" ({ORACLE_LABEL})" if p.startswith("oracle_") else ""
        lines.append(
            f"| {p}{bound} | {a['completed']}/{a['jobs']} | {_fmt(a['avg_jct_s'])} | {_fmt(a['p99_jct_s'])} | {_fmt(a['makespan_s'])} | {_fmt(a['gpu_hours'], '.1f')} | "
            f"{_fmt(a['utilization'], '.3f')} | {_fmt(a['cluster_utilization'], '.3f')} | {_fmt(a['final_metric'], '.4f')} | "
            f"{a['reallocations']} | {_pct(vs.get('jct_change'))} | {_pct(vs.get('p99_jct_change'))} | {_fmt(a['wall_s'], '.2f')} |"
        )
    for p, v in published.items():
        lines.append(f"| {p} (published) | | {_fmt(v)} | | | | | | | | | | |")
    short = unfinished_note(doc)
    if short:
        lines.append("\n" + short)
    d = doc.get("declarations")
    if d:
        lines.append(
            f"\nDeclarations: budget x exp({d['sigma']:g} z), {d['none_share']:.0%} declare nothing, "
            f"{d['early_stop_share']:.0%} stop early (seed {d['seed']})."
        )
        if not d.get("from_file") and d["sigma"] == 0 and d["none_share"] == 0:
            lines.append(
                "Every job declares its exact budget: the most favourable case for a policy that reads declarations "
                "(convergence_aware); --declared-sigma 0.5 --declared-none 0.25 gives realistic ones "
                "(docs/guide/simulator-results.md)."
            )
    return "\n".join(lines) + "\n"


# What an oracle_* row is: the same policy handed the truth. Not a bound: on workload-1 at 30 s per
# reallocation it averaged 1927 s against convergence_aware's 1904 s (an outside review).
ORACLE_LABEL = "oracle reference: reads the true remaining work; not guaranteed better"


def markdown_study(doc: dict[str, Any]) -> str:
    c = doc["conditions"]
    lines = [
        f"### Study: {doc['runs']} runs, seed {doc['seed']} (simulated): {c['requests']} requests, quota {c['quota_scale']:g}x "
        f"request, resize cost {c['reallocation_cost_s']:g} s, {c['cluster']}, target {c['target']} (wall {doc['wall_s']:.1f} s)",
        "",
        "| policy | finished | mean training time (s) | median training time (s) | mean JCT (s) | GPU-hours "
        "| utilisation (busy / capacity x span) | busy/held | target reached | final metric (attainment) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, a in doc["policies"].items():
        lines.append(
            f"| {p}{f' ({ORACLE_LABEL})' if p.startswith('oracle_') else ''} | {a['completed']}/{a['runs']} | {_fmt(a['mean_training_time_s'])} | {_fmt(a.get('median_training_time_s'))} | {_fmt(a['mean_jct_s'])} | "
            f"{_fmt(a['gpu_hours'], '.0f')} | {_fmt(a['utilization'], '.3f')} | {_fmt(a.get('busy_fraction_of_held'), '.3f')} | "
            f"{_fmt(a['reached_target'], '.3f')} | {_fmt(a['final_metric_attainment'], '.4f')} |"
        )
    short = unfinished_note(doc)
    if short:
        lines.append("\n" + short)
    if not c.get("declared_sigma"):
        lines.append(
            "\nEvery run declares its exact budget (--declared-sigma 0): the most favourable case for a policy that "
            "reads declarations."
        )
    if c["cluster"] == "each run alone":
        # Alone, the remaining-work estimate reaches a decision only through the run's own steps
        # left: --declared-sigma 0, 0.5, 1 and 3 gave identical results at 1 s per resize.
        lines.append(
            "Each run alone: declarations hardly enter decisions here (the estimate only bounds the run's own steps "
            "left); their effect shows in `replay` and in the shared-cluster study."
        )
    for b in doc["baselines"]:
        rows = [(p, a["vs"][b]) for p, a in doc["policies"].items() if b in a.get("vs", {})]
        if not rows:
            continue
        lines += [
            "",
            f"| vs {b} | training time (pooled mean) | per-run median | mean of per-run ratios | JCT (mean) | GPU-hours | "
            "utilisation (points) | final metric |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p, v in rows:
            lines.append(
                f"| {p} | {_pct(v['training_time_change'])} | {_pct(v.get('median_training_time_change_per_run'))} | "
                f"{_pct(v['training_time_change_per_run'])} | {_pct(v['jct_change'])} | "
                f"{_pct(v['gpu_hours_change'])} | {_pct(v['utilization_change'], pct=False)} | "
                f"{v['final_metric_change']['estimate']:+.4f} |"
            )
    return "\n".join(lines) + "\n"
