"""One rank of the SAGE benchmark: trains an MLP on scikit-learn's digits with one gradient-sync
method and writes its measurements as JSON lines. Launched by ``dra_bench.sage`` (inside a
network namespace) with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.distributed as dist

METHODS = ("fp32_allreduce", "torch_powersgd_hook", "dra_powersgd", "dra_sparse90", "ao_pruning90", "dra_sage")


def load_digits_split(seed: int):
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=METHODS, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--rank-psgd", type=int, default=2)
    ap.add_argument("--dense-warmup", type=int, default=10, help="fp32 steps before PowerSGD (both PowerSGDs)")
    ap.add_argument("--sparsify-every", type=int, default=50)
    ap.add_argument("--ramp-start", type=int, default=50, help="step the cubic ramp to 90 %% sparsity starts (dra_sparse90, ao_pruning90)")
    ap.add_argument("--ramp-steps", type=int, default=200, help="steps of that ramp")
    ap.add_argument("--sparse-step-up", type=float, default=0.3, help="dra sparsity added per mask update when steady")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    xtr, ytr, xte, yte = load_digits_split(a.seed)
    model = make_model(a.hidden, a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    per_rank = a.batch // world

    from dra import ConvergenceEstimator
    from dra.compress import DynamicSparsifier, GradientReducer
    from dra.compress._torch import rank_from_signals
    from dra.energy import EnergyMeter

    estimator = ConvergenceEstimator()
    meter = EnergyMeter()
    ddp = reducer = sparsifier = ao = ao_schedule = None
    dense = None
    if a.method in ("fp32_allreduce", "torch_powersgd_hook", "ao_pruning90"):
        if a.method == "ao_pruning90":
            # torch.ao.pruning's magnitude (weight-norm) sparsifier at 90 % from the start, masks
            # refreshed every sparsify_every steps; gradients still travel dense through DDP.
            from torch.ao.pruning import CubicSL, WeightNormSparsifier

            ao = WeightNormSparsifier(sparsity_level=0.9, sparse_block_shape=(1, 1), zeros_per_block=1)
            ao.prepare(model, [{"tensor_fqn": f"{i}.weight"} for i in (0, 2, 4)])
            # Gradual (cubic) schedule to 90 %, the standard recipe for magnitude pruning (Zhu & Gupta).
            ao_schedule = CubicSL(ao, init_sl=0.0, init_t=a.ramp_start, delta_t=a.sparsify_every,
                                  total_t=max(1, a.ramp_steps // a.sparsify_every), initially_zero=True)
        if a.method == "torch_powersgd_hook":
            # One gradient bucket: with Gloo, PowerSGD's hook waits on a collective inside a future
            # callback, and two buckets' callbacks occupying Gloo's worker threads deadlock (seen with
            # torch 2.13 here: DDP's 1 MiB first bucket splits this model in two).
            dist._DEFAULT_FIRST_BUCKET_BYTES = 256 << 20
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=256)
        else:
            # torch.ao keeps its masks as module buffers; they are identical on every rank (derived
            # from identical weights), so DDP need not broadcast them each step (it would double the
            # traffic): the tuned setting for the baseline.
            ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=ao is None)
        if a.method == "torch_powersgd_hook":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank_psgd,
                                       start_powerSGD_iter=max(2, a.dense_warmup), min_compression_rate=2,
                                       use_error_feedback=True, warm_start=True, random_seed=a.seed)
            ddp.register_comm_hook(state, psgd.powerSGD_hook)
        net = ddp
    else:
        net = model
        dense = GradientReducer(model, "fp32")
        if a.method == "dra_powersgd":
            reducer = GradientReducer(model, f"powersgd:{a.rank_psgd}", seed=a.seed)
        elif a.method == "dra_sage":
            # PowerSGD whose rank follows the gradient noise scale, plus RigL sparsity following the phase.
            reducer = GradientReducer(model, f"powersgd:{a.rank_psgd}", seed=a.seed)
            sparsifier = DynamicSparsifier(model, every=a.sparsify_every, max_sparsity=0.9, end_step=a.steps,
                                           step_up=a.sparse_step_up)
        else:  # dra_sparse90: RigL masks (drop by magnitude, regrow by gradient) on the same cubic ramp to
            # 90 % as the torch.ao baseline; the masked codec sends only the active entries (the mask
            # is the same on every rank).
            reducer = GradientReducer(model, "masked", seed=a.seed)
            sparsifier = DynamicSparsifier(model, every=a.sparsify_every, max_sparsity=0.9, end_step=a.steps,
                                           schedule=lambda t: cubic_sparsity(t, a.ramp_start, a.ramp_steps, 0.9))
    loss_fn = torch.nn.CrossEntropyLoss()
    out = open(a.out, "w") if rank == 0 else None
    train_time = 0.0
    g = torch.Generator().manual_seed(a.seed)
    order = torch.randperm(len(xtr), generator=g)
    pos = 0
    n_params = sum(p.numel() for p in model.parameters())
    tx0 = tx_bytes()
    payload = 0
    dist.barrier()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        if pos + a.batch > len(order):
            order, pos = torch.randperm(len(xtr), generator=g), 0
        idx = order[pos + rank * per_rank: pos + (rank + 1) * per_rank]
        pos += a.batch
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(xtr[idx]), ytr[idx])
        loss.backward()
        if ddp is None:
            if sparsifier is not None:
                sparsifier.mask_gradients()
            local_sqr = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
            use = reducer if step > a.dense_warmup or a.method == "dra_sparse90" else dense
            if a.method == "dra_sparse90":
                reducer.codec.set_masks(_all_masks(model, sparsifier))
            before = use.codec.bytes_sent
            use.reduce()
            payload += use.codec.bytes_sent - before
            global_sqr = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
        else:
            payload += 4 * n_params if a.method != "torch_powersgd_hook" else 0
        # The convergence estimator sees the mean loss and the mean per-rank gradient norm (one small
        # all-reduce, as dra.step does): every rank then holds the same signals, so decisions taken
        # from them (mask updates, PowerSGD rank) agree without being exchanged.
        stats = torch.tensor([float(loss.detach()), local_sqr if ddp is None else 0.0], dtype=torch.float64)
        dist.all_reduce(stats)
        stats /= world
        estimator.update_loss(step, float(stats[0]))
        if a.method == "dra_sage":
            # Gradient noise scale from the mean per-rank norm and the reduced gradient's norm (after
            # warm-up that is PowerSGD's approximation: biased low, but the same on every rank).
            estimator.update_gradients(float(stats[1]), per_rank, global_sqr, a.batch)
            if step % a.sparsify_every == 0 and step > a.dense_warmup:
                reducer.codec.set_rank(rank_from_signals(estimator.signals, a.batch, 1, a.rank_psgd * 2))
        if sparsifier is not None:
            sparsifier.step(step, estimator.signals.phase)
        opt.step()
        if sparsifier is not None:
            sparsifier.apply()
        if ao_schedule is not None:
            ao_schedule.step()
            if step % a.sparsify_every == 0:
                ao.step()
        lt = stats[0]
        train_time += time.perf_counter() - t0
        if rank == 0 and (step % a.eval_every == 0 or step == a.steps):
            with torch.no_grad():
                acc = float((model(xte).argmax(1) == yte).float().mean())
            meter.mark()
            sparsity = sparsifier.sparse_fraction() if sparsifier else (_ao_sparsity(model) if ao else 0.0)
            out.write(json.dumps({"step": step, "time_s": train_time, "acc": acc, "wire_tx_bytes": tx_bytes() - tx0,
                                  "payload_bytes": payload, "loss": float(lt),
                                  "phase": estimator.signals.phase, "sparsity": sparsity,
                                  "rank": reducer.codec.rank if reducer is not None else 0,
                                  "energy_j": meter.job.joules, "energy_source": meter.source}) + "\n")
            out.flush()
    if ao is not None:
        ao.squash_mask()
    dist.barrier()
    if out:
        out.close()
    dist.destroy_process_group()


def cubic_sparsity(step: int, start: int, ramp: int, final: float) -> float:
    """Zhu & Gupta's gradual schedule: 0 before start, final after start + ramp, cubic in between."""
    if step <= start:
        return 0.0
    done = min(1.0, (step - start) / ramp)
    return final * (1.0 - (1.0 - done) ** 3)


def _ao_sparsity(model) -> float:
    """Fraction of zero weights in torch.ao's parametrized matrices."""
    zeros = total = 0
    for m in model.modules():
        if hasattr(m, "parametrizations"):
            w = m.weight
            zeros += int((w == 0).sum())
            total += w.numel()
    return zeros / max(total, 1)


def _all_masks(model, sparsifier):
    """One mask per parameter in GradientReducer's order: the sparsifier's for matrices, all-ones for the rest."""
    by_id = {id(p): m for p, m in zip(sparsifier.params, sparsifier.masks)}
    return [by_id.get(id(p), np.ones(p.numel(), dtype=np.uint8)) for p in model.parameters() if p.requires_grad]


if __name__ == "__main__":
    main()
