"""Outside review of the training state a third-party script holds besides its model, optimizer and
LR scheduler: a GradScaler and an EMA model (torch.optim.swa_utils.AveragedModel), given as
``extra_state``, travel to joiners and to the survivors of a crash, and a GradScaler guarded by
``ctl.update_skipped`` survives a failed step and an epoch's padding batches. Real processes under
`dra run`, real Gloo.

Every process a test starts carries an environment token; the test kills exactly those at the end.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from _elastic_harness import run_logged_script

import dra.elastic as de

# A script with AMP's loss scaling and an EMA, configured by the environment (CFG, JSON). The scaler
# grows its scale every 2 steps, so a joiner's fresh scaler (or a survivor's that counted a failed
# step) differs from the world's within a few steps; its scaled gradients would then be reduced with
# the others' and every rank's parameters would drift apart.
SCRIPT = r'''
import json, os, signal, torch
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
torch.manual_seed(0)
x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
data = TensorDataset(torch.arange(96), x, (x.sum(1) > 0).long())
sampler = de.DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=cfg.get("workers", 0))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
ctl = de.init(model, opt, sampler, extra_state={"scaler": scaler, "ema": ema})
log = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")
for epoch in ctl.epochs(cfg.get("epochs", 2)):
    for ids, xb, yb in loader:
        if [ctl.uid, ctl.step_index] == cfg.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        loss = torch.nn.functional.cross_entropy(ctl.model(xb), yb)
        ctl.optimizer.zero_grad()
        scaler.scale(loss).backward()
        if not ctl.update_skipped:  # a failed step (redone) or a dropped batch: nothing is applied
            scaler.unscale_(ctl.optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(ctl.optimizer)
            scaler.update()
            ema.update_parameters(model)
        st = dra.step(loss)
        if st.committed:
            log.write(json.dumps({"kind": "step", "ids": ids.tolist()}) + "\n")
            log.flush()
log.write(json.dumps({"kind": "final", "uid": ctl.uid, "rank": ctl.rank, "step": ctl.step_index,
                      "scaler": scaler.state_dict(), "n_averaged": int(ema.n_averaged),
                      "params": [p.detach().flatten().tolist() for p in model.parameters()],
                      "ema": [p.detach().flatten().tolist() for p in ema.parameters()]}) + "\n")
log.close()
'''


def _run(tmp_path: Path, nproc: int, options: dict, cfg: dict, timeout: float = 50) -> tuple[int, str, list[dict]]:
    return run_logged_script(tmp_path, SCRIPT, nproc, options, cfg, timeout)


def _assert_same_state_everywhere(records: list[dict], members: int, steps: int) -> None:
    finals = [r for r in records if r["kind"] == "final" and r["rank"] >= 0]
    assert len(finals) == members, finals
    first = finals[0]
    for other in finals[1:]:
        # The world's scale, the EMA's count and values, and so the parameters, bit for bit.
        assert other["scaler"] == first["scaler"], (first["uid"], other["uid"])
        assert other["n_averaged"] == first["n_averaged"] == steps
        assert other["ema"] == first["ema"]
        assert other["params"] == first["params"]


def _assert_each_sample_once_per_epoch(records: list[dict], epochs: int) -> None:
    seen = Counter(i for r in records if r["kind"] == "step" for i in r["ids"])
    assert sorted(seen) == list(range(96)) and set(seen.values()) == {epochs}, seen


@pytest.mark.timeout(60)
def test_grad_scaler_and_ema_reach_a_joiner(tmp_path: Path) -> None:
    """2 -> 3 at step 5: the joiner takes the world's GradScaler (its scale grew twice since) and EMA
    (a fresh scaler scaled its gradients 4x off the others': every rank's parameters drifted)."""
    code, out, records = _run(tmp_path, 3, {"policy": "none", "start_size": 2, "resize_schedule": {"5": 3}}, {})
    assert code == 0, out[-3000:]
    _assert_same_state_everywhere(records, members=3, steps=16)
    _assert_each_sample_once_per_epoch(records, 2)


@pytest.mark.timeout(60)
def test_grad_scaler_survives_a_killed_worker_and_padding_batches(tmp_path: Path) -> None:
    """A worker killed at step 5 (its peers' step fails: no gradients) and DataLoader workers (an
    epoch's padding batches are dropped): ``scaler.step`` raised AssertionError on both ("No inf
    checks were recorded") and took the job down; guarded by ``ctl.update_skipped`` the scaler and
    the EMA count each committed step once."""
    code, out, records = _run(tmp_path, 3, {"policy": "none"}, {"kill": [1, 5], "workers": 2})
    assert code == 0, out[-3000:]
    assert "No inf checks" not in out
    _assert_same_state_everywhere(records, members=2, steps=16)
    _assert_each_sample_once_per_epoch(records, 2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("extra", "message"), [
    ([torch.amp.GradScaler("cpu")], "extra_state: expected a dict"),
    ({"gen": torch.Generator()}, "extra_state['gen']: Generator has no state_dict or load_state_dict"),
    ({"": torch.amp.GradScaler("cpu")}, "names must be non-empty strings"),
])
def test_extra_state_refused_by_name(extra: object, message: str) -> None:
    """A bad ``extra_state`` is refused before anything joins a world, naming the entry."""
    model = torch.nn.Linear(2, 1)
    sampler = de.DistributedSampler(torch.utils.data.TensorDataset(torch.zeros(4, 2)))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        de.init(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler, extra_state=extra)


def test_an_emas_tensors_travel_as_tensors_not_in_the_manifest() -> None:
    """An EMA of a large model was serialised whole into the handoff's manifest (one message, not
    chunked, not covered by verify=True); its tensors are now in the tensor list, after the optimizer's."""
    from dra.elastic._state import TorchState

    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ema = torch.optim.swa_utils.AveragedModel(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(3):
        model(torch.randn(4, 256)).sum().backward()
        opt.step()
        ema.update_parameters(model)
    tensors, manifest, first_deferrable = TorchState(model, opt, None, {"ema": ema, "scaler": scaler}).collect()
    ema_sd = ema.state_dict()
    assert len(tensors) == 2 + 2 + len(ema_sd), "model, momentum buffers, then the EMA's tensors"
    assert first_deferrable == 2
    assert len(manifest) < 64 * 1024, f"a {len(manifest)}-byte manifest carries the EMA's tensors"

    other = torch.nn.Linear(256, 256)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other_ema = torch.optim.swa_utils.AveragedModel(other)
    other_scaler = torch.amp.GradScaler("cpu")
    receiver = TorchState(other, other_opt, None, {"ema": other_ema, "scaler": other_scaler})
    targets = receiver.prepare(manifest)
    assert other_scaler.get_scale() == 1024.0, "a state without tensors is loaded before the first forward"
    for dst, src in zip(targets, tensors):
        dst.copy_(src)
    receiver.load(manifest, targets)
    for k, v in ema_sd.items():
        assert torch.equal(other_ema.state_dict()[k], v), k
    assert int(other_ema.n_averaged) == 3
