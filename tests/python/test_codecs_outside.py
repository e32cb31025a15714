"""Outside review of the gradient codecs (``compress=``) on models the other codec tests do not use:
convolutions with BatchNorm, an nn.Embedding (large first dimension) tied to the output layer (one
Parameter used twice), a frozen layer and one unfrozen mid-training (and, for ``masked``, one
frozen mid-training), a branch that gets no gradient on some steps (differently on each rank), a
0-d, a 1-element and a 1x1 parameter, one large matrix beside many tiny tensors; in float32,
bfloat16 and float16. Every codec the docs list runs through the option a third-party script sets
(``dra run --options '{"compress": ...}'``) in a real elastic world on Gloo, growing 2 -> 3 where a
third process is affordable.

Checked on what the workers logged: the job finishes; every member ends with bit-identical
parameters and buffers and the same shared codec state; the frozen layer is unchanged and the tie
holds; each sample is consumed exactly once per epoch; the loss falls; and the bytes each codec
reports per step are the ones its documented payload gives for this model's tensors (masked at 90 %
sparsity about 10x fewer than dense). Before the fix a parameter unfrozen (or frozen) between steps
took down every worker with "tensor 21 has 8 elements, the codec saw 2400; reduce the same tensors
every step" (top-k, random, fp16, bf16, masked), and PowerSGD silently gave the other tensors'
residuals and warm starts to the wrong ones: the codecs' per-tensor state is now carried over by
parameter (codec_hook::follow_layout). Two more tests pin that down: unfreezing a layer the forward does
not use leaves every other parameter bit-identical to a run that never unfreezes it, and a SIGKILL in
the very step that unfreezes a layer leaves the survivors identical, masks included.

Every process a test starts carries an environment token (run_logged_script) and is killed at the end.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from _elastic_harness import run_logged_script

pytestmark = pytest.mark.timeout(150)

N, EPOCHS, VOCAB = 64, 3, 300
UNFREEZE_AT, FREEZE_AT = 5, 7
# masked: mask updates at steps 3, 6 and 9 on a cubic ramp to 90 % by step 9; sparse steps after 9.
SPARSITY = {"every": 3, "ramp_start": 0, "ramp_steps": 9, "max_sparsity": 0.9, "end_step": 10}

SCRIPT = r'''
import hashlib, json, os, signal, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
N, VOCAB = cfg["n"], cfg["vocab"]
g = torch.Generator().manual_seed(1)
img = torch.randn(N, 1, 6, 6, generator=g)
tok = torch.randint(0, VOCAB, (N,), generator=g)
yreg = img.mean((1, 2, 3)).unsqueeze(1) * 3.0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8)
        self.emb = nn.Embedding(VOCAB, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.late = nn.Linear(8, 8)  # frozen until cfg["unfreeze_at"]
        self.late.requires_grad_(False)
        self.sometimes = nn.Linear(8, 8)  # used on some batches only
        self.scale = nn.Parameter(torch.tensor(1.0))  # 0-d
        self.shift = nn.Parameter(torch.zeros(1))  # 1 element
        self.gate = nn.Parameter(torch.ones(1, 1))  # a 1x1 matrix
        self.tiny = nn.ParameterList([nn.Parameter(torch.full((2,), 0.1 * i)) for i in range(12)])
        self.big = nn.Linear(8, 256)  # the large matrices
        self.back = nn.Linear(256, 8)
        self.reg = nn.Linear(8, 1)
        self.dec = nn.Linear(8, VOCAB)
        self.dec.weight = self.emb.weight  # tied: one Parameter, used twice

    def forward(self, x, t, use_branch):
        h_img = torch.relu(self.bn1(self.conv1(x)))
        h_img = torch.relu(self.bn2(self.conv2(h_img))).mean((2, 3))
        h = self.frozen(h_img) + self.emb(t)
        if cfg.get("late_used", True):
            h = h + self.late(h_img)
        if use_branch:
            h = h + self.sometimes(h)
        h = h * self.scale * self.gate + self.shift + sum(p.sum() for p in self.tiny) * 0.01
        h = h + 0.1 * self.back(torch.relu(self.big(h)))
        return self.dec(h), self.reg(h_img)


torch.manual_seed(int(os.environ.get("RANK", "0")))  # differs per process: the world starts from rank 0's
model = Net()
dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(cfg["dtype"])
if dtype is not None:
    model = model.to(dtype)
    img, yreg = img.to(dtype), yreg.to(dtype)
data = TensorDataset(torch.arange(N), img, tok, yreg)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
sampler = de.DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)
ctl = de.init(model, opt, sampler)
log = open(os.path.join(cfg["out"], f"log-{os.getpid()}.jsonl"), "a")


def digest(tensors):
    return hashlib.sha256(b"".join(t.detach().float().contiguous().numpy().tobytes() for t in tensors)).hexdigest()


def codec():
    c = ctl.compression
    return {"codec": c["codec"], "sent": c["bytes_sent"], "dense": c["bytes_dense"], "sparsity": c["sparsity"],
            "shared": hashlib.sha256(c["shared_state"]).hexdigest()}


def full_loss():
    """The loss over the whole data set, BatchNorm on its running statistics (nothing changes)."""
    model.eval()
    with torch.no_grad():
        logits, r = model(img, tok, True)
        parts = [nn.functional.cross_entropy(logits.float(), tok), nn.functional.mse_loss(r.float(), yreg.float())]
    model.train()
    return [float(v) for v in parts]


frozen_at_start = digest([model.frozen.weight, model.frozen.bias])
loss_at_start = full_loss()
for epoch in ctl.epochs(cfg["epochs"]):
    for ids, xb, tb, yb in loader:
        if ctl.step_index == cfg["unfreeze_at"]:
            model.late.requires_grad_(True)
        if ctl.step_index == cfg.get("freeze_at"):
            model.big.requires_grad_(False)
        use_branch = int(ids[0]) % 2 == 0  # differs between ranks and steps: no gradient on some
        logits, r = ctl.model(xb, tb, use_branch)
        loss = nn.functional.cross_entropy(logits.float(), tb) + nn.functional.mse_loss(r.float(), yb.float())
        ctl.optimizer.zero_grad()
        if [ctl.uid, ctl.step_index] == cfg.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: the others are in this step's reduction
        loss.backward()
        ctl.optimizer.step()
        step, world = ctl.step_index, ctl.world_size
        if dra.step(loss).committed:
            log.write(json.dumps({"kind": "step", "uid": ctl.uid, "step": step, "world": world, "ids": ids.tolist(),
                                  "loss": float(loss), "codec": codec()}) + "\n")
            log.flush()
log.write(json.dumps({
    "kind": "final", "uid": ctl.uid, "rank": ctl.rank, "step": ctl.step_index,
    "loss_at_start": loss_at_start, "loss_at_end": full_loss(),
    "digest": digest(list(model.parameters()) + list(model.buffers())),
    "digest_but_late": digest([p for n, p in model.named_parameters() if not n.startswith("late.")]
                              + list(model.buffers())),
    "frozen_unchanged": digest([model.frozen.weight, model.frozen.bias]) == frozen_at_start,
    "tied": model.dec.weight is model.emb.weight, "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    "trainable": [list(p.shape) for p in model.parameters() if p.requires_grad],
    "zeros": {n: [int((p == 0).sum()), p.numel()] for n, p in model.named_parameters() if p.dim() >= 2},
    "codec": codec()}) + "\n")
log.close()
'''


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))  # C++ llround for x >= 0


def _expected_step_bytes(codec: str, shapes: list[list[int]]) -> int:
    """What docs/guide/sage.md's table gives per rank and step for tensors of these shapes (a 0-d
    tensor counts as one element): the codec's payload, computed here from the rules, not read back."""
    kind, _, arg = codec.partition(":")
    total = 0
    for shape in shapes:
        n = math.prod(shape) if shape else 1
        if kind in ("fp16", "bf16"):
            total += 2 * n
        elif kind == "powersgd":
            if len(shape) < 2:
                total += 4 * n
                continue
            rows, cols = shape[0], n // shape[0]
            r = min(int(arg), rows, cols)
            # small matrices travel uncompressed when they would not shrink 2x (min_compression_rate)
            total += 4 * n if n < 2 * r * (rows + cols) else 4 * r * (rows + cols)
        elif kind == "topk":
            total += 8 * min(n, max(1, _round(float(arg) * n)))  # (index, value) pairs
        elif kind == "random":
            total += 4 * min(n, max(1, _round(float(arg) * n)))
        elif kind == "masked":  # a sparse step at the final target: every tensor keeps round((1 - s) n), >= 1
            total += 4 * min(n, max(1, _round((1.0 - SPARSITY["max_sparsity"]) * n)))
        else:
            raise AssertionError(codec)
    return total


