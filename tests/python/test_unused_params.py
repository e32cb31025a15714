"""A parameter no rank used on a step (a branch the batch did not take), under `dra run` with real
processes and real Gloo: with DDP's ``find_unused_parameters=True`` it keeps no gradient (None) on
every rank and the optimizer skips it, as in one process and as torch's DDP does; without it, it
gets a zero gradient on every rank (dra goes on where DDP would raise, and each process says so
once, naming the parameters), which AdamW's decay and moments still move. A branch some ranks used gets the world's mean on every rank in both cases;
the same under a gradient codec (PowerSGD).
Before the option was taken, both runs gave zero gradients (docs/guide/compatibility.md).

Every process carries an environment token; whatever still runs at the end is killed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _elastic_harness import SKLEARN_PRELOAD, run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = r'''
import hashlib, json, os
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

CFG = json.loads(os.environ["CFG"])
OUT, unused = CFG["out"], CFG["unused"]
d = load_digits()
X, Y = torch.tensor(d.data[:768], dtype=torch.float32) / 16.0, torch.tensor(d.target[:768])
DS = TensorDataset(X, Y, torch.arange(len(Y)))
REC = open(os.path.join(OUT, f"log-{os.getpid()}.jsonl"), "a")

def digest(t):
    return hashlib.sha256(t.detach().numpy().tobytes()).hexdigest()[:16]

class Net(torch.nn.Module):
    """A trunk, a head every batch takes, a branch taken on every third step by every rank alike
    (`rare`), and one taken where a rank's batch starts at an even sample (`some`: rank by rank)."""
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(64, 32)
        self.head = torch.nn.Linear(32, 10)
        self.rare = torch.nn.Linear(32, 10)
        self.some = torch.nn.Linear(32, 10)

    def forward(self, x, take_rare, take_some):
        h = torch.tanh(self.trunk(x))
        out = self.head(h)
        if take_rare:
            out = out + self.rare(h)
        if take_some:
            out = out + self.some(h)
        return out

torch.manual_seed(0)
net = Net()
opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
sampler = de.DistributedSampler(DS, shuffle=True, seed=1)
loader = DataLoader(DS, batch_size=32, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler, find_unused_parameters=unused)
ctl = model.controller
step = 0
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y, idx in loader:
        take_rare, take_some = step % 3 == 0, int(idx[0]) % 2 == 0
        before = digest(net.rare.weight)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x, take_rare, take_some), y)
        loss.backward()
        rec = {"uid": ctl.uid, "step": step, "rare": take_rare, "some": take_some,
               "rare_grad": None if net.rare.weight.grad is None else float(net.rare.weight.grad.abs().sum()),
               "some_grad": None if net.some.weight.grad is None else digest(net.some.weight.grad)}
        opt.step()
        dra.step(loss)
        rec.update(rare_moved=digest(net.rare.weight) != before, world=ctl.world_size)
        REC.write(json.dumps(rec) + "\n"); REC.flush()
        step += 1
REC.write(json.dumps({"uid": ctl.uid, "final": {n: digest(p) for n, p in net.named_parameters()}}) + "\n")
REC.flush()
'''


def _run(tmp_path: Path, unused: bool, compress: str) -> list[dict]:
    code, out, records = run_logged_script(tmp_path, SCRIPT, 2, {"policy": "none", "compress": compress},
                                           {"unused": unused}, timeout=120,
                                           launcher_args=SKLEARN_PRELOAD)
    assert code == 0, out[-6000:]
    # Without the option, each process says once which parameters had no gradient (DDP would raise).
    warned = out.count("had no gradient in this backward on this process")
    assert warned == (0 if unused else 2), out[-6000:]
    if not unused:
        assert "'rare.weight', 'rare.bias'" in out and "find_unused_parameters=True" in out, out[-6000:]
    return records


@pytest.mark.parametrize(("unused", "compress"), [(True, ""), (False, ""), (True, "powersgd:2")],
                         ids=["find_unused_parameters", "default", "find_unused_parameters-powersgd"])
def test_a_parameter_no_rank_used_keeps_no_gradient_with_find_unused_parameters(tmp_path: Path, unused: bool,
                                                                                 compress: str) -> None:
    # PowerSGD: the counts of which parameters had a gradient ride uncompressed with its first all-reduce.
    records = _run(tmp_path, unused, compress)
    finals = [r["final"] for r in records if "final" in r]
    assert len(finals) == 2 and finals[0] == finals[1], finals  # every rank ends identical
    steps = [r for r in records if "step" in r]
    assert {r["world"] for r in steps} == {2} and len(steps) == 2 * 24
    by_step: dict[int, list[dict]] = {}
    for r in steps:
        by_step.setdefault(r["step"], []).append(r)
    skipped = [rs for rs in by_step.values() if not rs[0]["rare"]]
    taken = [rs for rs in by_step.values() if rs[0]["rare"]]
    assert skipped and taken
    for rs in taken:
        assert all(r["rare_grad"] is not None and r["rare_grad"] > 0 and r["rare_moved"] for r in rs), rs
    later = [rs for rs in skipped if rs[0]["step"] > 0]  # AdamW has moments once the branch was taken
    if unused:
        # No rank took it: no gradient, and AdamW leaves it as it was (its decay and moments too).
        assert all(r["rare_grad"] is None and not r["rare_moved"] for rs in skipped for r in rs), skipped
    else:
        # A zero gradient on every rank: AdamW's decay and moments move it.
        assert all(r["rare_grad"] == 0.0 for rs in skipped for r in rs), skipped
        assert all(r["rare_moved"] for rs in later for r in rs), later
    # `some`, taken by one rank and not the other on a step: the world's mean on both, either way.
    mixed = [rs for rs in by_step.values() if len({r["some"] for r in rs}) == 2]
    assert mixed, "no step where the ranks took different branches"
    for rs in mixed:
        assert rs[0]["some_grad"] is not None and rs[0]["some_grad"] == rs[1]["some_grad"], rs
