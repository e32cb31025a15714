"""The processes of ``python -m dra.bench nccl``: one per rank, started with multiprocessing's spawn.

Each worker drives dra's NCCL backend (``_core._testing.NcclWorld``: the real library on a GPU, the
emulated one on CPU tensors under ``DRA_NCCL_EMULATION=1``) and, beside it in the same processes,
the baseline from ``torch.distributed`` (NCCL on a GPU, Gloo on the CPU). Rank 0 puts its figures
on the queue; every worker puts ``{"error": ...}`` instead of hanging when something fails.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

import torch


class Setup:
    """What every worker of one part is given (picklable)."""

    def __init__(self, world: int, port: int, cuda: bool, repeats: int, budget_s: float) -> None:
        self.world, self.port, self.cuda, self.repeats, self.budget_s = world, port, cuda, repeats, budget_s


def _device(setup: Setup, rank: int) -> torch.device:
    if setup.cuda:
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _sync(setup: Setup) -> None:
    if setup.cuda:
        torch.cuda.synchronize()


def _connect(setup: Setup, rank: int, prefix: str, *, collective_timeout_s: float | None = None):
    """dra's NCCL world (epoch 1, every rank) and torch.distributed's group, on one store."""
    import torch.distributed as dist

    from dra import _core

    store = dist.TCPStore("127.0.0.1", setup.port, setup.world, rank == 0, timeout=timedelta(seconds=120),
                          wait_for_workers=False)
    ours = _core._testing.NcclWorld(device=rank if setup.cuda else -1, store_host="127.0.0.1", store_port=setup.port,
                                    timeout_s=120, prefix=f"{prefix}/dra", capture_log=True)
    t0 = time.perf_counter()
    path = ours.rebuild(1, [], list(range(setup.world)), rank, collective_timeout_s=collective_timeout_s)
    ours.barrier()
    init_s = time.perf_counter() - t0
    kwargs: dict[str, Any] = {"device_id": torch.device("cuda", rank)} if setup.cuda else {}
    t0 = time.perf_counter()
    dist.init_process_group("nccl" if setup.cuda else "gloo", store=dist.PrefixStore(f"{prefix}/torch", store),
                            rank=rank, world_size=setup.world, timeout=timedelta(seconds=120), **kwargs)
    dist.barrier()
    torch_init_s = time.perf_counter() - t0
    return store, ours, {"dra_init_s": init_s, "torch_init_s": torch_init_s, "path": path,
                         "runtime": ours.runtime_version, "emulated": ours.emulated}


def _timed(setup: Setup, fn, iters: int) -> float:
    """Seconds per call of `fn` over `iters` calls (CUDA events on a GPU), after a barrier-free warm-up."""
    fn()
    _sync(setup)
    if setup.cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _alternated(setup: Setup, first, second, iters: int) -> tuple[float, float]:
    """Medians over `setup.repeats` of two timed blocks, their order alternated per repeat."""
    import torch.distributed as dist

    a, b = [], []
    for rep in range(setup.repeats):
        dist.barrier()
        if rep % 2 == 0:
            a.append(_timed(setup, first, iters))
            b.append(_timed(setup, second, iters))
        else:
            b.append(_timed(setup, second, iters))
            a.append(_timed(setup, first, iters))
    return statistics.median(a), statistics.median(b)


def state_like(total_bytes: int, device: torch.device) -> list[torch.Tensor]:
    """A model's state as the handoff sees it: 256 small tensors of 4 KiB (biases, norms, step
    counters) and the rest in tensors of at most 4 MiB."""
    sizes = [4096] * 256
    rest = max(0, total_bytes - 256 * 4096)
    while rest > 0:
        sizes.append(min(rest, 4 << 20))
        rest -= sizes[-1]
    return [torch.full((n // 4,), float(i), device=device) for i, n in enumerate(sizes)]


def bandwidth_and_p2p(rank: int, setup: Setup, sizes: list[int], p2p_bytes: int, chunk_mb: float, queue) -> None:
    """All-reduce of each size through dra and torch.distributed; then rank 0 -> 1: the state
    handoff's chunked transfer against one plain send/recv of the same bytes (dra's, torch's)."""
    try:
        import torch.distributed as dist

        device = _device(setup, rank)
        _, ours, info = _connect(setup, rank, "bench/bw")
        rows, deadline = [], time.monotonic() + setup.budget_s
        for nbytes in sizes:
            if time.monotonic() > deadline:
                break
            tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            iters = int(max(3, min(50, (64 << 20) // nbytes)))
            t_dra, t_torch = _alternated(setup, lambda: ours.all_reduce_sum(tensor),
                                         lambda: dist.all_reduce(tensor), iters)
            rows.append({"bytes": nbytes, "dra_s": t_dra, "torch_s": t_torch, "iters": iters})
        check = torch.ones(1024, device=device)
        ours.all_reduce_sum(check)
        _sync(setup)
        info["correct"] = bool(torch.all(check == float(setup.world)))
        info["rows"] = rows
        if setup.world >= 2 and rank < 2 and p2p_bytes > 0:
            info["p2p"] = _p2p(rank, setup, device, ours, p2p_bytes, chunk_mb)
        dist.barrier()
        ours.close()
        dist.destroy_process_group()
        if rank == 0:
            queue.put(info)
    except BaseException as exc:  # reported, never left hanging
        queue.put({"error": f"rank {rank}: {exc!r}"})


def _p2p(rank: int, setup: Setup, device: torch.device, ours, nbytes: int, chunk_mb: float) -> dict[str, Any]:
    import torch.distributed as dist

    pieces = state_like(nbytes, device)
    if rank == 1:
        for p in pieces:  # what the receiver holds must come from the handoff
            p.zero_()
    total = sum(p.numel() * p.element_size() for p in pieces)
    flat = torch.ones(total // 4, dtype=torch.float32, device=device)
    if rank == 0:
        handoff, plain = (lambda: ours.transfer_send(pieces, [1], chunk_mb)), (lambda: ours.send(flat, [1]))
        torch_plain = lambda: dist.send(flat, 1)  # noqa: E731
    else:
        handoff, plain = (lambda: ours.transfer_recv(pieces, 0, chunk_mb)), (lambda: ours.recv(flat, 0))
        torch_plain = lambda: dist.recv(flat, 0)  # noqa: E731
    samples: dict[str, list[float]] = {"handoff": [], "plain": [], "torch": []}
    order = list(samples)
    fns = {"handoff": handoff, "plain": plain, "torch": torch_plain}
    for rep in range(setup.repeats + 1):  # the first round warms up and is dropped
        for name in order[rep % 3:] + order[: rep % 3]:
            ours.barrier()
            _sync(setup)
            t0 = time.perf_counter()
            fns[name]()
            _sync(setup)
            if rep:
                samples[name].append(time.perf_counter() - t0)
    if rank == 1:  # what arrived is what was sent
        if not all(bool(torch.all(p == float(i))) for i, p in enumerate(pieces)):
            raise RuntimeError("the state handoff delivered wrong bytes")
    return {"bytes": total, "tensors": len(pieces), **{k: statistics.median(v) for k, v in samples.items()}}


def hung_peer(rank: int, setup: Setup, timeout_s: float, queue) -> None:
    """The last rank stops taking part (alive, silent). The others' next all-reduce: how long after
    the timeout the watchdog's revoke/abort reaches the caller, then the survivors' abortive shrink;
    and torch.distributed's Gloo timeout with the same bound on the same hang (CPU tensors)."""
    try:
        import torch.distributed as dist

        device = _device(setup, rank)
        store, ours, _ = _connect(setup, rank, "bench/wd", collective_timeout_s=timeout_s)
        last = setup.world - 1
        survivors = list(range(last))
        # The baseline's group: Gloo (CPU tensors) with the same timeout; every rank creates it.
        gloo = dist.new_group(list(range(setup.world)), backend="gloo", timeout=timedelta(seconds=timeout_s))
        if rank == last:  # hangs: alive but silent until the survivors are done
            store.wait(["wd/done"], timedelta(seconds=300))
            ours.abort()
            return
        out: dict[str, Any] = {"timeout_s": timeout_s, "world": setup.world}
        # torch.distributed Gloo, the same hang: its all-reduce fails after the group's timeout.
        t0 = time.perf_counter()
        try:
            dist.all_reduce(torch.ones(16), group=gloo)
            out["torch_error"] = "none: the all-reduce completed"
        except Exception as exc:  # noqa: BLE001 - the expected timeout
            out["torch_error"] = type(exc).__name__
        out["torch_detect_s"] = time.perf_counter() - t0
        # dra: the watchdog revokes (NCCL >= 2.28) or aborts; the caller learns it at once or at
        # its next wait on the communicator's work.
        t0 = time.perf_counter()
        try:
            ours.all_reduce_sum(torch.ones(16, device=device))
            ours.barrier()
            out["dra_error"] = "none: the all-reduce completed"
        except Exception as exc:  # noqa: BLE001 - the expected timeout
            out["dra_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        out["dra_detect_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        out["shrink_path"] = ours.rebuild(2, list(range(setup.world)), survivors, rank, abortive=True,
                                          collective_timeout_s=60.0)
        check = torch.ones(16, device=device)
        if len(survivors) > 1:
            ours.all_reduce_sum(check)
        _sync(setup)
        out["shrink_s"] = time.perf_counter() - t0
        out["correct"] = bool(torch.all(check == float(len(survivors))))
        if len(survivors) > 1:
            ours.barrier()
        if rank == 0:
            store.set("wd/done", "1")
            queue.put(out)
        ours.close()
    except BaseException as exc:  # reported, never left hanging
        queue.put({"error": f"rank {rank}: {exc!r}"})
