"""Code a script runs after the wrap, on a process that joins a running world (an outside review):
torchvision's, DeiT's and MAE's scripts wrap the model first and then resume from a checkpoint
into ``model.module`` and the optimizer, or scale the learning rate by the world size. Founders
all do it alike; a joiner did it over the world's state it had just received, and its parameters
parted from the world's at every step, silently. Now the world's state is restored at its first
forward, with a warning. The model holds a channels_last parameter too: a model with a
non-contiguous parameter could not start on 2 processes. Real processes under `dra run`, real Gloo.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from _elastic_harness import SCRIPT_HEAD, grown_run, run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = SCRIPT_HEAD + r"""
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 1)
    def forward(self, x):
        return self.fc(torch.tanh(self.conv(x)).flatten(1))

g = torch.Generator().manual_seed(0)
x, y = torch.randn(96, 2, 4, 4, generator=g), torch.randn(96, 1, generator=g)
torch.manual_seed(0)
net = Net().to(memory_format=torch.channels_last)  # the conv's weight: not contiguous
assert not net.conv.weight.is_contiguous()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
data = TensorDataset(x, y)
sampler = de.DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
if cfg.get("resume"):  # as torchvision's train.py: after the wrap, into model.module and the optimizer
    ckpt = torch.load(cfg["checkpoint"], map_location="cpu", weights_only=True)
    model.module.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
if cfg.get("reload_same"):  # accelerate's prepare(opt): the same state loaded again (device placement)
    opt.load_state_dict(opt.state_dict())
if cfg.get("lr_scale"):  # the linear scaling rule, applied once the model is wrapped
    for group in opt.param_groups:
        group["lr"] = 0.02 * dist.get_world_size()
total = 3 * len(loader)  # a schedule's length taken after the wrap, as many scripts do
for epoch in range(3):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        if cfg.get("len_schedule"):  # a hand-written decay over `total`, driven by the world's step
            for group in opt.param_groups:
                group["lr"] = 0.05 * (1 - ctl.step_index / total)
        opt.step()
        status = dra.step(0.0)
        if not status.committed:
            continue
        LOG.write(json.dumps(dict(uid=ctl.uid, step=ctl.step_index, lr=opt.param_groups[0]["lr"], total=total,
                                  params=[round(float(p.double().sum()), 9) for p in net.parameters()])) + "\n")
        LOG.flush()
LOG.close()
"""


def _checkpoint(path: Path) -> str:
    """A checkpoint unlike the model every process builds (another seed, momentum in the state)."""
    import torch
    from torch import nn

    torch.manual_seed(7)
    net = nn.Sequential()
    net.add_module("conv", nn.Conv2d(2, 4, 3, padding=1))
    net.add_module("fc", nn.Linear(64, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()}, path)
    return str(path)


@pytest.mark.parametrize("what", ["resume", "lr_scale"])
def test_a_joiner_keeps_the_worlds_state_over_what_its_script_loads_after_the_wrap(tmp_path: Path,
                                                                                 what: str) -> None:
    cfg = {"resume": what == "resume", "lr_scale": what == "lr_scale",
           "checkpoint": _checkpoint(tmp_path / "ckpt.pt")}
    logs, steps = grown_run(tmp_path, SCRIPT, cfg, 4)
    for step, rs in sorted(steps.items()):
        assert len({str(r["params"]) for r in rs}) == 1, (step, rs)
        assert len({r["lr"] for r in rs}) == 1, (step, rs)
    assert logs.count("joined a running world, and its script changed the model") == 1, logs[-3000:]


def test_a_joiner_whose_script_changes_nothing_after_the_wrap_is_not_warned(tmp_path: Path) -> None:
    # Its schedule's length comes from len(loader) after the wrap. A joiner's len(loader) was the
    # steps left in the data epoch (8 - 4 here; the global batch is 4 x 3 processes): its schedule ran 3x faster than the world's and its
    # parameters parted from the world's (an outside review). Now it is a whole epoch's, everywhere.
    # It also loads its optimizer's own state again, as accelerate's prepare(opt) does: touched,
    # unchanged, and no longer warned about as a script that changed the state after the wrap.
    logs, steps = grown_run(tmp_path, SCRIPT, {"len_schedule": True, "reload_same": True}, 4)
    assert "joined a running world" not in logs
    assert {r["total"] for rs in steps.values() for r in rs} == {3 * 96 // 12}, logs[-3000:]
    for step, rs in sorted(steps.items()):
        assert len({str(r["params"]) for r in rs}) == 1 and len({r["lr"] for r in rs}) == 1, (step, rs)


LBFGS = SCRIPT_HEAD + r"""
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(48, 4, generator=g), torch.randn(48, 1, generator=g))
torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=cfg["max_iter"], history_size=5)
sampler = de.DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
for xb, yb in loader:
    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        return loss
    status = dra.step(opt.step(closure))
    LOG.write(json.dumps(dict(uid=model.controller.uid, step=status.step,
                              params=[round(float(p.sum()), 9) for p in net.parameters()])) + "\n")
    LOG.flush()
