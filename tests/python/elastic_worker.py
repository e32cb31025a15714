"""One process of the elastic test jobs (launched by tests/python/test_elastic_*.py).

Trains a tiny MLP on a seeded synthetic regression set under the elastic controller and logs,
to <out>/log-<uid>.jsonl, every committed step (the rank's sample ids and the step's global
batch), the digest of the parameters after every world change, and a final record. Faults are
injected for real: SIGKILL of this process at a chosen step and point, or a hang; or a phase that
fails on this process alone ("fail": an exception raised in the phase hook, e.g. at "reduced").
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import torch

import dra
import dra.elastic as de
import dra.testing

cfg = json.loads(os.environ["DRA_TEST_CFG"])
out = cfg["out"]
torch.manual_seed(1234)
gen = torch.Generator().manual_seed(7)
N, D = cfg.get("dataset_size", 192), 8
X = torch.randn(N, D, generator=gen)
Y = X @ torch.randn(D, 1, generator=gen) + 0.1 * torch.randn(N, 1, generator=gen)

hidden = cfg.get("hidden", 16)
if os.environ.get("DRA_TEST_MISMATCH") == "1":
    hidden += 1
# Different seeds per process: the start-up handoff must make them identical anyway.
torch.manual_seed(int(os.environ.get("RANK", "0")) + 100 * int(os.environ.get("DRA_JOIN", "0")))
net = torch.nn.Sequential(torch.nn.Linear(D, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
sampler = de.ElasticSampler(N, cfg.get("global_batch", 16), seed=3)

uid_hint = os.environ.get("RANK", "late")
kill = cfg.get("kill") or {}
hang = cfg.get("hang") or {}
log = None


def write(rec):
    log.write(json.dumps(rec) + "\n")
    log.flush()


def maybe_fault(point, ctl):
    ks = cfg.get("kill_store") or {}
    if ks and ks["uid"] == ctl.uid and ks["step"] == ctl.step_index and ks["point"] == point:
        os.kill(cfg["store_pid"], signal.SIGKILL)
    specs = [(kill, "kill"), (hang, "hang"), (cfg.get("fail") or {}, "fail")] + [(k, "kill") for k in cfg.get("kills") or []]
    for spec, act in specs:
        if spec and spec.get("uid") == ctl.uid and spec.get("point") == point and spec.get("step", ctl.step_index) == ctl.step_index:
            if spec.get("epoch") is not None and spec["epoch"] != ctl.epoch:
                continue
            if act == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif act == "fail":  # once: this phase fails on this process alone
                if not spec.get("fired"):
                    spec["fired"] = True
                    raise RuntimeError(f"injected failure at {point} of step {ctl.step_index}")
            else:
                time.sleep(3600)


dra.testing.set_phase_hook(lambda c, phase: maybe_fault(phase, c))
ctl = de.init(
    net, opt, sampler, scheduler=sched,
    start_size=cfg.get("start_size"), min_size=cfg.get("min_size", 1), max_size=cfg.get("max_size"),
    max_resize_retries=cfg.get("max_resize_retries", 3),
    release=cfg.get("release", "standby"), decide_every=cfg.get("decide_every", 1000),
    resize_schedule={int(k): v for k, v in cfg.get("schedule", {}).items()},
    fault_timeout_s=cfg.get("fault_timeout_s", 2.0), verify=True, chunk_mb=cfg.get("chunk_mb", 16.0),
    backend=cfg.get("backend", "gloo"), compress=cfg.get("compress"), sparsity=cfg.get("sparsity"),
    status_every=cfg.get("status_every"), heal=cfg.get("heal", True),
    events_path=os.path.join(out, "events.jsonl"),
)
log = open(os.path.join(out, f"log-{ctl.uid}.jsonl"), "a")
if cfg.get("wait_candidates", 0) and os.environ.get("DRA_JOIN") != "1":
    # A test that admits late joiners first waits (on the store only, outside any collective)
    # until they registered.
    while len(ctl.registered_candidates()) < cfg["wait_candidates"]:
        time.sleep(0.05)


def codec_record():
    c = ctl.compression
    if c is None:
        return None
    matrices = [p for p in net.parameters() if p.dim() >= 2]
    zero = [p.detach() == 0 for p in matrices]
    # Pruned weights have no optimizer state left (a later regrowth starts from zero, as in RigL).
    state_clean = all(bool((opt.state[p]["momentum_buffer"][z] == 0).all()) for p, z in zip(matrices, zero)
                      if "momentum_buffer" in opt.state.get(p, {}))
    return {"codec": c["codec"], "shared": hashlib.sha256(c["shared_state"]).hexdigest(), "ef": c["error_feedback_norm1"],
            "sent": c["bytes_sent"], "dense": c["bytes_dense"], "sparsity": c["sparsity"],
            "zero_fraction": sum(int(z.sum()) for z in zero) / sum(p.numel() for p in matrices),
            "pruned_state_clean": state_clean}


def record_world():
    if ctl.is_member:
        write({"kind": "world", "uid": ctl.uid, "epoch": ctl.epoch, "step": ctl.step_index, "size": ctl.world_size,
               "digest": ctl.last_digest, "members": ctl.members, "codec": codec_record()})


record_world()
loss_fn = torch.nn.MSELoss()
for _epoch in ctl.epochs(cfg.get("epochs", 2)):
    for idx in sampler:
        idx_t = torch.as_tensor(idx)
        share, batch = [int(i) for i in idx], [int(i) for i in sampler.step_indices()]
        step, wepoch, rank, depoch = ctl.step_index, ctl.epoch, ctl.rank, sampler.epoch
        maybe_fault("forward", ctl)
        if cfg.get("step_sleep_s"):
            time.sleep(cfg["step_sleep_s"])  # a step as long as a real model's
        # A scheduled grow to standbys: the members wait (on the store, outside any collective) at
        # the step it is decided until enough have registered again; on a loaded host a standby
        # released two steps before had not, and the job ended first.
        need = cfg.get("wait_candidates_at", {}).get(str(step))
        while need and ctl.is_member and len(ctl.registered_candidates()) < need:
            time.sleep(0.05)
        loss = loss_fn(ctl.model(X[idx_t]), Y[idx_t])
        ctl.optimizer.zero_grad()
        maybe_fault("backward", ctl)
        loss.backward()
        maybe_fault("optimizer", ctl)
        ctl.optimizer.step()
        ctl.scheduler.step()
        before_epoch = ctl.epoch
        st = dra.step(loss)
        if st.committed:
            write({"kind": "commit", "uid": ctl.uid, "epoch": wepoch, "rank": rank, "step": step,
                   "data_epoch": depoch, "share": share, "batch": batch, "loss": float(loss),
                   "phase": st.signals.phase,
                   **({"sparsity": ctl.compression["sparsity"]} if cfg.get("compress") == "masked" else {})})
        if ctl.epoch != before_epoch:
            record_world()
        maybe_fault("after_step", ctl)
final = {"kind": "final", "uid": ctl.uid, "role": ctl.role, "step": ctl.step_index}
final["digest"] = ctl.state_digest()
final["codec"] = codec_record()
final["energy"] = ctl.energy
write(final)
log.close()
sys.exit(0)
