"""Training loops of third-party scripts that the other tests do not train, run under `dra run`
with real processes and real Gloo: a world of 2 grows to 3 at step 5 and the process with uid 1 is
killed -9 at step 12. Each either trains with every sample once per data epoch and bit-identical
parameters, buffers and optimizer state on the surviving ranks, or is refused by name before it
diverges (docs/guide/compatibility.md, "Limits of the drop-in").

- ``torch.compile`` of the model before the wrapper, and of the wrapper: works; with the
  ``aot_eager`` backend the parameters are bit for bit those of the eager run, with inductor the
  loss follows it;
- a GAN with one optimizer (a parameter group per model), the discriminator on ``fake.detach()``,
  the generator's loss through the frozen discriminator, one backward; a WGAN-GP critic whose
  gradient penalty is a double backward (``create_graph=True``); two forwards of the wrapper before
  one backward (a Siamese loss): work (the GAN's two optimizers and two backwards are refused,
  tests/python/test_outside_scripts.py);
- two losses with two ``backward()`` calls (``retain_graph=True``) before one optimizer step: was
  refused as "gradient accumulation without no_sync()", whose fix (no_sync) is refused in turn; now
  refused as a second backward on the same batch, naming ``(loss1 + loss2).backward()``;
- activation checkpointing: ``use_reentrant=False`` worked; ``use_reentrant=True`` around the last
  layer crashed at the first step (the reduction ended with the checkpoint's nested backward, and
  the rest of the gradients started another one); now bit-identical to the eager run;
- ``torch.autocast("cpu", dtype=torch.bfloat16)``: works;
- a new head assigned mid-run, ``model.fc = nn.Linear(...)`` or ``model.fc.weight = nn.Parameter(...)``
  mid-run, ``optimizer.add_param_group`` mid-run: the new parameters were stepped unreduced (each rank with its own gradient) and a joiner
  crashed on the world's state; now refused by name at the next forward or optimizer step;
- BatchNorm in train mode with ``model.eval()`` / ``torch.no_grad()`` validation passes between
  steps: works (running statistics are the world's mean at every step, a joiner receives them):
  every rank computes the same validation loss.

Every process carries an environment token; whatever still runs at the end is killed.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pytest
from _elastic_harness import SKLEARN_PRELOAD, STATE_DIGEST, run_logged_script

pytestmark = pytest.mark.timeout(150)

SCRIPT = r'''
import hashlib, json, os, signal, time
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
mode, kill = cfg["mode"], cfg.get("kill")  # kill: [uid, step], that process is killed -9 there
d = load_digits()
X, Y = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)
DS = TensorDataset(X, Y, torch.arange(len(Y)))
LOG = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")

def rec(**kw):
    LOG.write(json.dumps(kw) + "\n"); LOG.flush()

''' + STATE_DIGEST + r'''
class Net(torch.nn.Module):
    def __init__(self, bn=False):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 32), *([torch.nn.BatchNorm1d(32)] if bn else []), torch.nn.Tanh())
        self.mid = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh())
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = self.body(x)
        if mode == "ckpt_reentrant":
            h = torch.utils.checkpoint.checkpoint(self.mid, h, use_reentrant=True)
        elif mode == "ckpt":
            h = torch.utils.checkpoint.checkpoint(self.mid, h, use_reentrant=False)
        else:
            h = self.mid(h)
        if mode == "ckpt_reentrant_last":  # the first gradients come from inside a nested backward
            return torch.utils.checkpoint.checkpoint(self.fc, h, use_reentrant=True)
        return self.fc(h)

torch.manual_seed(0)
net = Net(bn=mode == "bn_eval")
if mode in ("gan", "gp"):
    class GAN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.G = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64), torch.nn.Sigmoid())
            self.D = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
        def forward(self, z):
            return self.G(z)
    net = GAN()
    opt = torch.optim.Adam([{"params": net.G.parameters(), "lr": 2e-4, "betas": (0.5, 0.9)},
                            {"params": net.D.parameters(), "lr": 1e-4, "betas": (0.5, 0.9)}])
elif mode == "add_group":
    opt = torch.optim.SGD([*net.mid.parameters(), *net.fc.parameters()], lr=0.1, momentum=0.9)
else:
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
sampler = de.DistributedSampler(DS, seed=0)
loader = DataLoader(DS, batch_size=32, sampler=sampler)
if mode == "compile_inner":
    net_c = torch.compile(net, backend=cfg.get("backend", "inductor"))
    model = de.DistributedDataParallel(net_c, opt, sampler)
else:
    model = de.DistributedDataParallel(net, opt, sampler)
if mode == "compile_outer":
    model_c = torch.compile(model, backend=cfg.get("backend", "inductor"))
ctl = model.controller
if cfg.get("wait_candidates") and ctl.step_index == 0:
    # The scheduled grow finds the standby registered (on a loaded host its start-up, torch's import
    # included, outlasted the job once and the grow never came); waits on the store only.
    until = time.monotonic() + 90
    while len(ctl.registered_candidates()) < cfg["wait_candidates"] and time.monotonic() < until:
        time.sleep(0.05)
val = list(range(0, len(DS), 7))  # a validation set every rank evaluates whole
for epoch in ctl.epochs(cfg.get("epochs", 2)):
    for x, y, ids in loader:
        if [ctl.uid, ctl.step_index] == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        if mode in ("gan", "gp"):
            bce = F.binary_cross_entropy_with_logits
            fake = model(torch.randn(len(x), 8))
            d_real, d_fake = net.D(x), net.D(fake.detach())
            if mode == "gan":
                d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
            else:  # WGAN-GP: the critic's gradient penalty, a double backward
                a = torch.rand(len(x), 1)
                mix = (a * x + (1 - a) * fake.detach()).requires_grad_(True)
                g, = torch.autograd.grad(net.D(mix).sum(), mix, create_graph=True)
                d_loss = d_fake.mean() - d_real.mean() + 10 * ((g.norm(dim=1) - 1) ** 2).mean()
            net.D.requires_grad_(False)
            g_out = net.D(fake)
            net.D.requires_grad_(True)
            g_loss = bce(g_out, torch.ones_like(g_out)) if mode == "gan" else -g_out.mean()
            loss = d_loss + g_loss
            loss.backward()
        elif mode == "two_losses":
            out = model(x)
            l1, l2 = F.cross_entropy(out, y), 1e-3 * out.pow(2).mean()
            l1.backward(retain_graph=True); l2.backward()
            loss = l1 + l2
        elif mode == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = F.cross_entropy(out.float(), y)
            loss.backward()
        elif mode == "siamese":  # two forwards of the wrapper, one loss over both, one backward
            z1, z2 = model(x), model(x + 0.05 * torch.randn_like(x))
            loss = F.cross_entropy(z1, y) + F.cross_entropy(z2, y) + 0.1 * (z1 - z2).pow(2).mean()
            loss.backward()
        elif mode == "ckpt_whole":  # the wrapper checkpointed whole: its forward runs again inside the backward
            loss = F.cross_entropy(torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False), y)
            loss.backward()
        else:
            loss = F.cross_entropy((model_c if mode == "compile_outer" else model)(x), y)
            loss.backward()
        opt.step()
        st = dra.step(loss)
        rec(epoch=epoch, step=st.step, committed=st.committed, ids=ids.tolist(), loss=loss.item(), world=st.loss)
        if mode == "bn_eval" and st.step % 5 == 0:
            model.eval()
            with torch.no_grad():
                vl = F.cross_entropy(model(X[val]), Y[val]).item()
            model.train()
            rec(val=vl, step=st.step)
        if mode == "new_head" and st.step == cfg.get("at", 8):
            net.head2 = torch.nn.Linear(32, 10)
            opt.add_param_group({"params": net.head2.parameters()})
        if mode == "add_group" and st.step == cfg.get("at", 8):  # the body joins the optimizer (fine-tuning)
            opt.add_param_group({"params": net.body.parameters(), "lr": 0.01})
        if mode == "replace_weight" and st.step == cfg.get("at", 8):  # a parameter replaced, not copied into
            net.fc.weight = torch.nn.Parameter(torch.zeros(10, 32))
        if mode == "replace_fc" and st.step == cfg.get("at", 8):  # a head re-initialised by assignment
            net.fc = torch.nn.Linear(32, 10)
rec(final=True, member=ctl.rank >= 0, uid=ctl.uid, model=digest(net.state_dict()), opt=digest(opt.state_dict()))
'''

# 2 -> 3 at step 5, then uid 1 is killed -9 at step 12: the survivors (uids 0 and 2) finish.
GROW_KILL = {"policy": "none", "start_size": 2, "resize_schedule": {"5": 3}}


def _run(tmp_path: Path, mode: str, nproc: int = 3, options: dict | None = None, fault_timeout_s: float | None = None,
         store_timeout_s: float | None = None, **cfg) -> tuple[int, str, list[dict]]:
    out = tmp_path / mode
    out.mkdir()
    cfg = {"mode": mode, "kill": [1, 12] if options is None else None, "wait_candidates": 1 if options is None else 0,
           **cfg}
    options = options or GROW_KILL
    if fault_timeout_s is not None:
        options = {**options, "fault_timeout_s": fault_timeout_s}
    if store_timeout_s is not None:
        options = {**options, "store_timeout_s": store_timeout_s}
    # The fork server imports sklearn once (dra run --preload): each worker forked from it skips
    # the import (1.6 s of CPU), and the suite's 17 jobs start some 70 workers.
    code, logs, records = run_logged_script(out, SCRIPT, nproc, options, cfg, timeout=120, launcher_args=SKLEARN_PRELOAD)
    assert code != -1, f"{mode}: still running after 120 s\n{logs[-4000:]}"
    return code, logs, records


def _trained(code: int, logs: str, records: list[dict], members: int = 2) -> list[dict]:
    """The job ended well after its grow and its kill, every sample was committed once per data
    epoch, and the members' parameters, buffers and optimizer state are bit-identical; returns
    the members' final records."""
    assert code == 0, logs[-4000:]
    events = logs.replace(" ", "")
    assert '"event":"resize"' in events and '"event":"fault"' in events, "the grow and the kill happened"
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        if r.get("committed"):
            seen[r["epoch"]].update(r["ids"])
    for epoch in range(2):
        assert sorted(seen[epoch]) == list(range(1797)) and max(seen[epoch].values()) == 1, f"epoch {epoch}"
    finals = [r for r in records if r.get("final") and r["member"]]
    assert sorted(r["uid"] for r in finals) == [0, 2], "the joiner is among the survivors"
    for key in ("model", "opt"):
        assert len({r[key] for r in finals}) == 1, f"{key} differs between the ranks"
    return finals


