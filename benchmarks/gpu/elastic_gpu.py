"""The elastic controller on real NCCL, on one GPU (only one is ever lent: several ranks on real
NCCL cannot run here; they run on the emulated library, tests/python/test_elastic_nccl.py).

1. A one-rank elastic world (dra.elastic.init, backend="nccl", a real c10d store from
   ``python -m dra store``) trains a small transformer with ``ctl.model`` and ``dra.step(loss)`` on a
   CUDA loss, under ``set_sync_debug_mode("error")``: any device synchronisation in a
   step raises, so "0 synchronising steps" is checked, not assumed. ``ctl.device_reads`` says how
   often the host read device values (decision steps) and how often such a read had to wait.
2. Step time of that loop against plain DDP over a one-rank NCCL process group on the same model
   and data (interleaved blocks, medians). One rank: dra skips the reduction of a world of one,
   DDP does not skip its all-reduce; the figure is labelled so.
3. The NVML energy counter (dra.energy.EnergyMeter) over the timed blocks, with its source.
4. dra's NCCL communicator: init, a kept rebuild, abort, and a re-init after the fault.

Usage: python benchmarks/gpu/elastic_gpu.py [--json PATH] [--steps N] [--rounds R] [--quick]
Exit 0 when every check passed; 1 when one failed; 3 without a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

from dra_bench._store import StoreProcess
from dra_bench.nccl import TinyLM

SUITE = "elastic_gpu"
DEVICE = "cuda"  # --device cpu: the same script over Gloo on the CPU (to check the script itself)
BACKEND = "nccl"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def set_sync_debug_mode(mode: str) -> None:
    if DEVICE == "cuda":
        torch.cuda.set_sync_debug_mode(mode)


def make_model(small: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return (TinyLM(vocab=512, d_model=64, layers=2, heads=4, seq=32) if small else TinyLM()).to(DEVICE)


def elastic_loop(args: argparse.Namespace, checks: dict[str, Any]) -> tuple[list[float], list[float], dict]:
    import dra  # noqa: PLC0415
    import dra.elastic as de  # noqa: PLC0415
    from dra.energy import EnergyMeter  # noqa: PLC0415

    vocab, seq, batch = (512, 32, 4) if args.quick else (8192, 256, 32)
    steps_total = args.steps * args.rounds * 2 + 20
    model = make_model(args.quick)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sampler = de.ElasticSampler(batch * steps_total, batch, seed=0)
    ctl = de.init(
        model,
        opt,
        sampler,
        backend=BACKEND,
        policy="none",
        min_size=1,
        max_size=1,
        decide_every=args.decide_every,
        fault_timeout_s=30.0,
    )
    tokens = torch.randint(0, vocab, (batch, seq), device=DEVICE)
    targets = torch.randint(0, vocab, (batch, seq), device=DEVICE)
    loss_fn = torch.nn.CrossEntropyLoss()

    # The baseline: DDP over a one-rank NCCL process group, its own copy of the model.
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_initialized():
        dist.init_process_group(BACKEND, store=dist.HashStore(), rank=0, world_size=1)
    ddp_model = torch.nn.parallel.DistributedDataParallel(
        make_model(args.quick), device_ids=[torch.cuda.current_device()] if DEVICE == "cuda" else None
    )
    ddp_opt = torch.optim.AdamW(ddp_model.parameters(), lr=1e-4)

    it = iter(sampler)

    def dra_step() -> None:
        next(it)
        loss = loss_fn(ctl.model(tokens).reshape(-1, vocab), targets.reshape(-1))
        ctl.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        ctl.optimizer.step()
        dra.step(loss)

    def ddp_step() -> None:
        ddp_opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp_model(tokens).reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        ddp_opt.step()

    for _ in range(5):
        dra_step()
        ddp_step()
    # 1. No synchronisation: any synchronising call in a step raises under "error".
    sync_steps, first_sync = 0, ""
    sync()
    for step in range(args.steps * 2):
        set_sync_debug_mode("error")
        try:
            dra_step()
        except RuntimeError as exc:
            sync_steps += 1
            first_sync = first_sync or f"step {step}: {str(exc).splitlines()[0]}"
            break
        finally:
            set_sync_debug_mode("default")
    checks["synchronising_steps"] = sync_steps
    checks["synchronising_steps_checked"] = args.steps * 2
    checks["first_sync"] = first_sync
    # 2 + 3. Interleaved timed blocks, rotating the order; energy over all of them.
    meter = EnergyMeter()
    meter.mark()
    times: dict[str, list[float]] = {"dra": [], "ddp": []}
    fns = {"dra": dra_step, "ddp": ddp_step}
    joules = {"dra": 0.0, "ddp": 0.0}
    for r in range(args.rounds):
        for name in ("dra", "ddp") if r % 2 == 0 else ("ddp", "dra"):
            sync()
            meter.mark()
            start = time.perf_counter()
            for _ in range(args.steps):
                fns[name]()
            sync()
            times[name].append((time.perf_counter() - start) / args.steps)
            joules[name] += meter.mark().joules
    reads = dict(ctl.device_reads)
    ctl.finish()  # while the store is up: the job's end is announced
    energy = {
        "source": meter.source,
        "reader": meter.reader,
        "joules_dra": joules["dra"],
        "joules_ddp": joules["ddp"],
        "notes": list(meter.notes),
    }
    params = sum(p.numel() for p in model.parameters())
    return times["dra"], times["ddp"], {"reads": reads, "energy": energy, "params": params, "steps": ctl.step_index}


def comm_lifecycle(checks: dict[str, Any]) -> None:
    from dra import _core  # noqa: PLC0415

    world = _core._testing.NcclWorld(device=torch.cuda.current_device(), capture_log=True, timeout_s=60)
    paths = [world.rebuild(1, [], [0], 0)]
    t = torch.ones(1 << 20, device=DEVICE)
    world.all_reduce_sum(t)
    paths.append(world.rebuild(2, [0], [0], 0))
    world.abort()
    paths.append(world.rebuild(3, [0], [0], 0, abortive=True))
    world.all_reduce_sum(t)
    sync()
    ok = bool(torch.all(t == 1.0))
    world.close()
    checks["comm_paths"] = paths
    checks["comm_lifecycle_ok"] = ok and paths == ["fresh_init", "keep", "fresh_init"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--steps", type=int, default=20, help="training steps per timed block")
    p.add_argument("--rounds", type=int, default=6, help="timed blocks per variant (median taken)")
    p.add_argument("--decide-every", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="a small model (for tests)")
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: the same script over Gloo on the CPU, to check the script where there is no GPU",
    )
    args = p.parse_args(argv)
    global DEVICE, BACKEND  # noqa: PLW0603
    DEVICE, BACKEND = args.device, "nccl" if args.device == "cuda" else "gloo"
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("elastic_gpu: no CUDA GPU visible to torch (--device cpu checks the script on the CPU)", file=sys.stderr)
        return 3
    from dra_bench._report import result, write_report  # noqa: PLC0415

    store = StoreProcess()
    port = store.port
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1", "RANK": "0", "DRA_JOB_ID": "gpucheck"}
    )
    checks: dict[str, Any] = {}
    try:
        if DEVICE == "cuda":
            torch.cuda.set_device(0)
            comm_lifecycle(checks)
        else:
            checks.update(comm_paths=[], comm_lifecycle_ok=True)  # NCCL's communicator needs a GPU
        dra_t, ddp_t, info = elastic_loop(args, checks)
    finally:
        store.close()
    med_dra, med_ddp = statistics.median(dra_t), statistics.median(ddp_t)
    reads = info["reads"]
    results = [
        result(
            "elastic_step_ms_one_rank",
            med_dra * 1e3,
            "ms",
            (f"plain DDP, one-rank {BACKEND} group (DDP all-reduces, dra skips a world of one)", med_ddp * 1e3),
            label="measured",
            params=info["params"],
            steps=args.steps * args.rounds,
            overhead_pct=(med_dra / med_ddp - 1.0) * 100.0,
        ),
        result(
            "synchronising_steps",
            float(checks["synchronising_steps"]),
            "steps",
            None,
            label="measured",
            checked=checks["synchronising_steps_checked"],
            first=checks["first_sync"],
            goal="0 (torch.cuda.set_sync_debug_mode('error') raised nothing)",
            goal_met=checks["synchronising_steps"] == 0,
        ),
        result(
            "device_reads",
            float(reads["reads"]),
            "reads",
            None,
            label="measured",
            blocking_waits=reads["blocking_waits"],
            steps=info["steps"],
        ),
        result(
            "energy_j_dra_blocks",
            info["energy"]["joules_dra"],
            "J",
            ("DDP blocks", info["energy"]["joules_ddp"]),
            label=info["energy"]["source"],
            reader=info["energy"]["reader"],
            notes=info["energy"]["notes"],
        ),
    ]
    write_report(SUITE, results, args.json)
    ok = checks["synchronising_steps"] == 0 and checks["comm_lifecycle_ok"]
    print(
        f"elastic_gpu: comm paths {checks['comm_paths']}, synchronising steps {checks['synchronising_steps']}"
        f"{' (' + checks['first_sync'] + ')' if checks['first_sync'] else ''}, device reads {reads}, "
        f"step {med_dra * 1e3:.2f} ms vs DDP {med_ddp * 1e3:.2f} ms, energy {info['energy']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
