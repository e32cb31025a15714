"""The process on one device slot of the live RL loop (``python -m dra.rl.live.worker``).

It holds the rollout role or the trainer role and switches in place at a step boundary when the
coordinator says so. Weights reach every slot over one Gloo group built once and reused; the
trainers are a ``dra.elastic`` world (``policy="none"``, ``release="return"``,
``capacity_poll_s=0``, ``handoff="deferred"``): a released trainer starts a rollout engine in the
same process, and a rollout worker that becomes a trainer joins with ``ctl.try_join()`` and is
sent only what it lacks (no weights, the optimizer state during its first step). Which
trajectories a trainer trains on comes from the controller's sampler, so each is trained exactly
once whatever the world did; every generation carries its policy version (docs/design/rl.md).
Control messages come from the coordinator over a ``multiprocessing.connection`` on a Unix socket in a
directory only the coordinator's user can enter, after the key the coordinator gave it: JSON, checked
on receipt against the loop's message schemas, never unpickled (``dra.rl.live.channel``)."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Client
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dra.rl.live import channel
from dra.rl.live.model import ModelConfig, PolicyModel, RolloutEngine, Sequence, answer_logprobs
from dra.rl.live.task import reward


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def _unflat(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, at = [], 0
    for t in like:
        out.append(flat[at : at + t.numel()].view_as(t))
        at += t.numel()
    return out


def balanced_order(lengths: list[int], shares: list[int]) -> list[int]:
    """A step's trajectories in the order the sampler's positions address them: rank r's
    contiguous share of ``shares[r]`` positions holds a set of trajectories of about equal tokens
    (longest first onto the least loaded rank with room). The same on every rank, and a
    permutation: the union of the shares is the step's batch, once."""
    bins: list[list[int]] = [[] for _ in shares]
    load = [0] * len(shares)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min((r for r in range(len(shares)) if len(bins[r]) < shares[r]), key=lambda r: (load[r], r))
        bins[r].append(i)
        load[r] += lengths[i]
    return [i for b in bins for i in b]


