"""GPU measurements of dra's NCCL backend, each against its baseline in the same run.

1. All-reduce bandwidth, 1 KiB .. 1 GiB (powers of 4), through dra's NCCL communicator
   (_core._testing.NcclWorld) against torch.distributed's own NCCL all-reduce, one process per GPU.
2. dra's NCCL communicator init (fresh init, non-blocking + polled) against
   torch.distributed.init_process_group + first all-reduce.
3. dra.step overhead on a real training step (a small transformer on random data): the same loop
   with dra.step(loss) against one that reads the loss with loss.item(), and one that never syncs.

Usage: python benchmarks/gpu/nccl_bench.py [--json PATH] [--nproc N] [--max-bytes B] [--budget-s S]
Writes the common report {"suite", "machine", "results"} (dra.bench._report) and a table.
`--device cpu` runs only part 3 on the CPU (to check the script where there is no GPU).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch

SUITE = "nccl_gpu"


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- 1 + 2: bandwidth and init, one process per GPU ------------------------------------------


def _time_collective(fn, tensor: torch.Tensor, iters: int) -> float:
    """Seconds per call, timed with CUDA events on the current stream after a warm-up."""
    for _ in range(2):
        fn(tensor)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn(tensor)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def _bandwidth_worker(rank: int, world: int, port: int, byte_sizes: list[int], budget_s: float, queue) -> None:
    try:
        import torch.distributed as dist  # noqa: PLC0415

        from dra import _core  # noqa: PLC0415

        torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, wait_for_workers=False)
        t0 = time.perf_counter()
        ours = _core._testing.NcclWorld(device=rank, store_host="127.0.0.1", store_port=port, timeout_s=120, prefix="bench/dra")
        path = ours.rebuild(1, [], list(range(world)), rank)
        probe = torch.ones(1, device="cuda")
        ours.all_reduce_sum(probe)
        torch.cuda.synchronize()
        dra_init_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        dist.init_process_group("nccl", store=dist.PrefixStore("bench/torch", store), rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        probe = torch.ones(1, device="cuda")
        dist.all_reduce(probe)
        torch.cuda.synchronize()
        torch_init_s = time.perf_counter() - t0

        rows = []
        deadline = time.monotonic() + budget_s
        for nbytes in byte_sizes:
            if time.monotonic() > deadline:
                break
            tensor = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
            # Enough iterations to time, bounded so 1 GiB stays within budget.
            iters = int(max(3, min(50, (256 << 20) // nbytes)))
            # Alternate the order per size so neither side always runs on a warmer GPU.
            if len(rows) % 2 == 0:
                t_dra = _time_collective(ours.all_reduce_sum, tensor, iters)
                t_torch = _time_collective(dist.all_reduce, tensor, iters)
            else:
                t_torch = _time_collective(dist.all_reduce, tensor, iters)
                t_dra = _time_collective(ours.all_reduce_sum, tensor, iters)
            rows.append({"bytes": nbytes, "dra_s": t_dra, "torch_s": t_torch, "iters": iters})
            del tensor
        # Correctness of the last size: sum of ones over `world` ranks.
        check = torch.ones(1024, device="cuda")
        ours.all_reduce_sum(check)
        torch.cuda.synchronize()
        correct = bool(torch.all(check == float(world)))
        ours.close()
        dist.destroy_process_group()
        if rank == 0:
            queue.put({"rows": rows, "dra_init_s": dra_init_s, "torch_init_s": torch_init_s, "path": path,
                       "correct": correct, "runtime": ours.runtime_version})
    except BaseException as exc:  # reported, never left hanging
        queue.put({"error": f"rank {rank}: {exc!r}"})


def bandwidth(nproc: int, byte_sizes: list[int], budget_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch.multiprocessing as mp  # noqa: PLC0415

    from dra.bench._report import result  # noqa: PLC0415

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_bandwidth_worker, args=(r, nproc, port, byte_sizes, budget_s, queue)) for r in range(nproc)]
    for p in procs:
        p.start()
    try:
        got = queue.get(timeout=budget_s + 180)
    finally:  # never leave a worker holding a GPU
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    if "error" in got:
        raise RuntimeError(got["error"])
    factor = 2.0 * (nproc - 1) / nproc if nproc > 1 else 1.0  # bus bandwidth (nccl-tests); algbw for one rank
    kind = "busbw" if nproc > 1 else "algbw"
    results = [
        result("nccl_init_s", got["dra_init_s"], "s", ("torch.distributed init_process_group", got["torch_init_s"]),
               world=nproc),
    ]
    for row in got["rows"]:
        nbytes = row["bytes"]
        dra_bw = nbytes / row["dra_s"] / 1e9 * factor
        torch_bw = nbytes / row["torch_s"] / 1e9 * factor
        results.append(result(f"allreduce_{kind}_{human(nbytes)}", dra_bw, "GB/s",
                              ("torch.distributed all_reduce", torch_bw), bytes=nbytes, world=nproc,
                              iters=row["iters"], dra_us=row["dra_s"] * 1e6, torch_us=row["torch_s"] * 1e6))
    return results, {"path": got["path"], "correct": got["correct"], "runtime": got["runtime"]}


# ---- 3: dra.step overhead --------------------------------------------------------------------


class TinyLM(torch.nn.Module):
    """A small transformer LM (about 20 M parameters)."""

    def __init__(self, vocab: int = 8192, d_model: int = 512, layers: int = 4, heads: int = 8, seq: int = 256):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d_model))
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens) + self.pos[: tokens.shape[1]]))


def step_overhead(device: str, steps: int, rounds: int, small: bool) -> list[dict[str, Any]]:
    import dra  # noqa: PLC0415
    from dra.bench._report import result  # noqa: PLC0415

    torch.manual_seed(0)
    vocab, seq, batch = (512, 32, 4) if small else (8192, 256, 32)
    model = (TinyLM(vocab=vocab, d_model=64, layers=2, heads=4, seq=seq) if small else TinyLM()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    targets = torch.randint(0, vocab, (batch, seq), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def train_step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    modes = {
        "plain": lambda loss: None,
        "item": lambda loss: loss.item(),
        "dra": lambda loss: dra.step(loss),
    }
    for _ in range(5):  # warm-up (allocator, kernels, autotuning)
        train_step()
    dra.reset()
    samples: dict[str, list[float]] = {m: [] for m in modes}
    order = list(modes)
    for round_index in range(rounds):
        # Rotate the order each round so no mode always follows the same one.
        for mode in order[round_index % len(order):] + order[: round_index % len(order)]:
            after = modes[mode]
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                after(train_step())
            sync()
            samples[mode].append((time.perf_counter() - start) / steps)
    med = {m: statistics.median(v) for m, v in samples.items()}
    # The call itself, apart from the training step's noise: a loss already computed on the device.
    loss = train_step().detach()
    sync()
    dra.reset()
    calls = 200
    call_s = {}
    for name, fn in (("dra", lambda: dra.step(loss)), ("item", lambda: loss.item())):
        best = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best.append((time.perf_counter() - start) / calls)
        call_s[name] = statistics.median(best)
    params = sum(p.numel() for p in model.parameters())
    return [
        result("step_ms_with_dra_step", med["dra"] * 1e3, "ms", ("same loop with loss.item()", med["item"] * 1e3),
               params=params, device=device, steps=steps * rounds),
        result("step_ms_with_dra_step_vs_no_sync", med["dra"] * 1e3, "ms", ("same loop, no loss read", med["plain"] * 1e3),
               params=params, device=device),
        result("dra_step_overhead_pct", (med["dra"] / med["item"] - 1.0) * 100.0, "%", None, device=device),
        result("dra_step_call_us", call_s["dra"] * 1e6, "us", ("loss.item() call", call_s["item"] * 1e6), device=device),
    ]


# ---- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the JSON report here")
    p.add_argument("--nproc", default="auto", help="processes (GPUs) for the bandwidth part: a number or 'auto' (all, up to 8)")
    p.add_argument("--min-bytes", type=int, default=1 << 10)
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--budget-s", type=float, default=150.0, help="time budget of the bandwidth sweep (sizes beyond it are skipped)")
    p.add_argument("--steps", type=int, default=10, help="training steps per timed block")
    p.add_argument("--rounds", type=int, default=6, help="timed blocks per mode (median taken)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: only the dra.step part, small model")
    args = p.parse_args(argv)
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes:
        p.error("--min-bytes must be >= 4 and <= --max-bytes")
    if args.steps < 1 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dra.bench._report import write_report  # noqa: PLC0415

    results: list[dict[str, Any]] = []
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("nccl_bench: no CUDA GPU visible to torch; use --device cpu for the CPU-only part", file=sys.stderr)
            return 3
        count = torch.cuda.device_count()
        nproc = min(count, 8) if args.nproc == "auto" else int(args.nproc)
        if not 1 <= nproc <= count:
            print(f"nccl_bench: --nproc {nproc} but {count} GPUs are visible", file=sys.stderr)
            return 2
        bw, info = bandwidth(nproc, sizes(args.min_bytes, args.max_bytes), args.budget_s)
        if not info["correct"]:
            print("nccl_bench: dra's all-reduce returned a wrong sum", file=sys.stderr)
            return 1
        print(f"nccl_bench: {nproc} rank(s), runtime NCCL {info['runtime']}, dra init path {info['path']}")
        results += bw
        results += step_overhead("cuda", args.steps, args.rounds, small=False)
    else:
        results += step_overhead("cpu", max(2, args.steps // 4), args.rounds, small=True)
    write_report(SUITE, results, args.json)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    sys.exit(main())
