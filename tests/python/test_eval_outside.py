"""A ported DDP script's validation under `dra run`: a `range` epoch loop with `set_epoch`, a
validation pass after each epoch, `dist.all_reduce` of the correct and total counts. Real
processes, real Gloo (an outside review).

- A validation sampler made with the world spelled out (`num_replicas=dist.get_world_size(),
  rank=dist.get_rank()`, the common form) kept that split: after a shrink from 3 to 2 the all-reduced
  total was 16 of 23 samples, every epoch, silently. dra's sampler now follows the world when given
  the world as it was; torch's own sampler is said once.
- A standby admitted again walks, in its `range` loop, an epoch the world has trained (its pass
  trains nothing). Its validation `all_reduce` after that pass met no member (they were training
  on): the world's next step waited for it until the fault timeout, and it was left out of the
  world for the rest of the job. Such a collective now completes with the process's own value.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = r"""
import json, os
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import dra
from dra.elastic import DistributedDataParallel as DDP, DistributedSampler

cfg = json.loads(os.environ["CFG"])
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
g = torch.Generator().manual_seed(0)
x = torch.randn(83, 8, generator=g)
train = TensorDataset(x[:60], (x[:60, 0] > 0).long())
val = TensorDataset(torch.arange(23), x[60:], (x[60:, 0] > 0).long())
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
split = dict(num_replicas=dist.get_world_size(), rank=dist.get_rank())  # the world, spelled out
if cfg.get("torch_val"):
    val_sampler = torch.utils.data.DistributedSampler(val, shuffle=False)
else:
    val_sampler = DistributedSampler(val, shuffle=False, **split)
train_loader = DataLoader(train, batch_size=4, sampler=DistributedSampler(train, seed=0))
val_loader = DataLoader(val, batch_size=4, sampler=val_sampler)
model = DDP(net, opt, train_loader.sampler)
ctl = model.controller
for epoch in range(3):
    train_loader.sampler.set_epoch(epoch)
    for xb, yb in train_loader:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        dra.step(0.0)
    total, ids = torch.zeros(1), []
    val_sampler.set_epoch(epoch)
    with torch.no_grad():
        for idx, xb, yb in val_loader:
            total += len(yb)
            ids += idx.tolist()
    dist.all_reduce(total)  # unguarded, as the torchrun script had it
    LOG.write(json.dumps(dict(uid=ctl.uid, epoch=epoch, world=ctl.world_size, total=total.item(), ids=ids,
                              behind=ctl.update_skipped)) + "\n")
    LOG.flush()
"""


def _run(tmp_path: Path, schedule: dict, **cfg) -> tuple[list[dict], str]:
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 3, {"policy": "none", "fault_timeout_s": 3.0,
                                                                 "resize_schedule": schedule}, cfg, timeout=120)
    assert code == 0, logs[-4000:]
    return records, logs


def test_a_validation_sampler_given_the_world_follows_it_after_a_shrink(tmp_path: Path) -> None:
    records, _ = _run(tmp_path, {"3": 2})
    assert {r["world"] for r in records} == {2}
    for epoch in range(3):
        rs = [r for r in records if r["epoch"] == epoch]
        # The two ranks' shares cover the set (torch's split pads it to 24 with one repeat).
        assert len(rs) == 2 and all(r["total"] == 24 for r in rs), rs
        assert sorted(set(rs[0]["ids"]) | set(rs[1]["ids"])) == list(range(23)), rs


def test_torchs_own_validation_sampler_is_said_once_after_a_shrink(tmp_path: Path) -> None:
    records, logs = _run(tmp_path, {"3": 2}, torch_val=True)
    assert "torch's DistributedSampler over TensorDataset splits it over num_replicas=3" in logs, logs[-3000:]
    assert "dra.elastic.DistributedSampler" in logs
    assert logs.count("splits it over num_replicas=3 processes (this one rank 0)") == 1  # once per sampler
    assert all(r["total"] == 16 for r in records), records  # its split, as torch's: 2 of the 3 shards of 8


def test_a_standby_admitted_again_whose_loop_is_behind_is_not_taken_out_by_its_validation(tmp_path: Path) -> None:
    # 3 -> 2 at step 3, back to 3 at step 9 (5 steps a data epoch). uid 2 finishes data epoch 1
    # under its loop's epoch 0, then walks loop epoch 1 with nothing to train; its all_reduce there
    # held up the world's next step for the fault timeout and it was left out for good.
    records, logs = _run(tmp_path, {"3": 2, "9": 3})
    assert '"event":"fault"' not in logs.replace(" ", "") and "arrived late" not in logs, logs[-4000:]
    assert "behind the world" in logs, logs[-3000:]
    last = [r for r in records if r["epoch"] == 2]
    assert sorted(r["uid"] for r in last) == [0, 1, 2] and all(r["world"] == 3 for r in last), last
    behind = [r for r in records if r["behind"]]
    assert [r["uid"] for r in behind] == [2], behind
    # Its collective completed with its own value, as if every member had contributed it.
    own = len(behind[0]["ids"])
    assert behind[0]["total"] == own * 3, behind
    members = [r for r in records if not r["behind"] and r["world"] == 3]
    assert members and all(r["total"] == 24 for r in members), members  # 23 padded to 24, as torch splits


EPOCHS_SCRIPT = r"""
import json, os
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import dra
from dra.elastic import DistributedDataParallel as DDP, DistributedSampler