def _run(tmp_path: Path, codec: str, dtype: str, grow: bool, kill: list[int] | None = None,
         nproc: int | None = None, **extra) -> tuple[list[dict], list[dict]]:
    options = {"policy": "none", "compress": codec, "fault_timeout_s": 3}
    if codec == "masked":
        options["sparsity"] = SPARSITY
    if grow:
        options.update(start_size=2, resize_schedule={"4": 3})
    cfg = {"n": N, "vocab": VOCAB, "epochs": EPOCHS, "dtype": dtype, "unfreeze_at": UNFREEZE_AT,
           "freeze_at": FREEZE_AT if codec == "masked" else None, "kill": kill, **extra}
    nproc = nproc or (3 if grow else 2)
    code, out, records = run_logged_script(tmp_path, SCRIPT, nproc, options, cfg, timeout=140)
    assert code == 0, out[-4000:]
    return [r for r in records if r["kind"] == "step"], [r for r in records if r["kind"] == "final"]


# One run per codec, each on a parameter dtype; grow 2 -> 3 (the joiner receives the shared codec
# state) for the three codecs with the most state.
CASES = [
    ("powersgd:2", "float32", True),
    ("topk:0.25", "bfloat16", True),
    ("masked", "float32", True),
    ("random:0.25", "float16", False),
    ("fp16", "bfloat16", False),
    ("bf16", "float16", False),
]


