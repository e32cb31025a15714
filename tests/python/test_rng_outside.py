"""Each process keeps its own random state, as under torch's DDP (an outside review).

A script that seeds each rank its own way (``torch.manual_seed(seed + rank)``, nanoGPT's seed
offset) wants distinct dropout masks, augmentations, diffusion noise and DataLoader worker seeds
per rank. dra used to hand the random state over with the model: from the first world on, every
rank drew process 0's numbers (torch's, Python's and NumPy's), in a fixed world too. Real
processes under `dra run`, real Gloo.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = r"""
import json, os, random, signal
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
dist.init_process_group("gloo")
seed = 1234 + dist.get_rank() + 100 * int(os.environ.get("DRA_JOIN", "0"))
torch.manual_seed(seed); random.seed(seed); np.random.seed(seed)
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")

class Augmented(Dataset):  # a random augmentation in the worker: its seed comes from torch's generator
    def __len__(self):
        return 48
    def __getitem__(self, i):
        return torch.full((4,), float(i)) + torch.randn(4), torch.tensor([float(i % 3)])

net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
sampler = de.DistributedSampler(Augmented(), seed=0)
loader = DataLoader(Augmented(), batch_size=4, sampler=sampler, num_workers=cfg.get("workers", 0))
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
for epoch in ctl.epochs(3):
    for xb, yb in loader:
        if [ctl.uid, ctl.step_index] == cfg.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        draws = [torch.rand(1).item(), random.random(), float(np.random.rand())]
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        opt.step()
        status = dra.step(0.0)
        if not status.committed:  # an epoch's padding batch (DataLoader workers), dropped
            continue
        LOG.write(json.dumps(dict(uid=ctl.uid, step=ctl.step_index, world=ctl.world_size, draws=draws,
                                  noise=round(float(xb.sum() - xb.round().sum()), 6),
                                  params=[round(float(p.sum()), 6) for p in net.parameters()])) + "\n")
        LOG.flush()
"""


def _run(tmp_path: Path, options: dict, **cfg) -> list[dict]:
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 3, {"policy": "none", "fault_timeout_s": 3.0, **options},
                                            cfg, timeout=120)
    assert code == 0, logs[-4000:]
    return records


def _by_step(records: list[dict]) -> dict[int, list[dict]]:
    steps: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        steps[r["step"]].append(r)
    return steps


@pytest.mark.parametrize("workers", [0, 2])
def test_each_rank_keeps_its_own_random_stream_from_the_first_world_on(tmp_path: Path, workers: int) -> None:
    steps = _by_step(_run(tmp_path, {}, workers=workers))
    assert len(steps) >= 10
    for step, rs in steps.items():
        assert len(rs) == 3, rs
        for k in range(3):  # torch's, Python's and NumPy's draws: one per rank, all different
            assert len({r["draws"][k] for r in rs}) == 3, (step, k, rs)
        # The DataLoader's random augmentation (its workers' seeds come from torch's generator).
        assert len({r["noise"] for r in rs}) == 3, (step, rs)
        assert len({tuple(r["params"]) for r in rs}) == 1, (step, rs)  # the model is still the world's


def test_a_joiner_and_the_survivors_of_a_kill_keep_their_own_streams(tmp_path: Path) -> None:
    # Starts on 2; the third process joins at step 4 (its own seed: DRA_JOIN differs), then uid 1 is
    # killed at step 9: the survivors take the state from the new rank 0 but not its random state.
    steps = _by_step(_run(tmp_path, {"start_size": 2, "resize_schedule": {"4": 3}}, kill=[1, 9]))
    worlds = {rs[0]["world"] for rs in steps.values()}
    assert {2, 3} <= worlds, worlds
    for step, rs in steps.items():
        for k in range(3):
            assert len({r["draws"][k] for r in rs}) == len(rs), (step, k, rs)
        assert len({tuple(r["params"]) for r in rs}) == 1, (step, rs)
