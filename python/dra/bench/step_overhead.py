"""``python -m dra.bench step --json PATH``: dra's per-step overhead in the digits job.

The question (issue 3): how much longer is one optimizer step of the digits job under dra (the
elastic controller over a static world) than the same step under plain torch DDP over Gloo, at the
same world size, on the same samples, with the same model? Goal: < 1 %.

How it is measured:

* One torchrun job of N processes (N = 2 and 4 by default) holds all the variants, in the same
  processes, on the same data (scikit-learn's digits, the examples' 75/25 split), with the same
  initial weights and SGD with momentum:

  - ``plain``: ``torch.nn.parallel.DistributedDataParallel`` (defaults) over a Gloo process
    group; each rank's share of every global batch is precomputed before the timed loop (the
    cheapest plain loop), from the very samples dra's sampler hands that rank;
  - ``dra``: ``dra.elastic.init`` (policy ``convergence`` with min = max = start = N, so the
    world never changes; default ``decide_every``), ``ElasticSampler``, ``ctl.model``,
    ``dra.step(loss)`` after ``optimizer.step()``; the sampler runs inside the loop (its cost is
    dra's cost);
  - ``bare``: the least a data-parallel step must do, written by hand: after ``backward``, one
    flat Gloo all-reduce of all gradients (``torch.cat``, ``all_reduce``, divide, copy back),
    the same single collective dra issues; dra vs bare is dra's own cost;
  - ``local``: the same model and per-rank batch with no communication at all (the compute floor);
  - ``plain2``: the plain DDP job once more (its own model, the same group): the A/A control.
    Its "overhead" against ``plain`` is what the measurement scatters by on this machine; a dra
    figure inside that band is not distinguishable from zero.

  The variants are interleaved step by step: every iteration of a round runs one step of each,
  back to back, so load from elsewhere on the machine falls on all of them alike; the order
  rotates from round to round and from launch to launch. A barrier (on the plain group, untimed)
  precedes every step, so no step inherits the skew between the ranks that the previous one left.
  Each round drops its first ``--discard`` iterations; an untimed warm-up of each variant comes
  first.
* Per-step time = rank 0's perf_counter from asking for the step's batch (the sampler's yield) to
  the end of the step: indexing the batch, forward, zero_grad + backward with the gradient
  reduction, optimizer step, ``dra.step``. Per variant and launch: the median over the timed
  steps; beside it the 10th percentile (the steps that other processes on the machine did not
  slow down), the mean (which also carries periodic costs such as the leader's decision every
  ``decide_every`` steps), and the process CPU time per step (all threads, Gloo's too).
* Each launch (``--repeats``) gives a ratio dra/plain of the medians; the headline is the median
  of those ratios with their min/max, and a bootstrap 95 % interval over the per-round ratios.
* Models: ``digits`` (the job's own model: 64-128-10 MLP, global batch 32; its step is a few
  milliseconds of fixed per-step latencies, the all-reduce's among them) and ``wide``
  (64-1024-1024-10, global batch 256, 1.1 M parameters; compute dominates, as in most users'
  models).
* Breakdown (rank 0, medians): the phases of each variant; the time inside ``dra.step``; the
  gradient reduction of each variant (its backward minus the local backward) against one flat
  all-reduce of the gradients' size on the same Gloo world; ``--profile`` runs cProfile over
  rank 0's dra steps in one extra launch (written beside the JSON as ``.profile.txt``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra.bench._report import result, write_report

# Per model: architecture, global batch, and the default steps of each variant per round and
# warm-up steps (the wide model's step is ~30x longer).
MODELS: dict[str, dict[str, int]] = {
    "digits": {"hidden": 128, "depth": 1, "global_batch": 32, "steps": 60, "warmup": 20},
    "wide": {"hidden": 1024, "depth": 2, "global_batch": 256, "steps": 15, "warmup": 5},
}
VARIANTS = ("plain", "dra", "bare", "local", "plain2")
PHASES = ("data", "forward", "backward", "optimizer", "dra_step")
GOAL_PCT = 1.0
# name: (variant, baseline variant). "aa" is the A/A control: the same DDP job twice, whose
# "overhead" shows how far the measurement itself scatters on this machine.
COMPARISONS = {"vs_plain": ("dra", "plain"), "vs_bare": ("dra", "bare"), "aa": ("plain2", "plain")}


# ---------------------------------------------------------------------------------------------
# worker: one process of the measured torchrun job
# ---------------------------------------------------------------------------------------------
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


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


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
    def plain_runner(ddp, opt, gen):
        def one_plain() -> tuple:
            c = cpu()
            tp = pc()
            idx = next(gen)
            t0 = pc()
            it = torch.as_tensor(idx)
            xb, yb = x[it], y[it]
            t1 = pc()
            loss = loss_fn(ddp(xb), yb)
            t2 = pc()
            opt.zero_grad()
            loss.backward()
            t3 = pc()
            opt.step()
            t4 = pc()
            return tp, t0, t1, t2, t3, t4, t4, c, cpu()

        return one_plain

    def one_dra(gen=gens["dra"], model=ctl.model) -> tuple:
        c = cpu()
        tp = pc()
        idx = next(gen)
        t0 = pc()
        it = torch.as_tensor(idx)
        xb, yb = x[it], y[it]
        t1 = pc()
        loss = loss_fn(model(xb), yb)
        t2 = pc()
        ctl.optimizer.zero_grad()
        loss.backward()
        t3 = pc()
        ctl.optimizer.step()
        t4 = pc()
        step(loss)
        t5 = pc()
        return tp, t0, t1, t2, t3, t4, t5, c, cpu()

    def one_bare(gen=gens["bare"]) -> tuple:
        c = cpu()
        tp = pc()
        idx = next(gen)
        t0 = pc()
        it = torch.as_tensor(idx)
        xb, yb = x[it], y[it]
        t1 = pc()
        loss = loss_fn(bare_model(xb), yb)
        t2 = pc()
        bare_opt.zero_grad()
        loss.backward()
        torch.cat([p.grad.reshape(-1) for p in bare_params], out=bare_flat)
        dist.all_reduce(bare_flat, group=bare_group)
        bare_flat.div_(world)
        off = 0
        for p in bare_params:
            n = p.numel()
            p.grad.copy_(bare_flat[off : off + n].view_as(p))
            off += n
        t3 = pc()
        bare_opt.step()
        t4 = pc()
        return tp, t0, t1, t2, t3, t4, t4, c, cpu()

    def one_local(gen=gens["local"]) -> tuple:
        c = cpu()
        tp = pc()
        idx = next(gen)
        t0 = pc()
        it = torch.as_tensor(idx)
        xb, yb = x[it], y[it]
        t1 = pc()
        loss = loss_fn(local_model(xb), yb)
        t2 = pc()
        local_opt.zero_grad()
        loss.backward()
        t3 = pc()
        local_opt.step()
        t4 = pc()
        return tp, t0, t1, t2, t3, t4, t4, c, cpu()

    runners = {
        "plain": plain_runner(ddp, plain_opt, gens["plain"]),
        "plain2": plain_runner(ddp2, plain2_opt, gens["plain2"]),
        "dra": one_dra, "bare": one_bare, "local": one_local,
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
                    rec = one_dra()
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
            one_dra()
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


# ---------------------------------------------------------------------------------------------
# the suite: launches, aggregation, report
# ---------------------------------------------------------------------------------------------
def _launch(nproc: int, model: str, repeat: int, out: str, args: argparse.Namespace, profile: bool = False) -> list[dict]:
    spec = MODELS[model]
    steps = args.steps or spec["steps"]
    warmup = args.warmup if args.warmup is not None else spec["warmup"]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
        "-m", "dra.bench.step_overhead", "--worker", "--out", out, "--repeat", str(repeat),
        "--hidden", str(spec["hidden"]), "--depth", str(spec["depth"]), "--global-batch", str(spec["global_batch"]),
        "--rounds", str(args.rounds), "--steps", str(steps), "--warmup", str(warmup),
        "--discard", str(args.discard), "--seed", str(args.seed), "--lr", str(args.lr),
    ]
    if profile:
        cmd.append("--profile")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"step overhead job ({model}, {nproc} processes) failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]


def _pooled(run: dict, variant: str, key: str, phase: str | None = None) -> list[float]:
    values: list[float] = []
    for rnd in run["rounds"]:
        v = rnd["variants"][variant]
        values += v["phases_s"][phase] if phase else v[key]
    return values


def _bootstrap_median_ci(values: list[float], rng: random.Random, n: int = 2000) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def _launch_figures(ranks: list[dict]) -> dict[str, Any]:
    """One launch: rank 0's statistics per variant, the ratios of dra to plain and to bare."""
    r0 = ranks[0]
    row: dict[str, Any] = {}
    for v in VARIANTS:
        steps, cpus = _pooled(r0, v, "step_s"), _pooled(r0, v, "cpu_s")
        row[v] = {
            "median_s": statistics.median(steps),
            "p10_s": _quantile(steps, 0.10),
            "mean_s": statistics.fmean(steps),
            "cpu_median_s": statistics.median(cpus),
            "phases_median_s": {ph: statistics.median(_pooled(r0, v, "", ph)) for ph in PHASES},
            "steps": len(steps),
        }
    for key, (var, base) in COMPARISONS.items():
        d, b = row[var], row[base]
        # Paired: the steps of one iteration ran back to back, under the same load.
        diffs = [x - y for rnd in r0["rounds"] for x, y in zip(rnd["variants"][var]["step_s"], rnd["variants"][base]["step_s"])]
        row[key] = {
            "ratio": d["median_s"] / b["median_s"],
            "ratio_p10": d["p10_s"] / b["p10_s"],
            "ratio_mean": d["mean_s"] / b["mean_s"],
            "ratio_cpu": d["cpu_median_s"] / b["cpu_median_s"],
            "ratio_paired": 1.0 + statistics.median(diffs) / b["median_s"],
            "round_ratios": [
                statistics.median(rnd["variants"][var]["step_s"]) / statistics.median(rnd["variants"][base]["step_s"])
                for rnd in r0["rounds"]
            ],
            "per_rank": [statistics.median(_pooled(r, var, "step_s")) / statistics.median(_pooled(r, base, "step_s")) for r in ranks],
        }
    calls = _pooled(r0, "dra", "", "dra_step")
    row["dra_step_mean_s"] = statistics.fmean(calls)
    row["dra_step_p90_s"] = _quantile(calls, 0.90)
    others = [t for r in ranks[1:] for t in _pooled(r, "dra", "", "dra_step")]
    row["dra_step_other_ranks_median_s"] = statistics.median(others) if others else None
    row["allreduce_flat_s"] = statistics.median(r0["allreduce_flat_s"])
    row["grad_numel"] = r0["grad_numel"]
    row["decide_every"] = r0["decide_every"]
    return row


