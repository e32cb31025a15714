"""A training job for the device pool: elastic data parallel on scikit-learn's bundled data.

Started by ``dra run`` (one process per lease; ``DRA_STORE``, ``DRA_JOB_ID``, ``RANK``/``DRA_JOIN``
and ``DRA_OPTIONS`` come from the launcher). The job trains a fixed sample budget (``--epochs`` over
the data, global batch fixed), so its result does not depend on how many workers it had. The pool
decides the size (``--policy none``, the default: the job has no resize policy of its own): a
worker on a new lease joins in place when the leader sees the job below its granted size, a worker
whose lease the pool takes back leaves and exits 0. The leader publishes the job's report (its
samples/s at every size it ran); at the end it writes ``result.json`` (accuracy, steps, training
time) into ``--out``; every process appends its first step's wall time to ``first_steps.jsonl``
(the handover measurement).

    --model mlp|cnn|logreg   --data digits|wine|breast_cancer
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def load(name: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    loader = {"digits": datasets.load_digits, "wine": datasets.load_wine, "breast_cancer": datasets.load_breast_cancer}[name]
    d = loader()
    x_tr, x_te, y_tr, y_te = train_test_split(d.data, d.target, test_size=0.25, random_state=seed, stratify=d.target)
    scale = StandardScaler().fit(x_tr)
    f = lambda a: torch.tensor(scale.transform(a), dtype=torch.float32)  # noqa: E731
    return f(x_tr), f(x_te), torch.tensor(y_tr), torch.tensor(y_te), int(d.target.max()) + 1


def model_for(kind: str, features: int, classes: int) -> torch.nn.Module:
    if kind == "logreg":
        return torch.nn.Linear(features, classes)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(features, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                   torch.nn.ReLU(), torch.nn.Linear(256, classes))
    side = int(round(features ** 0.5))  # cnn: digits are 8x8 images
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, side, side)), torch.nn.Conv2d(1, 32, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(64 * side * side, classes))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn", "logreg"], default="mlp")
    p.add_argument("--data", choices=["digits", "wine", "breast_cancer"], default="digits")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="none", help="the job's own resize policy (dra.Options: policy)")
    p.add_argument("--out", required=True)
    p.add_argument("--die-at-step", type=int, default=-1, help="test hook: the worker of --die-uid dies (exit 9) at this step")
    p.add_argument("--die-uid", type=int, default=1)
    args = p.parse_args()
    t_begin = time.time()
    import dra
    import dra.elastic as de
    from dra.pool.job import lease as lease_info

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lease = lease_info()
    torch.manual_seed(args.seed)
    x_tr, x_te, y_tr, y_te, classes = load(args.data, args.seed)
    model = model_for(args.model, x_tr.shape[1], classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = de.ElasticSampler(len(x_tr), args.global_batch, seed=args.seed)
    # Other options (fault_timeout_s, events_path...) come from the job spec's "options" (DRA_OPTIONS).
    ctl = de.init(model, optimizer, sampler, policy=args.policy)
    loss_fn = torch.nn.CrossEntropyLoss()
    first, leader, world = True, False, 0
    t_train = time.time()
    for _ in ctl.epochs(args.epochs):
        for idx in sampler:
            t_step = time.perf_counter()
            idx_t = torch.as_tensor(idx)
            loss = loss_fn(ctl.model(x_tr[idx_t]), y_tr[idx_t])
            ctl.optimizer.zero_grad()
            loss.backward()
            ctl.optimizer.step()
            st = dra.step(loss, step_time_s=time.perf_counter() - t_step)
            if st.committed and st.step == args.die_at_step and ctl.uid == args.die_uid:
                os._exit(9)  # a crash, not a leave: no goodbye to the others
            if st.committed:
                leader, world = ctl.rank == 0, ctl.world_size
                if first:
                    first = False
                    with open(out / "first_steps.jsonl", "a") as f:
                        f.write(json.dumps({"time": time.time(), "lease": lease.get("id"), "device": lease.get("device"),
                                            "uid": ctl.uid, "started": t_begin}) + "\n")
    ctl.finish()  # (the epochs loop has already finished the world; the leader is who led it last)
    if leader:
        with torch.no_grad():
            accuracy = float((model(x_te).argmax(1) == y_te).float().mean())
        (out / "result.json").write_text(json.dumps({
            "accuracy": accuracy, "steps": ctl.step_index, "resizes": ctl.resizes, "train_s": time.time() - t_train,
            "final_world": world, "model": args.model, "data": args.data, "end": time.time()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
