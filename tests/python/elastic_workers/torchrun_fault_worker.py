"""One torchrun worker of tests/python/test_elastic_torchrun_fault.py (public dra API only).

Launched by torchrun (RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT and TORCHELASTIC_RUN_ID come from
the agent). Trains a tiny MLP on a seeded synthetic regression set under ``dra.elastic.init`` and
logs to ``<out>/log-<uid>.jsonl``: a ``hello`` record (pid, torchrun's environment), every
committed step (this rank's sample ids and the step's global batch, the format
``_elastic_harness.check_exactly_once`` reads), and a ``final`` record with a digest of the
parameters and optimizer state.

The victim (``cfg["victim"]``) does not kill itself: at ``cfg["kill_step"]``, before its forward,
it writes ``<out>/at-<uid>-<step>`` and waits there; the test sees the file and sends SIGKILL.
Its peers meanwhile sit in that step's gradient all-reduce, so the death lands mid-step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch

import dra
import dra.elastic as de

cfg = json.loads(os.environ["DRA_TEST_CFG"])
out = cfg["out"]
gen = torch.Generator().manual_seed(7)
N, D = cfg.get("dataset_size", 192), 8
X = torch.randn(N, D, generator=gen)
Y = X @ torch.randn(D, 1, generator=gen) + 0.1 * torch.randn(N, 1, generator=gen)

# Different initial weights per process: the start-up handoff must make them identical anyway.
torch.manual_seed(int(os.environ["RANK"]))
net = torch.nn.Sequential(torch.nn.Linear(D, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
sampler = de.ElasticSampler(N, cfg.get("global_batch", 16), seed=3)

ctl = de.init(
    net, opt, sampler, scheduler=sched, min_size=1,
    decide_every=1000,  # no policy resize: the only world change is the fault
    fault_timeout_s=cfg.get("fault_timeout_s", 2.0), verify=True,
    events_path=os.path.join(out, "events.jsonl"),
)
log = open(os.path.join(out, f"log-{ctl.uid}.jsonl"), "a")


def write(rec: dict) -> None:
    log.write(json.dumps(rec) + "\n")
    log.flush()


def digest() -> str:
    """sha256 of every parameter and optimizer-state tensor, in a fixed order."""
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
        for value in opt.state.get(p, {}).values():
            if torch.is_tensor(value):
                h.update(value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


env_keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")
write({"kind": "hello", "uid": ctl.uid, "pid": os.getpid(), "env": {k: os.environ.get(k) for k in env_keys}})

loss_fn = torch.nn.MSELoss()
for _epoch in ctl.epochs(cfg.get("epochs", 2)):
    for idx in sampler:
        step, wepoch, rank, depoch = ctl.step_index, ctl.epoch, ctl.rank, sampler.epoch
        share, batch = [int(i) for i in idx], [int(i) for i in sampler.step_indices()]
        if ctl.uid == cfg["victim"] and step == cfg["kill_step"]:
            marker = os.path.join(out, f"at-{ctl.uid}-{step}")
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(marker + ".tmp", marker)  # the test never reads a half-written file
            time.sleep(120)  # waiting for the test's SIGKILL (bounded: the test's own timeout is shorter)
            sys.exit(3)
        idx_t = torch.as_tensor(idx)
        loss = loss_fn(ctl.model(X[idx_t]), Y[idx_t])
        ctl.optimizer.zero_grad()
        loss.backward()
        ctl.optimizer.step()
        ctl.scheduler.step()
        st = dra.step(loss)
        if st.committed:
            write({"kind": "commit", "uid": ctl.uid, "epoch": wepoch, "rank": rank, "step": step,
                   "data_epoch": depoch, "share": share, "batch": batch})
write({"kind": "final", "uid": ctl.uid, "role": ctl.role, "step": ctl.step_index, "world": ctl.members,
       "digest": digest()})
log.close()
sys.exit(0)