def _analyse(launches: list[list[dict]]) -> dict[str, Any]:
    """Across launches: medians of the per-launch figures, spread of the ratios, breakdown."""
    per_launch = [_launch_figures(ranks) for ranks in launches]

    def med(f) -> float:
        return statistics.median(f(r) for r in per_launch)

    out: dict[str, Any] = {"per_launch": per_launch}
    for key in COMPARISONS:
        ratios = [r[key]["ratio"] for r in per_launch]
        rounds = [x for r in per_launch for x in r[key]["round_ratios"]]
        out[key] = {
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_ci95_rounds": list(_bootstrap_median_ci(rounds, random.Random(0))),
            "per_launch": ratios,
            "per_rank": [r[key]["per_rank"] for r in per_launch],
            **{k: med(lambda r, k=k, key=key: r[key][k]) for k in ("ratio_p10", "ratio_mean", "ratio_cpu", "ratio_paired")},
        }
    for v in VARIANTS:
        out[v] = {k: med(lambda r, v=v, k=k: r[v][k]) for k in ("median_s", "p10_s", "mean_s", "cpu_median_s")}
        out[v]["phases"] = {ph: med(lambda r, v=v, ph=ph: r[v]["phases_median_s"][ph]) for ph in PHASES}
    others = [r["dra_step_other_ranks_median_s"] for r in per_launch if r["dra_step_other_ranks_median_s"] is not None]
    out.update(
        dra_step_mean_s=med(lambda r: r["dra_step_mean_s"]),
        dra_step_p90_s=med(lambda r: r["dra_step_p90_s"]),
        dra_step_other_ranks_s=statistics.median(others) if others else None,
        allreduce_flat_s=med(lambda r: r["allreduce_flat_s"]),
        grad_numel=per_launch[0]["grad_numel"],
        decide_every=per_launch[0]["decide_every"],
        steps_per_variant=sum(r["dra"]["steps"] for r in per_launch),
    )
    return out


