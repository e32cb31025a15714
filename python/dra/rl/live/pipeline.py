"""The live GRPO loop without a per-phase barrier: one step stale, devices moved inside a step.

The pipeline of ``include/dra/rl/events.hpp`` on real slots: batch b is generated with policy
version max(b - 1, 0) and opens as soon as that version is published; step k trains on batch k as
soon as it is generated, in ``updates_per_step`` mini-batch updates (each an optimizer step of
the trainers' ``dra.elastic`` world, so the world may change at each one's boundary); the leader
stages each step's weights in a file that a rollout worker loads when it starts generating the
next version (no broadcast, no barrier). The dynamic run asks the stage-balance policy at every
boundary (the code the simulator evaluates): ``decide_window`` (planner "window") or
``StageBalancePolicy.plan`` on the leader's snapshot of the pipeline (planner "lookahead": the
sequences in flight and what each generated, the queues, the finished lengths, the training step's
progress, the last switch's parts); it lends waiting trainers to rollout and takes idle rollout
workers into training. A ledger checks that every sequence is generated once and trained once.
docs/design/rl.md ("Live"), docs/guide/rl.md.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from dataclasses import replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import dra.rl as rl
from dra._core.elastic import JobControl
from dra.rl.live import channel
from dra.rl.live.task import MAX_ANSWER

# `live` below is a dra.rl.live.coordinator.LiveRL (not imported: the coordinator imports this
# module, and one direction keeps the package free of import cycles).
LiveRL = Any


def _stage_start(live: LiveRL, path: Path) -> None:
    """Version 0: the weights every run starts from, as the flat float32 file rollout workers load."""
    import torch

    from dra.rl.live.model import PolicyModel

    model = PolicyModel(live.config.model)
    model.load_state_dict(torch.load(live.weights, weights_only=True))
    torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().astype("float32").tofile(path)


class _Batch:
    def __init__(self, slots: int) -> None:
        self.open = False
        self.assigned: dict[int, deque[dict[str, Any]]] = {s: deque() for s in range(slots)}
        self.queued = 0
        self.remaining = 0
        self.opened_t = self.complete_t = -1.0
        self.rollout_at_open = 0
        self.generated: list[dict[str, Any]] = []

    def take(self, slot: int, count: int) -> list[dict[str, Any]]:
        """Up to `count` sequences: the slot's own share first, then from the longest other share."""
        out = []
        while len(out) < count and self.queued > 0:
            mine = self.assigned[slot]
            q = mine if mine else max(self.assigned.values(), key=len)
            out.append(q.popleft())
            self.queued -= 1
        return out


