"""Tensors of every kind a model holds reach every rank as torch's DDP would have them (an outside
review): complex buffers and parameters, float64 parameters, constant float buffers, non-persistent
buffers; and a training sampler whose subclass overrides ``__iter__`` is refused, not bypassed.
Real processes under `dra run`, real Gloo, a grow from 2 to 3 processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _elastic_harness import SCRIPT_HEAD, grown_run, run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = SCRIPT_HEAD + r"""
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.body = torch.nn.Linear(4, 4)
        self.phase = torch.nn.Parameter(torch.polar(torch.ones(4), torch.rand(4, generator=g)))  # complex64
        self.head = torch.nn.Linear(8, 1).double()                                                  # float64
        # A rotary-style table (complex), a constant float32 one, and a forward counter nobody saves.
        self.register_buffer("rotary", torch.polar(torch.ones(4), torch.arange(4.0) / 3.0))
        self.register_buffer("const", torch.randn(64, generator=g))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=False)
    def forward(self, x):
        self.calls += 1
        z = self.body(x).to(torch.complex64) * self.phase * self.rotary
        return self.head(torch.view_as_real(z).flatten(1).double())

class Data(Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.randn(1, generator=g).double()

class Filtered(de.DistributedSampler):
    def __iter__(self):
        return iter([i for i in super().__iter__() if i % 5])

torch.manual_seed(1)
net = Model()
rotary0, const0 = net.rotary.clone(), net.const.clone()
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sampler = (Filtered if cfg.get("filtered") else de.DistributedSampler)(Data(), seed=0)
loader = DataLoader(Data(), batch_size=4, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
for epoch in ctl.epochs(2):
    for xb, yb in loader:
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        g = net.head.weight.grad
        opt.step()
        status = dra.step(0.0)
        if not status.committed:
            continue
        LOG.write(json.dumps(dict(
            uid=ctl.uid, step=ctl.step_index, world=ctl.world_size, calls=int(net.calls),
            rotary_err=float((net.rotary - rotary0).abs().max()), const_changed=int((net.const != const0).sum()),
            phase_grad_imag=float(net.phase.grad.imag.abs().max()),
            head_grad_is_f32=bool((g.float().double() == g).all()),
            params=[p.detach().cpu().flatten().tolist() if not p.is_complex() else torch.view_as_real(p.detach()).flatten().tolist()
                    for p in net.parameters()])) + "\n")
        LOG.flush()
LOG.close()
"""


@pytest.mark.parametrize("compress", ["", "powersgd:2", "masked:0.5"])
def test_complex_float64_constant_and_non_persistent_tensors_reach_every_rank_exactly(tmp_path: Path,
                                                                                      compress: str) -> None:
    """With a codec too: it compresses the float32 buckets (the complex weight's real view among
    them; the masked codec reads that weight as its gradient travels), the float64 ones go whole."""
    _, steps = grown_run(tmp_path, SCRIPT, {}, 3, compress=compress)
    for step, rs in sorted(steps.items()):
        assert len(rs) >= 2, (step, rs)  # (world: the size after the step, a grow included)
        for r in rs:
            # The complex table was rounded to integers with its imaginary part dropped; the constant
            # float32 one moved by an ulp in a world of 3.
            assert r["rotary_err"] == 0.0 and r["const_changed"] == 0, (step, r)
            assert r["phase_grad_imag"] > 0, (step, r)  # a complex weight's imaginary part trains
            assert not r["head_grad_is_f32"], (step, r)  # float64 gradients reduced in float64
        # Every rank holds the same parameters and the same forward count: the joiner's counter is
        # the world's (it was mixed in: 5 -> 4 after a grow).
        assert len({str(r["params"]) for r in rs}) == 1, step
        assert {r["calls"] for r in rs} == {step}, (step, [r["calls"] for r in rs])  # step_index: steps done


def test_a_training_sampler_whose_subclass_overrides_iter_is_refused(tmp_path: Path) -> None:
    code, logs, records = run_logged_script(tmp_path, SCRIPT, 2, {"policy": "none", "fault_timeout_s": 3.0},
                                            {"filtered": True}, timeout=90)
    assert code != 0 and not records, logs[-3000:]
    assert "overrides __iter__, which dra never calls" in logs and "Subset" in logs, logs[-3000:]
