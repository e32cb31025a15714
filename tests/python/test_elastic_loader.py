"""dra.elastic.DistributedSampler behind a DataLoader with worker processes (batches prefetched
for a world that then changes), and the DDP script port of docs/guide/elastic.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _elastic_harness import Job, check_exactly_once

import dra.elastic as de

ROOT = Path(__file__).resolve().parents[2]
LOADER_WORKER = Path(__file__).resolve().parent / "elastic_workers" / "loader_worker.py"
pytestmark = pytest.mark.timeout(300)


def test_prefetched_batches_of_a_changed_world_are_dropped_and_every_sample_is_seen_once(tmp_path):
    # 3 processes, 2 DataLoader workers each prefetching 2 batches: a grow at step 5 and a shrink
    # at step 12 land while stale batches are in flight; per-rank batch 4, so the global batch is 12.
    job = Job(tmp_path, 3, start_size=2, schedule={"5": 3, "12": 1}, epochs=2, dataset_size=150, batch_size=4,
              workers=2, prefetch=2)
    for r in range(3):
        job.start(f"r{r}", RANK=r, worker=LOADER_WORKER)
    codes = job.wait(240)
    assert codes == {"r0": 0, "r1": 0, "r2": 0}, [job.output(n)[-3000:] for n in codes]
    sizes = [(e["event"], e["after"]) for e in job.events()]
    assert sizes == [("start", 2), ("resize", 3), ("resize", 1)]
    assert all(e["params_identical"] for e in job.events())
    check_exactly_once(job, 150, 2)
    finals = {r["uid"]: r for r in job.records("final")}
    assert finals[0]["step"] == 2 * -(-150 // 12)  # every step of both epochs committed once


def test_distributed_sampler_takes_torch_arguments_and_the_per_rank_batch(monkeypatch):
    from dra.elastic import _following

    # Outside any controller: one that an earlier test in this process left followed is not followed.
    monkeypatch.setattr(_following, "FOLLOWED", [None])
    monkeypatch.setenv("WORLD_SIZE", "4")
    data = list(range(100))
    monkeypatch.setenv("RANK", "0")
    s = de.DistributedSampler(data, shuffle=False, seed=3)
    assert len(s) == 25  # outside the controller: torch's num_samples (100 over WORLD_SIZE 4)
    with pytest.raises(ValueError, match="batches"):
        s.indices()
    batches = s.batches(8)
    assert batches.sampler is s and s.global_batch == 32 and len(batches) == 4  # 32 x 3, then 4 left
    assert s.indices().tolist() == list(range(32))  # shuffle=False: index order; one rank holds all
    # num_replicas/rank as torch's, for a sampler the controller does not follow (an eval loader's)
    assert list(de.DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)) == list(range(1, 100, 2))
    with pytest.raises(ValueError, match="batch_size"):
        de.DistributedSampler(data).batches(0)
    with pytest.raises(ValueError, match="dataset"):
        de.DistributedSampler(iter(data))


def _torchrun(script: Path, tmp_path: Path, *args: str, nproc: int = 2, env: dict | None = None) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--standalone",
           "--max-restarts=0", str(script), *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(cmd, cwd=tmp_path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def test_the_ported_ddp_script_runs_and_resizes_under_torchrun(tmp_path):
    # fault_timeout_s: a joiner stalled 3 s (the default) on a loaded host turned the resize into a
    # fault and its recovery (seen once on a fresh clone); this test is about resizing.
    options = {"policy": "none", "start_size": 1, "resize_schedule": {"3": 2, "30": 1}, "events_path": "events.jsonl",
               "fault_timeout_s": 15.0}
    out = _torchrun(ROOT / "examples/ddp/train_dra.py", tmp_path, "--epochs", "2", "--workers", "2", "--out", "model",
                    env={"DRA_OPTIONS": json.dumps(options)})
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith('{"epoch"')]
    assert [e["epoch"] for e in epochs] == [0, 1]  # printed once per epoch, by the rank-0 process of the moment
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["after"]) for e in events] == [("start", 1), ("resize", 2), ("resize", 1)]
    assert (tmp_path / "model" / "model-1.pt").exists()
    assert torch.load(tmp_path / "model" / "model-1.pt")["0.weight"].shape == (64, 64)


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


def test_the_readme_status_example_runs_alone_and_under_torchrun(tmp_path):
    """dra.step returns one StepStatus: its signals and decision work in one process and under
    torchrun alike (the README's example, run as written)."""
    script = tmp_path / "readme_example.py"
    script.write_text(_readme_block("Under torchrun"))
    alone = subprocess.run([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert alone.returncode == 0, alone.stdout[-3000:]
    both = alone.stdout + _torchrun(script, tmp_path)
    lines = [line for line in both.splitlines() if line.startswith("step ")]
    assert lines and all(" phase " in line and " decision " in line for line in lines), both[-3000:]


def test_padding_batches_have_the_usual_size_so_batch_norm_models_train_with_loader_workers(tmp_path):
    """At an epoch's end, with DataLoader workers, the sampler pads with batches that are trained
    locally and dropped. They held one sample, which a BatchNorm1d model cannot train on: a ported
    script with num_workers=1 failed at its first epoch's end ("Expected more than 1 value per
    channel when training"). Padding now has the usual per-rank size."""
    script = tmp_path / "bn.py"
    script.write_text(
        "import torch, dra, dra.elastic as de\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "torch.manual_seed(0)\n"
        "ds = TensorDataset(torch.randn(120, 6), torch.randint(0, 2, (120,)))\n"
        "model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "sampler = de.DistributedSampler(ds, seed=0)\n"
        "loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=1)\n"
        "ctl = de.init(model, opt, sampler, policy='none')\n"
        "for ep in ctl.epochs(2):\n"
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(ctl.model(x), y)\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        dra.step(loss)\n"
        "print('steps', ctl.step_index)\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "steps 16" in proc.stdout, proc.stdout[-3000:]  # 120 / 16 = 7.5: 8 steps an epoch, 2 epochs