def _world_losses(records: list[dict]) -> list[float]:
    """The world's mean loss of each committed step (rank 0's records: uid 0 survives), in order."""
    by_step = {r["step"]: r["world"] for r in records if r.get("committed") and r["world"] == r["world"]}
    return [by_step[k] for k in sorted(by_step)]


@pytest.fixture(scope="module")
def eager(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[float]]:
    """The plain eager loop under the same grow and kill: its final state and world losses."""
    code, logs, records = _run(tmp_path_factory.mktemp("eager"), "eager")
    finals = _trained(code, logs, records)
    losses = _world_losses(records)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses  # it learns
    return finals[0], losses


@pytest.mark.parametrize(("where", "backend"), [("inner", "aot_eager"), ("outer", "aot_eager"), ("inner", "inductor")])
def test_torch_compile_before_or_after_the_wrapper_trains_as_the_eager_loop(tmp_path: Path, eager, where: str,
                                                                            backend: str) -> None:
    """``torch.compile(model)`` wrapped by dra, or ``torch.compile`` of dra's wrapper: the gradient
    hooks fire on the compiled graph's parameters as in eager mode."""
    # The joiner compiles at its first step while the members wait in that step's reduction: on a
    # loaded host (load 5+) that outlasted the default fault_timeout_s (3 s) and made a fault of a
    # slow joiner (it also split that step's outcome, fixed since: tests/python/test_step_outcome_agreed.py).
    # Inductor's first compile (C++ kernels) took over 30 s on a fresh clone's loaded host: a joiner's
    # bounded wait on the store (store_timeout_s, 30 s) ran out and the grow never came.
    finals = _trained(*(result := _run(tmp_path, f"compile_{where}", backend=backend, fault_timeout_s=15.0,
                                       store_timeout_s=90.0 if backend == "inductor" else None)))
    if backend == "aot_eager":  # the same kernels as eager: the same bits
        assert finals[0]["model"] == eager[0]["model"] and finals[0]["opt"] == eager[0]["opt"]
    else:
        losses = _world_losses(result[2])
        assert len(losses) == len(eager[1])
        assert abs(sum(losses[-5:]) - sum(eager[1][-5:])) / 5 < 0.05, (losses[-5:], eager[1][-5:])


