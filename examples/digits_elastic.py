"""Elastic data-parallel training on scikit-learn's digits data under torchrun, resized in place by
the convergence policy, compared with a static run of the same sample budget.

    .venv/bin/python examples/digits_elastic.py --nproc 4 --out outputs/digits_elastic

launches two torchrun jobs of --nproc processes on this machine (real Gloo, real c10d store):
a static one (all processes train from start to end) and a dynamic one (starts with
--start-size processes; the convergence policy grows the world while learning is fast and
releases processes on plateau; released processes stand by). It then prints test accuracy of
both, the resizes performed and the rank-seconds used, writes loss/world-size plots
(``digits_elastic.png``), the dynamic run's event log (``events.jsonl``) and ``summary.json``
into the output directory, and ends with the line ``outputs: <dir>``.

One process of a job (what torchrun starts) is ``--worker``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from digits_data import build_model, load_data  # examples/ is on sys.path when run as a script


def plain_worker(args: argparse.Namespace) -> int:
    """The same job without dra: torch DDP over Gloo, static world (the overhead baseline)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data(args.seed)
    model = DDP(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = 0
    t_start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        for start in range(0, len(order), args.global_batch):
            batch = order[start : start + args.global_batch]
            share = batch.tensor_split(world)[rank]
            loss = loss_fn(model(x_train[share]), y_train[share])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    wall = time.perf_counter() - t_start
    if rank == 0:
        with torch.no_grad():
            accuracy = float((model.module(x_test).argmax(1) == y_test).float().mean())
        (out / "result.json").write_text(json.dumps({"mode": "plain", "accuracy": accuracy, "steps": steps,
                                                     "wall_s": wall, "step_s": wall / max(steps, 1)}, indent=2))
    dist.destroy_process_group()
    return 0


def worker(args: argparse.Namespace) -> int:
    if args.mode == "plain":
        return plain_worker(args)
    import dra
    import dra.elastic as de

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data(args.seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = de.ElasticSampler(len(x_train), args.global_batch, seed=args.seed)
    nproc = int(os.environ["WORLD_SIZE"])
    static = args.mode == "static"
    ctl = de.init(
        model, optimizer, sampler,
        policy="convergence",
        start_size=nproc if static else args.start_size,
        decide_every=args.decide_every,
        release="standby",
        events_path=str(out / "events.jsonl"),
        status_every=args.status_every,
        verify=True,
        limits={"min_size": nproc if static else 1, "max_size": nproc, "cooldown_steps": args.cooldown, "amortise": False},
        estimator={"window": 32, "warmup_steps": 16, "plateau_patience": 16, "fast_relative_improvement": 0.10},
        convergence={"grow_step": 1, "plateau_size": 1, "min_parallel_efficiency": 0.0},
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    trace = []
    t_start = time.perf_counter()
    last = t_start
    rank_seconds = 0.0
    for _epoch in ctl.epochs(args.epochs):
        for idx in sampler:
            idx_t = torch.as_tensor(idx)
            loss = loss_fn(ctl.model(x_train[idx_t]), y_train[idx_t])
            ctl.optimizer.zero_grad()
            loss.backward()
            ctl.optimizer.step()
            world = ctl.world_size
            st = dra.step(loss)
            if ctl.rank == 0 and st.committed:
                now = time.perf_counter()
                rank_seconds += (now - last) * world
                last = now
                trace.append({"step": st.step, "loss": st.loss, "world": world, "t": now - t_start})
    wall = time.perf_counter() - t_start
    if trace:  # the leader at the end of training (uid 0 never leaves under this policy)
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        result = {
            "mode": args.mode, "accuracy": accuracy, "resizes": ctl.resizes, "rank_seconds": rank_seconds,
            "wall_s": wall, "step_s": wall / max(ctl.step_index, 1), "steps": ctl.step_index, "samples": ctl.step_index * args.global_batch,
            "final_world": ctl.members if ctl.members else None,
        }
        (out / "trace.json").write_text(json.dumps(trace))
        (out / "result.json").write_text(json.dumps(result, indent=2))
    return 0


def run_job(mode: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}", "--standalone",
        "--max-restarts=0", __file__, "--worker", "--mode", mode, "--out", str(out / mode),
        "--epochs", str(args.epochs), "--global-batch", str(args.global_batch), "--lr", str(args.lr),
        "--seed", str(args.seed), "--start-size", str(args.start_size), "--decide-every", str(args.decide_every),
        "--cooldown", str(args.cooldown), "--status-every", str(args.status_every),
    ]
    print(f"[digits] {mode} run: {' '.join(cmd[2:6])} ...", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    (out / f"{mode}.log").write_text(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"[digits] the {mode} job failed (exit {proc.returncode}); log: {out / (mode + '.log')}")
    for line in proc.stdout.splitlines():
        if line.startswith("[dra] step"):
            print(f"  {mode}: {line}", flush=True)
    return json.loads((out / mode / "result.json").read_text())


def plot(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_world) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for mode, color in (("static", "tab:gray"), ("dynamic", "tab:blue")):
        trace = json.loads((out / mode / "trace.json").read_text())
        steps = [r["step"] for r in trace]
        ax_loss.plot(steps, [r["loss"] for r in trace], color=color, label=mode, lw=1)
        ax_world.step(steps, [r["world"] for r in trace], color=color, label=mode, where="post")
    ax_loss.set_ylabel("training loss (world mean)")
    ax_loss.set_yscale("log")
    ax_loss.legend()
    ax_world.set_ylabel("world size")
    ax_world.set_xlabel("step")
    ax_world.legend()
    fig.suptitle("digits: elastic (convergence policy) vs static data parallel")
    fig.tight_layout()
    path = out / "digits_elastic.png"
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["static", "dynamic", "plain"], default="dynamic")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--start-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decide-every", type=int, default=10)
    parser.add_argument("--cooldown", type=int, default=20)
    parser.add_argument("--status-every", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default="outputs/digits_elastic")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if not 1 <= args.start_size <= args.nproc:
        parser.error(f"--start-size must lie in [1, --nproc={args.nproc}], got {args.start_size}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for mode in ("static", "dynamic"):
        events = out / mode / "events.jsonl"
        if events.exists():
            events.unlink()
    static = run_job("static", args, out)
    dynamic = run_job("dynamic", args, out)
    (out / "events.jsonl").write_text((out / "dynamic" / "events.jsonl").read_text())
    png = plot(out)
    saved = 1.0 - dynamic["rank_seconds"] / static["rank_seconds"]
    summary = {"static": static, "dynamic": dynamic, "rank_seconds_saved_fraction": saved,
               "accuracy_delta_points": 100 * (dynamic["accuracy"] - static["accuracy"])}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"test accuracy: dynamic {100 * dynamic['accuracy']:.2f}%  static {100 * static['accuracy']:.2f}%  "
          f"(delta {summary['accuracy_delta_points']:+.2f} points)")
    print(f"resizes performed: {dynamic['resizes']}  (static: {static['resizes']})")
    print(f"rank-seconds: dynamic {dynamic['rank_seconds']:.2f}  static {static['rank_seconds']:.2f}  "
          f"({f'{100 * saved:.1f}% saved' if saved >= 0 else f'{-100 * saved:.1f}% more'}) for the same "
          f"{dynamic['samples']} samples")
    print(f"plot: {png}")
    print(f"events: {out / 'events.jsonl'}")
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