def _overhead_row(name: str, key: str, a: dict[str, Any], config: dict[str, Any], note: str) -> dict[str, Any]:
    c = a[key]
    return result(
        name, 100.0 * (c["ratio"] - 1.0), "%",
        goal_pct=GOAL_PCT,
        ratio_median=c["ratio"], ratio_min=c["ratio_min"], ratio_max=c["ratio_max"], ratio_ci95_rounds=c["ratio_ci95_rounds"],
        per_launch_ratios=c["per_launch"], per_rank_ratios=c["per_rank"],
        p10_pct=100.0 * (c["ratio_p10"] - 1.0),
        paired_pct=100.0 * (c["ratio_paired"] - 1.0),
        mean_based_pct=100.0 * (c["ratio_mean"] - 1.0),
        cpu_time_pct=100.0 * (c["ratio_cpu"] - 1.0),
        steps_per_variant=a["steps_per_variant"],
        note=note + "; value: median over launches of (median step / median baseline step) - 1, rank 0; spread: min/max over "
        "launches and a bootstrap 95% CI of the median per-round ratio; p10: 10th percentiles; paired: median of the "
        "back-to-back step differences; mean_based: means (carry periodic costs); cpu: process CPU time",
        **config,
    )


def _rows(model: str, nproc: int, a: dict[str, Any], spec: dict[str, int]) -> list[dict[str, Any]]:
    tag = f"{model}_n{nproc}"
    ph = {v: a[v]["phases"] for v in VARIANTS}
    config = {"model": model, "world_size": nproc, "grad_numel": a["grad_numel"], "decide_every": a["decide_every"],
              "hidden": spec["hidden"], "depth": spec["depth"], "global_batch": spec["global_batch"]}
    sync = {v: ph[v]["backward"] - ph["local"]["backward"] for v in ("plain", "dra", "bare")}
    rows = [
        result(f"step_time_plain_ddp_{tag}", a["plain"]["median_s"], "s", p10_s=a["plain"]["p10_s"], mean_s=a["plain"]["mean_s"],
               note="median per-step time, torch DDP over Gloo", **config),
        result(f"step_time_dra_{tag}", a["dra"]["median_s"], "s", ("plain_ddp", a["plain"]["median_s"]),
               p10_s=a["dra"]["p10_s"], mean_s=a["dra"]["mean_s"],
               note="median per-step time, dra elastic controller (static world)", **config),
        _overhead_row(f"step_overhead_{tag}", "vs_plain", a, config, "dra vs torch DDP (the goal: < 1 %)"),
        _overhead_row(f"step_noise_aa_{tag}", "aa", a, config,
                      "A/A control: the same DDP job twice in the same processes; its 'overhead' is the measurement's scatter"),
        result(f"step_time_bare_{tag}", a["bare"]["median_s"], "s", p10_s=a["bare"]["p10_s"], mean_s=a["bare"]["mean_s"],
               note="median per-step time, one hand-written flat Gloo all-reduce after backward", **config),
        _overhead_row(f"step_overhead_vs_bare_{tag}", "vs_bare", a, config, "dra vs the hand-written flat all-reduce (dra's own cost)"),
        result(f"step_time_local_{tag}", a["local"]["median_s"], "s", note="same model and per-rank batch, no communication", **config),
        result(f"dra_step_call_{tag}", ph["dra"]["dra_step"], "s", mean_s=a["dra_step_mean_s"], p90_s=a["dra_step_p90_s"],
               other_ranks_median_s=a["dra_step_other_ranks_s"],
               note="time inside dra.step(loss) per step, rank 0 (the leader, which also decides every decide_every steps)"),
        result(f"grad_sync_dra_{tag}", sync["dra"], "s", ("plain_ddp", sync["plain"]), bare_s=sync["bare"],
               note="backward with the gradient reduction minus the local backward: dra's gradient hook + flat all-reduce, "
               "vs DDP's reducer; bare_s: the hand-written flat all-reduce"),
        result(f"allreduce_flat_{tag}", a["allreduce_flat_s"], "s", note="one Gloo all-reduce of the gradients' size (the floor)"),
        result(f"step_cpu_dra_{tag}", a["dra"]["cpu_median_s"], "s", ("plain_ddp", a["plain"]["cpu_median_s"]),
               bare_s=a["bare"]["cpu_median_s"], note="process CPU time per step (all threads), median"),
    ]
    rows[2]["breakdown_median_s"] = ph
    return rows


