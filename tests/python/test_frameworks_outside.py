"""Framework ports under `dra run` (an outside review of accelerate, Lightning and Fabric ports):
a sampler that wraps dra's and splits it again (Lightning Fabric's ``setup_dataloaders`` puts its
``DistributedSamplerWrapper`` over it) is refused at the first batch, naming the fix; an
accumulation window still open when the epoch's pass ends is said to be that, not "the loop left
the loader early". Stand-ins of Lightning's classes, of the same shape (the frameworks are not
installed here); real processes, real Gloo.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _elastic_harness import SCRIPT_HEAD, run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = SCRIPT_HEAD + r"""
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

class _DatasetSamplerWrapper(torch.utils.data.Dataset):
    # lightning_fabric.utilities.distributed._DatasetSamplerWrapper: a sampler's order as a dataset.
    def __init__(self, sampler):
        self._sampler, self._sampler_list = sampler, None
    def __getitem__(self, index):
        if self._sampler_list is None:
            self._sampler_list = list(self._sampler)
        return self._sampler_list[index]
    def __len__(self):
        return len(self._sampler)

class DistributedSamplerWrapper(TorchDistributedSampler):
    # lightning_fabric.utilities.distributed.DistributedSamplerWrapper (setup_dataloaders' default).
    def __init__(self, sampler, *args, **kwargs):
        super().__init__(_DatasetSamplerWrapper(sampler), *args, **kwargs)
    def __iter__(self):
        self.dataset._sampler_list = None
        return (self.dataset[index] for index in super().__iter__())

torch.manual_seed(0)
n = cfg.get("n", 48)
x, y = torch.randn(n, 4), torch.randn(n, 1)
ds = TensorDataset(x, y)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sampler = de.DistributedSampler(ds, seed=0)
loader = DataLoader(ds, batch_size=4, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
if cfg.get("fabric"):  # what fabric.setup_dataloaders(loader) makes of it
    loader = DataLoader(ds, batch_size=4, sampler=DistributedSamplerWrapper(
        sampler, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False))
accum = cfg.get("accum", 1)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        last = (i + 1) % accum == 0  # the epoch's last window left open when n is not a whole number of them
        with (contextlib.nullcontext() if last else model.no_sync()):
            F.mse_loss(model(xb), yb).backward()
        if last:
            opt.step()
            opt.zero_grad()
            status = dra.step(0.0)
            LOG.write(json.dumps(dict(uid=ctl.uid, step=status.step, committed=status.committed)) + "\n")
            LOG.flush()
LOG.close()
"""
SCRIPT = SCRIPT.replace("import json, os", "import contextlib, json, os", 1)


def test_fabrics_sampler_wrapper_over_dras_sampler_is_refused_at_the_first_batch(tmp_path: Path) -> None:
    """Before: each rank trained half of its share (24 of 48 samples never, exit 0), and the next
    epoch crashed inside Lightning with an IndexError."""
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 2, {"policy": "none", "fault_timeout_s": 3.0},
                                            {"fabric": True}, timeout=90)
    assert code != 0 and not records, logs[-3000:]
    assert "DistributedSamplerWrapper) draws from dra's training sampler" in logs, logs[-3000:]
    assert "use_distributed_sampler=False" in logs, logs[-3000:]


def test_a_window_open_at_the_end_of_the_pass_is_named_as_such(tmp_path: Path) -> None:
    """40 samples, 8 a step in a world of 2, windows of 2 steps: the epoch's fifth batch opens a
    window the pass never closes. Before: 'the loop left the loader early', which it did not."""
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 2, {"policy": "none", "fault_timeout_s": 3.0},
                                            {"n": 40, "accum": 2}, timeout=90)
    assert code == 0, logs[-3000:]
    assert "the pass ended inside an accumulation window" in logs, logs[-3000:]
    assert "the loop left the loader early" not in logs, logs[-3000:]
    assert {r["step"] for r in records if r["committed"]} == set(range(4)), records  # 2 windows an epoch, 2 epochs


FORWARD_COLLECTIVE = SCRIPT_HEAD + r"""
class Balanced(torch.nn.Module):
    # A mixture of experts' load-balancing count, all-reduced inside the forward (not guardable by
    # ctl.is_member in the loop).
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        count = torch.tensor([float(x.shape[0])])
        dist.all_reduce(count)
        return self.lin(x) * (count / count)

torch.manual_seed(0)
x, y = torch.randn(96, 4), torch.randn(96, 1)
ds = TensorDataset(x, y)
net = Balanced()
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sampler = de.DistributedSampler(ds, seed=0)
loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
for epoch in ctl.epochs(2):
    for xb, yb in loader:
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        opt.step()
        dra.step(0.0)
LOG.close()
"""


def test_a_process_standing_by_at_the_end_gets_no_batch_its_loader_workers_prefetched(tmp_path: Path) -> None:
    """A world of 3 shrinks to 2 (the third process stands by) and the job ends. Before: with
    DataLoader workers, the standby's loop received a batch prefetched before the end, ran its
    forward, and the all_reduce there failed: it exited 1 after the job had finished."""
    code, logs, _ = run_logged_script(
        tmp_path, FORWARD_COLLECTIVE, 3, {"policy": "none", "fault_timeout_s": 3.0, "start_size": 2,
                                          "resize_schedule": {"3": 3, "7": 2}}, {}, timeout=120)
    assert code == 0, logs[-3000:]
    assert "after the job finished" not in logs and "survived" not in logs, logs[-3000:]