cfg = json.loads(os.environ["CFG"])
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
x = torch.randn(60, 8, generator=torch.Generator().manual_seed(0))
train = TensorDataset(x, (x[:, 0] > 0).long())
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
loader = DataLoader(train, batch_size=2, sampler=DistributedSampler(train, seed=0))
model = DDP(net, opt, loader.sampler, scheduler=sched)
ctl = model.controller
for epoch in ctl.epochs(3):
    for xb, yb in loader:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        dra.step(0.0)
    ctl.scheduler.step()  # a per-epoch schedule
    LOG.write(json.dumps(dict(uid=ctl.uid, epoch=epoch, lr=opt.param_groups[0]["lr"])) + "\n")
LOG.write(json.dumps(dict(uid=ctl.uid, final=ctl.state_digest(), lr=opt.param_groups[0]["lr"])) + "\n")
LOG.close()
"""


def test_a_joiner_admitted_at_an_epochs_last_step_runs_that_epochs_end_under_ctl_epochs(tmp_path: Path) -> None:
    # 10 steps a data epoch; the third process joins at step 9, the last of data epoch 0. Its
    # ctl.epochs() loop began at data epoch 1: it never stepped epoch 0's schedule, which the
    # members stepped after the admission, so its learning rate stayed twice theirs and its
    # parameters parted for the rest of the job, silently.
    code, logs, records = run_logged_script(tmp_path, EPOCHS_SCRIPT, 3, {"policy": "none", "fault_timeout_s": 3.0,
                                                                        "start_size": 2, "resize_schedule": {"9": 3}},
                                            {}, timeout=120)
    assert code == 0, logs[-4000:]
    ends = [r for r in records if "epoch" in r]
    assert sorted(r["uid"] for r in ends if r["epoch"] == 0) == [0, 1, 2], ends
    assert all(r["lr"] == 0.05 * 0.5 ** (r["epoch"] + 1) for r in ends), ends
    finals = [r for r in records if "final" in r]
    assert len(finals) == 3 and len({r["final"] for r in finals}) == 1 and len({r["lr"] for r in finals}) == 1, finals


TRAIN_EVAL_SCRIPT = r"""
import json, os
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import dra
from dra.elastic import DistributedDataParallel as DDP, DistributedSampler

cfg = json.loads(os.environ["CFG"])
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
x = torch.randn(48, 8, generator=torch.Generator().manual_seed(0))
train = TensorDataset(torch.arange(48), x, (x[:, 0] > 0).long())
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sampler = DistributedSampler(train, seed=0)
loader = DataLoader(train, batch_size=4, sampler=sampler)
model = DDP(net, opt, sampler)
ctl = model.controller
epochs = ctl.epochs(3) if cfg["style"] == "epochs" else range(3)
for epoch in epochs:
    if cfg["style"] == "range":
        sampler.set_epoch(epoch)
    for ids, xb, yb in loader:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        dra.step(0.0)
    seen = []
    with torch.no_grad():  # the training set's accuracy: a second pass over the training loader
        for n, (ids, xb, yb) in enumerate(loader):
            assert n < 100, "the pass does not end"
            seen += ids.tolist()
    LOG.write(json.dumps(dict(uid=ctl.uid, epoch=epoch, world=ctl.world_size, seen=seen)) + "\n")
LOG.close()
"""


@pytest.mark.parametrize("style", ["epochs", "range"])
def test_a_second_pass_over_the_training_loader_in_an_epoch_goes_over_that_epoch(tmp_path: Path, style: str) -> None:
    # A training-set evaluation after each epoch (torch's update_bn(loader, model) does the same):
    # under ctl.epochs it started the next epoch's order and then yielded padding for ever; in a
    # range loop it yielded one batch of 4 samples, the same on every rank. Each rank now goes over
    # its share of the epoch for the world as it is (3 after the grow at step 3, the last of epoch 0).
    code, logs, records = run_logged_script(tmp_path, TRAIN_EVAL_SCRIPT, 3,
                                            {"policy": "none", "start_size": 2, "resize_schedule": {"3": 3}},
                                            {"style": style}, timeout=120)
    assert code == 0, logs[-4000:]
    for epoch in range(3):
        rs = [r for r in records if r["epoch"] == epoch]
        assert sorted(r["uid"] for r in rs) == [0, 1, 2], rs
        assert all(len(r["seen"]) == 16 for r in rs), rs  # 48 samples over 3 ranks
        assert sorted(i for r in rs for i in r["seen"]) == list(range(48)), rs
