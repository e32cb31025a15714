"""One process of a job that feeds dra through a DataLoader with worker processes (prefetching
ahead) and dra.elastic.DistributedSampler, resized by a schedule. Logs, per committed step, the
sample ids the rank trained on, read from the batch itself (the dataset returns its indices)."""

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
gen = torch.Generator().manual_seed(7)
x = torch.randn(N, 8, generator=gen)
y = x @ torch.randn(8, 1, generator=gen)
dataset = TensorDataset(torch.arange(N), x, y)
torch.manual_seed(int(os.environ.get("RANK", "0")))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sampler = dra.elastic.DistributedSampler(dataset, shuffle=True, seed=5)
loader = DataLoader(dataset, batch_sampler=sampler.batches(cfg.get("batch_size", 4)), num_workers=cfg.get("workers", 2),
                    prefetch_factor=cfg.get("prefetch", 2) if cfg.get("workers", 2) else None)
model = dra.elastic.DistributedDataParallel(
    model, optimizer, sampler, policy="none", start_size=cfg.get("start_size"),
    resize_schedule=cfg.get("schedule", {}), fault_timeout_s=cfg.get("fault_timeout_s", 4.0), verify=True,
    events_path=os.path.join(out, "events.jsonl"))
ctl = model.controller
log = open(os.path.join(out, f"log-{ctl.uid}.jsonl"), "a")
loss_fn = torch.nn.MSELoss()
for epoch in range(cfg.get("epochs", 2)):
    sampler.set_epoch(epoch)
    for ids, xb, yb in loader:
        step, wepoch, depoch = ctl.step_index, ctl.epoch, sampler.epoch
        batch = [int(i) for i in sampler.step_indices()]
        loss = loss_fn(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        st = dra.step(loss)
        if st.committed:
            log.write(json.dumps({"kind": "commit", "uid": ctl.uid, "epoch": wepoch, "rank": ctl.rank, "step": step,
                                  "data_epoch": depoch, "share": ids.tolist(), "batch": batch}) + "\n")
            log.flush()
log.write(json.dumps({"kind": "final", "uid": ctl.uid, "role": ctl.role, "step": ctl.step_index,
                      "digest": ctl.state_digest()}) + "\n")
log.close()
ctl.finish()
sys.exit(0)