def _print_breakdown(model: str, nproc: int, a: dict[str, Any]) -> None:
    print(f"[step] {model}, {nproc} processes: phases (rank 0, median ms)", flush=True)
    print(f"    {'variant':<7} " + " ".join(f"{p:>10}" for p in PHASES) + f" {'step':>10} {'p10':>8} {'cpu':>8}")
    for v in VARIANTS:
        ph = a[v]["phases"]
        print(f"    {v:<7} " + " ".join(f"{1e3 * ph[p]:>10.3f}" for p in PHASES)
              + f" {1e3 * a[v]['median_s']:>10.3f} {1e3 * a[v]['p10_s']:>8.3f} {1e3 * a[v]['cpu_median_s']:>8.3f}")
    for key, (var, base) in COMPARISONS.items():
        c = a[key]
        lo, hi = c["ratio_ci95_rounds"]
        print(f"    {var}/{base} = {c['ratio']:.4f} (launches {c['ratio_min']:.4f}..{c['ratio_max']:.4f}; rounds CI95 {lo:.4f}..{hi:.4f}); "
              f"p10 {c['ratio_p10']:.4f}; paired {c['ratio_paired']:.4f}; mean {c['ratio_mean']:.4f}; CPU {c['ratio_cpu']:.4f}")
    other = a["dra_step_other_ranks_s"]
    print(f"    dra.step: rank 0 median {1e6 * a['dra']['phases']['dra_step']:.1f} us, p90 {1e6 * a['dra_step_p90_s']:.1f} us, "
          f"mean {1e6 * a['dra_step_mean_s']:.1f} us" + (f"; other ranks median {1e6 * other:.1f} us" if other is not None else "")
          + f"; flat all-reduce of {a['grad_numel']} floats {1e3 * a['allreduce_flat_s']:.3f} ms", flush=True)


