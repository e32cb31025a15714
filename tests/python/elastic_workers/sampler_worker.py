"""dra.elastic.DistributedSampler used exactly as torch's is, next to torch's own for the same
rank: a training loader (batch_size + sampler=, workers, a batch peeked before the loop, set_epoch
in a `range` loop, loader.sampler) and an eval loader built the same way (never given to the
controller). Every process logs its committed steps' ids, torch's batches for its launch rank, and
what the eval loader yielded next to torch's. Run by tests/python/test_dropin.py under `dra run`."""

import json
import os

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import dra
import dra.elastic as de

cfg = json.loads(os.environ["DRA_TEST_CFG"])
out, n, batch, seed, epochs = cfg["out"], cfg["dataset"], cfg["batch_size"], cfg.get("seed", 5), cfg["epochs"]
data = TensorDataset(torch.arange(n), torch.randn(n, 4, generator=torch.Generator().manual_seed(1)))
test = TensorDataset(torch.arange(n // 3), torch.randn(n // 3, 4))


def loader(dataset, sampler):
    return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=cfg.get("workers", 1))


train_loader = loader(data, de.DistributedSampler(data, seed=seed))
eval_loader = loader(test, de.DistributedSampler(test, shuffle=False))
peeked = len(next(iter(train_loader))[0])  # before the controller exists: torch's split
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
# A per-epoch scheduler stepped after each pass, as torchvision's reference scripts do (cfg "scheduler").
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5) if cfg.get("scheduler") else None
model = de.DistributedDataParallel(model, optimizer, train_loader.sampler, scheduler=scheduler, **cfg.get("options", {}))
ctl = model.controller
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
rec = {"uid": ctl.uid, "peeked": peeked, "is_sampler": train_loader.sampler is ctl.sampler, "epochs": []}
for epoch in range(epochs):
    peek = len(next(iter(train_loader))[0])  # the tutorial's batch-size peek, before set_epoch
    train_loader.sampler.set_epoch(epoch)
    reference = TorchSampler(data, num_replicas=world, rank=rank, seed=seed)
    reference.set_epoch(epoch)
    ref_ids = list(reference)
    steps, padding = [], 0
    for ids, xb in train_loader:
        dropped = ctl.batch_dropped
        # Where the step stands, read before dra.step (a released process returns from it later, elsewhere).
        at = {"ids": ids.tolist(), "rank": ctl.rank, "world": ctl.world_size, "data_epoch": ctl.sampler.epoch}
        loss = model(xb).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        status = dra.step(loss)
        if status.committed:
            steps.append({"step": status.step, **at})
        padding += int(dropped)
    if scheduler is not None:
        ctl.scheduler.step()
    eval_ids = [i for ids, _ in eval_loader for i in ids.tolist()]
    ref_eval = TorchSampler(test, num_replicas=ctl.world_size if ctl.rank >= 0 else world,
                            rank=max(ctl.rank, 0) if ctl.rank >= 0 else rank, shuffle=False)
    rec["epochs"].append({"epoch": epoch, "peek": peek, "steps": steps, "padding": padding,
                          "torch": [ref_ids[i:i + batch] for i in range(0, len(ref_ids), batch)],
                          "eval": eval_ids, "torch_eval": list(ref_eval), "len_eval": len(eval_loader.sampler)})
rec["final"] = {"rank": ctl.rank, "role": ctl.role, "step": ctl.step_index, "lr": optimizer.param_groups[0]["lr"],
                "params": [p.detach().flatten().tolist() for p in model.parameters()]}
with open(os.path.join(out, f"sampler-{ctl.uid}.json"), "w") as f:
    json.dump(rec, f)