def run_pipeline(live: LiveRL, name: str, rollout: int | None, *, steps: int | None = None,
                 schedule: dict[tuple[int, int], int] | None = None, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run of the pipeline without a per-phase barrier: `rollout` slots generate at the start
    and throughout (static), or None: the stage-balance policy moves slots at every boundary
    (dynamic, starting at half). `schedule` ({(step, update): rollout slots}) asks for moves at
    given boundaries through the same path (tests): update 0 is the step's window; a move to
    training takes idle rollout slots only, and none before the first update. `policy`: the
    stage-balance options of this run (default: the config's)."""
    c = live.config if steps is None else replace(live.config, steps=steps)
    if policy is not None:
        c = replace(c, policy=dict(policy))
        c.validate()
    n_slots = c.slots
    n = c.prompts_per_step * c.group_size
    m = c.updates_per_step
    if n % m:
        raise ValueError(f"updates_per_step: must divide the step's batch ({n} sequences), got {m}")
    dynamic = rollout is None
    split = n_slots // 2 if dynamic else int(rollout)
    if not 1 <= split < n_slots:
        raise ValueError(f"rollout: must lie in [1, {n_slots - 1}], got {rollout}")
    # Every trainer needs a sequence of each mini-batch (one with none fails in its forward).
    most = n_slots - 1 if dynamic else n_slots - min([split, *schedule.values()])
    if n // m < most:
        raise ValueError(f"updates_per_step: a mini-batch of {n // m} sequences ({n} / {m}) cannot give each of up to {most} trainers "
                         f"one; use updates_per_step <= {n // most}, or more prompts_per_step x group_size")
    mb = n // m
    live._runs += 1
    run_id = f"{live._runs}-{name}"
    job_id = f"{live.job}-{run_id}"
    trainers = list(range(split, n_slots))
    rollout_slots = list(range(split))
    live._uid = {s: i for i, s in enumerate(trainers + rollout_slots)}
    # The job's contract keys, through the one API every outside actor uses (docs/guide/elastic.md).
    live._control = JobControl(f"127.0.0.1:{live.store.port}", job_id, timeout_s=c.timeout_s)
    events_path = live.out / "events" / f"{job_id}.jsonl"  # unique: events files are appended to
    job = {"id": job_id, "steps": c.steps * m, "global_batch": mb,
           "options": {"policy": "none", "release": "return", "start_size": len(trainers), "capacity_poll_s": 0.0,
                       "handoff": c.handoff, "fault_timeout_s": max(30.0, c.timeout_s / 4), "store_timeout_s": c.timeout_s,
                       "events_path": str(events_path)}}
    for slot, conn in live.conns.items():
        channel.send(conn, {"cmd": "reset", "weights": str(live.weights), "run": run_id, "uid": live._uid[slot], "job": job})
    for slot in live.conns:
        ack = live._recv(slot, "reset")
        if ack["role"] != ("train" if slot in trainers else "rollout"):
            raise RuntimeError(f"slot {slot}: started as {ack['role']} in run {name}")
    stage = live.out / "stage" / run_id
    stage.mkdir(parents=True, exist_ok=True)
    published: dict[int, Path] = {0: stage / "v0.bin"}
    _stage_start(live, published[0])

    stage_policy = None
    planner = c.policy.get("planner", "window")
    if dynamic:
        opts = {"devices": n_slots, "min_relative_gain": 0.05, "prior_switch_cost_s": 0.5, "group_size": c.group_size, **c.policy}
        cfg = rl.StageBalanceConfig(**opts)
        cfg.generation.max_concurrency = c.rollout_slots
        cfg.lengths.half_life = 4.0 * n
        stage_policy = rl.StageBalancePolicy(cfg)

    def required(b: int) -> int:
        return max(0, b - 1)

    batches = [_Batch(n_slots) for _ in range(c.steps)]
    ledger: dict[int, str] = {}
    progress: dict[int, int] = {}   # tokens generated so far by a sequence in flight
    # What the look-ahead planner's snapshot needs: each sequence's id in the pipeline's numbering
    # (batch * n + prompt * group + sample), the finished lengths, the sequences each slot
    # decodes in its engine's order and when it last reported their progress.
    seq_id: dict[int, int] = {}
    lengths = [[0.0] * n for _ in range(c.steps)]
    decoding: dict[int, list[int]] = {s: [] for s in range(n_slots)}
    reported = {s: 0.0 for s in range(n_slots)}
    prompt_tokens: list[float] = []
    flight_batch: dict[int, int] = {}
    version_of = {s: 0 for s in range(n_slots)}  # the weights a slot holds (-1: unpublished, mid-step)
    session: dict[int, int] = {}  # slot -> the version it is generating with
    roles = {s: "train" if s in trainers else "rollout" for s in range(n_slots)}
    record: dict[str, Any] = {"name": name, "rollout": None if dynamic else split, "mode": "barrier_free", "steps": c.steps,
                              "updates_per_step": m, "phases": [], "switch_log": [], "decisions": [], "roles": []}
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    def sample_roles() -> None:
        record["roles"].append({"t": now(), "rollout": sum(r == "rollout" for r in roles.values()),
                                "train": sum(r == "train" for r in roles.values())})

    sample_roles()

    def open_batches() -> None:
        latest = max(published)
        for b in range(c.steps):
            bt = batches[b]
            if bt.open:
                continue
            if required(b) > latest:
                break
            scale = 1.0 + (c.drift - 1.0) * (b / max(1, c.steps - 1))
            to = [s for s in range(n_slots) if roles[s] == "rollout"] or [0]
            i = 0
            for prompt in live.stream.prompts(b, c.prompts_per_step, scale):
                for j in range(c.group_size):
                    key = prompt.pid * 64 + j
                    if key in ledger:
                        raise AssertionError(f"ledger: sequence {key} queued twice")
                    ledger[key] = "queued"
                    seq_id[key] = b * n + i
                    prompt_tokens.append(float(len(prompt.tokens)))
                    bt.assigned[to[i % len(to)]].append({"prompt": channel.prompt_fields(prompt), "sample": j, "batch": b})
                    i += 1
            bt.open, bt.queued, bt.remaining, bt.opened_t = True, n, n, now()
            bt.rollout_at_open = sum(r == "rollout" for r in roles.values())

    def pullable(version: int) -> int | None:
        for b in range(c.steps):
            if not batches[b].open:
                break
            if batches[b].queued > 0 and required(b) == version:
                return b
        return None

    def newer(version: int) -> int | None:
        for b in range(c.steps):
            if not batches[b].open:
                break
            if batches[b].queued > 0 and required(b) > version:
                return b
        return None

    def give(slot: int, version: int, count: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < count:
            b = pullable(version)
            if b is None:
                break
            out += batches[b].take(slot, count - len(out))
        for g in out:
            key = g["prompt"]["pid"] * 64 + g["sample"]
            decoding[slot].append(key)
            ledger[key] = "generating"
            flight_batch[key] = g["batch"]
            progress[key] = 0
        return out

    def start_session(slot: int) -> bool:
        """An idle rollout slot starts generating the lowest batch it may (loading its version)."""
        v = version_of[slot]
        b = pullable(v) if v >= 0 else None
        load = None
        if b is None:
            b = newer(v)
            if b is None:
                return False
            v = required(b)
            load = str(published[v])
        first = give(slot, v, c.rollout_slots)
        if not first:
            return False
        session[slot] = v
        version_of[slot] = v
        channel.send(live.conns[slot], {"cmd": "phase", "role": "rollout", "version": v, "seqs": first, "more": pullable(v) is not None,
                               "load": load, "progress": dynamic})
        return True

    def idle_slots() -> list[int]:
        return [s for s in range(n_slots) if roles[s] == "rollout" and s not in session
                and (pullable(version_of[s]) is None if version_of[s] >= 0 else True) and newer(version_of[s]) is None]

    # Training state.
    step = 0          # the step to train next / being trained
    update = 0        # its next update
    training = False  # an update in flight
    update_members: list[int] = []
    update_done: dict[int, dict[str, Any]] = {}
    step_record: dict[str, Any] = {}
    fired = False     # the boundary before the next update happened (once per boundary)
    ordered: list[dict[str, Any]] = []
    pending_join: list[int] = []
    pending_switch: dict[str, Any] | None = None
    last_end = 0.0
    completions = 0

    def window_state(updates_left: int) -> dict[str, Any]:
        bt = batches[step] if step < c.steps else None
        nb = batches[step + 1] if step + 1 < c.steps else None

        def flight(b: int) -> list[float]:
            return [float(progress[k]) for k, fb in flight_batch.items() if fb == b]

        return {"rollout": n_slots - len(trainers), "train": len(trainers), "idle_rollout": len(idle_slots()), "step": step,
                "remaining_steps": c.steps - step, "sequences_per_step": n, "updates_per_step": m, "updates_left": updates_left,
                "wait_complete": bool(bt and bt.open and bt.remaining == 0), "wait_queued": bt.queued if bt and bt.open else n,
                "wait_in_flight": flight(step), "next_exists": nb is not None,
                "next_queued": (nb.queued if nb.open else n) if nb else 0, "next_in_flight": flight(step + 1) if nb else []}

    def snapshot(updates_left: int) -> dict[str, Any]:
        """The leader's view of the pipeline at this boundary (include/dra/rl/snapshot.hpp)."""
        t = now()
        members = trainers + pending_join
        slots = []
        for s in range(n_slots):
            flight = [(seq_id[k], float(progress.get(k, 0))) for k in decoding[s]]
            slots.append({"role": "train" if s in members else "rollout", "version": version_of[s],
                          "clock_s": reported[s] if flight else t, "in_flight": flight})
        open_ = []
        for b in range(step, c.steps):
            bt = batches[b]
            if not bt.open:
                break
            open_.append({"open": True, "opened_s": bt.opened_t, "complete_s": bt.complete_t, "rollout_at_open": bt.rollout_at_open,
                          "remaining": bt.remaining,
                          "queued": [[seq_id[g["prompt"]["pid"] * 64 + g["sample"]] for g in bt.assigned[s]] for s in range(n_slots)]})
        last: dict[str, float] = {}
        log = record["switch_log"]
        if log:
            last.update(agree_s=float(log[-1]["agree_s"]), rebuild_s=float(log[-1].get("boundary_s", 0.0)))
        joins = [x for x in log if x["direction"] == "to_train"]
        if joins:
            last.update(weights_s=float(joins[-1]["exposed_s"]), optimizer_s=float(joins[-1]["deferred_optimizer_s"]))
        return {"now_s": t, "seed": c.seed, "steps": c.steps, "prompts_per_step": c.prompts_per_step, "group_size": c.group_size,
                "updates_per_step": m, "prompt_tokens": statistics.fmean(prompt_tokens),
                "max_generation_tokens": float(MAX_ANSWER + 1), "max_concurrency": c.rollout_slots,
                "step": step, "update": m - updates_left, "training": updates_left < m, "published": max(published),
                "trainers_free_s": t, "members": members, "slots": slots, "batches": open_, "lengths": lengths,
                "last_switch": last}

    def ask_planner(updates_left: int) -> dict[str, Any]:
        """The look-ahead planner's move as a decision of the window planner's form."""
        t_plan = time.perf_counter()
        mv = stage_policy.plan(snapshot(updates_left))
        plan_ms = 1e3 * (time.perf_counter() - t_plan)
        if mv["leave"]:
            return {"action": "to_rollout", "moved": len(mv["leave"]), "reason": mv["reason"], "payback_steps": None, "plan_ms": plan_ms}
        if mv["join"]:
            return {"action": "to_train", "moved": len(mv["join"]), "join": mv["join"], "reason": mv["reason"], "payback_steps": None,
                    "plan_ms": plan_ms}
        return {"action": "hold", "moved": 0, "reason": "lookahead: hold", "payback_steps": None, "plan_ms": plan_ms}

    def decide(updates_left: int) -> None:
        """At a boundary of the trainers' world (once): the policy's move, made at once. Before the
        first update there is no boundary to move at (nothing was committed yet)."""
        if fired or step >= c.steps or (step == 0 and updates_left == m):
            return
        at = (step, m - updates_left)
        if schedule and at in schedule:
            target = schedule.pop(at)
            rollout_now = n_slots - len(trainers)
            d = {"action": "to_rollout" if target > rollout_now else "to_train" if target < rollout_now else "hold",
                 "moved": abs(target - rollout_now), "reason": f"schedule: {target} rollout slots at step {at[0]}, update {at[1]}",
                 "payback_steps": None}
        elif stage_policy is not None and planner == "lookahead":
            d = ask_planner(updates_left)
        elif stage_policy is not None:
            d = stage_policy.decide_window(**window_state(updates_left))
        else:
            return
        # `moved`: the slots actually moved; `dropped`: why the pipeline overtook a wanted move.
        entry = {"t": now(), "step": step, "updates_left": updates_left, "action": d["action"], "reason": d["reason"], "moved": 0,
                 **({"plan_ms": d["plan_ms"]} if "plan_ms" in d else {})}
        record["decisions"].append(entry)
        if d["action"] == "to_rollout" and d["moved"] > 0:
            leave = trainers[len(trainers) - min(d["moved"], len(trainers) - 1):]
            if leave:
                entry["moved"] = len(leave)
                lend(leave, d, updates_left)
            else:
                entry["dropped"] = "one trainer left: nothing to lend"
        elif d["action"] == "to_train" and d["moved"] > 0:
            idle = idle_slots()
            join = [s for s in d["join"] if s in idle] if "join" in d else idle[: d["moved"]]
            if join:
                entry["moved"] = len(join)
                borrow(join, d, updates_left)
            else:
                wanted = d["join"] if "join" in d else f"{d['moved']} slot(s)"
                entry["dropped"] = f"no idle rollout slot to take back (wanted {wanted}; idle {idle})"

    def lend(leave: list[int], d: dict[str, Any], updates_left: int) -> None:
        nonlocal fired, pending_switch
        t_agree = time.perf_counter()
        for s in leave:
            trainers.remove(s)
        live._capacity(len(trainers), leave=leave)
        in_window = updates_left == m
        # Every member passes the world's boundary now: the shrink is agreed by all of them, so the
        # leavers alone would wait for the others forever (they get their next update only after).
        targets = trainers + leave
        for s in targets:
            channel.send(live.conns[s], {"cmd": "boundary"})
        replies = {s: live._recv(s, "boundary") for s in targets}
        for s in leave:
            if not replies[s]["released"]:
                raise RuntimeError(f"slot {s}: the trainers' world kept it (boundary {replies[s]})")
            roles[s] = "rollout"
            version_of[s] = max(published) if in_window else -1
        fired = True
        sample_roles()
        pending_switch = {"step": step, "direction": "to_rollout", "moved": len(leave), "slots": leave, "t": now(),
                          "agree_s": time.perf_counter() - t_agree, "reason": d["reason"], "in_window": in_window,
                          "predicted_payback_steps": d["payback_steps"],
                          "boundary_s": max((r.get("boundary_s", 0.0) for r in replies.values()), default=0.0),
                          "event": next((r["event"] for r in replies.values() if r.get("event")), None)}
        for s in leave:
            start_session(s)

    def borrow(join: list[int], d: dict[str, Any], updates_left: int) -> None:
        nonlocal fired, pending_switch
        t_agree = time.perf_counter()
        for s in join:
            channel.send(live.conns[s], {"cmd": "register"})
        for s in join:
            live._recv(s, "registered")
        live._capacity(len(trainers) + len(join), leave=[])
        pending_join.extend(join)
        for s in join:
            roles[s] = "train"
        fired = True
        sample_roles()
        pending_switch = {"step": step, "direction": "to_train", "moved": len(join), "slots": list(join), "t": now(),
                          "agree_s": time.perf_counter() - t_agree, "reason": d["reason"], "in_window": updates_left == m,
                          "predicted_payback_steps": d["payback_steps"]}

    def start_update() -> None:
        nonlocal training, update_members, update_done, fired
        for s in pending_join:
            trainers.append(s)
            session.pop(s, None)
        pending_join.clear()
        update_members = list(trainers)
        update_done = {}
        mini = ordered[update * mb:(update + 1) * mb]
        shard = {"trajectories": mini, "global_tokens": sum(len(t["tokens"]) for t in mini), "step": step * m + update}
        publish = str(stage / f"v{step + 1}.bin") if update == m - 1 else None
        channel.send_all([live.conns[s] for s in update_members],
                         {"cmd": "phase", "role": "train", "shard": shard, "digest": False, "publish": publish})
        training = True
        fired = False

    def try_start_step() -> None:
        nonlocal ordered, update, step_record, completions
        if training or step >= c.steps or update != 0:
            return
        bt = batches[step]
        if not (bt.open and bt.remaining == 0):
            return
        decide(m)
        batch = live._batch(bt.generated, step, step)  # advantages per group over the whole step's batch
        ordered = batch["trajectories"]
        for t in ordered:
            if t["version"] != required(step):
                raise AssertionError(f"staleness: sequence {t['key']} of version {t['version']} in step {step} (expected {required(step)})")
        step_record = {"phase": step, "start_s": last_end, "train_start_s": now(), "train": len(trainers) + len(pending_join),
                       "rollout_s": bt.complete_t - bt.opened_t, "wait_s": max(0.0, bt.complete_t - last_end),
                       "mean_reward": statistics.fmean(t["reward"] for t in bt.generated),
                       "exact": statistics.fmean(1.0 if t["exact"] else 0.0 for t in bt.generated),
                       "mean_length": statistics.fmean(len(t["tokens"]) for t in bt.generated),
                       "longest": max(len(t["tokens"]) for t in bt.generated), "updates": []}
        completions = 0
        start_update()

    def finish_update() -> None:
        nonlocal training, update, step, last_end, pending_switch
        training = False
        ts = update_done
        keys = sorted(k for st in ts.values() for k in st.get("trained_keys", []))
        mini = ordered[update * mb:(update + 1) * mb]
        if keys != sorted(t["key"] for t in mini):
            raise AssertionError(f"step {step} update {update}: trained {len(keys)} of {len(mini)} trajectories")
        for k in keys:
            if ledger.get(k) != "generated":
                raise AssertionError(f"ledger: sequence {k} trained while {ledger.get(k)}")
            ledger[k] = "trained"
        tokens = sum(st["tokens"] for st in ts.values())
        t_up = max(st["compute_s"] + st["sync_s"] + st.get("optimizer_step_s", 0.0) for st in ts.values())
        sync = statistics.fmean(st["sync_s"] for st in ts.values())
        blocking = max(st.get("boundary_s", 0.0) + st.get("join_s", 0.0) + st.get("deferred_wait_s", 0.0) for st in ts.values())
        step_record["updates"].append({"members": len(ts), "seconds": t_up, "blocking_s": blocking})
        if stage_policy is not None:
            stage_policy.observe_train(len(ts), tokens / len(ts), t_up, min(sync, t_up))
        if pending_switch is not None:
            events = [st["event"] for st in ts.values() if st.get("event")] + ([pending_switch["event"]] if pending_switch.get("event") else [])
            deferred = max((st.get("deferred_s", 0.0) for st in ts.values()), default=0.0)
            if pending_switch["direction"] == "to_train":
                exposed = blocking
            elif pending_switch["in_window"]:
                exposed = 0.0  # the trainers were waiting for their batch anyway
            else:  # between updates the trainers stood at the boundary while the leavers left
                exposed = pending_switch["agree_s"] + blocking
            sw = {**pending_switch, "exposed_s": exposed, "deferred_optimizer_s": deferred, "event": events[0] if events else None}
            record["switch_log"].append(sw)
            if stage_policy is not None:
                stage_policy.observe_switch(sw["direction"], exposed)
            pending_switch = None
        update += 1
        if update < m:
            decide(m - update)
            start_update()
            return
        # The step is done: the leader staged its weights (version step + 1).
        lead = ts[update_members[0]]
        published[step + 1] = stage / f"v{step + 1}.bin"
        if not published[step + 1].is_file():
            raise RuntimeError(f"step {step}: the leader did not stage its weights ({published[step + 1]})")
        if stage_policy is not None:
            stage_policy.observe_weight_sync(float(lead.get("publish_s", 0.0)))
        for s in trainers:
            version_of[s] = step + 1
        step_record["end_s"] = now()
        step_record["train_s"] = step_record["end_s"] - step_record["train_start_s"]
        step_record["duration_s"] = step_record["end_s"] - last_end
        step_record["rollout"] = n_slots - step_record["train"]
        step_record["trained_sequences"] = n
        step_record["action"] = "hold"
        record["phases"].append(step_record)
        last_end = step_record["end_s"]
        if not live.quiet:
            live.log(f"{name} step {step}/{c.steps - 1}: {n_slots - len(trainers)}R/{len(trainers)}T {step_record['duration_s']:.2f} s "
                     f"(wait {step_record['wait_s']:.2f}, train {step_record['train_s']:.2f}) reward {step_record['mean_reward']:.3f}")
        step += 1
        update = 0
        open_batches()
        decide(m)  # the next step's window opens
        for s in range(n_slots):
            if roles[s] == "rollout" and s not in session:
                start_session(s)
        try_start_step()

    open_batches()
    for s in rollout_slots:
        start_session(s)
    by_conn = {id(live.conns[s]): s for s in live.conns}
    # Past the last step, the rollout workers' last reports (a final `gen`, `rollout_done`) are
    # still drained: an unread one would be taken for the answer to `end` or to the next run's
    # `reset`, shifting every later answer by one.
    while step < c.steps or session:
        ready = wait(list(live.conns.values()), timeout=c.timeout_s)
        if not ready:
            raise live._failure(None, f"{name}: no worker answered within {c.timeout_s:g} s (step {step}, update {update})")
        for conn in ready:
            slot = by_conn[id(conn)]
            msg = live._read(slot, f"{name}, step {step}, update {update}", "gen", "rollout_done", "train_done")
            if "gen" in msg:
                reported[slot] = now()
                if msg.get("progress"):
                    for key, tokens in msg["progress"]:
                        progress[key] = tokens
                decided = False
                for t in msg["finished"]:
                    key = t["key"]
                    if ledger.get(key) != "generating":
                        raise AssertionError(f"ledger: sequence {key} finished while {ledger.get(key)}")
                    ledger[key] = "generated"
                    b = flight_batch.pop(key)
                    progress.pop(key, None)
                    decoding[slot].remove(key)
                    lengths[b][seq_id[key] % n] = float(max(1, len(t["tokens"])))
                    bt = batches[b]
                    bt.generated.append(t)
                    bt.remaining -= 1
                    if stage_policy is not None:
                        stage_policy.observe_generation(float(len(t["prompt"])), float(len(t["tokens"])))
                    if bt.remaining == 0:
                        bt.complete_t = now()
                        if stage_policy is not None:
                            stage_policy.observe_batch(0.5 * (bt.rollout_at_open + (n_slots - len(trainers))), n, bt.complete_t - bt.opened_t)
                    if b == step:
                        completions += 1
                        decided |= completions % max(1, n // 16) == 0
                if msg["want"] > 0:
                    v = session[slot]
                    more = give(slot, v, msg["want"])
                    channel.send(conn, {"cmd": "seqs", "seqs": more, "more": pullable(v) is not None})
                if decided and not training and update == 0:
                    decide(m)
                try_start_step()
            elif "rollout_done" in msg:
                st = msg["rollout_done"]
                session.pop(slot, None)
                if stage_policy is not None:
                    for cc, ctx, iters, secs in st["segments"]:
                        stage_policy.observe_decode(int(cc), float(ctx), float(iters), float(secs))
                    if st.get("engine_start_s", 0.0) > 0.0:
                        stage_policy.observe_engine_start(st["engine_start_s"] + st.get("load_s", 0.0))
                if roles[slot] == "rollout" and not start_session(slot) and not training and update == 0:
                    decide(m)  # an idle rollout worker in the window
                try_start_step()
            elif "train_done" in msg:
                update_done[slot] = msg["train_done"]
                if training and set(update_done) >= set(update_members):
                    finish_update()
            else:
                raise RuntimeError(f"slot {slot}: unexpected message {sorted(msg)}")
    for conn in live.conns.values():
        channel.send(conn, {"cmd": "end"})
    ends = {s: live._recv(s, "ended") for s in live.conns}
    committed = {ends[s]["step_index"] for s in trainers}
    cursors = {ends[s]["cursor"] for s in trainers}
    record["controller"] = {"committed_steps": sorted(committed), "sampler_cursor": sorted(cursors), "resizes": ends[trainers[0]]["resizes"],
                            "world": ends[trainers[0]]["world"], "events": str(events_path)}
    if committed != {c.steps * m} or cursors != {c.steps * n}:
        raise AssertionError(f"run {name}: the trainers committed {sorted(committed)} updates (sampler at {sorted(cursors)}), "
                             f"expected {c.steps * m}")
    record["final_weights_identical"] = len({ends[s]["param_digest"] for s in trainers}) == 1
    states = set(ledger.values())
    record["ledger"] = {"sequences": len(ledger), "states": sorted(states), "exactly_once": states == {"trained"} and len(ledger) == c.steps * n}
    total = sum(p["duration_s"] for p in record["phases"])
    record["total_s"] = total
    record["samples_per_s"] = c.steps * n / total if total else 0.0
    record["switches"] = len(record["switch_log"])
    record["mean_rollout_devices"] = _mean_rollout(record["roles"], total)
    record["rewards"] = [p["mean_reward"] for p in record["phases"]]
    record["exact"] = [p["exact"] for p in record["phases"]]
    record["load_average"] = os.getloadavg()[0]
    return record


def _mean_rollout(samples: list[dict[str, Any]], total: float) -> float:
    if not samples or total <= 0:
        return 0.0
    weighted = 0.0
    for i, s in enumerate(samples):
        end = samples[i + 1]["t"] if i + 1 < len(samples) else total
        weighted += s["rollout"] * max(0.0, min(end, total) - s["t"])
    return weighted / total