@pytest.mark.parametrize(("codec", "dtype", "grow"), CASES)
def test_codec_on_every_kind_of_tensor(tmp_path: Path, codec: str, dtype: str, grow: bool) -> None:
    steps, finals = _run(tmp_path, codec, dtype, grow)
    members = [f for f in finals if f["rank"] >= 0]
    assert len(members) == (3 if grow else 2), finals
    last = max(s["step"] for s in steps)
    assert all(f["step"] == last + 1 for f in members), members
    if grow:
        assert {s["world"] for s in steps} == {2, 3}, sorted({(s["step"], s["world"]) for s in steps})

    # Bit-identical parameters and buffers (BatchNorm's statistics), the same shared codec state.
    assert len({f["digest"] for f in members}) == 1, members
    assert len({f["codec"]["shared"] for f in members}) == 1, [f["codec"] for f in members]
    for f in members:
        assert f["frozen_unchanged"] and f["tied"], f
        assert f["dtypes"] == [f"torch.{dtype}"], f
        assert f["codec"]["codec"] == codec

    # Exactly once: every sample once per epoch over the world's committed steps.
    seen = Counter(i for s in steps for i in s["ids"])
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {EPOCHS}, seen

    # The loss falls: over the whole data set, the world's start state against the end state. At
    # 90 % sparsity (by step 9 of 24) the tied embedding keeps 30 of its 300 rows' worth of entries
    # and cannot fit the tokens (the cross-entropy part): there the convolutions' regression must fall.
    (ce0, mse0), (ce1, mse1) = members[0]["loss_at_start"], members[0]["loss_at_end"]
    assert all(math.isfinite(v) for v in (ce1, mse1)), members[0]
    if codec == "masked":
        assert mse1 < 0.85 * mse0, (mse0, mse1)
    else:
        assert ce1 + mse1 < 0.8 * (ce0 + mse0), ((ce0, mse0), (ce1, mse1))

    # Bytes per step, rank 0's counter (its codec ran every step), from the trainable tensors' shapes.
    leader = sorted((s for s in steps if s["uid"] == 0), key=lambda s: s["step"])
    per_step = {b["step"]: (b["codec"]["sent"] - a["codec"]["sent"], b["codec"]["dense"] - a["codec"]["dense"])
                for a, b in zip(leader, leader[1:]) if b["step"] == a["step"] + 1}
    shapes = members[0]["trainable"]
    dense = 4 * sum(math.prod(s) if s else 1 for s in shapes)
    after = [st for st in per_step if st > (SPARSITY["end_step"] if codec == "masked" else FREEZE_AT)]
    assert len(after) >= 4, per_step
    for st in after:
        assert per_step[st] == (_expected_step_bytes(codec, shapes), dense), (st, per_step[st], shapes)
    if codec == "masked":
        # 90 % sparse: about 10x fewer bytes than dense (tensors of one or two entries keep one).
        assert dense / per_step[after[0]][0] > 9.0, per_step
        zeros = members[0]["zeros"]
        for name, (z, n) in zeros.items():
            if name in ("frozen.weight", "big.weight"):
                continue  # never reduced / frozen at step 7 (kept as it was then)
            # pruned to 10 % (the unfrozen layer too); a regrown entry starts at 0 and may still be 0
            assert z >= n - max(1, _round(0.1 * n)), (name, z, n)
        assert members[0]["codec"]["sparsity"] == pytest.approx(0.9, abs=0.01)


