"""Where a training loop ends, in the forms third-party scripts use (found by reviews porting
scripts nobody here wrote): a `range` loop that leaves its loader early each epoch, a loop-local
step counter that ends a joiner's loop later than the members', and a batch sampler of the
script's own over dra's training sampler. Real processes under `dra run`, Gloo."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(200)

SCRIPT = r'''
import json, os, sys
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler, TensorDataset
import dra
from dra.elastic import DistributedDataParallel as DDP, DistributedSampler

cfg = json.loads(os.environ["CFG"])
log = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
def rec(**kw):
    log.write(json.dumps(kw) + "\n"); log.flush()

torch.manual_seed(0)
n = cfg["dataset"]
ds = TensorDataset(torch.randn(n, 4), torch.randn(n, 1), torch.arange(n))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
if cfg.get("own_batches"):
    class Buckets(Sampler):  # a bucketing batch sampler's shape: the ids of the pass, batched by itself
        def __init__(self, sampler, batch_size):
            self.sampler, self.batch_size = sampler, batch_size
        def __iter__(self):
            ids = list(self.sampler)
            return iter([ids[i:i + self.batch_size] for i in range(0, len(ids), self.batch_size)])
        def __len__(self):
            return -(-len(self.sampler) // self.batch_size)
    sampler = DistributedSampler(ds, seed=3, batch_size=8)
    loader = DataLoader(ds, batch_sampler=Buckets(sampler, 8))
elif cfg.get("shard"):
    from torch.utils.data import BatchSampler
    class BatchSamplerShard(BatchSampler):  # accelerate's: torch's BatchSampler over the sampler, sharded again
        def __init__(self, batch_sampler, shards, index):
            self.batch_sampler, self.shards, self.index = batch_sampler, shards, index
            self.batch_size, self.drop_last = batch_sampler.batch_size, batch_sampler.drop_last
        def __iter__(self):
            return (b for k, b in enumerate(self.batch_sampler) if k % self.shards == self.index)
        def __len__(self):
            return len(self.batch_sampler) // self.shards
    sampler = DistributedSampler(ds, seed=3)
    loader = DataLoader(ds, batch_sampler=BatchSamplerShard(BatchSampler(sampler, 8, False), 2, 0))
else:
    sampler = DistributedSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
ddp = DDP(model, opt, sampler)
ctl = ddp.controller
budget, counted = cfg.get("budget"), 0
for epoch in range(cfg["epochs"]):
    sampler.set_epoch(epoch)
    for i, (x, y, ids) in enumerate(loader):
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        at = ctl.sampler.epoch
        status = dra.step(loss)
        if status.committed:
            counted += 1
            rec(uid=ctl.uid, step=status.step, data_epoch=at, ids=ids.tolist(), world=ctl.world_size)
        if cfg.get("per_epoch") and i + 1 == cfg["per_epoch"]:
            break  # a per-epoch step budget
        if budget and counted >= budget:
            break  # the accelerate idiom: a counter of the loop's own
    if budget and counted >= budget:
        break
rec(uid=ctl.uid, final=True, step_index=ctl.step_index, leader=ctl.is_leader,
    weight=model.weight.flatten().tolist())
'''


def test_a_range_loop_that_leaves_its_loader_early_trains_each_epochs_own_order(tmp_path: Path) -> None:
    """A per-epoch budget (2 of 5 steps) in the guide's `range` loop: the next `set_epoch` used to
    go on with the rest of the same data epoch, and the epochs after it were skipped once it ended
    (data epochs 1 and 2 never trained). Now each epoch starts its own order there, as torch's
    sampler does: step k of loop epoch e is torch's step k of epoch e."""
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 2, {"policy": "none"},
                                            {"dataset": 80, "epochs": 4, "per_epoch": 2}, timeout=150)
    assert code == 0, logs[-3000:]
    steps: dict[int, list[int]] = collections.defaultdict(list)
    epochs: dict[int, set[int]] = collections.defaultdict(set)
    for r in records:
        if "ids" in r:
            steps[r["step"]] += r["ids"]
            epochs[r["step"]].add(r["data_epoch"])
    assert sorted(steps) == list(range(8)), sorted(steps)
    for step, ids in steps.items():
        epoch, k = divmod(step, 2)
        assert epochs[step] == {epoch}, (step, epochs[step])
        order = torch.randperm(80, generator=torch.Generator().manual_seed(3 + epoch)).tolist()
        assert sorted(ids) == sorted(order[16 * k:16 * (k + 1)]), (step, epoch)
    # Said at each next set_epoch; the last epoch's break ends the job inside its data epoch, which
    # is said at the exit (it was not: a framework stopping an epoch one step short went unsaid).
    assert logs.count("its last 48 sample(s) are not trained (the loop left the loader early)") == 3, logs[-3000:]
    assert logs.count("the job ended inside data epoch 3 after step 8: its last 48 sample(s) were not trained") == 1


def test_a_member_that_trains_past_the_others_end_of_loop_fails_naming_why(tmp_path: Path) -> None:
    """A joiner's loop-local counter starts at 0 at its admission, so it went on training after the
    members broke at the budget: the leader's end barrier timed out ("could not be announced"),
    the joiner recovered into a world of its own, trained on alone and, its leader now, saved over
    the world's result; exit 0. The members' end is now said before their barrier, and the one
    that went on fails at its recovery, naming the step the loop ended at and the fix."""
    code, logs, records = run_logged_script(
        tmp_path, SCRIPT, 2, {"policy": "none", "start_size": 1, "resize_schedule": {"3": 2}, "fault_timeout_s": 3.0},
        {"dataset": 400, "epochs": 50, "budget": 10}, timeout=150)
    assert "went on training past the end of the loop: process 0 ended its training loop, or its process exited, after step 10" in logs, \
        logs[-4000:]
    assert "not on a counter of the loop's own" in logs
    finals = {r["uid"]: r for r in records if r.get("final")}
    assert 1 not in finals, "the joiner finished as if the job went on"  # it failed inside dra.step
    assert finals[0]["step_index"] == 10 and finals[0]["leader"]
    joiner_steps = [r["step"] for r in records if r.get("uid") == 1 and "ids" in r]
    assert joiner_steps and max(joiner_steps) == 9 and all(r["world"] == 2 for r in records if r.get("uid") == 1
                                                            and "ids" in r), joiner_steps  # never trained alone
    assert code != 0, logs[-3000:]


@pytest.mark.parametrize(("kind", "name"), [("own_batches", "Buckets"), ("shard", "BatchSamplerShard")])
def test_a_batch_sampler_of_the_scripts_own_over_the_training_sampler_is_refused(tmp_path: Path, kind: str,
                                                                                 name: str) -> None:
    """A bucketing batch sampler takes the sampler's ids for the world at its pass's start and
    batches them itself: after a grow its ranks trained samples twice and others never, silently.
    accelerate's BatchSamplerShard (transformers.Trainer's default loader) shards torch's batches
    over it again: 66 of 96 samples were never trained in a fixed world of 2 (an outside review).
    Refused at the pass's first batch, naming what to give the DataLoader instead."""
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 1, {"policy": "none"},
                                            {"dataset": 96, "epochs": 1, kind: True}, timeout=120)
    assert code != 0 and not [r for r in records if "ids" in r], logs[-3000:]
    assert f"the DataLoader's batch sampler (__main__.{name}) makes its batches from dra's training sampler" in logs
    assert "sampler.batches(B) as batch_sampler=" in logs and "accelerator.prepare" in logs, logs[-3000:]
