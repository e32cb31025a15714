"""One process of a job that accumulates gradients over several loader batches per optimizer step
(DDP's recipe: every backward but the window's last inside ``model.no_sync()``; ``accumulate`` 1:
none), fed by a DataLoader (workers optional) and dra.elastic.DistributedSampler, resized by a
schedule and optionally killed; ``batch_norm`` adds a BatchNorm layer (its buffers averaged unless
``broadcast_buffers`` is False). Logs, per committed step, the sample ids the rank trained on (read
from the batches themselves) and the positions of the epoch's order the step consumed."""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import dra
import dra.elastic

cfg = json.loads(os.environ["DRA_TEST_CFG"])
out = cfg["out"]
N = cfg.get("dataset_size", 150)
K = cfg.get("accumulate", 3)
gen = torch.Generator().manual_seed(7)
x = torch.randn(N, 8, generator=gen)
y = x @ torch.randn(8, 1, generator=gen)
dataset = TensorDataset(torch.arange(N), x, y)
torch.manual_seed(int(os.environ.get("RANK", "0")))
layers = [torch.nn.Linear(8, 16)] + ([torch.nn.BatchNorm1d(16)] if cfg.get("batch_norm") else []) + [
    torch.nn.ReLU(), torch.nn.Linear(16, 1)]
model = torch.nn.Sequential(*layers)
if cfg.get("unused_first"):
    class WithUnused(torch.nn.Module):  # its first parameter never gets a gradient
        def __init__(self, body: torch.nn.Module) -> None:
            super().__init__()
            self.aux = torch.nn.Parameter(torch.zeros(3))
            self.body = body

        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return self.body(v)

    model = WithUnused(model)
optimizer = torch.optim.SGD(model.parameters(), lr=cfg.get("lr", 0.05), momentum=cfg.get("momentum", 0.9))
sampler = dra.elastic.DistributedSampler(dataset, shuffle=True, seed=5)
workers = cfg.get("workers", 2)
loader = DataLoader(dataset, batch_size=cfg.get("batch_size", 4), sampler=sampler, num_workers=workers,
                    prefetch_factor=cfg.get("prefetch", 2) if workers else None)
model = dra.elastic.DistributedDataParallel(
    model, optimizer, sampler, policy="none", start_size=cfg.get("start_size"),
    resize_schedule=cfg.get("schedule", {}), fault_timeout_s=cfg.get("fault_timeout_s", 4.0), verify=True,
    broadcast_buffers=cfg.get("broadcast_buffers", True),
    events_path=os.path.join(out, "events.jsonl"))
ctl = model.controller
log = open(os.path.join(out, f"log-{ctl.uid}.jsonl"), "a")
loss_fn = torch.nn.MSELoss()
die_at = cfg.get("die_at", {}).get(str(ctl.uid))
per_micro_step = cfg.get("step_every_batch", False)
for epoch in range(cfg.get("epochs", 2)):
    sampler.set_epoch(epoch)
    window: list[int] = []
    fresh = 0
    optimizer.zero_grad()
    for i, (ids, xb, yb) in enumerate(loader):
        last = (i + 1) % K == 0 or i + 1 == len(loader)
        if not ctl.batch_dropped:
            window += [int(v) for v in ids]
            fresh += 1
        if cfg.get("flag_style"):  # nanoGPT's form: DDP's flag, set before the forward
            model.require_backward_grad_sync = last
        loss = loss_fn(model(xb), yb) / K
        if not cfg.get("no_sync", True):  # accumulation without no_sync(): every backward reduces
            loss.backward()
            if last:
                optimizer.step()
                optimizer.zero_grad()
            if last or per_micro_step:
                dra.step(loss)
            continue
        if last or cfg.get("flag_style"):
            loss.backward()
        else:
            with model.no_sync():
                loss.backward()
        if not last:
            if per_micro_step:
                st = dra.step(loss)
                assert not st.committed, "a micro-batch's dra.step committed"
            continue
        if die_at is not None and ctl.step_index == die_at:
            os._exit(9)  # killed between the window's reduction and its commit
        optimizer.step()
        optimizer.zero_grad()
        step, wepoch, depoch, c0 = ctl.step_index, ctl.epoch, sampler.epoch, sampler.cursor
        # The positions the window's fresh batches hold (a leaver's sampler is finished after its step).
        batch = [int(v) for v in sampler.order()[c0:min(c0 + fresh * sampler.global_batch, sampler.epoch_size)]]
        st = dra.step(loss)
        if st.committed:
            assert sampler.cursor == c0 + len(batch) or not ctl.is_member, (c0, len(batch), sampler.cursor)
            log.write(json.dumps({"kind": "commit", "uid": ctl.uid, "epoch": wepoch, "rank": ctl.rank, "step": step,
                                  "data_epoch": depoch, "share": window, "batch": batch}) + "\n")
            log.flush()
        window, fresh = [], 0
log.write(json.dumps({"kind": "final", "uid": ctl.uid, "role": ctl.role, "step": ctl.step_index,
                      "digest": ctl.state_digest(),
                      "params": [p.detach().flatten().tolist() for p in model.module.parameters()]}) + "\n")
log.close()
ctl.finish()
sys.exit(0)