def test_a_crash_in_the_step_that_unfreezes_a_layer(tmp_path: Path) -> None:
    """masked, 3 processes: process 2 is killed (SIGKILL) in step 5, after its forward with the layer
    just unfrozen, while the others are inside that step's reduction with the new layout. The world
    re-forms with the leader's codec state (its masks moved to the new layout) and redoes the step:
    both survivors end identical, in state and masks, every sample once per epoch."""
    steps, finals = _run(tmp_path, "masked", "float32", False, kill=[2, UNFREEZE_AT], nproc=3)
    members = [f for f in finals if f["rank"] >= 0]
    assert sorted(f["uid"] for f in members) == [0, 1], finals
    assert len({f["digest"] for f in members}) == 1 and len({f["codec"]["shared"] for f in members}) == 1
    assert {s["world"] for s in steps} == {3, 2}
    seen = Counter(i for s in steps for i in s["ids"])
    assert sorted(seen) == list(range(N)) and set(seen.values()) == {EPOCHS}, seen
    assert members[0]["codec"]["sparsity"] == pytest.approx(0.9, abs=0.01)
    late, n = members[0]["zeros"]["late.weight"]
    assert late >= n - max(1, _round(0.1 * n)), (late, n)  # the unfrozen layer joined the masks and was pruned


@pytest.mark.parametrize("codec", ["powersgd:2", "topk:0.25"])
def test_unfreezing_a_layer_leaves_the_other_parameters_state_alone(tmp_path: Path, codec: str) -> None:
    """A layer unfrozen at step 5 that the forward does not use (its gradient counts as zero): every
    other parameter must train bit for bit as in a run that never unfreezes it, its error feedback and
    warm start unmoved. PowerSGD kept them by position before: the embedding's residual was read as
    another tensor's (here: dropped, a fresh one in its place) and the runs parted; top-k stopped."""
    runs = {}
    for unfreeze in (UNFREEZE_AT, None):
        out = tmp_path / f"unfreeze-{unfreeze}"
        out.mkdir()
        _, finals = _run(out, codec, "float32", False, late_used=False, unfreeze_at=unfreeze)
        members = [f for f in finals if f["rank"] >= 0]
        assert len(members) == 2 and len({f["digest"] for f in members}) == 1, finals
        runs[unfreeze] = members[0]
    assert runs[UNFREEZE_AT]["trainable"] != runs[None]["trainable"]  # the layer did enter the reduction
    assert runs[UNFREEZE_AT]["digest_but_late"] == runs[None]["digest_but_late"]
