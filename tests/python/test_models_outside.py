"""Model and optimizer setups of third-party scripts that the other tests do not train, run under
`dra run` with real processes and real Gloo (a grow, a joiner, a kill -9): each either trains with
every sample once per data epoch and bit-identical parameters, buffers, optimizer and scheduler
state on every rank, or is refused by name before it trains (docs/guide/compatibility.md, "Limits of
the drop-in").

- a buffer the forward assigns anew (``self.ema = 0.9 * self.ema + ...``, not in place): the
  controller kept averaging the replaced tensor, and each rank's new one followed its own batches
  (the ranks' states drifted apart); now the world's mean at every step;
- a backbone frozen at the start and unfrozen mid-run (``requires_grad_(True)``): its gradients
  were never reduced (each rank stepped with its own: the ranks diverged), and a process joining
  after the unfreeze kept its script's frozen backbone (the world's reduction and its own differed
  in size: it crashed); now reduced from the unfreeze on, and a joiner takes the world's
  ``requires_grad``;
- a part frozen mid-run (``requires_grad_(False)``): it was given zero gradients, which SGD's
  momentum and weight decay still moved; now it stays exactly as it was frozen;
- a language-model-like net (tied input/output embedding, bfloat16 parameters, a ``LazyLinear``
  initialised by a forward before wrapping, AdamW with parameter groups, OneCycleLR given as
  ``scheduler=``) across a grow and a kill -9 of a worker: works (a guard: the most state of any
  test here, in three dtypes, travels to a joiner and survives a fault);
- an LR scheduler stepping the optimizer but not given to dra: a joiner's schedule restarted and
  the ranks diverged; now refused at init, or at the optimizer's first step when built after it;
- an uninitialised lazy module and an ``nn.Embedding(sparse=True)``: refused at init by name (the
  sparse one crashed at the first reduction of a grown world with "reshape is not implemented for
  sparse tensors"); a sparse gradient from ``F.embedding(..., sparse=True)``: refused at its
  backward, naming the parameter.

Every process carries an environment token; whatever still runs at the end is killed.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from _elastic_harness import SKLEARN_PRELOAD, STATE_DIGEST

import dra.elastic as de
from dra.testing import kill_tagged, tagged_processes

pytestmark = pytest.mark.timeout(120)

SCRIPT = r'''
import hashlib, json, os, signal, sys
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

OUT, mode = os.environ["OUT"], sys.argv[1]
kill = json.loads(os.environ.get("KILL", "null"))  # [uid, step]: that process is killed -9 there
d = load_digits()
X, Y = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)
DS = TensorDataset(X, Y, torch.arange(len(Y)))
REC = open(os.path.join(OUT, f"rec-{os.getpid()}.jsonl"), "a")

def rec(**kw):
    REC.write(json.dumps(kw) + "\n"); REC.flush()

''' + STATE_DIGEST + r'''
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh())
        self.head = torch.nn.Linear(32, 10)
        self.register_buffer("ema", torch.zeros(32))  # an EMA of the features
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))  # a counter, in place

    def forward(self, x):
        h = self.backbone(x)
        if self.training:
            self.ema = 0.9 * self.ema + 0.1 * h.detach().mean(0)  # assigned anew, as much user code does
            self.seen += 1
        return self.head(h)

class LM(torch.nn.Module):
    """Tied input/output embedding over the 17 pixel values, a lazy head."""
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(17, 16)
        self.proj = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(16, 17, bias=False)
        self.out.weight = self.emb.weight
        self.head = torch.nn.LazyLinear(10)

    def forward(self, x):
        h = torch.tanh(self.proj(self.emb((x * 16).long()).mean(1)))
        return self.head(self.out(h))

torch.manual_seed(0)
sched = None
if mode == "lm":
    net = LM()
    with torch.no_grad():  # the lazy head takes its shape (torch's DDP wants it so as well)
        net(X[:2])
    net.to(torch.bfloat16)
    decay = [p for n, p in net.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in net.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}], lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[2e-2, 5e-3], total_steps=200)
elif mode == "sparse_functional":  # a sparse gradient that no nn.Embedding(sparse=True) announces
    class Sparse(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(17, 10) * 0.1)

        def forward(self, x):
            return torch.nn.functional.embedding((x * 16).long(), self.table, sparse=True).mean(1)
    net = Sparse()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
else:
    net = Net()
    if mode == "unfreeze":
        net.backbone.requires_grad_(False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
sampler = de.DistributedSampler(DS, seed=0)
loader = DataLoader(DS, batch_size=32, sampler=sampler)
model = de.DistributedDataParallel(net, opt, sampler, **({"scheduler": sched} if mode == "lm" else {}))
ctl = model.controller
if mode == "scheduler_after":
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
frozen_at = None
for epoch in ctl.epochs(2):
    for x, y, ids in loader:
        if [ctl.uid, ctl.step_index] == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if mode == "lm":
            ctl.scheduler.step()
        elif sched is not None:
            sched.step()
        st = dra.step(loss)
        rec(epoch=epoch, committed=st.committed, ids=ids.tolist())
        # Events seen by the members of step 8 only (a process joining later never sees them).
        if mode == "unfreeze" and st.step == 8:
            net.backbone.requires_grad_(True)
        if mode == "freeze" and st.step == 8:
            frozen_at = digest(net.backbone.state_dict())
            net.backbone.requires_grad_(False)
rec(final=True, member=ctl.rank >= 0, uid=ctl.uid, model=digest(net.state_dict()), opt=digest(opt.state_dict()),
    sched=digest(sched.state_dict()) if sched is not None else None, frozen_at=frozen_at,
    backbone=digest(net.backbone.state_dict()) if hasattr(net, "backbone") else None,
    trainable=[n for n, p in net.named_parameters() if p.requires_grad], dtypes=sorted({str(p.dtype) for p in net.parameters()}))
'''


def _run(tmp_path: Path, mode: str, nproc: int = 2, options: dict | None = None, kill: list[int] | None = None,
         timeout: float = 90) -> tuple[int, str, list[dict]]:
    """`dra run --nproc-per-node nproc` of SCRIPT in `mode`; (exit code, every worker's log, records)."""
    out = tmp_path / mode
    out.mkdir()
    (out / "train.py").write_text(SCRIPT)
    token = uuid.uuid4().hex
    env = dict(os.environ, OUT=str(out), DRA_TEST_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONFAULTHANDLER="1", KILL=json.dumps(kill))
    for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
              "TORCHELASTIC_RUN_ID", "DRA_JOIN", "DRA_STOP_ON_SIGTERM", "DRA_LAUNCHER"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "dra", "run", "--nproc-per-node", str(nproc), "--log-dir", str(out / "logs"),
           "--rdzv-id", mode, *SKLEARN_PRELOAD, "--options", json.dumps(options or {"policy": "none"}), str(out / "train.py"), mode]
    try:
        code = subprocess.run(cmd, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = None
        for pid in tagged_processes("DRA_TEST_TOKEN", token):  # each thread's stack into its log
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        time.sleep(2.0)
    finally:
        kill_tagged("DRA_TEST_TOKEN", token)
    logs = "".join(p.read_text(errors="replace") for p in sorted((out / "logs").glob("*.log")))
    assert code is not None, f"{mode}: still running after {timeout} s (stacks at SIGABRT in the logs)\n{logs[-6000:]}"
    records = [json.loads(line) for f in out.glob("rec-*.jsonl") for line in f.read_text().splitlines()]
    return code, logs, records


def _finals(records: list[dict], members: int) -> list[dict]:
    """The members' final records, checked bit-identical: parameters and buffers, optimizer state,
    scheduler state, the trainable parameters."""
    finals = [r for r in records if r.get("final") and r["member"]]
    assert len(finals) == members, [r["uid"] for r in finals]
    for key in ("model", "opt", "sched", "trainable", "dtypes"):
        values = {json.dumps(r[key]) for r in finals}
        assert len(values) == 1, f"{key} differs between the ranks: {values}"
    return finals


def _check_exactly_once(records: list[dict], epochs: int = 2, n: int = 1797) -> None:
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        if r.get("committed"):
            seen[r["epoch"]].update(r["ids"])
    for epoch in range(epochs):
        counts = seen[epoch]
        assert len(counts) == n and max(counts.values()) == 1, (
            f"epoch {epoch}: {n - len(counts)} samples lost, {sum(v - 1 for v in counts.values())} repeated")


GROW = {"policy": "none", "start_size": 1, "resize_schedule": {"10": 2}}
JOIN_AFTER_EVENT = {"policy": "none", "start_size": 2, "resize_schedule": {"15": 3}}  # the event is at step 8


def test_a_buffer_the_forward_assigns_anew_is_the_worlds_mean_on_every_rank(tmp_path: Path) -> None:
    code, logs, records = _run(tmp_path, "buffers", options=GROW)
    assert code == 0, logs[-3000:]
    assert '"event":"resize"' in logs.replace(" ", ""), "the grow happened"
    _check_exactly_once(records)
    _finals(records, members=2)  # the EMA buffer (in 'model') included


@pytest.mark.parametrize("mode", ["unfreeze", "freeze"])
def test_requires_grad_changed_mid_run_is_followed_by_the_reduction_and_reaches_a_joiner(tmp_path: Path,
                                                                                         mode: str) -> None:
    """Two members change the backbone's requires_grad at step 8; a third process joins at step 15
    (its script never sees step 8)."""
    code, logs, records = _run(tmp_path, mode, nproc=3, options=JOIN_AFTER_EVENT)
    assert code == 0, logs[-3000:]
    _check_exactly_once(records)
    finals = _finals(records, members=3)
    has_backbone = any(n.startswith("backbone.") for n in finals[0]["trainable"])
    assert has_backbone == (mode == "unfreeze"), finals[0]["trainable"]
    if mode == "freeze":
        # The frozen backbone is exactly as it was at step 8 (zero gradients with momentum and
        # weight decay moved it), on the members that froze it and on the joiner.
        frozen = {r["frozen_at"] for r in finals if r["frozen_at"] is not None}
        assert len(frozen) == 1 and frozen == {finals[0]["backbone"]}, (frozen, finals[0]["backbone"])


def test_tied_bfloat16_lazy_model_with_adamw_groups_and_onecycle_survives_a_grow_and_a_kill(tmp_path: Path) -> None:
    # 2 -> 3 at step 5, then uid 1 is killed -9 at step 12: the survivors finish, and the state
    # a joiner received (bfloat16 parameters, float32 Adam moments, the schedule) stays identical.
    options = {"policy": "none", "start_size": 2, "resize_schedule": {"5": 3}}
    code, logs, records = _run(tmp_path, "lm", nproc=3, options=options, kill=[1, 12])
    assert code == 0, logs[-3000:]
    assert '"event":"fault"' in logs.replace(" ", ""), "the kill happened"
    _check_exactly_once(records)
    finals = _finals(records, members=2)
    assert finals[0]["dtypes"] == ["torch.bfloat16"]
    assert sorted(r["uid"] for r in finals) == [0, 2], "the joiner is among the survivors"


def test_a_scheduler_not_given_to_dra_is_refused_before_it_trains(tmp_path: Path) -> None:
    """Before the fix the job ran, and the ranks' parameters diverged after a grow: the joiner's
    LambdaLR restarted at step 0. Built before the wrapper, it is refused at init (before anything
    joins a world); built after it, at the optimizer's first step, before that step changes
    anything (on every rank: the job fails, no step commits)."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    sampler = de.DistributedSampler(torch.utils.data.TensorDataset(torch.zeros(4, 4)))
    with pytest.raises(ValueError, match=r"scheduler: an LR scheduler steps the optimizer \(SGD\) but was not given "
                                         r"to dra.*scheduler=scheduler"):
        de.init(model, opt, sampler)
    code, logs, records = _run(tmp_path, "scheduler_after", options={"policy": "none"})
    assert code == 1, logs[-3000:]
    assert "RuntimeError: dra: scheduler: an LR scheduler steps the optimizer (SGD)" in logs, logs[-3000:]
    assert not [r for r in records if r.get("committed")]


def test_a_reduce_on_plateau_scheduler_not_given_to_dra_is_refused_at_init() -> None:
    """ReduceLROnPlateau leaves no mark on the optimizer (it steps on a metric, not with
    optimizer.step), so the check above missed it: a joiner's plateau counter and best metric would
    start afresh and its learning rate part from the world's. Found among the optimizer's holders at
    init; one given as scheduler=, and SequentialLR's own schedulers, are not refused."""
    def parts():
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.zeros(4, 4))
        sampler = de.DistributedSampler(data)
        torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)  # gives the sampler its batch
        return model, opt, sampler

    model, opt, sampler = parts()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(ValueError, match=r"scheduler: an LR scheduler \(ReduceLROnPlateau\) steps the optimizer \(SGD\) "
                                         r"but was not given to dra.*scheduler=scheduler"):
        de.init(model, opt, sampler)
    del plateau
    model, opt, sampler = parts()
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
    chained = torch.optim.lr_scheduler.SequentialLR(opt, [warm, torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)],
                                                    milestones=[2])
    de.init(model, opt, sampler, scheduler=chained).finish()
    model, opt, sampler = parts()
    de.init(model, opt, sampler, scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(opt)).finish()
    # Torch's SWA recipe: a second scheduler besides the one given. The fix names one scheduler.
    model, opt, sampler = parts()
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    swa = torch.optim.swa_utils.SWALR(opt, swa_lr=0.05)
    with pytest.raises(ValueError, match=r"\(SWALR\) steps the optimizer \(SGD\) but was not given to dra \(another "
                                         r"one was\).*combine them into one \(torch.optim.lr_scheduler.SequentialLR"):
        de.init(model, opt, sampler, scheduler=cosine)
    del swa


