"""The process on one device slot of the live RL loop (``python -m dra.rl.live.worker``).

It holds the rollout role or the trainer role and switches in place, at a step boundary, when
the coordinator says so:

- weights reach every slot over one Gloo group of all slots (``weights``), built once at start
  and reused for every step's weight sync;
- the trainers form a data-parallel world, one Gloo group per membership epoch
  (``trainers/<epoch>``); a trainer that leaves (trainer -> rollout) drops out of the next epoch's
  group (an in-place shrink: the others rebuild without it and go on) and starts a rollout engine;
  a rollout worker that joins (rollout -> trainer) already holds the current weights (from the
  weight sync) and receives the optimizer state from the trainers' leader *while* it computes
  its first step's forward and backward (deferred optimizer restore): only the part of the
  transfer that outlasts that compute is exposed;
- every generation carries the policy version it was sampled with.

Control messages come from the coordinator over a ``multiprocessing.connection`` (pickled dicts).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Client
from typing import Any

import torch
import torch.distributed as dist

from dra.rl.live.model import ModelConfig, PolicyModel, RolloutEngine, Sequence, answer_logprobs
from dra.rl.live.task import Prompt, reward


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)


def _unflat(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, at = [], 0
    for t in like:
        out.append(flat[at : at + t.numel()].view_as(t))
        at += t.numel()
    return out


class SlotWorker:
    def __init__(self, slot: int, conn: Any, init: dict[str, Any]) -> None:
        self.slot, self.conn, self.init = slot, conn, init
        self.timeout = timedelta(seconds=float(init.get("timeout_s", 120.0)))
        torch.set_num_threads(1)
        self.model = PolicyModel(ModelConfig(**init["model"]))
        self.params = list(self.model.parameters())
        self.store = dist.TCPStore(init["store_host"], init["store_port"], is_master=False, timeout=self.timeout)
        self.job = init["job"]
        t0 = time.perf_counter()
        self.weights_pg = dist.ProcessGroupGloo(dist.PrefixStore(f"{self.job}/weights", self.store), slot, init["slots"], self.timeout)
        self.weights_group_s = time.perf_counter() - t0
        self.role = "none"
        self.epoch = -1
        self.pg: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.engine: RolloutEngine | None = None
        self.version = 0

    # ---- run lifecycle ------------------------------------------------------------------------
    def reset(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A new run: the pretrained weights, no optimizer state, no role yet."""
        self.model.load_state_dict(torch.load(msg["weights"], weights_only=True))
        self.role, self.pg, self.optimizer, self.engine, self.version = "none", None, None, None, 0
        self.run = msg["run"]
        return {"reset": self.slot}

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.params, lr=self.init["lr"], betas=(0.9, 0.99))

    # ---- optimizer state as one flat tensor (the deferred restore's payload) -----------------
    def _optimizer_flat(self) -> torch.Tensor:
        assert self.optimizer is not None
        st = [self.optimizer.state.get(p, {}) for p in self.params]
        if not st or "exp_avg" not in st[0]:
            return torch.zeros(2 * sum(p.numel() for p in self.params) + 1)
        step = float(st[0]["step"])
        return torch.cat([_flat([s["exp_avg"] for s in st]), _flat([s["exp_avg_sq"] for s in st]), torch.tensor([step])])

    def _install_optimizer(self, flat: torch.Tensor) -> None:
        assert self.optimizer is not None
        n = sum(p.numel() for p in self.params)
        step = float(flat[-1])
        if step == 0.0:
            return  # the world has not stepped yet: nothing to restore
        for p, m, v in zip(self.params, _unflat(flat[:n], self.params), _unflat(flat[n : 2 * n], self.params)):
            self.optimizer.state[p] = {"step": torch.tensor(step), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}

    # ---- one phase ---------------------------------------------------------------------------
    def phase(self, msg: dict[str, Any]) -> None:
        if msg["role"] == "train":
            self._train(msg)
        else:
            self._rollout(msg)

    def _train(self, msg: dict[str, Any]) -> None:
        t_start = time.perf_counter()
        trainers: list[int] = msg["trainers"]
        joining = self.role != "train"
        rebuild_s = 0.0
        if joining:
            self.engine = None  # the rollout engine's KV cache goes
            self.optimizer = self._new_optimizer()
        if msg["epoch"] != self.epoch or self.pg is None:
            t0 = time.perf_counter()
            self.pg = dist.ProcessGroupGloo(
                dist.PrefixStore(f"{self.job}/{self.run}/trainers/{msg['epoch']}", self.store), trainers.index(self.slot), len(trainers), self.timeout
            )
            rebuild_s = time.perf_counter() - t0
            self.epoch = msg["epoch"]
        self.role = "train"
        rank = trainers.index(self.slot)
        # Deferred optimizer restore: the leader sends its optimizer state to each joiner, which
        # receives it while computing; only the wait after backward is exposed.
        joiners = [trainers.index(j) for j in msg.get("joiners", [])]
        pending: list[Any] = []
        recv_buf = None
        t_post = time.perf_counter()
        if joiners and rank == 0:
            payload = self._optimizer_flat()
            pending = [self.pg.send([payload], j, 7) for j in joiners]
        elif rank in joiners:
            recv_buf = torch.zeros(2 * sum(p.numel() for p in self.params) + 1)
            pending = [self.pg.recv([recv_buf], 0, 7)]
        stats: dict[str, Any] = {"slot": self.slot, "rebuild_s": rebuild_s, "joined": joining}
        shard = msg.get("shard")
        if shard is None:  # a switch phase without a batch to train on (the pipeline's fill phase)
            for w in pending:
                w.wait()
            if recv_buf is not None:
                self._install_optimizer(recv_buf)
            stats.update(train_s=time.perf_counter() - t_start, compute_s=0.0, sync_s=0.0, tokens=0)
            self.conn.send({"train_done": stats})
            return
        t0 = time.perf_counter()
        self.model.train()
        loss_sum = torch.zeros(())
        tokens = 0
        if shard["trajectories"]:
            trajs = shard["trajectories"]
            logp, mask = answer_logprobs(self.model, [tuple(t["prompt"]) for t in trajs], [t["tokens"] for t in trajs])
            width = logp.shape[1]
            behaviour = torch.zeros_like(logp)
            adv = torch.tensor([t["advantage"] for t in trajs], dtype=torch.float32).unsqueeze(1)
            for i, t in enumerate(trajs):
                behaviour[i, : len(t["logprobs"])] = torch.tensor(t["logprobs"][:width])
            ratio = torch.exp(logp - behaviour)
            clip = self.init["clip"]
            per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
            loss_sum = (per_token * mask).sum()
            tokens = int(mask.sum())
            (loss_sum / shard["global_tokens"]).backward()
        compute_s = time.perf_counter() - t0
        t_wait = time.perf_counter()
        for w in pending if rank in joiners else []:
            w.wait()
        optimizer_wait_s = time.perf_counter() - t_wait
        optimizer_transfer_s = time.perf_counter() - t_post if rank in joiners else 0.0
        if recv_buf is not None:
            self._install_optimizer(recv_buf)
        t_sync = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = _flat(grads)
        flat = torch.cat([flat, loss_sum.detach().reshape(1)])
        self.pg.allreduce([flat]).wait()
        for p, g in zip(self.params, _unflat(flat[:-1], self.params)):
            p.grad = g.clone()
        sync_s = time.perf_counter() - t_sync
        t_opt = time.perf_counter()
        assert self.optimizer is not None
        torch.nn.utils.clip_grad_norm_(self.params, self.init["max_grad_norm"])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - t_opt
        for w in pending if rank == 0 else []:
            w.wait()
        if msg.get("digest"):  # tests: every trainer must hold the same parameters and optimizer state
            stats["param_digest"] = float(_flat(self.params).double().sum())
            stats["optimizer_digest"] = float(self._optimizer_flat().double().sum())
        stats.update(
            train_s=time.perf_counter() - t_start, compute_s=compute_s, sync_s=sync_s, optimizer_step_s=step_s,
            optimizer_wait_s=optimizer_wait_s, optimizer_transfer_s=optimizer_transfer_s, tokens=tokens,
            loss=float(flat[-1]) / max(1, shard["global_tokens"]),
        )
        self.conn.send({"train_done": stats})

    def _rollout(self, msg: dict[str, Any]) -> None:
        t_start = time.perf_counter()
        engine_start_s = 0.0
        if self.role != "rollout" or self.engine is None:
            t0 = time.perf_counter()
            self.pg, self.optimizer, self.epoch = None, None, -1  # out of the trainers' world
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
            done = [self._trajectory(s) for s in eng.admit([Sequence(Prompt(**x["prompt"]), x["sample"], version) for x in items])]
            busy += time.perf_counter() - t0
            return done

        finished = admit(msg["seqs"])  # the router's first share
        more = msg["more"]
        while True:
            want = eng.free_slots() if more else 0
            if want > 0 or finished:
                self.conn.send({"gen": self.slot, "finished": finished, "want": want})
                finished = []
                if want > 0:
                    reply = self.conn.recv()
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
        self.conn.send({"rollout_done": {"slot": self.slot, "engine_start_s": engine_start_s, "busy_s": busy,
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
        self.conn.send({"synced": self.slot, "sync_s": time.perf_counter() - t0, "digest": digest})


def main() -> int:
    host, port = os.environ["DRA_RL_COORD"].rsplit(":", 1)
    slot = int(os.environ["DRA_RL_SLOT"])
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ["DRA_RL_AUTH"]))
    conn.send({"hello": slot, "pid": os.getpid()})
    init = conn.recv()
    worker = SlotWorker(slot, conn, init)
    conn.send({"ready": slot, "weights_group_s": worker.weights_group_s})
    while True:
        msg = conn.recv()
        cmd = msg["cmd"]
        if cmd == "stop":
            break
        if cmd == "reset":
            conn.send(worker.reset(msg))
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