@pytest.mark.parametrize("mode", ["gan", "gp", "siamese"])
def test_a_gan_a_wgan_gp_double_backward_and_two_forwards_stay_identical(tmp_path: Path, mode: str) -> None:
    """A GAN: one optimizer with a group per model, D on fake.detach(), G's loss through the frozen
    D, one backward per batch; a WGAN-GP critic adds a gradient penalty taken with
    create_graph=True (torch.autograd.grad to the input: no parameter gradient, so no reduction,
    until the one backward differentiates it again); a Siamese loss runs the wrapper twice (two
    views of the batch) before one backward."""
    code, logs, records = _run(tmp_path, mode)
    _trained(code, logs, records)
    assert all(math.isfinite(x) for x in _world_losses(records))


def test_two_backwards_before_one_optimizer_step_are_refused_naming_the_summed_loss(tmp_path: Path) -> None:
    """loss1.backward(retain_graph=True); loss2.backward(); optimizer.step(): refused at the second
    backward, before it reduces anything. Before, it was refused as "gradient accumulation without
    no_sync()", whose fix (the first backward under no_sync()) is refused in turn."""
    code, logs, records = _run(tmp_path, "two_losses", nproc=2, options={"policy": "none"})
    assert code == 1, logs[-4000:]
    assert "a second backward that reduces gradients on the same batch" in logs, logs[-4000:]
    assert "(loss1 + loss2).backward()" in logs and "without no_sync()" not in logs, logs[-4000:]
    assert not [r for r in records if r.get("committed")]


