"""What a live RL run measured, from the records the coordinator keeps: the cost split of each role
switch and how much of it its phase hid, the run's totals, and its phases as columns for plots."""

from __future__ import annotations

from typing import Any


def switch_cost(sw: dict[str, Any], phase: dict[str, Any]) -> dict[str, Any]:
    """The cost split of a switch in the phase it took effect, and how much of it the phase
    hid. The parts: the coordinator's decision and the joiners' registration (agree, serial),
    then the controller's world change as its resize event reports it (the members' agreement,
    the rebuild of the trainers' communicator, the state handed to joiners, the reshard), the
    optimizer state a joiner received after the change (deferred restore), and a new rollout
    worker's engine start. Exposed = this phase's stage time minus what it would have been
    without the blocking parts (the trainers' boundary or a joiner's admission, the part of the
    deferred transfer a joiner waited for at its optimizer step, the engine start)."""
    ts = phase["train_stats"]
    rs = phase["rollout_stats"]
    events = [st["event"] for st in list(ts.values()) + list(rs.values()) if st.get("event")]
    cost = (events[0].get("cost_s") or {}) if events else {}
    blocking = max((st.get("boundary_s", 0.0) + st.get("join_s", 0.0) + st.get("deferred_wait_s", 0.0) for st in ts.values()), default=0.0)
    deferred = max((st.get("deferred_s", 0.0) for st in ts.values()), default=0.0)
    engine = max((rs[s].get("engine_start_s", 0.0) for s in sw["slots"] if s in rs), default=0.0)
    leave = max((rs[s].get("leave_s", 0.0) for s in sw["slots"] if s in rs), default=0.0)
    clean_train = max(0.0, phase["train_s"] - blocking) if phase["train_s"] else 0.0
    clean_rollout = max(0.0, phase["rollout_s"] - engine - leave) if phase["rollout_s"] else 0.0
    exposed = max(0.0, phase["stages_s"] - max(clean_rollout, clean_train)) + sw["agree_s"]
    split = {
        "agree_s": sw["agree_s"] + float(cost.get("agree", 0.0)),
        "rebuild_s": float(cost.get("rebuild", 0.0)),
        "state_s": float(cost.get("state_transfer", 0.0)) + float(cost.get("reshard", 0.0)),
        "weights_s": 0.0,
        "optimizer_s": deferred,
        "rollout_start_s": engine,
    }
    total = sum(split.values())
    return {
        "phase": sw["phase"], "direction": sw["direction"], "moved": sw["moved"], "slots": sw["slots"], "cost_split": split,
        "weights_note": "a joiner already holds the current weights from the step's weight sync",
        "event": events[0] if events else None,
        "total_s": total, "exposed_s": min(exposed, total), "hidden_s": max(0.0, total - min(exposed, total)),
        "deferred_wait_s": max((st.get("deferred_wait_s", 0.0) for st in ts.values()), default=0.0),
        "reason": sw["reason"], "predicted_payback_steps": sw["predicted_payback_steps"],
    }


def finish_run(r: dict[str, Any]) -> dict[str, Any]:
    ph = r["phases"]
    total = sum(p["duration_s"] for p in ph)
    trained = sum(p["trained_sequences"] for p in ph)
    r["total_s"] = total
    r["samples_per_s"] = trained / total if total else 0.0
    r["switches"] = len(r["switch_log"])
    tot = sum(s["total_s"] for s in r["switch_log"])
    r["switch_total_s"] = tot
    r["switch_exposed_s"] = sum(s["exposed_s"] for s in r["switch_log"])
    r["hidden_fraction"] = 1.0 - r["switch_exposed_s"] / tot if tot > 0 else None
    r["mean_rollout_devices"] = sum(p["rollout"] * p["duration_s"] for p in ph) / total if total else 0.0
    r["rewards"] = [p.get("mean_reward") for p in ph if "mean_reward" in p]
    r["exact"] = [p.get("exact") for p in ph if "exact" in p]
    for p in ph:  # columns for plots and JSON; the per-slot details stay in the events file
        p.pop("rollout_stats", None)
        p.pop("train_stats", None)
        p.pop("lengths", None)
    return r


def columns(run: dict[str, Any]) -> dict[str, Any]:
    """The run's phases as columns (the shape ``dra.rl.plots.plot_roles`` reads)."""
    keys = ("phase", "rollout", "train", "start_s", "duration_s", "rollout_s", "train_s", "trained_sequences", "action")
    return {**run, "phases": {k: [p[k] for p in run["phases"]] for k in keys}}