def test_torchs_own_sampler_is_refused_naming_the_import_to_change() -> None:
    """The port's likeliest slip, torch's DistributedSampler left imported, was refused as "expected
    a dra.elastic.DistributedSampler ..., got DistributedSampler": the same name, no fix."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.zeros(4, 4))
    theirs = torch.utils.data.distributed.DistributedSampler(data, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"got torch\.utils\.data\.distributed\.DistributedSampler; import "
                                         r"DistributedSampler from dra\.elastic instead"):
        de.init(model, opt, theirs)
    with pytest.raises(ValueError, match=r"got None; import DistributedSampler from dra\.elastic"):
        de.init(model, opt, None)


def test_a_sparse_gradient_is_refused_at_its_backward_by_name(tmp_path: Path) -> None:
    # F.embedding(..., sparse=True) on a plain Parameter: nothing to see at init; its backward
    # raises naming the parameter (it failed inside the reduction: "reshape is not implemented
    # for sparse tensors").
    code, logs, records = _run(tmp_path, "sparse_functional", options={"policy": "none"})
    assert code == 1, logs[-3000:]
    assert "RuntimeError: dra: parameter 'table' received a torch.sparse_coo gradient" in logs, logs[-3000:]
    assert not [r for r in records if r.get("committed")]


class _Lazy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.LazyLinear(2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("build", "message"), [
    (_Lazy, "model: 'head.weight' is not initialised yet"),
    (lambda: torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2)),
     "model: '0' (Embedding) has sparse=True"),
    (lambda: torch.nn.EmbeddingBag(10, 4, sparse=True), "model: 'EmbeddingBag' (EmbeddingBag) has sparse=True"),
])
def test_a_model_dra_cannot_reduce_is_refused_at_init_by_name(build, message: str) -> None:
    """Refused before anything joins a world (no store is needed to see it)."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = de.DistributedSampler(torch.utils.data.TensorDataset(torch.zeros(4, 4)))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        de.init(model, opt, sampler)
