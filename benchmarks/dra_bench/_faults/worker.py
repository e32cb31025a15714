"""One Python process of a fault trial (``python -m dra.bench faults``).

Trains a small MLP on seeded synthetic data under the elastic controller, as the C++ example
(examples/cpp/elastic_train.cpp) does with ``--log-samples``, and writes the same records to
``<out>/samples-<uid>.jsonl`` (one JSON object a line, flushed at once):

- ``attempt``: this rank's share of a step, written before the step's gradient reduction (which
  runs at the end of backward), so that the record of a step that commits is complete even when a
  process dies right after the reduction;
- ``commit``: a step this process committed, with the world epoch its reduction ran in;
- ``world``: after every world change this process entered (rank, members, RSS);
- ``fault``: an in-process fault about to happen (written before it);
- ``checkpoint``: rank 0's checkpoint, every ``checkpoint_every`` committed steps (whether it was
  written; a failing filesystem makes it fail, and the loop, as a careful trainer's, goes on);
- ``final``: after the training loop (role, committed steps, the state digest, RSS).

The job is described by ``DRA_FAULT_JOB`` (JSON, the same for every process); in-process faults
of this process by ``DRA_FAULT_SPEC`` (see ``dra_bench._faults.spec``). Faults that come from
outside (kill -9, SIGSTOP) are sent by the trial's driver.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time

import torch

import dra
import dra.elastic as de
import dra.testing
from dra_bench._faults.spec import FaultSpec, parse_specs, rss_mb

job = json.loads(os.environ["DRA_FAULT_JOB"])
specs = parse_specs(os.environ.get("DRA_FAULT_SPEC", ""))
out = job["out"]
N, D = job["dataset"], 8
gen = torch.Generator().manual_seed(7)
X = torch.randn(N, D, generator=gen)
Y = X @ torch.randn(D, 1, generator=gen) + 0.1 * torch.randn(N, 1, generator=gen)
torch.manual_seed(100 + int(os.environ.get("RANK", "0")))  # different on purpose: the handoff aligns them
# A joiner that differs from the world (a mismatched-joiner trial): another model, optimizer or dtype.
variant = os.environ.get("DRA_FAULT_VARIANT", "")
hidden = 48 if variant == "model" else 32
net = torch.nn.Sequential(torch.nn.Linear(D, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
if variant == "dtype":
    net = net.double()
if job.get("ballast_mb", 0) > 0:
    # State that is handed over but not all-reduced (a buffer): a big model's handoff without the
    # cost of reducing its gradients every step. Filled, so that its pages are resident.
    net.register_buffer("ballast", torch.full((int(job["ballast_mb"] * 262144),), 1.0))
if variant == "optimizer":
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
else:
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
sampler = de.ElasticSampler(N, job["global_batch"], seed=job.get("seed", 0))


class Records:
    def __init__(self) -> None:
        self.fh = None

    def write(self, uid: int, rec: dict) -> None:
        if self.fh is None:
            self.fh = open(os.path.join(out, f"samples-{uid}.jsonl"), "a")
        rec.update(uid=uid, pid=os.getpid(), time=time.time())
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()


records = Records()
world_changes = 0


class CaughtFault(Exception):
    """An exception the training loop catches (the ``catch`` action): the rest of the step is skipped."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


def act(spec: FaultSpec, ctl, where: str) -> None:
    records.write(
        ctl.uid, {"kind": "fault", "action": spec.action, "where": where, "step": ctl.step_index, "epoch": ctl.epoch}
    )
    if spec.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif spec.action == "sleep":
        time.sleep(spec.seconds)
    elif spec.action == "raise":
        raise RuntimeError(f"test fault: an exception nobody catches, {where} of step {ctl.step_index}")
    elif spec.action == "catch":
        raise CaughtFault(f"test fault: an exception the loop catches, {where} of step {ctl.step_index}", where)


def fire(where: str, step: int) -> None:
    for spec in specs:
        if spec.where == where and spec.index == step and not spec.fired:
            spec.fired = True
            act(spec, ctl, where)


