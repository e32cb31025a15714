"""The guide's checkpoint idiom (docs/guide/elastic.md, "Checkpoint and restart"): train with
ctl.epochs(), then save on the leader after the loop (``ctl.rank`` keeps its last value). Run by
tests/python/test_dropin.py under `dra run`; DRA_TEST_CFG (JSON) sets the data, options, the
DataLoader's workers and a per-step pause; every process logs its committed steps and its end."""

import json
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import dra
import dra.elastic as de

cfg = json.loads(os.environ["DRA_TEST_CFG"])
out = cfg["out"]
n = cfg.get("dataset", 192)
gen = torch.Generator().manual_seed(3)
x = torch.randn(n, 8, generator=gen)
data = TensorDataset(torch.arange(n), x, x @ torch.randn(8, 1, generator=gen))
sampler = de.DistributedSampler(data, seed=1)
loader = DataLoader(data, batch_size=cfg.get("batch_size", 4), sampler=sampler, num_workers=cfg.get("workers", 0))
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ctl = de.init(model, optimizer, sampler, **cfg.get("options", {}))
log = open(os.path.join(out, f"log-{ctl.uid}.jsonl"), "a")
log.write(json.dumps({"kind": "start", "uid": ctl.uid, "pid": os.getpid(), "member": ctl.is_member}) + "\n")
log.flush()
for _epoch in ctl.epochs(cfg.get("epochs", 3)):
    for ids, xb, yb in loader:
        loss = torch.nn.functional.mse_loss(ctl.model(xb), yb)
        ctl.optimizer.zero_grad()
        loss.backward()
        ctl.optimizer.step()
        step = ctl.step_index
        status = dra.step(loss)
        if status.committed:
            log.write(json.dumps({"kind": "commit", "uid": ctl.uid, "step": step, "ids": ids.tolist(),
                                  "time": time.time()}) + "\n")
            log.flush()
        time.sleep(cfg.get("step_sleep", 0.0))
# After the loop: the leader of the last world writes the final checkpoint.
if ctl.rank == 0:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "dra": ctl.state_dict()},
               os.path.join(out, "ckpt.pt"))
log.write(json.dumps({"kind": "final", "uid": ctl.uid, "rank": ctl.rank, "leader": ctl.is_leader, "role": ctl.role,
                      "stopped": ctl.stopped, "step": ctl.step_index, "saved": ctl.rank == 0}) + "\n")
log.close()
