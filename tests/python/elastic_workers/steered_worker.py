"""One process of a job steered from outside at exact steps (tests/python/test_elastic_steered.py).

Three processes, uids 0..2; uids 0 and 1 form the first world. The options are the RL
coordinator's: ``policy="none"`` (only ``capacity`` decides), ``release="return"`` (a released
process gets its ``dra.step`` back and may rejoin), ``capacity_poll_s=0`` (a change asked for is
applied at the boundary where the leader reads it) and ``handoff="deferred"``. The leader plays
the outside actor: it writes ``capacity`` just before its own step boundary.

- uid 2 starts outside the world. It takes the world's current weights out of band (as an RL
  slot does from the weight sync), registers, and is admitted at boundary 3: its parameters are
  checked by digest, not sent, and the Adam moments arrive during its first step.
- uid 1 leaves at boundary 5 (named in ``leave``), does other work, and rejoins at boundary 7
  with stale weights: those are sent.
- Everyone logs each committed step (world size, its share of the sample ids) and the final
  digests of the parameters and of the optimizer's state.
"""

from __future__ import annotations

import json
import os
import struct
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import dra
import dra.elastic as de  # noqa: F401 (the sampler)

cfg = json.loads(os.environ["DRA_TEST_CFG"])
out = cfg["out"]
uid = int(os.environ["RANK"])
STEPS, N, B = 10, 96, 8
torch.manual_seed(0)
gen = torch.Generator().manual_seed(7)
X = torch.randn(N, 8, generator=gen)
Y = X @ torch.randn(8, 1, generator=gen)
torch.manual_seed(100 + uid)  # different weights per process: the start-up handoff makes them equal
net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
opt = torch.optim.Adam(net.parameters(), lr=0.05)
sampler = de.ElasticSampler(N, B, shuffle=False)
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60))
CAPACITY = "dra/t/0/capacity"
log = open(os.path.join(out, f"log-{uid}.jsonl"), "a")


def write(**rec) -> None:
    log.write(json.dumps(rec) + "\n")
    log.flush()


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def weights() -> bytes:
    return flat(net.parameters()).numpy().tobytes()


def optimizer_digest() -> float:
    st = [opt.state[p] for p in net.parameters()]
    return float(flat([s["exp_avg"] for s in st]).sum() + flat([s["exp_avg_sq"] for s in st]).sum()) + float(st[0]["step"])


ctl = dra.Controller(model=net, optimizer=opt, sampler=sampler, policy="none", release="return", start_size=2,
                     capacity_poll_s=0.0, handoff=cfg.get("handoff", "deferred"), fault_timeout_s=20.0,
                     events_path=os.path.join(out, "events.jsonl"))
write(kind="start", role=ctl.role, released=ctl.status.released)


def enter(weights_key: str | None) -> None:
    """Out of the world: optionally take the world's weights out of band, register, get in."""
    if weights_key:
        raw = store.get(weights_key)
        values = struct.unpack(f"{len(raw) // 8}d", raw)
        with torch.no_grad():
            at = 0
            for p in net.parameters():
                p.copy_(torch.tensor(values[at : at + p.numel()], dtype=p.dtype).view_as(p))
                at += p.numel()
    assert ctl.try_join() is False  # the first call registers; admission comes at the members' boundary
    store.set(f"t/registered/{uid}", "1")
    deadline = time.monotonic() + 60
    while not ctl.try_join():
        assert time.monotonic() < deadline, f"uid {uid} not admitted ({ctl.role})"
        time.sleep(0.005)
    write(kind="admitted", step=ctl.step_index, handoff=ctl.handoff)


if uid == 2:
    store.wait(["t/weights"])
    enter("t/weights")
while ctl.step_index < STEPS:
    step = ctl.step_index + 1
    idx = sampler.indices()
    x, y = X[list(idx)], Y[list(idx)]
    loss = torch.nn.functional.mse_loss(ctl.model(x), y)
    ctl.optimizer.zero_grad()
    loss.backward()
    ctl.optimizer.step()
    if ctl.rank == 0 and step == 3:
        store.set("t/weights", weights())  # the weights uid 2 will hold when it registers
        store.wait(["t/registered/2"])
        store.set(CAPACITY, json.dumps({"min_size": 3, "max_size": 3, "leave": []}))
    if ctl.rank == 0 and step == 5:
        store.set(CAPACITY, json.dumps({"min_size": 2, "max_size": 2, "leave": [1]}))
    if ctl.rank == 0 and step == 6:
        # uid 1 is out: "leave" no longer needs to name it (a candidate named there is dismissed).
        store.set(CAPACITY, json.dumps({"min_size": 2, "max_size": 2, "leave": []}))
        store.set("t/may_register/1", "1")
    if ctl.rank == 0 and step == 7:
        store.wait(["t/registered/1"])
        store.set(CAPACITY, json.dumps({"min_size": 3, "max_size": 3, "leave": []}))
    write(kind="commit", step=step, world=ctl.world_size, share=[int(i) for i in idx])
    status = ctl.step(loss)
    if status.event:
        write(kind="event", step=step, event=status.event, handoff=ctl.handoff)
    if status.released:
        write(kind="released", step=step)
        time.sleep(0.2)  # other work, outside the world
        store.wait([f"t/may_register/{uid}"])
        enter(None)
write(kind="end", step=ctl.step_index, params=weights().hex(), optimizer=optimizer_digest(), handoff=ctl.handoff)
ctl.finish()