def checkpoint(step: int) -> None:
    """What a careful trainer does: rank 0 saves now and then, and a save that fails is reported, not
    fatal (the filesystem trials make it fail)."""
    every = job.get("checkpoint_every", 0)
    if not every or ctl.rank != 0 or (step + 1) % every:
        return
    path = os.path.join(job.get("fs_dir") or out, "ckpt.pt")
    # Serialized in memory, then written with Python's file calls: a failing filesystem raises
    # OSError (torch.save onto a path raises RuntimeError for a read-only, full or missing folder).
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "dra": ctl.state_dict()}, buffer)
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(path + ".tmp", path)
        records.write(ctl.uid, {"kind": "checkpoint", "step": step, "ok": True})
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(path + ".tmp")  # a partial file (a full disk) is not left behind
        records.write(ctl.uid, {"kind": "checkpoint", "step": step, "ok": False, "error": str(e)[:200]})


def on_phase(ctl, phase: str) -> None:
    global world_changes
    if phase == "rebuild":
        world_changes += 1
    for spec in specs:
        if spec.where == phase and spec.index == world_changes - 1 and not spec.fired:
            spec.fired = True
            act(spec, ctl, phase)


def record_world(ctl) -> None:
    if ctl.is_member:
        records.write(
            ctl.uid,
            {
                "kind": "world",
                "epoch": ctl.epoch,
                "rank": ctl.rank,
                "size": ctl.world_size,
                "members": list(ctl.members),
                "step": ctl.step_index,
                "rss_mb": rss_mb(),
            },
        )


dra.testing.set_phase_hook(on_phase)
ctl = de.init(
    net,
    opt,
    sampler,
    start_size=job["start_size"],
    max_size=job["max_size"],
    release="standby",
    decide_every=job.get("decide_every", 1000),
    resize_schedule={int(k): v for k, v in job["schedule"].items()},
    fault_timeout_s=job["fault_timeout_s"],
    verify=True,
    events_path=os.path.join(job.get("fs_dir") or out, "events.jsonl"),
)
if ctl.is_member and ctl.uid < job["start_size"]:
    # The first world trains once the expected candidates registered, so that a scheduled grow
    # finds them (waiting on the store only, outside any collective).
    while len(ctl.registered_candidates()) < job.get("wait_candidates", 0):
        time.sleep(0.02)
record_world(ctl)
loss_fn = torch.nn.MSELoss()
compute_s = job.get("compute_ms", 0) / 1000.0
missed_step = False  # the previous step was reduced but never stepped: the next backward commits it first
for _ in ctl.epochs(job["epochs"]):
    for idx in sampler:
        step, wepoch, depoch = ctl.step_index + missed_step, ctl.epoch, sampler.epoch
        missed_step = False
        try:
            fire("step", step)
            if compute_s:
                time.sleep(compute_s)  # stands for a real model's compute: a step lasts about as long
            idx_t = torch.as_tensor(idx)
            loss = loss_fn(ctl.model(X[idx_t].to(net[0].weight.dtype)), Y[idx_t].to(net[0].weight.dtype))
            ctl.optimizer.zero_grad()
            records.write(
                ctl.uid,
                {
                    "kind": "attempt",
                    "step": step,
                    "data_epoch": depoch,
                    "world_epoch": wepoch,
                    "rank": ctl.rank,
                    "world": ctl.world_size,
                    "ids": [int(i) for i in idx],
                },
            )
            loss.backward()  # the reduction runs at the end of backward
            fire("after_reduce", step)
            ctl.optimizer.step()
            fire("after_update", step)
            st = dra.step(loss)
        except CaughtFault as e:
            missed_step = e.where in ("after_reduce", "after_update")
            if missed_step and not ctl._skip_update():
                # Reduced, never stepped: the world commits the step's batches whatever this rank did
                # with them (dra counts them consumed at the next backward), whoever else stepped.
                records.write(ctl.uid, {"kind": "commit", "step": step, "data_epoch": depoch, "world_epoch": wepoch,
                                        "update": e.where == "after_update"})
            continue  # a trainer that logs a failed step and goes on with its next batch
        if st.committed:
            records.write(ctl.uid, {"kind": "commit", "step": step, "data_epoch": depoch, "world_epoch": wepoch})
            checkpoint(step)
        if ctl.epoch != wepoch:
            record_world(ctl)
# The code after the loop (a final checkpoint in a real job) must run whatever happened to the
# store or to other processes.
records.write(
    ctl.uid,
    {
        "kind": "final",
        "member": ctl.uid in ctl.members,
        "step": ctl.step_index,
        "digest": ctl.state_digest(),
        "resizes": ctl.resizes,
        "rss_mb": rss_mb(),
    },
)
sys.exit(0)
