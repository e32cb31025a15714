"""The elastic controller behind ``dra.step`` under torchrun (DESIGN.md §3.3).

Protocol over the job's c10d store (keys under ``dra/<run id>/<restart>/``):

* ``cfg/<uid>``, ``sig/<uid>``: each process's config fingerprint and model signature; compared
  at start (inconsistent configs and models are refused before any training).
* ``epoch_seq``: counter handing out world epochs; ``pg/<epoch>/...``: the Gloo rendezvous.
* ``dec/<epoch>/<step>``: the leader's decision at a decision step (hold, or the next member
  list); every member reads it, so all agree.
* ``cands``, ``waiting/<uid>``, ``admit/<uid>``: candidates (standby ranks, late joiners) register
  with their model signature; the leader admits (or rejects) them by writing ``admit/<uid>``.
* ``fault/<epoch>/alive/<uid>``, ``fault/<epoch>/decider``, ``fault/<epoch>/result``: after a
  collective fails, the survivors check in; the first one to claim the decider role waits (at
  most the fault timeout) for the others and publishes the surviving member list.
* ``done``: the job finished; standby processes return.

Every wait is bounded (collectives by the Gloo timeout, store reads by the store/fault timeouts).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist

from dra import _controller, _core
from dra._core import elastic as _m
from dra.elastic import _state
from dra.elastic._comm import CommFailure, GlooWorld
from dra.elastic._events import EventLog, StatusLine
from dra.elastic._store import StoreClient, job_prefix, store_address_from_env
from dra.elastic.sampler import ElasticSampler

_NEVER = 1 << 62
LATE_UID_BASE = 10000

# Test hook: when set, called as hook(controller, phase) at "rebuild", "state_transfer" and
# "reshard" of every world change, so tests can kill a process inside a resize for real.
_phase_hook = None


class ElasticStepStatus:
    """What ``dra.step`` returns under the elastic controller."""

    __slots__ = ("committed", "step", "world_size", "rank", "epoch", "event", "loss")

    def __init__(self) -> None:
        self.committed = False
        self.step = -1
        self.world_size = 0
        self.rank = -1
        self.epoch = -1
        self.event: dict[str, Any] | None = None
        self.loss = float("nan")

    def __repr__(self) -> str:
        return f"<ElasticStepStatus step={self.step} committed={self.committed} world={self.world_size} epoch={self.epoch}>"


class ElasticDataParallel(torch.nn.Module):
    """DDP semantics over the current elastic world: after ``backward`` every parameter's
    gradient is the mean over the global batch (each rank's gradient weighted by its share of
    the step's samples; equal shares make this the plain average over ranks, as DDP does).
    Parameters that received no gradient count as zero. The reduction is one flat all-reduce at
    the end of backward."""

    def __init__(self, module: torch.nn.Module, controller: "ElasticController") -> None:
        super().__init__()
        self.module = module
        self._controller = controller
        self._queued = False
        self._params = [p for p in module.parameters() if p.requires_grad]
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _on_grad(self, _param: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync)

    def _sync(self) -> None:
        self._queued = False
        self._controller._sync_gradients(self._params)


class ElasticController:
    """Elastic data-parallel controller: one per process, installed as ``dra.step``'s controller.

    Processes with uid < ``start_size`` form the first world; the others wait as candidates
    (inside this constructor) until the policy admits them or the job ends.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        *,
        scheduler: Any = None,
        policy: str = "convergence",
        min_size: int = 1,
        max_size: int | None = None,
        start_size: int | None = None,
        release: str = "standby",
        batch_mode: str = "fixed",
        decide_every: int = 10,
        resize_schedule: dict[int, int] | None = None,
        fault_timeout_s: float = 3.0,
        store_timeout_s: float = 30.0,
        chunk_mb: float = 16.0,
        events_path: str | None = None,
        status_every: int = 0,
        verify: bool = False,
        store_address: tuple[str, int] | None = None,
        join: bool | None = None,
        max_resize_retries: int = 3,
        **engine_options: Any,
    ) -> None:
        if release not in ("standby", "exit"):
            raise ValueError(f"release: must be 'standby' or 'exit', got {release!r}")
        if batch_mode not in ("fixed", "adascale"):
            raise ValueError(f"batch_mode: must be 'fixed' (global batch kept) or 'adascale', got {batch_mode!r}")
        if fault_timeout_s <= 0:
            raise ValueError(f"fault_timeout_s: must be > 0, got {fault_timeout_s}")
        if decide_every < 1:
            raise ValueError(f"decide_every: must be >= 1, got {decide_every}")
        if chunk_mb <= 0:
            raise ValueError(f"chunk_mb: must be > 0, got {chunk_mb}")
        self.inner = model
        self.model = ElasticDataParallel(model, self)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.sampler = sampler
        self.release = release
        self.batch_mode = batch_mode
        self.decide_every = int(decide_every)
        self.schedule = {int(k): int(v) for k, v in (resize_schedule or {}).items()}
        self.fault_timeout_s = float(fault_timeout_s)
        self.chunk_bytes = int(chunk_mb * (1 << 20))
        self.verify = bool(verify)
        self.max_resize_retries = int(max_resize_retries)
        self.events = EventLog(events_path)
        self.status_line = StatusLine(status_every)
        options = dict(engine_options)
        if batch_mode == "adascale" and policy == "goodput":
            goodput = dict(options.pop("goodput", {}) or {})
            goodput.setdefault("adapt_batch", True)
            options["goodput"] = goodput
        self.engine = _core.ResizeEngine(
            _controller.make_engine_config(policy=policy, min_size=min_size, max_size=max_size, decide_every=_NEVER, **options)
        )
        self.min_size = int(min_size)

        # -- who am I ------------------------------------------------------------------------
        if join is None:
            join = os.environ.get("DRA_JOIN", "0") == "1"
        addr = store_address or store_address_from_env()
        host_store = False
        if addr is None:
            # Alone, without torchrun: a private store on a free port, a world of one.
            addr, host_store = ("127.0.0.1", 0), True
        elif not join and os.environ.get("RANK", "0") == "0":
            # Under torchrun the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True);
            # otherwise rank 0 hosts it, as init_process_group would. DRA_HOST_STORE=0/1 overrides.
            default = "1" if os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" else "0"
            host_store = os.environ.get("DRA_HOST_STORE", default) == "1"
        self.store = StoreClient(addr[0], addr[1], prefix=job_prefix(), timeout_s=store_timeout_s, is_master=host_store)
        if join:
            # Late joiners number themselves from LATE_UID_BASE up, so they never collide with
            # the ranks torchrun handed out, whenever they arrive.
            self.uid = LATE_UID_BASE + self.store.add("late_uid", 1) - 1
            self.universe_size = int(self.store.get("universe", timeout_s=store_timeout_s))
        else:
            self.uid = int(os.environ.get("RANK", "0"))
            self.universe_size = int(os.environ.get("WORLD_SIZE", "1"))
            if self.uid == 0:
                self.store.set("universe", self.universe_size)
        self.start_size = int(start_size) if start_size is not None else self.universe_size
        if not 1 <= self.start_size <= self.universe_size:
            raise ValueError(f"start_size: must lie in [1, {self.universe_size}] (the processes launched), got {self.start_size}")
        self.signature = _state.model_signature(model)
        self.config_fingerprint = {
            "global_batch": sampler.global_batch,
            "dataset_size": sampler.dataset_size,
            "seed": sampler.seed,
            "drop_last": sampler.drop_last,
            "policy": policy,
            "min_size": int(min_size),
            "max_size": max_size,
            "start_size": self.start_size,
            "release": release,
            "batch_mode": batch_mode,
            "decide_every": self.decide_every,
            "schedule": sorted(self.schedule.items()),
            "verify": self.verify,
            "engine": sorted((k, repr(v)) for k, v in engine_options.items()),
        }

        # -- state ---------------------------------------------------------------------------
        self.role = "candidate"
        self.world: GlooWorld | None = None
        self.members: list[int] = []
        self.epoch = -1
        self.step_index = 0
        self.num_epochs: int | None = None
        self._failed: str | None = None
        self._synced = False
        self._flat: torch.Tensor | None = None
        self._pending_loss = (0.0, 0.0)
        self._pending_dec: dict[str, Any] | None = None
        self._dec_flag = False
        self._last_loss = float("nan")
        self.last_digest: int | None = None
        self.last_event: dict[str, Any] | None = None
        self.resizes = 0
        self._decide_s = 0.0
        self._status = ElasticStepStatus()
        self._guard(optimizer, "step")
        if scheduler is not None:
            self._guard(scheduler, "step")

        self._check_consistency(join)
        if not join and self.uid < self.start_size:
            self._start_world()
        else:
            self._wait_for_admission()

    # ------------------------------------------------------------------------------------------
    # public surface
    # ------------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.world.size if self.world is not None else 0

    @property
    def rank(self) -> int:
        return self.world.rank if self.world is not None else -1

    @property
    def is_member(self) -> bool:
        return self.role == "member"

    @property
    def signals(self) -> _core.ConvergenceSignals:
        return self.engine.signals

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Data epochs, starting wherever the world is (a joiner starts mid-run)."""
        self.num_epochs = int(num_epochs)
        while self.role == "member" and self.sampler.epoch < self.num_epochs:
            e = self.sampler.epoch
            yield e
            if self.sampler.epoch == e and self.sampler.exhausted:
                self.sampler.next_epoch()
        self.finish()

    def finish(self) -> None:
        """End of training: members meet once more, the leader tells standby processes to go."""
        if self.role == "member" and self.world is not None:
            try:
                self.world.barrier()
            except CommFailure:
                pass
            if self.rank == 0:
                self.store.set("done", 1)
            self.world.close()
            self.world = None
            self.role = "finished"

    def step(self, loss: Any, **signals: Any) -> ElasticStepStatus:
        """One training step, after ``optimizer.step()``. Commits the step when its gradient
        reduction succeeded, feeds the policy, and resizes at decision steps. After a fault the
        survivors shrink and the step is redone by the next loop iteration."""
        st = self._status
        st.event = None
        if self.role != "member":
            st.committed = False
            return st
        if not self._synced and self._failed is None:
            raise RuntimeError(
                "dra.step: no gradient reduction ran this step; call backward() on the output of "
                "controller.model (the ElasticDataParallel wrapper) before dra.step"
            )
        self._synced = False
        if self._failed is not None:
            reason, self._failed = self._failed, None
            st.committed = False
            self._recover(reason)
            self._fill_status()
            return st
        value = loss if type(loss) is float else float(loss.detach().item() if torch.is_tensor(loss) else loss)
        n_share = self._share_size
        self._pending_loss = (value * n_share if n_share else 0.0, float(n_share))
        samples = self.sampler.step_range()[1] - self.sampler.step_range()[0]
        self.sampler.commit()
        committed = self.step_index
        self.step_index += 1
        if self._last_loss == self._last_loss:  # the world's mean loss of the previous step
            self.engine.step(committed, self._last_loss)
        if signals:  # gradient statistics, validation metric, timings: as dra.Controller takes them
            _controller.Controller._extra(self, signals)  # type: ignore[arg-type]
        st.committed = True
        st.step = committed
        st.epoch = self.epoch
        st.loss = self._last_loss
        if self.rank == 0:
            self.status_line.tick(self.step_index, self._last_loss, self.world_size, samples)
        if self._dec_flag:
            # The leader flagged a decision in this step's all-reduce: everyone applies it now.
            self._dec_flag = False
            self._apply_decision()
        elif self.rank == 0 and self._pending_dec is None and (
            self.step_index % self.decide_every == 0 or self.step_index in self.schedule
        ):
            self._leader_decides()
        self._fill_status()
        return st

    # ------------------------------------------------------------------------------------------
    # gradients
    # ------------------------------------------------------------------------------------------
    @property
    def _share_size(self) -> int:
        b, e = self.sampler.share_range()
        return e - b

    def _sync_gradients(self, params: list[torch.Tensor]) -> None:
        self._synced = True
        if self.role != "member" or self.world is None or self._failed is not None:
            return
        if self.world.size == 1:
            # Alone: the gradient already is the global batch's mean; nothing to reduce.
            count = self._pending_loss[1]
            self._last_loss = self._pending_loss[0] / count if count > 0 else float("nan")
            self._dec_flag = False
            return
        sizes = [p.numel() for p in params]
        total = sum(sizes)
        if self._flat is None or self._flat.numel() != total + 3:
            self._flat = torch.empty(total + 3, dtype=torch.float32)
        flat = self._flat
        b, e = self.sampler.step_range()
        weight = self._share_size / max(e - b, 1)
        off = 0
        for p, n in zip(params, sizes):
            if p.grad is None or weight == 0.0:
                flat[off : off + n].zero_()
            else:
                torch.mul(p.grad.reshape(-1), weight, out=flat[off : off + n])
            off += n
        flat[total] = self._pending_loss[0]
        flat[total + 1] = self._pending_loss[1]
        # The leader's "a decision is published" flag rides on the gradient all-reduce, so the
        # steps without a resize never touch the store.
        flat[total + 2] = 1.0 if (self._pending_dec is not None and self.world.rank == 0) else 0.0
        try:
            self.world.all_reduce_sum(flat)
        except CommFailure as err:
            self._failed = str(err)
            self.world.abort()
            return
        self._dec_flag = bool(flat[total + 2] > 0.5)
        off = 0
        for p, n in zip(params, sizes):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(flat[off : off + n].view_as(p.grad))
            off += n
        count = float(flat[total + 1])
        self._last_loss = float(flat[total]) / count if count > 0 else float("nan")

    def _guard(self, obj: Any, name: str) -> None:
        """A failed step must not be applied: the optimizer/scheduler step is skipped."""
        original = getattr(obj, name)

        @functools.wraps(original)  # keeps the LR scheduler's own marker on optimizer.step
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self._failed is not None or self.role != "member":
                return None
            return original(*args, **kwargs)

        setattr(obj, name, guarded)

    # ------------------------------------------------------------------------------------------
    # start, admission
    # ------------------------------------------------------------------------------------------
    def _check_consistency(self, join: bool) -> None:
        self.store.set(f"cfg/{self.uid}", self.config_fingerprint)
        self.store.set(f"sig/{self.uid}", self.signature)
        others = [0] if join else range(self.universe_size)
        for other in others:
            if other == self.uid:
                continue
            theirs = self.store.get(f"cfg/{other}", timeout_s=self.store.timeout_s)
            if theirs != json.loads(json.dumps(self.config_fingerprint)):
                diff = [k for k in self.config_fingerprint if json.dumps(self.config_fingerprint[k]) != json.dumps(theirs.get(k))]
                raise ValueError(
                    f"dra: inconsistent configuration: process {self.uid} and process {other} differ in {diff}; "
                    f"every process of a job must pass the same options"
                )
            if not join:
                problem = _state.signature_mismatch(self.store.get(f"sig/{other}"), self.signature)
                if problem:
                    raise _core.StateMismatchError(f"dra: process {self.uid}'s model differs from process {other}'s: {problem}")

    def _start_world(self) -> None:
        members = list(range(self.start_size))
        self._enter_world(0, members, source="start", joined=[], left=[], reason="start", before=0, t_agree=0.0)

    def _register_candidate(self) -> None:
        self.role = "candidate"
        self.store.set(f"waiting/{self.uid}", {"sig": self.signature})
        self.store.append_list("cands", self.uid)

    def _wait_for_admission(self) -> None:
        """Standby: blocks until admitted (then joins the world) or the job is done."""
        self._register_candidate()
        key = f"admit/{self.uid}"
        polls = 0
        while True:
            # Polled (not a blocking wait) so the job's end is noticed too; 5 ms keeps the
            # admission latency small next to a rebuild.
            if not self.store.exists(key):
                polls += 1
                if polls % 100 == 0 and self.store.exists("done"):
                    self.role = "finished"
                    self.sampler.epoch = _NEVER
                    return
                time.sleep(0.005)
                continue
            msg = self.store.get(key)
            self.store.delete(key)
            if msg.get("rejected"):
                self.role = "rejected"
                raise _core.StateMismatchError(f"dra: admission refused by the world: {msg['rejected']}")
            try:
                self._enter_world(msg["epoch"], msg["members"], source="admit", joined=[], left=[], reason="", before=0, t_agree=0.0)
                return
            except (CommFailure, TimeoutError, _core.MembershipError) as err:
                # A peer died while we joined: we are a member of that epoch, so we take part
                # in its recovery like everyone else.
                self.role = "member"
                self._recover(f"joining epoch {msg['epoch']} failed: {err}")
                return

    # ------------------------------------------------------------------------------------------
    # the world of an epoch: rebuild, state handoff, reshard, first all-reduce
    # ------------------------------------------------------------------------------------------
    def _enter_world(
        self,
        epoch: int,
        members: list[int],
        *,
        source: str,
        joined: list[int],
        left: list[int],
        reason: str,
        before: int,
        t_agree: float,
        receivers: list[int] | None = None,
        decided_step: int | None = None,
    ) -> None:
        """Builds the communicator of `epoch`, moves state to the ranks that need it, re-shards.

        Cases: "start" (first world; rank 0 sends its state to every other member), "admit"
        (this process is a joiner: receives from rank 0), "resize" (voluntary grow/shrink: rank 0
        sends to the joiners only), "fault" (after a crash: rank 0 sends to every other member,
        since survivors may disagree about whether the interrupted step was applied).
        """
        t0 = time.perf_counter()
        old = self.world
        self.world = None
        if old is not None:
            old.close()
        # Members and epoch first: if the build fails, recovery runs in this new epoch.
        self.members, self.epoch = list(members), int(epoch)
        if _phase_hook is not None:
            _phase_hook(self, "rebuild")
        world = GlooWorld(self.store, epoch, members, self.uid, self.fault_timeout_s)
        self.world = world
        t_rebuild = time.perf_counter() - t0

        t1 = time.perf_counter()
        nbytes = 0
        if _phase_hook is not None:
            _phase_hook(self, "state_transfer")
        if source == "admit":
            extra, nbytes = _state.recv_state(world, 0, self.inner, self.optimizer, self.scheduler, self.chunk_bytes)
            self._load_extra(extra)
        else:
            if source in ("start", "fault"):
                dst_ranks = list(range(1, world.size))
            else:
                dst_ranks = [world.members.index(u) for u in (receivers or [])]
            if world.rank == 0 and dst_ranks:
                tensors, manifest = _state.collect(self.inner, self.optimizer, self.scheduler, self._extra())
                nbytes = _state.send_state(world, dst_ranks, tensors, manifest, self.chunk_bytes)
            elif world.rank in dst_ranks:
                extra, nbytes = _state.recv_state(world, 0, self.inner, self.optimizer, self.scheduler, self.chunk_bytes)
                self._load_extra(extra)
        t_transfer = time.perf_counter() - t1

        t2 = time.perf_counter()
        if _phase_hook is not None:
            _phase_hook(self, "reshard")
        self.sampler.set_world(world.size, world.rank)
        self._flat = None
        self._pending_loss = (0.0, 0.0)
        self._pending_dec = None
        self._dec_flag = False
        world.barrier()  # the first all-reduce of the new world
        identical = None
        if self.verify:
            self.last_digest = _state.param_digest(self.inner, self.optimizer)
            d = torch.tensor([self.last_digest, -self.last_digest], dtype=torch.int64)
            world.all_reduce_max(d)
            identical = bool(int(d[0]) == -int(d[1]))
        t_reshard = time.perf_counter() - t2
        self.role = "member"
        self.engine.resized(world.size, float(self.sampler.global_batch))
        w = self.engine.world
        w.active = list(members)
        if source != "admit" and world.rank == 0:
            cost = {"agree": t_agree, "rebuild": t_rebuild, "state_transfer": t_transfer, "reshard": t_reshard}
            event = {
                "event": "fault" if source == "fault" else ("start" if source == "start" else "resize"),
                "step": self.step_index,
                "epoch": self.epoch,
                "data_epoch": self.sampler.epoch,
                "before": before,
                "after": world.size,
                "members": list(members),
                "left": list(left),
                "joined": list(joined),
                "reason": reason,
                "decided_step": decided_step,
                "cost_s": cost,
                "total_s": sum(cost.values()),
                "state_bytes": nbytes,
                "state_gbps": (nbytes / t_transfer / 1e9) if nbytes and t_transfer > 0 else None,
                "global_batch": self.sampler.global_batch,
                "batch_mode": self.batch_mode,
                "params_identical": identical,
            }
            if source == "start":
                event["release"] = self.release
            self.last_event = event
            self._status.event = event
            self.events.emit(event)
        if source != "start":
            self.resizes += 1

    def _extra(self) -> dict[str, Any]:
        return {
            "step_index": self.step_index,
            "sampler": self.sampler.state_dict(),
            "num_epochs": self.num_epochs,
            "resizes": self.resizes,
        }

    def _load_extra(self, extra: dict[str, Any]) -> None:
        self.step_index = int(extra["step_index"])
        self.sampler.load_state_dict(extra["sampler"])
        if extra.get("num_epochs") is not None:
            self.num_epochs = int(extra["num_epochs"])
        self.resizes = int(extra.get("resizes", 0))

    def _fill_status(self) -> None:
        st = self._status
        st.world_size = self.world_size
        st.rank = self.rank
        if not st.committed:
            st.epoch = self.epoch

    # ------------------------------------------------------------------------------------------
    # decisions (leader publishes, every member reads)
    # ------------------------------------------------------------------------------------------
    def _candidates(self) -> list[int]:
        """Waiting candidates with a matching model; mismatched ones are rejected here."""
        out = []
        for uid in sorted(set(self.store.read_list("cands"))):
            if uid in self.members:
                continue
            info = self.store.try_get(f"waiting/{uid}")
            if info is None:
                continue
            problem = _state.signature_mismatch(self.signature, info["sig"])
            if problem:
                self.store.delete(f"waiting/{uid}")
                self.store.set(f"admit/{uid}", {"rejected": f"model mismatch: {problem}"})
                self.events.emit({"event": "rejected", "step": self.step_index, "epoch": self.epoch, "uid": uid, "reason": problem})
                continue
            out.append(uid)
        return out

    def _decide(self) -> dict[str, Any]:
        candidates = self._candidates()
        w = self.engine.world
        w.size = len(self.members)
        w.active = list(self.members)
        w.candidates = candidates
        w.global_batch = float(self.sampler.global_batch)
        cap = self.engine.capacity
        cap.available = len(self.members) + len(candidates)
        batch_scale = lr_scale = 1.0
        if self.step_index in self.schedule:
            target = self.schedule[self.step_index]
            reason = f"schedule: size {target} at step {self.step_index}"
        else:
            d = self.engine.decide()
            target, reason = d.target_size, d.reason
            if self.batch_mode == "adascale":
                batch_scale, lr_scale = d.batch_scale, d.lr_scale
        current = len(self.members)
        joined: list[int] = []
        left: list[int] = []
        if target > current:
            joined = list(_m.pick_joiners(self.members, candidates, target))
        elif target < current:
            left = list(_m.pick_leavers(self.members, max(target, 1)))
        if not joined and not left and batch_scale == 1.0:
            return {"action": "hold", "reason": reason}
        members = list(_m.next_members(self.members, left, joined))
        new_epoch = self.store.add("epoch_seq", 1)
        return {
            "action": "grow" if joined else ("shrink" if left else "rebatch"),
            "reason": reason,
            "members": members,
            "joined": joined,
            "left": left,
            "epoch": new_epoch,
            "batch_scale": batch_scale,
            "lr_scale": lr_scale,
        }

    def _leader_decides(self) -> None:
        """Leader, at a decision step: decide; a non-hold decision is published to the store at
        once and flagged in the next gradient all-reduce, after which every member applies it."""
        t0 = time.perf_counter()
        try:
            dec = self._decide()
        except (TimeoutError, _core.MembershipError) as err:
            print(f"[dra] decision at step {self.step_index} skipped: {err}", flush=True)
            return
        if dec["action"] == "hold":
            return
        dec["decided_step"] = self.step_index
        self.store.set(f"dec/{self.epoch}", dec)
        self._pending_dec = dec
        self._decide_s = time.perf_counter() - t0
        if self.world is not None and self.world.size == 1:
            self._apply_decision()  # no peers to tell: apply at this boundary

    def _apply_decision(self) -> None:
        t0 = time.perf_counter()
        try:
            if self.rank == 0:
                dec = self._pending_dec
                assert dec is not None
                for uid in dec.get("joined", []):
                    self.store.delete(f"waiting/{uid}")
                    self.store.set(f"admit/{uid}", {"epoch": dec["epoch"], "members": dec["members"]})
            else:
                dec = self.store.get(f"dec/{self.epoch}", timeout_s=self.fault_timeout_s + 1.0)
        except (TimeoutError, _core.MembershipError) as err:
            if self.world is not None:
                self.world.abort()
            self._recover(f"decision of epoch {self.epoch} not received: {err}")
            return
        self._pending_dec = None
        self._dec_flag = False
        t_agree = time.perf_counter() - t0 + (self._decide_s if self.rank == 0 else 0.0)
        if dec["batch_scale"] != 1.0:
            self.sampler.global_batch = max(1, int(round(self.sampler.global_batch * dec["batch_scale"])))
            for group in self.optimizer.param_groups:
                group["lr"] *= dec["lr_scale"]
        before = len(self.members)
        if self.uid in dec["left"]:
            self._leave(dec)
            return
        try:
            self._enter_world(
                dec["epoch"], dec["members"], source="resize", joined=dec["joined"], left=dec["left"],
                reason=dec["reason"], before=before, t_agree=t_agree, receivers=dec["joined"],
                decided_step=dec.get("decided_step"),
            )
        except (CommFailure, TimeoutError, _core.MembershipError) as err:
            self._recover(f"resize to epoch {dec['epoch']} failed: {err}")

    def _leave(self, dec: dict[str, Any]) -> None:
        if self.world is not None:
            self.world.close()
        self.world = None
        self.role = "released"
        if self.release == "exit":
            print(f"[dra] process {self.uid} released at step {self.step_index}: exiting to give the device back", flush=True)
            raise SystemExit(0)
        self._wait_for_admission()

    # ------------------------------------------------------------------------------------------
    # faults
    # ------------------------------------------------------------------------------------------
    def _recover(self, reason: str) -> None:
        """A collective or a decision read failed: agree on the survivors, rebuild, resync."""
        for _attempt in range(self.max_resize_retries + 1):
            t0 = time.perf_counter()
            failed_epoch, old_members = self.epoch, list(self.members)
            if self.world is not None:
                self.world.abort()
                self.world = None
            base = f"fault/{failed_epoch}"
            self.store.set(f"{base}/alive/{self.uid}", 1)
            if self.store.claim(f"{base}/decider", str(self.uid)):
                deadline = time.monotonic() + self.fault_timeout_s + 1.0
                alive: list[int] = []
                while True:
                    alive = [u for u in old_members if self.store.exists(f"{base}/alive/{u}")]
                    if len(alive) == len(old_members) or time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)
                new_members = list(_m.survivors(old_members, alive))
                self.store.set(f"{base}/result", {"epoch": self.store.add("epoch_seq", 1), "members": new_members})
            result = self.store.get(f"{base}/result", timeout_s=2 * self.fault_timeout_s + 5.0)
            t_agree = time.perf_counter() - t0
            if self.uid not in result["members"]:
                print(f"[dra] process {self.uid} was left out of epoch {result['epoch']} (arrived late); standing by", flush=True)
                self.role = "released"
                if self.release == "exit":
                    raise SystemExit(0)
                self._wait_for_admission()
                return
            dead = [u for u in old_members if u not in result["members"]]
            try:
                self._enter_world(
                    result["epoch"], result["members"], source="fault", joined=[], left=dead,
                    reason=f"peer failure: {reason}", before=len(old_members), t_agree=t_agree,
                )
                return
            except (CommFailure, TimeoutError, _core.MembershipError) as err:
                reason = f"rebuild after fault failed: {err}"
        raise _core.MembershipError(f"dra: could not re-form the world after {self.max_resize_retries + 1} attempts: {reason}")


def init(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: ElasticSampler, **options: Any) -> ElasticController:
    """Creates the elastic controller and installs it as the process-wide one behind ``dra.step``."""
    controller = ElasticController(model, optimizer, sampler, **options)
    _controller.reset(controller)  # type: ignore[arg-type]
    return controller


del hashlib, dist
