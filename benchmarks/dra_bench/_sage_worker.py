"""One rank of the SAGE benchmark: trains an MLP on scikit-learn's digits with one gradient-sync
method and writes its measurements as JSON lines. Launched by ``dra_bench.sage`` (inside a
network namespace) with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment.

Every method sees the same batches: the elastic sampler's order (``epoch_order``, seeded, with
each rank's contiguous share of the global batch), whether the controller's sampler hands them
out (``dra_sparse90``) or this script does (the others)."""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from dra._argtypes import count_arg, nonnegative_int_arg, positive_arg, probability_arg, seed32_arg

METHODS = ("fp32_allreduce", "torch_powersgd_hook", "dra_powersgd", "dra_sparse90", "ao_pruning90", "dra_sage")


def load_digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return (torch.from_numpy(xtr), torch.from_numpy(ytr).long(), torch.from_numpy(xte), torch.from_numpy(yte).long())


def make_model(hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def tx_bytes() -> int:
    try:
        with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return -1


def batches(n: int, global_batch: int, seed: int, rank: int, world: int):
    """This rank's indices, step after step: the elastic sampler's order with drop_last."""
    from dra._core._testing import epoch_order, rank_share, step_batch

    epoch_size = n // global_batch * global_batch
    epoch = 0
    while True:
        order = epoch_order(n, seed, epoch)
        for cursor in range(0, epoch_size, global_batch):
            begin, end = step_batch(cursor, global_batch, epoch_size)
            lo, hi = rank_share(begin, end, world, rank)
            yield torch.from_numpy(order[lo:hi].copy())
        epoch += 1


def sparsity_options(a) -> dict:
    """RigL for dra_sparse90: an update every `sparsify_every` steps, 30 % swapped at first (cosine
    decay), no update from 75 % of the run on (RigL's end), the cubic ramp to 90 % that torch.ao's
    baseline follows too."""
    return {"max_sparsity": 0.9, "every": a.sparsify_every, "alpha": 0.3, "end_step": int(0.75 * a.steps),
            "ramp_start": a.ramp_start, "ramp_steps": a.ramp_steps}


class Log:
    """Rank 0's measurements every `every` steps (evaluation outside the timed region)."""

    def __init__(self, path: str, rank: int, every: int, steps: int, model, xte, yte) -> None:
        self.out = open(path, "w") if rank == 0 else None
        self.every, self.steps, self.model, self.xte, self.yte = every, steps, model, xte, yte
        from dra.energy import EnergyMeter

        self.meter = EnergyMeter() if rank == 0 else None
        self.tx0 = tx_bytes()
        self.train_time = 0.0

    def due(self, step: int) -> bool:
        return self.out is not None and (step % self.every == 0 or step == self.steps)

    def point(self, step: int, loss: float, payload: int, **extra) -> None:
        if not self.due(step):
            return
        with torch.no_grad():
            acc = float((self.model(self.xte).argmax(1) == self.yte).float().mean())
        self.meter.mark()
        self.out.write(json.dumps({"step": step, "time_s": self.train_time, "acc": acc,
                                   "wire_tx_bytes": tx_bytes() - self.tx0, "payload_bytes": payload, "loss": loss,
                                   "energy_j": self.meter.job.joules, "energy_source": self.meter.source,
                                   **extra}) + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.out:
            self.out.close()


def run_controller(a, xtr, ytr, xte, yte) -> None:
    """dra_sparse90 through the product: dra.Controller(compress="masked") runs RigL inside the
    elastic controller's gradient reduction (masks from the dense gradient on update steps, only
    active entries in between, biases at the same keep fraction)."""
    import dra
    import dra.elastic as de

    rank = int(os.environ["RANK"])
    model = make_model(a.hidden, a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sampler = de.ElasticSampler(len(xtr), a.batch, seed=a.seed, drop_last=True)
    ctl = de.init(model, opt, sampler, policy="none", compress="masked", sparsity=sparsity_options(a),
                  fault_timeout_s=30.0)
    log = Log(a.out, rank, a.eval_every, a.steps, model, xte, yte)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0
    for _ in ctl.epochs(10**6):
        for idx in sampler:
            t0 = time.perf_counter()
            idx_t = torch.as_tensor(idx)
            ctl.optimizer.zero_grad(set_to_none=False)
            loss = loss_fn(ctl.model(xtr[idx_t]), ytr[idx_t])
            loss.backward()
            ctl.optimizer.step()
            st = dra.step(loss)
            log.train_time += time.perf_counter() - t0
            step += 1
            if log.due(step):
                c = ctl.compression
                log.point(step, float(loss), c["bytes_sent"], sparsity=c["sparsity"], phase=st.signals.phase,
                          world_loss=st.loss)
            if step >= a.steps:
                break
        if step >= a.steps:
            break
    log.close()
    ctl.finish()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=METHODS, required=True)
    ap.add_argument("--steps", type=count_arg, default=400)
    ap.add_argument("--eval-every", type=count_arg, default=5)
    ap.add_argument("--seed", type=seed32_arg, default=0)
    ap.add_argument("--hidden", type=count_arg, default=512)
    ap.add_argument("--batch", type=count_arg, default=64, help="global batch")
    ap.add_argument("--lr", type=positive_arg, default=0.05)
    ap.add_argument("--rank-psgd", type=count_arg, default=2)
    ap.add_argument("--dense-warmup", type=nonnegative_int_arg, default=10, help="fp32 steps before PowerSGD (both PowerSGDs)")
    ap.add_argument("--sparsify-every", type=count_arg, default=50)
    ap.add_argument("--ramp-start", type=nonnegative_int_arg, default=50, help="step the cubic ramp to 90 %% sparsity starts")
    ap.add_argument("--ramp-steps", type=nonnegative_int_arg, default=200, help="steps of that ramp")
    ap.add_argument("--sparse-step-up", type=probability_arg, default=0.3, help="dra_sage: sparsity added per update when steady")
    ap.add_argument("--bucket-mb", type=positive_arg, default=25.0,
                    help="DDP bucket cap (fp32 DDP and torch.ao); 25: DDP's defaults, else the first bucket too")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    torch.set_num_threads(1)
    xtr, ytr, xte, yte = load_digits_split()
    if a.method == "dra_sparse90":
        run_controller(a, xtr, ytr, xte, yte)
        return
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(a.hidden, a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)

    from dra import ConvergenceEstimator
    from dra.compress import DynamicSparsifier, GradientReducer
    from dra.compress._torch import rank_from_signals

    ddp = reducer = dense = sparsifier = ao = ao_schedule = None
    estimator = ConvergenceEstimator()
    if a.method in ("fp32_allreduce", "torch_powersgd_hook", "ao_pruning90"):
        if a.method == "ao_pruning90":
            # torch.ao.pruning's magnitude (weight-norm) sparsifier on the same cubic ramp to 90 %, masks
            # refreshed every sparsify_every steps; gradients travel dense through DDP.
            from torch.ao.pruning import CubicSL, WeightNormSparsifier

            ao = WeightNormSparsifier(sparsity_level=0.9, sparse_block_shape=(1, 1), zeros_per_block=1)
            ao.prepare(model, [{"tensor_fqn": f"{i}.weight"} for i in (0, 2, 4)])
            ao_schedule = CubicSL(ao, init_sl=0.0, init_t=a.ramp_start, delta_t=a.sparsify_every,
                                  total_t=max(1, a.ramp_steps // a.sparsify_every), initially_zero=True)
        if a.method == "torch_powersgd_hook":
            # One gradient bucket: with Gloo, PowerSGD's hook waits on a collective inside a future
            # callback, and two buckets' callbacks occupying Gloo's worker threads deadlock (seen with
            # torch 2.13 here: DDP's 1 MiB first bucket splits this model in two).
            dist._DEFAULT_FIRST_BUCKET_BYTES = 256 << 20
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=256)
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            # The hook's recommended settings: error feedback, warm start, a dense warm-up.
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank_psgd,
                                       start_powerSGD_iter=max(2, a.dense_warmup), min_compression_rate=2,
                                       use_error_feedback=True, warm_start=True, random_seed=a.seed)
            ddp.register_comm_hook(state, psgd.powerSGD_hook)
        else:
            # The bucket cap tuned for the link (the benchmark calibrates it: a few short runs, the
            # fastest per step wins). torch.ao keeps its masks as module buffers, identical on every
            # rank (derived from identical weights), so DDP need not broadcast them each step.
            # 25 MB is DDP's default (with its 1 MiB first bucket); other caps apply to the first too.
            dist._DEFAULT_FIRST_BUCKET_BYTES = (1 << 20) if a.bucket_mb == 25.0 else int(a.bucket_mb * (1 << 20))
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb,
                                                            broadcast_buffers=ao is None)
        net = ddp
    else:
        net = model
        dense = GradientReducer(model, "fp32")
        reducer = GradientReducer(model, f"powersgd:{a.rank_psgd}", seed=a.seed)
        if a.method == "dra_sage":
            # PowerSGD whose rank follows the gradient noise scale, plus RigL sparsity following the
            # phase; the dense gradient travels on mask-update steps (RigL grows by it).
            sparsifier = DynamicSparsifier(model, every=a.sparsify_every, max_sparsity=0.9,
                                           end_step=int(0.75 * a.steps), step_up=a.sparse_step_up, seed=a.seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    log = Log(a.out, rank, a.eval_every, a.steps, model, xte, yte)
    n_params = sum(p.numel() for p in model.parameters())
    payload = 0
    data = batches(len(xtr), a.batch, a.seed, rank, world)
    dist.barrier()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        idx = next(data)
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(xtr[idx]), ytr[idx])
        loss.backward()
        world_loss = float(loss)
        if reducer is not None:
            # The loss and this rank's gradient norm ride the codec's first all-reduce (no round
            # trip of their own): every rank then holds the same signals.
            local_sqr = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
            update = sparsifier is not None and sparsifier.update_due(step - 1)
            use = reducer if step > a.dense_warmup and not update else dense
            ride = np.array([float(loss), local_sqr], np.float32)
            before = use.codec.bytes_sent
            use.reduce(exact=ride)
            payload += use.codec.bytes_sent - before
            world_loss = float(ride[0]) / world
            estimator.update_loss(step, world_loss)
            if a.method == "dra_sage":
                global_sqr = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
                # Gradient noise scale from the mean per-rank norm and the reduced gradient's norm (after
                # warm-up that is PowerSGD's approximation: biased low, but the same on every rank).
                estimator.update_gradients(float(ride[1]) / world, a.batch // world, global_sqr, a.batch)
                if step % a.sparsify_every == 0 and step > a.dense_warmup:
                    reducer.codec.set_rank(rank_from_signals(estimator.signals, a.batch, 1, a.rank_psgd * 2))
                sparsifier.step(step - 1, estimator.signals.phase)
                sparsifier.mask_gradients()
        elif a.method != "torch_powersgd_hook":
            payload += 4 * n_params
        opt.step()
        if sparsifier is not None:
            sparsifier.apply()
        if ao_schedule is not None:
            ao_schedule.step()
            if step % a.sparsify_every == 0:
                ao.step()
        log.train_time += time.perf_counter() - t0
        if log.due(step):
            sparsity = sparsifier.sparse_fraction() if sparsifier else (_ao_sparsity(model) if ao else 0.0)
            log.point(step, world_loss, payload, sparsity=sparsity, phase=estimator.signals.phase,
                      rank=reducer.codec.rank if reducer is not None else 0)
    if ao is not None:
        ao.squash_mask()
    dist.barrier()
    log.close()
    dist.destroy_process_group()


def _ao_sparsity(model) -> float:
    """Fraction of zero weights in torch.ao's parametrized matrices."""
    zeros = total = 0
    for m in model.modules():
        if hasattr(m, "parametrizations"):
            w = m.weight
            zeros += int((w == 0).sum())
            total += w.numel()
    return zeros / max(total, 1)


if __name__ == "__main__":
    main()