class SlotWorker:
    def __init__(self, slot: int, conn: Any, init: dict[str, Any]) -> None:
        self.slot, self.conn, self.init = slot, conn, init
        self.timeout = timedelta(seconds=float(init.get("timeout_s", 120.0)))
        torch.set_num_threads(1)
        self.store = dist.TCPStore(init["store_host"], init["store_port"], is_master=False, timeout=self.timeout)
        self.job = init["job"]
        t0 = time.perf_counter()
        self.weights_pg = dist.ProcessGroupGloo(dist.PrefixStore(f"{self.job}/weights", self.store), slot, init["slots"], self.timeout)
        self.weights_group_s = time.perf_counter() - t0
        self.role = "none"
        self.ctl: Any = None
        self.engine: RolloutEngine | None = None
        self.version = 0
        self._new_model()

    def _new_model(self) -> None:
        # A fresh model per run: the elastic controller's gradient hooks live on its parameters.
        self.model = PolicyModel(ModelConfig(**self.init["model"]))
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=self.init["lr"], betas=(0.9, 0.99))

    # ---- run lifecycle ------------------------------------------------------------------------
    def reset(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A new run: the pretrained weights, no optimizer state, and a new elastic job whose first
        world is the run's first trainers (uids 0..trainers-1); a slot that starts as a rollout
        worker is released from the start (``release="return"``) and enters with ``try_join``."""
        import dra
        from dra.elastic import ElasticSampler

        if self.ctl is not None:
            self.ctl.finish()
        self.ctl = None
        self._new_model()
        self.model.load_state_dict(torch.load(msg["weights"], weights_only=True))
        self.engine, self.version, self.pending_loss = None, 0, None
        self.run = msg["run"]
        job = msg["job"]
        # The trajectory stream: one global batch per training step, in order (no shuffle: a
        # step's positions are that step's trajectories).
        self.batch = int(job["global_batch"])
        self.sampler = ElasticSampler(int(job["steps"]) * self.batch, self.batch, shuffle=False)
        os.environ.update(RANK=str(msg["uid"]), WORLD_SIZE=str(self.init["slots"]), DRA_JOB_ID=job["id"])
        os.environ.pop("DRA_JOIN", None)
        self.ctl = dra.Controller(model=self.model, optimizer=self.optimizer, sampler=self.sampler,
                                  store_address=(self.init["store_host"], self.init["store_port"]), **job["options"])
        self.role = "train" if self.ctl.is_member else "rollout"
        return {"reset": self.slot, "uid": self.ctl.uid, "role": self.role, "rank": self.ctl.rank}

    def end(self) -> dict[str, Any]:
        """The end of a run: the trainers commit the last step and finish the job."""
        out: dict[str, Any] = {"ended": self.slot, "role": self.role}
        if self.role == "train":
            if self.pending_loss is not None:
                self._boundary()
            out.update(step_index=self.ctl.step_index, cursor=self.sampler.cursor, rank=self.ctl.rank, world=self.ctl.world_size,
                       resizes=self.ctl.resizes, param_digest=float(_flat(self.params).double().sum()))
        self.ctl.finish()
        return out

    # ---- optimizer state as one flat tensor (the trainers' digests) --------------------------
    def _optimizer_flat(self) -> torch.Tensor:
        st = [self.optimizer.state.get(p, {}) for p in self.params]
        if not st or "exp_avg" not in st[0]:
            return torch.zeros(2 * sum(p.numel() for p in self.params) + 1)
        step = float(st[0]["step"])
        return torch.cat([_flat([s["exp_avg"] for s in st]), _flat([s["exp_avg_sq"] for s in st]), torch.tensor([step])])

    # ---- one phase ---------------------------------------------------------------------------
    def phase(self, msg: dict[str, Any]) -> None:
        if msg["role"] == "train":
            self._train(msg)
        else:
            self._rollout(msg)

    def _boundary(self) -> tuple[Any, float]:
        """The previous step's boundary (``ctl.step``): it commits the step, and a world change the
        coordinator asked for through ``capacity`` happens here."""
        t0 = time.perf_counter()
        status = self.ctl.step(self.pending_loss)
        self.pending_loss = None
        return status, time.perf_counter() - t0

    def boundary(self) -> dict[str, Any]:
        """The world's boundary now, for a trainer waiting between steps (the pipeline without a
        per-phase barrier moves trainers while they wait): a released one becomes a rollout worker."""
        if self.role != "train":
            raise RuntimeError(f"slot {self.slot}: a boundary while {self.role}")
        t0 = time.perf_counter()
        status, took = self._boundary() if self.pending_loss is not None else (None, 0.0)
        released = bool(status is not None and status.released)
        if released:
            self.role = "rollout"
            self.version = -1  # mid-training weights: it loads a published version before generating
        return {"boundary": self.slot, "released": released, "event": getattr(status, "event", None), "boundary_s": took,
                "wall_s": time.perf_counter() - t0}

    def register(self) -> dict[str, Any]:
        """A rollout worker about to become a trainer registers as a candidate first, so that the
        world's leader sees it at the boundary where the coordinator's capacity admits it."""
        if self.role != "rollout":
            raise RuntimeError(f"slot {self.slot}: asked to join the trainers while {self.role}")
        admitted = self.ctl.try_join()  # the first call registers (admission needs the members' boundary)
        return {"registered": self.slot, "admitted": admitted}

    def _train(self, msg: dict[str, Any]) -> None:
        t_start = time.perf_counter()
        ctl = self.ctl
        joining = self.role != "train"
        boundary_s = join_s = 0.0
        event: Any = None
        if joining:
            self.engine = None  # the rollout engine's KV cache goes
            deadline = time.monotonic() + self.timeout.total_seconds()
            t0 = time.perf_counter()
            while not ctl.try_join():
                if ctl.role in ("finished", "rejected") or time.monotonic() > deadline:
                    raise RuntimeError(f"slot {self.slot}: not admitted to the trainers' world ({ctl.role}) within {self.timeout}")
                time.sleep(0.002)
            join_s = time.perf_counter() - t0
        elif self.pending_loss is not None:
            status, boundary_s = self._boundary()
            if status.released:
                raise RuntimeError(f"slot {self.slot}: released by the trainers' world while the coordinator kept it training")
            event = status.event
        self.role = "train"
        stats: dict[str, Any] = {"slot": self.slot, "joined": joining, "boundary_s": boundary_s, "join_s": join_s, "event": event,
                                 "rank": ctl.rank, "world": ctl.world_size}
        shard = msg.get("shard")
        if shard is None:  # the pipeline's fill phase: nothing to train on yet
            stats.update(train_s=time.perf_counter() - t_start, compute_s=0.0, sync_s=0.0, tokens=0)
            channel.send(self.conn, {"train_done": stats})
            return
        trajs = shard["trajectories"]
        step = int(shard["step"])
        if len(trajs) != self.batch or self.sampler.cursor != step * self.batch:
            raise AssertionError(f"slot {self.slot}: the sampler stands at {self.sampler.cursor}, step {step} of {len(trajs)} "
                                 f"trajectories starts at {step * self.batch}: a step was skipped or repeated")
        world = ctl.world_size
        shares = [len(self.sampler._native.indices_at(self.sampler.cursor, world, r)) for r in range(world)]
        order = balanced_order([len(t["tokens"]) for t in trajs], shares)
        mine = [trajs[order[i - step * self.batch]] for i in self.sampler.indices()]
        stats["trained_keys"] = [t["key"] for t in mine]
        t0 = time.perf_counter()
        self.model.train()
        logp, mask = answer_logprobs(self.model, [tuple(t["prompt"]) for t in mine], [t["tokens"] for t in mine])
        width = logp.shape[1]
        behaviour = torch.zeros_like(logp)
        adv = torch.tensor([t["advantage"] for t in mine], dtype=torch.float32).unsqueeze(1)
        for i, t in enumerate(mine):
            behaviour[i, : len(t["logprobs"])] = torch.tensor(t["logprobs"][:width])
        ratio = torch.exp(logp - behaviour)
        clip = self.init["clip"]
        per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
        # The GRPO loss is a sum over the step's tokens / all its tokens; the controller weights each
        # rank's gradient by its share of the samples, so the share's factor is undone here.
        loss = (per_token * mask).sum() / shard["global_tokens"] * (self.batch / len(mine))
        tokens = int(mask.sum())
        loss.backward()  # the controller's hooks all-reduce the gradient buckets during backward
        sync_s = self.ctl.model.reduce_s  # the all-reduces inside backward (blocking on CPU)
        compute_s = time.perf_counter() - t0 - sync_s
        t_opt = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(self.params, self.init["max_grad_norm"])
        ctl.optimizer.step()  # applied only when the step's reduction succeeded
        self.optimizer.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - t_opt
        self.pending_loss = float(loss.detach())
        if msg.get("publish") and ctl.rank == 0:  # the leader stages the step's weights for the rollout workers
            t_pub = time.perf_counter()
            _flat(self.params).numpy().astype("float32").tofile(msg["publish"])
            stats["publish_s"] = time.perf_counter() - t_pub
        if joining or event:
            # This step's handoff (the joiner received, the leader sent): the deferred optimizer
            # state's transfer time and how long the optimizer step waited for it (exposed).
            h = ctl.handoff
            stats.update(deferred_s=h["deferred_s"], deferred_wait_s=h["wait_s"], handoff=h)
        if msg.get("digest"):  # tests: every trainer must hold the same parameters and optimizer state
            stats["param_digest"] = float(_flat(self.params).double().sum())
            stats["optimizer_digest"] = float(self._optimizer_flat().double().sum())
        stats.update(
            train_s=time.perf_counter() - t_start, compute_s=compute_s, sync_s=sync_s, optimizer_step_s=step_s, tokens=tokens,
            loss=self.pending_loss * len(mine) / self.batch, samples=len(mine),
        )
        channel.send(self.conn, {"train_done": stats})

    def _rollout(self, msg: dict[str, Any]) -> None:
        t_start = time.perf_counter()
        engine_start_s = leave_s = 0.0
        event: Any = None
        if self.role == "train":
            # Named in capacity's "leave": released at this boundary (the others shrink without it).
            status, leave_s = self._boundary()
            if not status.released:
                raise RuntimeError(f"slot {self.slot}: the coordinator moved it to rollout but the trainers' world kept it")
            event = status.event
        load_s = 0.0
        if msg.get("load"):  # a staged policy version (raw float32, written by the trainers' leader)
            t0 = time.perf_counter()
            flat = torch.from_numpy(np.fromfile(msg["load"], dtype=np.float32))
            with torch.no_grad():
                for p, v in zip(self.params, _unflat(flat, self.params)):
                    p.copy_(v)
            self.version = msg["version"]
            load_s = time.perf_counter() - t0
        if self.engine is None:
            t0 = time.perf_counter()
            self.engine = RolloutEngine(self.model, self.init["rollout_slots"], self.init["seed"])
            engine_start_s = time.perf_counter() - t0
        self.role = "rollout"
        self.model.eval()
        eng = self.engine
        eng.iterations.clear()
        version = msg["version"]
        busy = 0.0

        def admit(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            nonlocal busy
            t0 = time.perf_counter()
            done = [self._trajectory(s) for s in eng.admit([Sequence(channel.prompt_from(x["prompt"]), x["sample"], version) for x in items])]
            busy += time.perf_counter() - t0
            return done

        finished = admit(msg["seqs"])  # the router's first share
        more = msg["more"]
        while True:
            want = eng.free_slots() if more else 0
            if want > 0 or finished:
                progress = [[q.key, len(q.tokens)] for q in eng.active.values()] if msg.get("progress") else None
                channel.send(self.conn, {"gen": self.slot, "finished": finished, "want": want, "progress": progress})
                finished = []
                if want > 0:
                    reply = channel.recv_command(self.conn, "seqs")
                    more = reply["more"]
                    finished += admit(reply["seqs"])
            if not eng.active:
                if not more and not finished:
                    break
                continue
            t0 = time.perf_counter()
            finished += [self._trajectory(s) for s in eng.step()]
            busy += time.perf_counter() - t0
        # Iterations as segments of equal concurrency: (concurrency, mean context, iterations, seconds).
        segments: list[list[float]] = []
        for c, ctx, s in eng.iterations:
            if segments and segments[-1][0] == c:
                seg = segments[-1]
                seg[1] += ctx
                seg[2] += 1
                seg[3] += s
            else:
                segments.append([c, ctx, 1, s])
        for seg in segments:
            seg[1] /= seg[2]
        channel.send(self.conn, {"rollout_done": {"slot": self.slot, "engine_start_s": engine_start_s, "leave_s": leave_s, "event": event, "busy_s": busy,
                                         "load_s": load_s, "version": version,
                                         "rollout_s": time.perf_counter() - t_start, "segments": segments}})

    def _trajectory(self, s: Sequence) -> dict[str, Any]:
        r, exact = reward(s.prompt, s.tokens)
        return {"key": s.key, "pid": s.prompt.pid, "sample": s.sample, "version": s.version, "prompt": list(s.prompt.tokens),
                "tokens": s.tokens, "logprobs": s.logprobs, "reward": r, "exact": exact, "gen_s": s.finished - s.started,
                "target": s.prompt.target, "slot": self.slot}

    def sync(self, msg: dict[str, Any]) -> None:
        """The step's weight sync over the group built once: the trainers' leader broadcasts."""
        t0 = time.perf_counter()
        src = msg["source"]
        flat = _flat(self.params) if self.slot == src else torch.zeros(sum(p.numel() for p in self.params))
        self.weights_pg.broadcast(flat, src).wait()
        if self.slot != src:
            with torch.no_grad():
                for p, v in zip(self.params, _unflat(flat, self.params)):
                    p.copy_(v)
        self.version = msg["version"]
        digest = float(flat.double().sum()) if msg.get("digest") else None
        channel.send(self.conn, {"synced": self.slot, "sync_s": time.perf_counter() - t0, "digest": digest})


_LOOP_COMMANDS = ("stop", "reset", "boundary", "register", "end", "phase", "sync")


def main() -> int:
    slot = int(os.environ["DRA_RL_SLOT"])
    # The coordinator's Unix socket, in a directory only its user can enter, and its key.
    conn = Client(os.environ["DRA_RL_COORD"], "AF_UNIX", authkey=bytes.fromhex(os.environ["DRA_RL_AUTH"]))
    channel.send(conn, {"hello": slot, "pid": os.getpid()})
    init = channel.recv_command(conn, "init")
    worker = SlotWorker(slot, conn, init)
    channel.send(conn, {"ready": slot, "weights_group_s": worker.weights_group_s})
    while True:
        msg = channel.recv_command(conn, *_LOOP_COMMANDS)
        cmd = msg["cmd"]
        if cmd == "stop":
            break
        if cmd == "reset":
            channel.send(conn, worker.reset(msg))
        elif cmd == "boundary":
            channel.send(conn, worker.boundary())
        elif cmd == "register":
            channel.send(conn, worker.register())
        elif cmd == "end":
            channel.send(conn, worker.end())
        elif cmd == "phase":
            worker.phase(msg)
        elif cmd == "sync":
            worker.sync(msg)
        else:
            raise ValueError(f"worker: unknown command '{cmd}'")
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