@pytest.mark.parametrize("mode", ["ckpt", "ckpt_reentrant", "ckpt_reentrant_last", "ckpt_whole"])
def test_activation_checkpointing_trains_as_the_eager_loop(tmp_path: Path, eager, mode: str) -> None:
    """torch.utils.checkpoint around the middle layer (use_reentrant False and True), reentrant
    around the last one, and (non-reentrant) around dra's wrapper, whose forward then runs again
    inside the backward. Reentrant around the last layer, the first gradients come inside the
    checkpoint's nested backward: the reduction ended with that nested backward, and the gradients
    that came after it started another (the job crashed at its first step, "gradient accumulation
    without no_sync()")."""
    finals = _trained(*_run(tmp_path, mode))
    assert finals[0]["model"] == eager[0]["model"] and finals[0]["opt"] == eager[0]["opt"]


def test_a_bfloat16_autocast_forward_trains_as_the_eager_loop(tmp_path: Path, eager) -> None:
    code, logs, records = _run(tmp_path, "autocast")
    _trained(code, logs, records)
    losses = _world_losses(records)
    assert abs(sum(losses[-5:]) - sum(eager[1][-5:])) / 5 < 0.05, (losses[-5:], eager[1][-5:])


@pytest.mark.parametrize(("mode", "message"), [
    ("new_head", "dra: the model's parameters changed after dra.elastic.init / DistributedDataParallel (new: "
                 "'head2.weight', 'head2.bias')"),
    ("replace_fc", "dra: the model's parameters changed after dra.elastic.init / DistributedDataParallel (new: "
                   "'fc.weight', 'fc.bias', 2 replaced or removed)"),
    ("replace_weight", "dra: the model's parameters changed after dra.elastic.init / DistributedDataParallel (new: "
                       "'fc.weight', 1 replaced or removed)"),
    ("add_group", "dra: the optimizer's (SGD) parameter groups changed after dra.elastic.init (parameters per "
                  "group [4], now [4, 2]"),
])
def test_a_model_or_optimizer_changed_mid_run_is_refused_by_name(tmp_path: Path, mode: str, message: str) -> None:
    """At step 8 the script assigns a new head (and adds its parameters to the optimizer), assigns a
    new model.fc or a new model.fc.weight, or adds the body to the optimizer (add_param_group). Before, the new parameters
    were stepped unreduced (each rank with its own gradient: the ranks diverged silently) and a
    process joining later crashed on the world's state. Now the next forward (or optimizer step)
    raises on every rank, before it changes anything; the steps before it are committed."""
    code, logs, records = _run(tmp_path, mode, nproc=2, options={"policy": "none"})
    assert code == 1, logs[-4000:]
    assert message in logs, logs[-4000:]
    assert "Build every part before wrapping" in logs or "Give the optimizer every group" in logs
    assert max(r["step"] for r in records if r.get("committed")) == 8


def test_batchnorm_with_eval_passes_between_steps_is_the_same_on_every_rank(tmp_path: Path) -> None:
    """BatchNorm in train mode (its running statistics the world's mean at every step, received by
    the joiner), and every 5 steps model.eval() and a validation pass under torch.no_grad(): every
    member computes the same validation loss, and the loss falls."""
    code, logs, records = _run(tmp_path, "bn_eval")
    _trained(code, logs, records)
    vals: dict[int, set[float]] = collections.defaultdict(set)
    for r in records:
        if "val" in r:
            vals[r["step"]].add(r["val"])
    assert len(vals) > 5 and all(len(v) == 1 for v in vals.values()), vals
    first, last = (next(iter(vals[k])) for k in (min(vals), max(vals)))
    assert last < 0.5 * first, (first, last)
