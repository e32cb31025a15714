"""The live RL loop's coordinator: device slots, the one-step-off GRPO pipeline, role switches.

It runs outside the slots and owns the prompt stream, the pipeline (phase p generates batch p with
policy version max(p - 1, 0) while the trainers train on batch p - 1, then the weight sync) and a
ledger that checks every sequence is generated once and trained once. Static runs keep a split;
the dynamic run asks ``StageBalancePolicy`` (the class the simulator evaluates) at every boundary
and moves whole slots by resizing the trainers' ``dra.elastic`` world in place through its
``capacity`` key. How and why: docs/design/rl.md; options and figures: docs/guide/rl.md ("Live")."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict
from datetime import timedelta
from multiprocessing import AuthenticationError
from multiprocessing.connection import Listener, wait
from pathlib import Path
from typing import Any

import torch.distributed as dist

import dra.rl as rl
from dra._core.elastic import JobControl
from dra.pool import _cgroup as cg
from dra.pool._state import exclusive_lock, release_lock
from dra.rl.live import channel
from dra.rl.live.accounting import finish_run, switch_cost
from dra.rl.live.config import LiveConfig, task_lengths
from dra.rl.live.pretrain import pretrain
from dra.rl.live.processes import WorkerError, child_setup, remove_leftovers, worker_failure
from dra.rl.live.task import PROMPT_TOKENS, PromptStream

_INSTANCES = itertools.count()


class LiveRL:
    """Slots, their worker processes and the store; `run` executes one schedule on them."""

    def __init__(self, config: LiveConfig, out_dir: str | Path, *, quiet: bool = False) -> None:
        config.validate()
        self.config, self.out, self.quiet = config, Path(out_dir), quiet
        self.slot_manager: cg.Slots | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: dict[int, Any] = {}
        self.weights: Path | None = None
        self._out_lock: int | None = None
        if config.use_cgroups:  # before the warm-up, which can take minutes
            why = cg.available()
            if why:
                raise RuntimeError(f"use_cgroups: {why}; run as root on a machine with cgroups v1, or pass "
                                   "use_cgroups=False (--no-cgroups)")
        self.out.mkdir(parents=True, exist_ok=True)
        # One run per out directory at a time: two would share the worker logs, the events files, the
        # staged weights (a rollout worker would load the other run's policy) and runs.json.
        self._out_lock = exclusive_lock(self.out / ".dra-rl-live.lock", lambda pid: (
            f"out: another live RL run (pid {pid}) is using {self.out}; give this run another out directory (--out)"))
        try:
            remove_leftovers(self.out, self.config.use_cgroups)
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        config, quiet = self.config, self.quiet
        # The reasoning workload is scaled to the model's longest answer already (length_scale is for traces).
        scale = 1.0 if config.trace == "reasoning" else config.length_scale
        self.stream = PromptStream(task_lengths(config.trace), length_scale=scale, seed=config.seed)
        self.log("pretraining the policy (cached)")
        model = pretrain(self.stream, steps=config.pretrain_steps, batch=config.pretrain_batch, lr=config.pretrain_lr,
                         seed=config.pretrain_seed, config=config.model, cache_dir=self.out / "cache", quiet=quiet)
        import torch

        self.weights = self.out / "cache" / f"rl-live-start-{os.getpid()}.pt"  # what every run starts from (removed by close())
        self.weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), self.weights)
        from dra.rl.live.model import parameter_count

        self.parameters = parameter_count(model)
        self.job = f"rl-{os.getpid()}-{next(_INSTANCES)}"  # its cgroups' name: one per coordinator (a name is locked)
        self._runs = 0
        self._digests = False
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=config.timeout_s))
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            # A terminated benchmark still stops its workers and removes its cgroups (close()).
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        self._start_workers()

    def log(self, text: str) -> None:
        if not self.quiet:
            print(f"[dra.rl live] {text}", file=sys.stderr, flush=True)

    # ---- processes ------------------------------------------------------------------------------
    def _start_workers(self) -> None:
        c = self.config
        if c.use_cgroups:
            self.slot_manager = cg.Slots(self.job, cg.plan_slots(c.slots, cpus=c.cpus_per_slot, memory_gb=None))
        # The workers connect to a Unix socket in a directory only this user can enter (another
        # user's connect is refused by the kernel, so none can stall the accepts or reach the
        # messages), and each shows the key it was given (its environment is its own). What a
        # worker says is still input: JSON, checked, never unpickled (dra.rl.live.channel).
        auth = secrets.token_bytes(16)
        sock_dir = tempfile.mkdtemp(prefix="dra-rl-")  # 0700
        listener = Listener(os.path.join(sock_dir, "coordinator.sock"), "AF_UNIX", authkey=auth)
        accepted: list[Any] = []

        def accept() -> None:
            while len(accepted) < c.slots:
                try:
                    accepted.append(listener.accept())
                except AuthenticationError:  # a peer without the key: dropped, the next one is taken
                    continue
                except OSError:
                    return

        try:
            threading.Thread(target=accept, daemon=True).start()
            for i in range(c.slots):
                env = dict(os.environ, DRA_RL_COORD=listener.address, DRA_RL_SLOT=str(i), DRA_RL_AUTH=auth.hex(),
                           OMP_NUM_THREADS="1")
                paths = self.slot_manager.paths(f"slot{i}") if self.slot_manager else None
                with open(self.out / f"worker-{i}.log", "ab") as log:  # the child keeps its own descriptor
                    self.procs.append(subprocess.Popen([sys.executable, "-m", "dra.rl.live.worker"], env=env, stdout=log,
                                                       stderr=subprocess.STDOUT, preexec_fn=lambda p=paths: child_setup(p),
                                                       start_new_session=True))
            deadline = time.monotonic() + c.timeout_s
            while len(accepted) < c.slots:
                for i, p in enumerate(self.procs):
                    if p.poll() is not None:
                        raise self._failure(i, f"slot {i}: worker exited with {p.returncode} at start")
                if time.monotonic() > deadline:
                    quota = f" on {c.cpus_per_slot:g} CPU per slot" if self.slot_manager else ""
                    raise WorkerError(f"only {len(accepted)} of {c.slots} workers connected within {c.timeout_s:g} s (each imports "
                                      f"torch at start{quota}, several CPU seconds); raise timeout_s or cpus_per_slot")
                time.sleep(0.05)
        finally:
            listener.close()
            shutil.rmtree(sock_dir, ignore_errors=True)
        for conn in accepted:
            if not conn.poll(c.timeout_s):
                raise self._failure(None, f"a worker connected but said nothing within {c.timeout_s:g} s")
            try:
                hello = channel.recv_reply(conn, "hello")
            except (EOFError, OSError):
                raise self._failure(None, "a worker died before it said which slot it is") from None
            except channel.ChannelError as e:
                raise self._failure(None, f"a worker's first message: {e}") from None
            if not 0 <= hello["hello"] < c.slots or hello["hello"] in self.conns:
                raise self._failure(None, f"a worker's first message names slot {hello['hello']}, not a free one of 0..{c.slots - 1}")
            self.conns[hello["hello"]] = conn
        init = {"cmd": "init", "model": asdict(c.model), "store_host": "127.0.0.1", "store_port": self.store.port, "slots": c.slots, "job": self.job,
                "lr": c.lr, "clip": c.clip, "max_grad_norm": c.max_grad_norm, "seed": c.seed, "rollout_slots": c.rollout_slots,
                "timeout_s": c.timeout_s}
        for conn in self.conns.values():
            channel.send(conn, init)
        self.weights_group_s = max(self._recv(s, "ready")["weights_group_s"] for s in self.conns)
        self.log(f"{c.slots} slots ready ({f'cgroups: {c.cpus_per_slot:.2f} CPU each' if self.slot_manager else 'no cgroups'}; "
                 f"weights group built once in {self.weights_group_s:.3f} s)")

    def _recv(self, slot: int, *expected: str) -> dict[str, Any]:
        """Slot `slot`'s next reply (of a kind in `expected`, any when none), checked."""
        conn = self.conns[slot]
        if not conn.poll(self.config.timeout_s):
            raise self._failure(slot, f"slot {slot}: no answer within {self.config.timeout_s:g} s")
        return self._read(slot, "", *expected)

    def _read(self, slot: int, where: str, *expected: str) -> dict[str, Any]:
        """Slot `slot`'s reply, ready to be read, checked; `where` (a phase, a step) goes in the error."""
        try:
            return channel.recv_reply(self.conns[slot], *expected)
        except (EOFError, OSError):
            raise self._failure(slot, f"slot {slot}: worker died{where and ' in ' + where}") from None
        except channel.ChannelError as e:
            raise self._failure(slot, f"slot {slot}: {e}{where and f' ({where})'}") from None

    def _failure(self, slot: int | None, what: str) -> WorkerError:
        return worker_failure(self.procs, slot, what, self.out)

    def close(self) -> None:
        """Stops the workers (all within one 10 s grace, then killed), removes the slots' cgroups, the
        start weights, the staged versions and the out directory's lock. Safe to call twice."""
        for conn in self.conns.values():
            try:
                channel.send(conn, {"cmd": "stop"})
            except OSError:
                pass
        for i, p in enumerate(self.procs):
            if i not in self.conns and p.poll() is None:  # never connected: no stop can reach it
                p.kill()
        deadline = time.monotonic() + 10.0
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs = []
        for conn in self.conns.values():
            conn.close()
        self.conns = {}
        if self.slot_manager is not None:
            self.slot_manager.close()
            self.slot_manager = None
        if self.weights is not None:
            self.weights.unlink(missing_ok=True)
            self.weights = None
        if self._out_lock is not None:
            shutil.rmtree(self.out / "stage", ignore_errors=True)
            release_lock(self.out / ".dra-rl-live.lock", self._out_lock)
            self._out_lock = None

    def __enter__(self) -> LiveRL:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def cpu_usage(self) -> dict[str, float]:
        if self.slot_manager is None:
            return {}
        return {s: self.slot_manager.usage_s(s) for s in self.slot_manager.specs}

    # ---- one run ----------------------------------------------------------------------------------
    def run_warmup(self, steps: int = 2) -> dict[str, Any]:
        """A short run to discard: first-time costs (the first Gloo groups, allocator, op
        dispatch caches) land here, not on the first measured schedule."""
        return self.run("warmup", self.config.slots // 2, steps=steps)

    def run_pipeline(self, name: str, rollout: int | None, *, steps: int | None = None,
                     schedule: dict[tuple[int, int], int] | None = None, policy: dict[str, Any] | None = None) -> dict[str, Any]:
        """One run without a per-phase barrier, devices moved inside a step (``dra.rl.live.pipeline``).
        `policy`: StageBalanceConfig options for this run in place of the config's (e.g.
        ``{"planner": "lookahead"}``)."""
        from dra.rl.live.pipeline import run_pipeline

        try:
            return run_pipeline(self, name, rollout, steps=steps, schedule=dict(schedule or {}), policy=policy)
        except (BrokenPipeError, ConnectionResetError) as e:  # a send to (or read from) a worker that died
            raise self._failure(None, f"{name}: lost a worker ({e})") from None
        finally:  # the run's staged versions (one file of the weights per step) go with it
            shutil.rmtree(self.out / "stage", ignore_errors=True)

    def run(self, name: str, rollout: int | None, *, steps: int | None = None, schedule: dict[int, int] | None = None,
            digests: bool = False) -> dict[str, Any]:
        """One training run: `rollout` slots generate throughout (static), or None: the
        stage-balance policy decides (dynamic, starting at half). `schedule` ({phase: rollout
        slots}) asks for switches at given phases through the same path (tests, experiments);
        `digests` records every trainer's parameter and optimizer-state digest after each step."""
        try:
            return self._run(name, rollout, steps=steps, schedule=schedule, digests=digests)
        except (BrokenPipeError, ConnectionResetError) as e:  # a send to (or read from) a worker that died
            raise self._failure(None, f"{name}: lost a worker ({e})") from None

    def _run(self, name: str, rollout: int | None, *, steps: int | None, schedule: dict[int, int] | None, digests: bool) -> dict[str, Any]:
        c = self.config
        self._digests = digests
        if steps is not None:
            from dataclasses import replace

            c = replace(c, steps=steps)
        n_slots = c.slots
        dynamic = rollout is None
        split = n_slots // 2 if dynamic else int(rollout)
        for q, r in (schedule or {}).items():
            if not (2 <= q <= c.steps and 1 <= r < n_slots):
                raise ValueError(f"schedule: phase {q} -> {r} rollout slots is outside phases [2, {c.steps}] (a switch takes effect "
                                 f"at a training step's boundary; the first step ends phase 1) or splits [1, {n_slots - 1}]")
        if not 1 <= split < n_slots:
            raise ValueError(f"rollout: must lie in [1, {n_slots - 1}], got {rollout}")
        self._runs += 1  # one elastic job per run, its keys unique even for a repeated name
        job_id = f"{self.job}-{self._runs}-{name}"
        rollout_slots = list(range(split))  # slots 0..split-1 generate, the rest train
        trainers = list(range(split, n_slots))
        # uids: the first trainers form the first world (0..T-1); trainers[0] leads it for the whole
        # run (a leader never leaves, and the coordinator moves the newest trainers first).
        self._uid = {s: i for i, s in enumerate(trainers + rollout_slots)}
        # The job's contract keys (docs/guide/elastic.md, "Driving a job from outside"), one API for
        # every outside actor (the launcher and the pool use it too).
        self._control = JobControl(f"127.0.0.1:{self.store.port}", job_id, timeout_s=c.timeout_s)
        events_path = self.out / "events" / f"{job_id}.jsonl"  # unique: events files are appended to
        job = {"id": job_id, "steps": c.steps, "global_batch": c.prompts_per_step * c.group_size,
               "options": {"policy": "none", "release": "return", "start_size": len(trainers), "capacity_poll_s": 0.0,
                           "handoff": c.handoff, "fault_timeout_s": max(30.0, c.timeout_s / 4), "store_timeout_s": c.timeout_s,
                           "events_path": str(events_path)}}
        for slot, conn in self.conns.items():
            channel.send(conn, {"cmd": "reset", "weights": str(self.weights), "run": f"{self._runs}-{name}", "uid": self._uid[slot], "job": job})
        for slot in self.conns:
            ack = self._recv(slot, "reset")
            if ack["role"] != ("train" if slot in trainers else "rollout"):
                raise WorkerError(f"slot {slot}: started as {ack['role']} in run {name}")
        policy = None
        if dynamic:
            opts = {"devices": n_slots, "cooldown_steps": 4, "hysteresis_decisions": 2, "min_relative_gain": 0.05,
                    "prior_switch_cost_s": 0.5, "group_size": c.group_size, **c.policy}
            cfg = rl.StageBalanceConfig(**opts)
            cfg.generation.max_concurrency = c.rollout_slots
            cfg.lengths.half_life = 4.0 * c.prompts_per_step * c.group_size
            policy = rl.StageBalancePolicy(cfg)
        pending_switch: dict[str, Any] | None = None
        version = 0
        since_switch = 10**9
        ledger: dict[int, str] = {}
        batches: dict[int, list[dict[str, Any]]] = {}
        record: dict[str, Any] = {"name": name, "rollout": split if not dynamic else None, "phases": [], "switch_log": [], "steps": c.steps}
        usage0 = self.cpu_usage()
        load0 = os.getloadavg()[0]
        t_run = time.perf_counter()
        phases = c.steps + 1
        for p in range(phases):
            gen_batch = p if p < c.steps else None
            train_batch = p - 1 if p >= 1 else None
            scale = 1.0 + (c.drift - 1.0) * (gen_batch / max(1, c.steps - 1)) if gen_batch is not None else 1.0
            queue: deque[dict[str, Any]] = deque()
            if gen_batch is not None:
                for prompt in self.stream.prompts(gen_batch, c.prompts_per_step, scale):
                    for j in range(c.group_size):
                        key = prompt.pid * 64 + j
                        if key in ledger:
                            raise AssertionError(f"ledger: sequence {key} queued twice")
                        ledger[key] = "queued"
                        queue.append({"prompt": channel.prompt_fields(prompt), "sample": j})
            shard = self._batch(batches.pop(train_batch), train_batch, version) if train_batch is not None else None
            phase = self._phase(p, rollout_slots, trainers, queue, shard, version, ledger, batches, gen_batch)
            if pending_switch is not None:
                sw = switch_cost(pending_switch, phase)
                record["switch_log"].append(sw)
                phase["action"] = sw["direction"]
                phase["switch_total_s"], phase["switch_exposed_s"] = sw["total_s"], sw["exposed_s"]
                if policy is not None:
                    policy.observe_switch(sw["direction"], sw["exposed_s"])
                pending_switch = None
            # Weight sync (after a training step): the trainers' leader to every slot.
            if phase["trained_sequences"]:
                t0 = time.perf_counter()
                for conn in self.conns.values():
                    channel.send(conn, {"cmd": "sync", "source": trainers[0], "version": version + 1, "digest": p == phases - 1})
                acks = [self._recv(s, "synced") for s in self.conns]
                phase["weight_sync_s"] = time.perf_counter() - t0
                version += 1
                if p == phases - 1:
                    digests = {a["digest"] for a in acks}
                    record["final_weights_identical"] = len(digests) == 1
            else:
                phase["weight_sync_s"] = 0.0
            phase["duration_s"] = phase["stages_s"] + phase["weight_sync_s"]
            phase["start_s"] = sum(x["duration_s"] for x in record["phases"])
            record["phases"].append(phase)
            since_switch += 1
            want: dict[str, Any] | None = None
            t0 = time.perf_counter()
            if policy is not None:
                self._observe(policy, phase, len(trainers))
                if p + 1 < phases:
                    d = policy.decide(len(rollout_slots), len(trainers), p, since_switch, phases - 1 - p, c.prompts_per_step * c.group_size)
                    phase["predicted_next_s"] = d["target"]["step_s"]
                    phase["reason"] = d["reason"]
                    if d["action"] != "hold":
                        want = d
            if schedule and schedule.get(p + 1, len(rollout_slots)) != len(rollout_slots):
                target = schedule[p + 1]
                want = {"action": "to_rollout" if target > len(rollout_slots) else "to_train", "moved": abs(target - len(rollout_slots)),
                        "reason": f"schedule: {target} rollout slots at phase {p + 1}", "payback_steps": None}
            agree_s = time.perf_counter() - t0
            if want is not None and not phase["trained_sequences"]:
                raise AssertionError(f"phase {p}: a switch before the first training step (it takes effect at a step's boundary)")
            if want is not None:
                moved = want["moved"]
                t0 = time.perf_counter()
                if want["action"] == "to_rollout":
                    slots_moved = trainers[-moved:]  # the newest trainers leave; the leader stays
                    trainers = trainers[:-moved]
                    rollout_slots = sorted(rollout_slots + slots_moved)
                    self._capacity(len(trainers), leave=slots_moved)
                else:
                    slots_moved = rollout_slots[-moved:]
                    rollout_slots = rollout_slots[:-moved]
                    trainers = trainers + slots_moved
                    for s in slots_moved:  # candidates first, so that the leader sees them at the boundary
                        channel.send(self.conns[s], {"cmd": "register"})
                    for s in slots_moved:
                        self._recv(s, "registered")
                    self._capacity(len(trainers), leave=[])
                agree_s += time.perf_counter() - t0
                since_switch = 0
                pending_switch = {"phase": p + 1, "direction": want["action"], "moved": moved, "slots": slots_moved, "agree_s": agree_s,
                                  "reason": want["reason"], "predicted_payback_steps": want["payback_steps"]}
            if not self.quiet:
                self.log(f"{name} phase {p}/{phases - 1}: {len(rollout_slots)}R/{len(trainers)}T {phase['duration_s']:.2f} s "
                         f"(rollout {phase['rollout_s']:.2f}, train {phase['train_s']:.2f}) reward {phase.get('mean_reward', float('nan')):.3f}"
                         + (f" -> {pending_switch['direction']}" if pending_switch else ""))
        for conn in self.conns.values():
            channel.send(conn, {"cmd": "end"})
        ends = {s: self._recv(s, "ended") for s in self.conns}
        committed = {ends[s]["step_index"] for s in trainers}
        cursors = {ends[s]["cursor"] for s in trainers}
        # Exactly once through the controller: every training step committed once, the sampler at the
        # end of the trajectory stream, the world as the coordinator planned it.
        record["controller"] = {"committed_steps": sorted(committed), "sampler_cursor": sorted(cursors),
                                "resizes": ends[trainers[0]]["resizes"], "world": ends[trainers[0]]["world"],
                                "events": str(events_path)}
        if committed != {c.steps} or cursors != {c.steps * c.prompts_per_step * c.group_size}:
            raise AssertionError(f"run {name}: the trainers committed {sorted(committed)} steps (sampler at {sorted(cursors)}), "
                                 f"expected {c.steps}")
        if [ends[s]["rank"] for s in trainers] != list(range(len(trainers))):
            raise AssertionError(f"run {name}: the trainers' ranks {[ends[s]['rank'] for s in trainers]} are not the planned order")
        record["wall_s"] = time.perf_counter() - t_run
        usage1 = self.cpu_usage()
        record["cpu_s"] = {s: usage1[s] - usage0.get(s, 0.0) for s in usage1}
        # The machine is shared: the load around the run says how much of the quota it could get.
        record["load_average"] = [load0, os.getloadavg()[0]]
        states = set(ledger.values())
        record["ledger"] = {"sequences": len(ledger), "states": sorted(states), "exactly_once": states == {"trained"},
                            "in_flight_at_switch": 0, "requeued": 0}
        return finish_run(record)

    def _batch(self, trajs: list[dict[str, Any]], step: int, version: int) -> dict[str, Any]:
        """A training step's batch with GRPO advantages per prompt group; every trainer gets all of
        it, in one order, and trains on the positions the controller's sampler gives its rank."""
        groups: dict[int, list[dict[str, Any]]] = {}
        for t in trajs:
            if version - t["version"] > 1:
                raise AssertionError(f"staleness: sequence {t['key']} of version {t['version']} trained at version {version}")
            groups.setdefault(t["pid"], []).append(t)
        for g in groups.values():
            rewards = [t["reward"] for t in g]
            mean = statistics.fmean(rewards)
            std = statistics.pstdev(rewards)
            for t in g:
                t["advantage"] = (t["reward"] - mean) / (std + 1e-6) if std > 1e-9 else 0.0
        ordered = sorted(trajs, key=lambda t: t["key"])
        return {"trajectories": ordered, "global_tokens": sum(len(t["tokens"]) for t in trajs), "step": step}

    def _capacity(self, trainers: int, leave: list[int]) -> None:
        """Sizes the trainers' world from outside: its ``capacity`` key (min = max = the new size;
        ``leave`` names the slots that go), read by the leader at the next step boundary."""
        self._control.set_capacity(trainers, trainers, sorted(self._uid[s] for s in leave))

    def _phase(self, p: int, rollout_slots: list[int], trainers: list[int], queue: deque[dict[str, Any]], shard: dict[str, Any] | None,
               version: int, ledger: dict[int, str], batches: dict[int, list[dict[str, Any]]], gen_batch: int | None) -> dict[str, Any]:
        t0 = time.perf_counter()
        gen_version = version
        # The router spreads the batch over the rollout engines (round robin, at most an engine's
        # slots each); what does not fit stays queued and is pulled as slots free.
        first: dict[int, list[dict[str, Any]]] = {s: [] for s in rollout_slots}
        while queue and any(len(first[s]) < self.config.rollout_slots for s in rollout_slots):
            for s in rollout_slots:
                if queue and len(first[s]) < self.config.rollout_slots:
                    g = queue.popleft()
                    ledger[g["prompt"]["pid"] * 64 + g["sample"]] = "generating"
                    first[s].append(g)
        for s in rollout_slots:
            channel.send(self.conns[s], {"cmd": "phase", "role": "rollout", "version": gen_version, "seqs": first[s], "more": bool(queue)})
        channel.send_all([self.conns[s] for s in trainers], {"cmd": "phase", "role": "train", "shard": shard, "digest": self._digests})
        generated: list[dict[str, Any]] = []
        rollout_stats: dict[int, dict[str, Any]] = {}
        train_stats: dict[int, dict[str, Any]] = {}
        rollout_end = t0
        train_end = t0
        by_conn = {id(self.conns[s]): s for s in self.conns}
        waiting = [self.conns[s] for s in rollout_slots + trainers]
        while waiting:
            ready = wait(waiting, timeout=self.config.timeout_s)
            if not ready:
                silent = [by_conn[id(c)] for c in waiting]
                raise self._failure(silent[0], f"phase {p}: slots {silent} did not answer within {self.config.timeout_s:g} s")
            for conn in ready:
                slot = by_conn[id(conn)]
                msg = self._read(slot, f"phase {p}", "gen", "rollout_done", "train_done")
                now = time.perf_counter()
                if "gen" in msg:
                    for t in msg["finished"]:
                        if ledger.get(t["key"]) != "generating":
                            raise AssertionError(f"ledger: sequence {t['key']} finished while {ledger.get(t['key'])}")
                        ledger[t["key"]] = "generated"
                        generated.append(t)
                        rollout_end = now
                    if msg["want"] > 0:  # a worker that asks waits for the answer; one that only reports does not
                        give = [queue.popleft() for _ in range(min(msg["want"], len(queue)))]
                        for g in give:
                            ledger[g["prompt"]["pid"] * 64 + g["sample"]] = "generating"
                        channel.send(conn, {"cmd": "seqs", "seqs": give, "more": bool(queue)})
                elif "rollout_done" in msg:
                    rollout_stats[slot] = msg["rollout_done"]
                    waiting.remove(conn)
                elif "train_done" in msg:
                    train_stats[slot] = msg["train_done"]
                    train_end = now
                    waiting.remove(conn)
                else:
                    raise WorkerError(f"slot {slot}: unexpected message {sorted(msg)}")
        if queue:
            raise AssertionError(f"phase {p}: {len(queue)} sequences never handed out")
        if gen_batch is not None:
            batches[gen_batch] = generated
        rollout_s = (rollout_end - t0) if generated else 0.0
        train_s = (train_end - t0) if train_stats else 0.0
        # Exactly once: the trainers' sampler shares cover the step's batch, each trajectory once.
        trained_keys = [k for st in train_stats.values() for k in st.get("trained_keys", [])]
        if shard is not None and sorted(trained_keys) != [t["key"] for t in shard["trajectories"]]:
            raise AssertionError(f"phase {p}: the trainers trained {len(trained_keys)} trajectories "
                                 f"({len(set(trained_keys))} distinct) of a batch of {len(shard['trajectories'])}")
        for key in trained_keys:
            if ledger.get(key) != "generated":
                raise AssertionError(f"ledger: sequence {key} trained while {ledger.get(key)}")
            ledger[key] = "trained"
        for slot, st in train_stats.items():
            if st["rank"] != trainers.index(slot) or st["world"] != len(trainers):
                raise AssertionError(f"phase {p}: slot {slot} is rank {st['rank']} of {st['world']}, "
                                     f"planned {trainers.index(slot)} of {len(trainers)}")
        trained = len(trained_keys)
        phase: dict[str, Any] = {
            "phase": p, "rollout": len(rollout_slots), "train": len(trainers), "rollout_s": rollout_s, "train_s": train_s,
            "stages_s": max(rollout_s, train_s), "trained_sequences": trained, "action": "hold", "switch_total_s": 0.0,
            "switch_exposed_s": 0.0, "version": version, "rollout_stats": rollout_stats, "train_stats": train_stats,
        }
        if generated:
            phase["mean_reward"] = statistics.fmean(t["reward"] for t in generated)
            phase["exact"] = statistics.fmean(1.0 if t["exact"] else 0.0 for t in generated)
            phase["mean_length"] = statistics.fmean(len(t["tokens"]) for t in generated)
            phase["longest"] = max(len(t["tokens"]) for t in generated)
            phase["generated_version"] = gen_version
            phase["lengths"] = [len(t["tokens"]) for t in generated]
        if train_stats:
            lead = train_stats[trainers[0]]
            phase["loss"] = lead.get("loss")
            if self._digests:
                phase["digests"] = {s: (st.get("param_digest"), st.get("optimizer_digest")) for s, st in train_stats.items()}
        return phase

    def _observe(self, policy: Any, phase: dict[str, Any], trainers: int) -> None:
        for length in phase.get("lengths", []):
            policy.observe_generation(float(PROMPT_TOKENS), float(length))
        for st in phase["rollout_stats"].values():
            for c, ctx, iters, secs in st["segments"]:
                policy.observe_decode(int(c), float(ctx), float(iters), float(secs))
        ts = phase["train_stats"]
        if ts and phase["trained_sequences"]:
            tokens = sum(s["tokens"] for s in ts.values())
            step = max(s["compute_s"] + s["sync_s"] + s.get("optimizer_step_s", 0.0) for s in ts.values())
            sync = statistics.fmean(s["sync_s"] for s in ts.values())
            policy.observe_train(trainers, tokens / trainers, step, min(sync, step))
        if phase["weight_sync_s"]:
            policy.observe_weight_sync(phase["weight_sync_s"])



if __name__ == "__main__":  # python -m dra.rl.live.coordinator runs dra.rl.live.cli (no import cycle)
    import runpy
    runpy.run_module("dra.rl.live.cli", run_name="__main__")
