"""One process of the torchrun job that ``python -m dra.bench step`` measures: every variant's step,
interleaved, timed phase by phase (see :mod:`dra_bench.step_overhead`)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from dra_bench._step_config import PHASES, VARIANTS


def _load_digits(seed: int):
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, _x_test, y_train, _y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_train.contiguous(), y_train.contiguous()


def _build_model(hidden: int, depth: int, seed: int):
    """The examples' digits MLP (64-hidden-10) with `depth` hidden layers, seeded."""
    import torch

    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    width = 64
    for _ in range(depth):
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def _order(round_index: int, repeat: int) -> list[str]:
    """The variants' order within every iteration of a round: rotated by one per round and per
    launch, so each variant takes each position equally often."""
    k = (round_index + repeat) % len(VARIANTS)
    return list(VARIANTS[k:] + VARIANTS[:k])


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dra
    import dra.elastic as de

    torch.set_num_threads(1)
    pc, cpu = time.perf_counter, time.process_time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    x, y = _load_digits(args.seed)
    loss_fn = torch.nn.CrossEntropyLoss()

    def make():
        model = _build_model(args.hidden, args.depth, args.seed)
        return model, torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # -- plain torch DDP over its own Gloo group (torchrun's store, env://) --------------------
    # Every variant gets a Gloo group of its own, used by it alone, as dra's world is used by dra
    # alone: each group then idles for the same time between its steps (one iteration). The
    # default group only holds the barriers between steps.
    dist.init_process_group("gloo")
    groups = {v: dist.new_group(backend="gloo") for v in ("plain", "plain2", "bare")}
    plain_model, plain_opt = make()
    ddp = DDP(plain_model, process_group=groups["plain"])
    plain2_model, plain2_opt = make()  # the A/A control: the same DDP job again
    ddp2 = DDP(plain2_model, process_group=groups["plain2"])

    # -- dra: the elastic controller over a static world of N ---------------------------------
    dra_model, dra_opt = make()
    sampler = de.ElasticSampler(len(x), args.global_batch, seed=args.seed)
    ctl = de.init(
        dra_model, dra_opt, sampler,
        policy="convergence", start_size=world, release="standby", status_every=0,
        limits={"min_size": world, "max_size": world},
    )
    decide_every = ctl.options.engine.decide_every

    # -- by hand: one flat all-reduce; and the no-communication floor -------------------------
    bare_model, bare_opt = make()
    bare_params = list(bare_model.parameters())
    numel = sum(p.numel() for p in bare_params)
    bare_flat = torch.zeros(numel)
    bare_group = groups["bare"]
    local_model, local_opt = make()

    # The plain loop's shares: the very samples dra's sampler hands this rank, precomputed.
    ref = de.ElasticSampler(len(x), args.global_batch, seed=args.seed)._native  # driven by hand here
    ref.set_world(world, rank)
    steps_per_epoch = ref.steps_left
    total_steps = args.warmup + args.rounds * args.steps
    num_epochs = total_steps // steps_per_epoch + 1
    plain_epochs = []
    for _ in range(num_epochs):
        shares = []
        while not ref.exhausted:
            shares.append(ref.indices().copy())
            ref.commit()
        plain_epochs.append(shares)
        ref.next_epoch()

    def plain_batches():
        while True:
            for shares in plain_epochs:
                yield from shares

    def dra_batches():
        for _epoch in ctl.epochs(num_epochs):
            yield from sampler

    gens = {"plain": plain_batches(), "plain2": plain_batches(), "dra": dra_batches(), "bare": plain_batches(), "local": plain_batches()}
    step = dra.step

    # One step of each variant. Returns (t_before_next_batch, t0..t5, cpu_before, cpu_after):
    # t0 after the batch's indices arrived, t1 data, t2 forward, t3 zero_grad + backward (the
    # gradient reduction included), t4 optimizer step, t5 dra.step (= t4 without dra).
    def runner(model, opt, gen, reduce=None, finish=None):
        """One step of a variant: the same skeleton for every variant, so that they differ only in
        what they call. ``reduce`` runs after backward (a hand-written gradient reduction),
        ``finish`` after the optimizer step (``dra.step``)."""

        def one() -> tuple:
            c = cpu()
            tp = pc()
            idx = next(gen)
            t0 = pc()
            it = torch.as_tensor(idx)
            xb, yb = x[it], y[it]
            t1 = pc()
            loss = loss_fn(model(xb), yb)
            t2 = pc()
            opt.zero_grad()
            loss.backward()
            if reduce is not None:
                reduce()
            t3 = pc()
            opt.step()
            t4 = pc()
            if finish is None:
                return tp, t0, t1, t2, t3, t4, t4, c, cpu()
            finish(loss)
            return tp, t0, t1, t2, t3, t4, pc(), c, cpu()

        return one

    def bare_reduce() -> None:
        torch.cat([p.grad.reshape(-1) for p in bare_params], out=bare_flat)
        dist.all_reduce(bare_flat, group=bare_group)
        bare_flat.div_(world)
        off = 0
        for p in bare_params:
            n = p.numel()
            p.grad.copy_(bare_flat[off : off + n].view_as(p))
            off += n

    runners = {
        "plain": runner(ddp, plain_opt, gens["plain"]),
        "plain2": runner(ddp2, plain2_opt, gens["plain2"]),
        "dra": runner(ctl.model, ctl.optimizer, gens["dra"], finish=step),
        "bare": runner(bare_model, bare_opt, gens["bare"], reduce=bare_reduce),
        "local": runner(local_model, local_opt, gens["local"]),
    }
    for _ in range(args.warmup):
        for name in VARIANTS:
            dist.barrier()
            runners[name]()

    profiler = None
    if args.profile and rank == 0:
        import cProfile

        profiler = cProfile.Profile()
    profiled_steps = 0
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = _order(r, args.repeat)
        recs: dict[str, list] = {v: [] for v in order}
        for i in range(args.steps):
            for name in order:
                # Every step starts with the ranks aligned, so no step inherits the skew between
                # the ranks that the previous step (another variant's) left.
                dist.barrier()
                if profiler is not None and name == "dra":
                    profiler.enable()
                    rec = runners["dra"]()
                    profiler.disable()
                    profiled_steps += 1
                else:
                    rec = runners[name]()
                if i >= args.discard:
                    recs[name].append(rec)
        rounds.append({
            "order": order,
            "variants": {
                v: {
                    "step_s": [t[6] - t[0] for t in rec_list],  # from asking for the batch to the end
                    "cpu_s": [t[8] - t[7] for t in rec_list],
                    "phases_s": {ph: [t[k + 2] - t[k + 1] for t in rec_list] for k, ph in enumerate(PHASES)},
                }
                for v, rec_list in recs.items()
            },
        })

    # The communication floor: one flat all-reduce of the gradients' size (+3 scalars, as dra
    # sends), on plain Gloo in these processes.
    flat = torch.zeros(numel + 3)
    times = []
    for i in range(args.steps + args.discard):
        dist.barrier()
        t0 = pc()
        dist.all_reduce(flat)
        if i >= args.discard:
            times.append(pc() - t0)

    # Train out dra's last epoch untimed, so ctl.epochs() ends the job the normal way.
    try:
        while True:
            runners["dra"]()
    except StopIteration:
        pass
    run = {
        "rank": rank, "world": world, "rounds": rounds, "allreduce_flat_s": times,
        "grad_numel": numel, "decide_every": decide_every, "steps_per_epoch": steps_per_epoch,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(run))
    if profiler is not None:
        import io
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        text.write(f"cProfile of rank 0's dra steps ({profiled_steps} steps, world {world}, "
                   f"hidden {args.hidden} x {args.depth}, global batch {args.global_batch}); times are totals\n")
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        (out / "profile.txt").write_text(text.getvalue())
    dist.destroy_process_group()
    return 0