def measure(
    sizes: tuple[int, ...] | list[int] = (2, 4),
    models: tuple[str, ...] | list[str] = ("digits", "wide"),
    *,
    repeats: int = 5,
    rounds: int = 4,
    steps: int | None = None,
    warmup: int | None = None,
    discard: int = 2,
    seed: int = 0,
    lr: float = 0.05,
    timeout: float = 900.0,
    profile: bool = False,
) -> tuple[list[dict[str, Any]], str | None]:
    """Runs the launches; returns the report rows (``_report.result`` dicts) and, with `profile`,
    the cProfile text of rank 0's dra steps (first size, first model). Other suites may call this
    (e.g. ``measure([4], ["digits"], repeats=3)``) and append the rows to their own report."""
    args = argparse.Namespace(rounds=rounds, steps=steps, warmup=warmup, discard=discard, seed=seed, lr=lr, timeout=timeout)
    results: list[dict[str, Any]] = []
    profile_text = None
    with tempfile.TemporaryDirectory(prefix="dra-bench-step-") as tmp:
        for model in models:
            for nproc in sizes:
                launches = []
                for rep in range(repeats):
                    out = os.path.join(tmp, f"{model}-n{nproc}-r{rep}")
                    t0 = time.perf_counter()
                    launches.append(_launch(nproc, model, rep, out, args))
                    r0 = launches[-1][0]
                    p = statistics.median(_pooled(r0, "plain", "step_s"))
                    d = statistics.median(_pooled(r0, "dra", "step_s"))
                    print(f"[step] {model} n={nproc} launch {rep + 1}/{repeats}: plain {1e3 * p:.3f} ms, dra {1e3 * d:.3f} ms, "
                          f"ratio {d / p:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
                a = _analyse(launches)
                _print_breakdown(model, nproc, a)
                results += _rows(model, nproc, a, MODELS[model])
        if profile:
            out = os.path.join(tmp, "profile")
            _launch(sizes[0], models[0], 0, out, args, profile=True)
            profile_text = Path(out, "profile.txt").read_text()
    return results, profile_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, help="where to write the JSON report")
    parser.add_argument("--sizes", default="2,4", help="world sizes (processes), comma-separated")
    parser.add_argument("--models", default="digits,wide", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--repeats", type=int, default=5, help="torchrun launches per size and model")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per launch (the variants' order rotates every round)")
    parser.add_argument("--steps", type=int, default=None, help="steps of each variant per round (default: per model)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps of each variant first (default: per model)")
    parser.add_argument("--discard", type=int, default=2, help="first iterations of every round not counted")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--profile", action="store_true", help="one extra launch with cProfile over rank 0's dra steps")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per torchrun launch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=128, help=argparse.SUPPRESS)
    parser.add_argument("--depth", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--global-batch", type=int, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: unknown model '{m}'; choose from {', '.join(MODELS)}")
    if not sizes or any(n < 2 for n in sizes):
        parser.error("--sizes: world sizes must be >= 2 (a world of one has no gradient reduction to compare)")
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be >= 1")
    for m in models:
        if (args.steps or MODELS[m]["steps"]) <= args.discard:
            parser.error(f"--steps ({args.steps or MODELS[m]['steps']}) must exceed --discard ({args.discard})")

    results, profile_text = measure(
        sizes, models, repeats=args.repeats, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
        discard=args.discard, seed=args.seed, lr=args.lr, timeout=args.timeout, profile=args.profile,
    )
    write_report("step", results, args.json)
    if profile_text is not None:
        print(profile_text)
        if args.json:
            path = os.path.splitext(args.json)[0] + ".profile.txt"
            Path(path).write_text(profile_text)
            print(f"  profile: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
