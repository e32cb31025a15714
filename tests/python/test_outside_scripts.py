"""Training scripts written the way an outside user writes them, run under `dra run` with real
processes (two workers, a real store, Gloo): the styles that went wrong silently before and now
either work or are refused by name (docs/guide/compatibility.md, "Limits of the drop-in").

- an IterableDataset whose ``__iter__`` loops over the training sampler: with ``num_workers=0``
  every sample once per epoch across a grow; with DataLoader workers it raises (each worker's copy
  of the sampler never saw a commit and yielded the same steps forever: the job never ended);
- a GAN's two backwards on one batch before ``dra.step``: raises (the second was counted as the
  next step, and that step's samples were never trained);
- a second optimizer stepping the model's parameters: raises at its first step (its state did not
  travel to a joiner, and the ranks diverged after a grow); one optimizer with a parameter group
  per part trains, identical on every rank across a grow.

Every process carries an environment token; whatever still runs at the end is killed.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from _elastic_harness import SKLEARN_PRELOAD

from dra.testing import kill_tagged, tagged_processes

pytestmark = pytest.mark.timeout(180)

# What every script shares: digits with sample ids, a record per dra.step and a final digest.
COMMON = '''
import hashlib, json, os, sys
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
import dra, dra.elastic as de

OUT = os.environ["OUT"]
d = load_digits()
X, Y = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)
DS = TensorDataset(X, Y, torch.arange(len(Y)))
REC = open(os.path.join(OUT, f"rec-{os.getpid()}.jsonl"), "a")

def rec(**kw):
    REC.write(json.dumps(kw) + "\\n"); REC.flush()

def digest(module):
    h = hashlib.sha256()
    for v in module.state_dict().values():
        h.update(v.detach().float().numpy().tobytes())
    return h.hexdigest()[:16]
'''

ITERABLE = COMMON + '''
workers = int(sys.argv[1])
sampler = de.ElasticSampler(len(DS), global_batch=48, seed=3)

class Stream(IterableDataset):
    def __iter__(self):
        for ids in sampler:
            ids = torch.as_tensor(ids)
            yield X[ids], Y[ids], ids

loader = DataLoader(Stream(), batch_size=None, num_workers=workers)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
ctl = de.init(net, opt, sampler)
for epoch in ctl.epochs(2):
    for x, y, ids in loader:
        loss = torch.nn.functional.cross_entropy(ctl.model(x), y)
        ctl.optimizer.zero_grad(); loss.backward(); ctl.optimizer.step()
        st = dra.step(loss.item())
        rec(epoch=epoch, committed=st.committed, ids=ids.tolist())
        if st.step > 1000:
            sys.exit("the epoch never ended")
rec(final=True, member=ctl.rank >= 0, digest=digest(net))
'''

GAN = COMMON + '''
mode = sys.argv[1]
sampler = de.DistributedSampler(DS, seed=0)
loader = DataLoader(DS, batch_size=32, sampler=sampler)
torch.manual_seed(0)

class GAN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.G = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64), torch.nn.Sigmoid())
        self.D = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))

    def forward(self, x, z):
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        fake = self.G(z)
        d_loss = bce(self.D(x), torch.ones(len(x), 1)) + bce(self.D(fake.detach()), torch.zeros(len(x), 1))
        if mode == "two_backwards":
            return d_loss, fake
        self.D.requires_grad_(False)
        g_loss = bce(self.D(fake), torch.ones(len(x), 1))
        self.D.requires_grad_(True)
        return d_loss, g_loss

gan = GAN()
if mode == "groups":  # the recipe: one optimizer, a parameter group per part
    opt = torch.optim.Adam([{"params": gan.G.parameters()}, {"params": gan.D.parameters(), "lr": 1e-4}], lr=2e-4)
    optimizers = [opt]
else:
    opt_d = torch.optim.Adam(gan.D.parameters(), lr=1e-4)
    opt_g = torch.optim.Adam(gan.G.parameters(), lr=2e-4)
    opt, optimizers = opt_d, [opt_d, opt_g]
ctl = de.init(gan, opt, sampler)
for epoch in ctl.epochs(2):
    for x, _, ids in loader:
        for o in optimizers:
            o.zero_grad()
        if mode == "two_backwards":  # D's step, then G's, each with a backward of its own
            d_loss, fake = ctl.model(x, torch.randn(len(x), 8))
            d_loss.backward()
            opt_d.step()
            g_loss = torch.nn.functional.binary_cross_entropy_with_logits(gan.D(fake), torch.ones(len(x), 1))
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
        else:
            d_loss, g_loss = ctl.model(x, torch.randn(len(x), 8))
            (d_loss + g_loss).backward()
            for o in optimizers:
                o.step()
        st = dra.step(d_loss + g_loss)
        rec(epoch=epoch, committed=st.committed, ids=ids.tolist())
rec(final=True, member=ctl.rank >= 0, digest=digest(gan))
'''


def _run(tmp_path: Path, name: str, script: str, *args: str, options: dict | None = None,
         timeout: float = 90) -> tuple[int, str, list[dict]]:
    """`dra run --nproc-per-node 2` of the script; (exit code, every worker's log, records)."""
    out = tmp_path / name
    out.mkdir()
    path = out / "train.py"
    path.write_text(textwrap.dedent(script))
    token = uuid.uuid4().hex
    # PYTHONFAULTHANDLER: a worker still running at the timeout gets SIGABRT first and writes
    # every thread's stack into its log, so that a hang says where it hangs.
    env = dict(os.environ, OUT=str(out), DRA_TEST_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1")
    for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
              "TORCHELASTIC_RUN_ID", "DRA_JOIN", "DRA_STOP_ON_SIGTERM", "DRA_LAUNCHER"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "dra", "run", "--nproc-per-node", "2", "--log-dir", str(out / "logs"),
           "--rdzv-id", name, *SKLEARN_PRELOAD]  # each worker imports sklearn
    if options:
        cmd += ["--options", json.dumps(options)]
    try:
        proc = subprocess.run([*cmd, str(path), *args], env=env, cwd=out, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
        for pid in tagged_processes("DRA_TEST_TOKEN", token):
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        time.sleep(2.0)
    finally:
        kill_tagged("DRA_TEST_TOKEN", token)
    logs = "".join(p.read_text(errors="replace") for p in sorted((out / "logs").glob("*.log")))
    assert code is not None, f"{name}: still running after {timeout} s (stacks at SIGABRT in the logs)\n{logs[-6000:]}"
    records = [json.loads(line) for f in out.glob("rec-*.jsonl") for line in f.read_text().splitlines()]
    return code, logs, records


def _check_exactly_once(records: list[dict], epochs: int, n: int = 1797) -> None:
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        if r.get("committed"):
            seen[r["epoch"]].update(r["ids"])
    for epoch in range(epochs):
        counts = seen[epoch]
        assert len(counts) == n and max(counts.values()) == 1, (
            f"epoch {epoch}: {n - len(counts)} samples lost, {sum(v - 1 for v in counts.values())} repeated")
    finals = {r["digest"] for r in records if r.get("final") and r["member"]}
    assert len(finals) == 1, finals


GROW = {"policy": "none", "start_size": 1, "resize_schedule": {"10": 2}}


def test_an_iterable_dataset_over_the_sampler_trains_once_and_in_loader_workers_raises(tmp_path):
    code, logs, records = _run(tmp_path, "iterable", ITERABLE, "0", options=GROW)
    assert code == 0, logs[-3000:]
    _check_exactly_once(records, epochs=2)
    # DataLoader workers iterate copies of the sampler: refused, naming the fix, instead of an
    # epoch that never ends.
    code, logs, _ = _run(tmp_path, "iterable_workers", ITERABLE, "2")
    assert code == 1, logs[-3000:]
    assert "not in the training process" in logs and "batch_sampler=" in logs, logs[-3000:]


def test_a_gans_second_backward_on_the_same_batch_is_refused_not_counted_as_the_next_step(tmp_path):
    code, logs, records = _run(tmp_path, "two_backwards", GAN, "two_backwards")
    assert code == 1, logs[-3000:]
    assert "a second backward that reduces gradients on the same batch" in logs, logs[-3000:]
    assert not [r for r in records if r.get("committed")], "no step may commit"


def test_a_second_optimizer_is_refused_and_one_with_parameter_groups_stays_identical_across_a_grow(tmp_path):
    code, logs, records = _run(tmp_path, "two_optimizers", GAN, "two_optimizers")
    assert code == 1, logs[-3000:]
    assert "that is not the one given to dra.elastic.init" in logs and "G.0.weight" in logs, logs[-3000:]
    code, logs, records = _run(tmp_path, "groups", GAN, "groups", options=GROW)
    assert code == 0, logs[-3000:]
    assert '"event":"resize"' in logs.replace(" ", ""), "the grow happened"
    _check_exactly_once(records, epochs=2)


LONE_MEMBER_DIES = COMMON + '''
import signal
sampler = de.DistributedSampler(DS, seed=0)
loader = DataLoader(DS, batch_size=32, sampler=sampler)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
ctl = de.init(net, opt, sampler)
for epoch in ctl.epochs(3):
    for x, y, ids in loader:
        loss = torch.nn.functional.cross_entropy(ctl.model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        st = dra.step(loss)
        if st.step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # the only member dies: the state is lost
'''


def test_a_candidate_is_told_when_every_process_holding_the_state_is_gone(tmp_path):
    # One member (start_size 1), one candidate waiting to be admitted at step 10; the member is
    # killed at step 5. The candidate was never told and waited until the launcher was stopped;
    # now it withdraws and raises MembershipError naming the dead member, and the job fails.
    code, logs, _ = _run(tmp_path, "lone_member", LONE_MEMBER_DIES, options=GROW, timeout=120)
    assert code not in (0, None), logs[-3000:]
    assert "every process that held the training state left the job" in logs, logs[-3000:]
    # Named dead by its stale heartbeat, or, killed before its first beat was published (a fresh
    # clone's run under load: killed 5.1 s after it started), as having published none once the
    # store's timeout passed.
    assert "process 0 no heartbeat" in logs or "process 0 published no heartbeat" in logs, logs[-3000:]


SAM = COMMON + '''
mode = sys.argv[1]
sampler = de.DistributedSampler(DS, seed=0)
loader = DataLoader(DS, batch_size=32, sampler=sampler)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
model = de.DistributedDataParallel(net, opt, sampler)
ctl = model.controller
for epoch in ctl.epochs(2):
    for x, y, ids in loader:
        params = list(net.parameters())
        if mode == "no_sync":  # SAM's DDP recipe: the first pass's local gradient under no_sync
            with model.no_sync():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
            grads = [p.grad.clone() for p in params]
            opt.zero_grad()
        else:  # the recipe for dra: the first pass's gradient without a backward
            loss = torch.nn.functional.cross_entropy(net(x), y)
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            norm = torch.norm(torch.stack([g.norm() for g in grads]))
            old = [p.detach().clone() for p in params]
            for p, g in zip(params, grads):
                p.add_(0.05 * g / (norm + 1e-12))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p, o in zip(params, old):
                p.copy_(o)
        opt.step(); opt.zero_grad()
        st = dra.step(loss)
        rec(epoch=epoch, committed=st.committed, ids=ids.tolist())
rec(final=True, member=ctl.rank >= 0, digest=digest(net))
'''


def test_sams_second_pass_on_the_batch_a_no_sync_pass_trained_is_refused_and_the_recipe_trains_once(tmp_path):
    # SAM with the first pass under no_sync: the window counted two batches for one (half of every
    # epoch silently never trained); now refused by name, with the recipe.
    code, logs, _ = _run(tmp_path, "sam_no_sync", SAM, "no_sync")
    assert code == 1, logs[-3000:]
    assert "a second backward on the batch a no_sync() backward already trained" in logs, logs[-3000:]
    assert "torch.autograd.grad" in logs, logs[-3000:]
    # The recipe (the first pass's gradient by torch.autograd.grad): every sample once per epoch
    # across a grow, identical states.
    code, logs, records = _run(tmp_path, "sam_recipe", SAM, "autograd", options=GROW)
    assert code == 0, logs[-3000:]
    _check_exactly_once(records, epochs=2)


def test_a_model_still_wrapped_in_torchs_ddp_is_refused_naming_its_module() -> None:
    """torch's DDP left around the module given to dra trained through the first world, then its
    reducer waited on the launch's process group for the script's timeout (30 min by default) and
    died with a Gloo timeout naming neither. Refused at init, naming `.module`."""
    import torch

    from dra._training_objects import check_training_objects

    inner = torch.nn.Linear(2, 1)
    for model, where in ((torch.nn.DataParallel(inner), "model:"),
                         (torch.nn.Sequential(torch.nn.DataParallel(inner)), "model.0:")):
        with pytest.raises(ValueError, match=r"DataParallel.*\.module\)") as e:
            check_training_objects(model, torch.optim.SGD(model.parameters(), lr=0.1), None)
        assert str(e.value).startswith(where), e.value
