"""Outside review of the elastic data path: data pipelines a user has, run under `dra run` with
real processes and real Gloo; every sample of every data epoch trained exactly once, counted from
the sample ids each rank's batches carried.

Every process a test starts carries an environment token; the test kills exactly those at the end.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(120)

# One training script, configured by the environment (CFG, JSON): a map-style dataset whose items
# carry their index, torch's DataLoader over dra's DistributedSampler, one record per batch.
SCRIPT = r'''
import json, os, torch
from torch.utils.data import DataLoader, Dataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])

class Numbered(Dataset):
    def __len__(self): return cfg["n"]
    def __getitem__(self, i): return int(i), torch.full((4,), float(i))

ds = Numbered()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sampler = de.DistributedSampler(ds, seed=3)
kw = {"num_workers": cfg.get("workers", 0)}
loader = DataLoader(ds, batch_size=cfg["batch"], sampler=sampler, **kw)
model = de.DistributedDataParallel(model, opt, sampler)
ctl = model.controller
log = open(os.path.join(cfg["out"], f"log-{ctl.uid}.jsonl"), "a")
accum = cfg.get("accum", 1)
for epoch in range(cfg.get("epochs", 1)):
    sampler.set_epoch(epoch)
    for i, (ids, x) in enumerate(loader):
        if epoch == 0 and i < cfg.get("skip", 0):
            continue  # a resume that skips the pass's first batches, on every rank alike
        step, depoch = ctl.step_index, sampler.epoch
        empty = getattr(sampler, "_current_is_empty", lambda: False)()
        loss = model(x).pow(2).mean()
        if accum > 1 and not ((i + 1) % accum == 0 or i + 1 == len(loader)):
            with model.no_sync():
                loss.backward()
            log.write(json.dumps({"kind": "micro", "uid": ctl.uid, "step": step, "depoch": depoch,
                                  "ids": [] if empty else ids.tolist()}) + "\n")
            continue
        loss.backward(); opt.step(); opt.zero_grad()
        st = dra.step(loss)
        log.write(json.dumps({"kind": "step", "uid": ctl.uid, "step": step, "depoch": depoch, "world": ctl.world_size,
                              "committed": bool(st.committed), "ids": [] if empty else ids.tolist(),
                              "loaded": len(ids)}) + "\n")
        log.flush()
log.write(json.dumps({"kind": "final", "uid": ctl.uid, "step": ctl.step_index, "digest": ctl.state_digest(),
                      "params": [p.detach().flatten().tolist() for p in model.module.parameters()]}) + "\n")
log.close()
'''


def _run(tmp_path: Path, nproc: int, options: dict, cfg: dict, timeout: float = 90) -> tuple[int, str, list[dict]]:
    return run_logged_script(tmp_path, SCRIPT, nproc, options, cfg, timeout)


def _trained(records: list[dict], epoch: int) -> Counter:
    """Sample ids of data epoch `epoch` in committed steps (a committed window's micro-batches too)."""
    seen: Counter = Counter()
    for r in records:
        if r["kind"] == "step" and r["depoch"] == epoch and r["committed"]:
            seen.update(r["ids"])
            for m in records:
                if m["kind"] == "micro" and (m["uid"], m["step"], m["depoch"]) == (r["uid"], r["step"], epoch):
                    seen.update(m["ids"])
    return seen


def _assert_exactly_once(records: list[dict], n: int, epochs: int) -> None:
    for e in range(epochs):
        seen = _trained(records, e)
        assert sorted(seen.elements()) == list(range(n)), (
            f"data epoch {e}: repeated {sorted(k for k, v in seen.items() if v > 1)}, "
            f"missing {sorted(set(range(n)) - set(seen))}")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_rank_whose_share_of_the_last_step_is_empty_trains_a_zero_weight_batch_instead_of_crashing(tmp_path, workers):
    """37 samples, per-rank batch 4, 3 ranks: the epoch's last step holds one sample, so two ranks'
    shares are empty. The DataLoader was handed an empty batch and torch's default_collate raised
    IndexError on both (they left the job mid-training; the survivor redid the step alone). Now
    the loader loads a batch of the usual size that weighs zero: all three finish the step."""
    code, out, records = _run(tmp_path, 3, {"policy": "none", "fault_timeout_s": 10},
                              {"n": 37, "batch": 4, "workers": workers})
    assert code == 0, out[-4000:]
    assert "IndexError" not in out and "leaves the job" not in out, out[-4000:]
    last = [r for r in records if r["kind"] == "step" and r["step"] == 3]
    assert sorted((r["uid"], r["world"], r["committed"]) for r in last) == [(0, 3, True), (1, 3, True), (2, 3, True)]
    assert sorted(r["loaded"] for r in last) == [1, 4, 4]  # the two empty shares loaded the usual 4
    _assert_exactly_once(records, 37, 1)
    finals = {r["uid"]: r for r in records if r["kind"] == "final"}
    assert sorted(finals) == [0, 1, 2] and len({r["digest"] for r in finals.values()}) == 1


@pytest.mark.parametrize("workers,options", [(0, {}), (2, {"resize_schedule": {"2": 2}})], ids=["fixed", "workers_shrink"])
def test_batches_every_rank_skips_at_a_passs_start_are_redone_not_replaced_by_padding(tmp_path, workers, options):
    """Every rank skips the first 2 batches of the first pass with `continue` (a resume that skips
    what it trained before). Counted against the batches in flight at the previous step, a skip
    before the pass's first reduced batch went unseen: the skipped steps were committed with the
    batches trained after them, and the pass ended on padding batches (the order's first samples,
    the same on every rank) trained as real steps: samples repeated, the step count ahead. Now the
    step is refused on every rank and redone with the skipped samples (the documented rule for a
    skipped batch): every sample once."""
    code, out, records = _run(tmp_path, 3, {"policy": "none", "fault_timeout_s": 10, **options},
                              {"n": 48, "batch": 4, "workers": workers, "skip": 2, "epochs": 2})
    assert code == 0, out[-4000:]
    assert '"event":"refused"' in out.replace(" ", ""), out[-3000:]
    _assert_exactly_once(records, 48, 2)
    finals = {r["uid"]: r for r in records if r["kind"] == "final"}
    assert len({r["digest"] for r in finals.values()}) == 1, finals
    committed = {(r["depoch"], r["step"]) for r in records if r["kind"] == "step" and r["committed"]}
    assert len(committed) == 8, committed  # 4 steps of 12 samples a data epoch (the global batch is kept), none more


def test_an_empty_share_inside_an_accumulation_window_after_a_grow_adds_no_gradient(tmp_path):
    """Windows of 3 batches of 2 per rank (global batch 6 per step); a grow from 2 to 3 lands on the
    epoch's last window, whose one step holds one sample: the joiner and rank 1 have empty shares
    inside a window. Their stand-in batch is zeroed (weight 0), every sample trained once."""
    code, out, records = _run(tmp_path, 3, {"policy": "none", "fault_timeout_s": 10, "start_size": 2,
                                            "resize_schedule": {"1": 3}}, {"n": 37, "batch": 2, "accum": 3,
                                                                           "epochs": 2})
    assert code == 0, out[-4000:]
    assert "IndexError" not in out and "leaves the job" not in out, out[-4000:]
    _assert_exactly_once(records, 37, 2)
    finals = {r["uid"]: r for r in records if r["kind"] == "final"}
    assert len({r["digest"] for r in finals.values()}) == 1, finals


def test_an_empty_share_closing_an_accumulation_window_adds_no_gradient(tmp_path):
    """31 samples, per-rank batch 2, 3 ranks, windows of 2 batches: the epoch's last window is a full
    step and a step of one sample, so two ranks close it on an empty share. The batch loaded in its
    place must add nothing to their window's gradient: the final parameters are replayed here from
    the ids each rank trained (each rank's summed window gradient weighted by its share of the
    window's samples, the guide's rule); the stand-in batch's gradient made them differ."""
    import torch

    code, out, records = _run(tmp_path, 3, {"policy": "none", "fault_timeout_s": 10},
                              {"n": 31, "batch": 2, "accum": 2})
    assert code == 0, out[-4000:]
    _assert_exactly_once(records, 31, 1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = sorted({r["step"] for r in records if r["kind"] == "step"})
    for step in steps:
        per_rank = {r["uid"]: [m["ids"] for m in records
                               if m["kind"] == "micro" and m["step"] == step and m["uid"] == r["uid"]] + [r["ids"]]
                    for r in records if r["kind"] == "step" and r["step"] == step}
        total = sum(len(ids) for batches in per_rank.values() for ids in batches)
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for batches in per_rank.values():
            mine = sum(len(ids) for ids in batches)
            model.zero_grad()
            for ids in batches:
                if ids:
                    x = torch.stack([torch.full((4,), float(i)) for i in ids])
                    model(x).pow(2).mean().backward()
            for g, p in zip(grads, model.parameters()):
                if p.grad is not None:
                    g += p.grad * (mine / total)
        for g, p in zip(grads, model.parameters()):
            p.grad = g
        opt.step()
    finals = [r for r in records if r["kind"] == "final"]
    assert len(finals) == 3
    replayed = [p.detach().flatten().tolist() for p in model.parameters()]
    for f in finals:
        for got, want in zip(f["params"], replayed):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6), (f["uid"], got, want)


# A loop that calls dra.step only where it logs (every N batches), its optimizer stepping every
# batch: each backward reduces, and the world commits each step; a process that skipped its
# dra.step counts the step at its next backward. Configured as SCRIPT is.
EVERY_SCRIPT = r'''
import json, os, torch
from torch.utils.data import DataLoader, Dataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])

class Numbered(Dataset):
    def __len__(self): return cfg["n"]
    def __getitem__(self, i): return int(i), torch.full((4,), float(i))

torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
sampler = de.DistributedSampler(Numbered(), seed=3)
loader = torch.utils.data.DataLoader(Numbered(), batch_size=2, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
log = open(os.path.join(cfg["out"], f"log-{ctl.uid}.jsonl"), "a")
for epoch in range(2):
    sampler.set_epoch(epoch)
    for i, (ids, x) in enumerate(loader):
        depoch = sampler.epoch
        opt.zero_grad(); loss = model(x).pow(2).mean(); loss.backward(); opt.step()
        kept = not ctl.update_skipped  # after backward: this batch trains (not padding, not stale)
        log.write(json.dumps({"kind": "batch", "uid": ctl.uid, "depoch": depoch, "kept": kept,
                              "ids": ids.tolist()}) + "\n")
        log.flush()
        if (i + 1) % cfg["every"] == 0:
            dra.step(loss)
            if cfg.get("twice"):
                dra.step(loss.item())  # a logging helper's second call
log.write(json.dumps({"kind": "final", "uid": ctl.uid, "digest": ctl.state_digest()}) + "\n")
log.close()
'''


def test_a_loop_calling_dra_step_every_third_batch_trains_every_sample_once_across_epochs(tmp_path):
    """10 steps a data epoch: epoch 0's last step and epoch 1's first call no dra.step. The missed
    step was counted at the next backward, after the next pass had begun: against the new epoch's
    position, so epoch 1's first step was trained twice and its third never (6 samples each way,
    silently). It is now counted before the next pass begins."""
    code, out, records = run_logged_script(tmp_path, EVERY_SCRIPT, 3, {"policy": "none", "fault_timeout_s": 10},
                                           {"n": 60, "every": 3}, 90)
    assert code == 0, out[-4000:]
    for e in range(2):
        seen = Counter(i for r in records if r["kind"] == "batch" and r["kept"] and r["depoch"] == e for i in r["ids"])
        assert sorted(seen.elements()) == list(range(60)), (e, sorted(k for k, v in seen.items() if v > 1),
                                                           sorted(set(range(60)) - set(seen)))
    finals = [r for r in records if r["kind"] == "final"]
    assert len(finals) == 3 and len({r["digest"] for r in finals}) == 1, finals


def test_dra_step_called_twice_for_one_batch_is_named(tmp_path):
    code, out, _ = run_logged_script(tmp_path, EVERY_SCRIPT, 2, {"policy": "none", "fault_timeout_s": 10},
                                     {"n": 24, "every": 1, "twice": True}, 90)
    assert code != 0
    assert "dra.step called again for the batch its previous call (step 0) committed" in out, out[-3000:]


STREAMED = r"""
import json, os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset
import dra.elastic as de

cfg = json.loads(os.environ["CFG"])
dist.init_process_group("gloo")
data = [(torch.randn(4), torch.randn(1)) for _ in range(24)]

class Stream(IterableDataset):  # streams the training sampler's ids: the DataLoader never sees the sampler
    def __init__(self, sampler):
        self.sampler = sampler
    def __iter__(self):
        return (data[int(i)] for i in self.sampler)

net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
sampler = de.DistributedSampler(data, seed=0)
model = de.DistributedDataParallel(net, opt, sampler)
for xb, yb in DataLoader(Stream(sampler), batch_size=4):
    pass
"""


def test_a_training_sampler_streamed_by_an_iterable_dataset_is_refused_naming_it(tmp_path: Path) -> None:
    """Outside review 6: the error asked for "the per-rank batch first" without saying where the
    sampler was used; it now names the IterableDataset and the two forms that work."""
    code, logs, _ = run_logged_script(tmp_path, STREAMED, 2, {"policy": "none"}, {}, timeout=60)
    assert code != 0, logs[-2000:]
    assert "no DataLoader(sampler=...) holds it (one made later by a framework, an IterableDataset" in logs, logs[-2000:]