LOG.close()
"""


def test_lbfgs_evaluating_its_closure_several_times_a_step_is_refused_naming_max_iter(tmp_path: Path) -> None:
    """LBFGS re-evaluates its closure within one step (max_iter 20 by default): the refusal spoke
    of GANs and summed losses; it now names LBFGS and max_iter=1, with which it trains."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, logs, _ = run_logged_script(tmp_path / "a", LBFGS, 2, {"policy": "none"}, {"max_iter": 4}, timeout=60)
    assert code != 0 and "the optimizer evaluated its closure again within one step" in logs, logs[-2000:]
    assert "max_iter=1" in logs
    code, logs, records = run_logged_script(tmp_path / "b", LBFGS, 2, {"policy": "none"}, {"max_iter": 1}, timeout=60)
    assert code == 0, logs[-3000:]
    by_step: dict[int, set[str]] = defaultdict(set)
    for r in records:
        by_step[r["step"]].add(str(r["params"]))
    assert len(by_step) >= 5 and all(len(v) == 1 for v in by_step.values()), by_step


# A linear model on 32 samples, wrapped by dra (the scripts below add what they test).
LINEAR_WRAPPED = r"""
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
sampler = de.DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
"""

TORCH_DDP_AFTER = SCRIPT_HEAD + LINEAR_WRAPPED + r"""
# accelerate's prepare(model) wraps dra's wrapper; Lightning's DDP strategy wraps the module itself.
torch.nn.parallel.DistributedDataParallel(model if cfg["around"] == "wrapper" else net)
LOG.write(json.dumps(dict(wrapped=True)) + "\n")
LOG.close()
"""


@pytest.mark.parametrize("around", ["wrapper", "module"])
def test_torchs_ddp_made_around_what_dra_reduces_is_refused(tmp_path: Path, around: str) -> None:
    """accelerate's prepare(model), transformers.Trainer and Lightning's DDP strategy wrap the model
    in torch's DDP after dra's wrap: after a grow the joiner's parameters parted from the world's
    at every step, exit 0, and a kill -9 killed every survivor (an outside review)."""
    code, logs, records = run_logged_script(tmp_path, TORCH_DDP_AFTER, 2, {"policy": "none"}, {"around": around},
                                            timeout=120)
    assert code not in (0, None) and not records, logs[-3000:]
    assert "torch.nn.parallel.DistributedDataParallel is being made around" in logs, logs[-3000:]
    assert "accelerator.prepare(opt); the scheduler goes to dra" in logs, logs[-3000:]


LATE_INIT = r"""
import json, os
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
""" + LINEAR_WRAPPED + r"""
dist.init_process_group("gloo")  # as transformers.TrainingArguments or Lightning's fit do, lazily
for xb, yb in loader:
    opt.zero_grad()
    F.mse_loss(model(xb), yb).backward()
    opt.step()
    if dra.step(0.0).committed:
        LOG.write(json.dumps(dict(step=model.controller.step_index, world=dist.get_world_size())) + "\n")
        LOG.flush()
LOG.close()
"""


@pytest.mark.parametrize("start_size", [1, 2])
def test_torchs_process_group_made_after_the_wrap_is_refused_unless_the_world_is_the_launchs(
        tmp_path: Path, start_size: int) -> None:
    """With a process standing by, the script's own init_process_group after dra's wrap waited for
    it in torch's rendezvous: a hang, without a message (an outside review, TrainingArguments made
    after the wrap). In the launch's world it meets every member and works, as before."""
    code, logs, records = run_logged_script(tmp_path, LATE_INIT, 2, {"policy": "none", "start_size": start_size},
                                            {}, timeout=120)
    if start_size == 2:
        assert code == 0 and records and {r["world"] for r in records} == {2}, logs[-3000:]
        return
    assert code not in (0, None) and not records, logs[-3000:]
    assert "torch.distributed.init_process_group is called after dra's wrap, in a world of 1" in logs, logs[-3000:]
