"""``python -m dra.bench nccl --json PATH``: dra's NCCL backend against the strongest baseline here.

Two modes, the same rows, each row labelled with its ``label``:

* **real** (a CUDA GPU, torch with CUDA, libnccl): "measured on <GPU>". One process per GPU.
* **emulated** (no GPU: ``DRA_NCCL_EMULATION=1``, real processes over shared memory, CPU tensors):
  "emulated". The emulated library is not a fabric: its bandwidth measures dra's protocol and the
  emulation's copies, never NCCL. The baseline beside it is torch.distributed on Gloo.

Rows:

1. all-reduce bandwidth per size (powers of 4 from ``--min-bytes`` to ``--max-bytes``: 1 KiB to 1 GiB
   on a GPU, to 16 MiB on the CPU by default, cut where ``--budget-s`` runs out) through dra's
   communicator against ``torch.distributed.all_reduce`` (NCCL on a GPU, Gloo on the CPU), in the
   same processes, alternated blocks, medians; bus bandwidth (nccl-tests) with 2+ ranks;
2. the state handoff (chunked, pipelined: ``tensor_transfer``) of a model-like state (256 tensors of
   4 KiB and the rest in 4 MiB tensors), rank 0 -> 1, against one plain send/recv of the same bytes
   as one tensor: dra's own ``send``/``recv`` and torch.distributed's;
3. an elastic world shrinking n -> n/2 and growing back through ``backend="nccl"`` (the controller,
   a real store, from the decision to the new world's first all-reduce), beside the same run on
   Gloo (``python -m dra.bench resize`` has the process-group and torchrun baselines);
4. a hung peer (alive, silent): how long after the timeout the watchdog's revoke/abort reaches the
   caller, and the survivors' abortive shrink; beside it torch.distributed Gloo's timeout;
5. host reads of device values per step in that elastic run (``ctl.device_reads``; "blocking" ones
   are device synchronisations: 0 expected off decision steps);
6. ``dra.step`` on a 0-d tensor (and a CUDA one) against a no-op binding call (thread CPU time), and
   a training step with ``dra.step(loss)`` against the same loop reading ``loss.item()``.

Several ranks of real NCCL need several GPUs: with one GPU, the rows that need two ranks are NaN
with a note. A plot of bandwidth against size goes next to the JSON (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dra._argtypes import count_arg, nonnegative_int_arg, positive_arg
from dra_bench import _nccl_workers as workers
from dra_bench._report import result, write_report

SUITE = "nccl"
PARTS = ("bandwidth", "resize", "watchdog", "step")
EMULATED_TRANSPORT = ("emulated: dra's communicator on the emulated library moves bytes through shared memory, "
                      "Gloo through TCP loopback; the ratio compares those transports, not NCCL with anything")


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(target, world: int, args: tuple, timeout_s: float) -> dict[str, Any]:
    """Runs `target(rank, setup, *args, queue)` in `world` spawned processes; rank 0's answer."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = queue.get(timeout=timeout_s)
    finally:  # never leave a worker behind (or holding a GPU)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    if "error" in got:
        raise RuntimeError(got["error"])
    return got


class Context:
    """The mode and what every part needs to know about this machine."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.cuda = args.mode == "real"
        self.gpus = torch.cuda.device_count() if self.cuda else 0
        self.world = (min(self.gpus, 8) if args.nproc == 0 else args.nproc) if self.cuda else (args.nproc or 2)
        self.label = f"measured on {torch.cuda.get_device_name(0)}" if self.cuda else "emulated"
        self.baseline = "torch.distributed NCCL" if self.cuda else "torch.distributed Gloo"
        self.args = args

    def row(self, name: str, value: float, unit: str, baseline: tuple[str, float] | None = None, **extra: Any):
        return result(name, value, unit, baseline, label=self.label, **extra)

    def missing(self, name: str, unit: str, why: str) -> dict[str, Any]:
        return self.row(name, float("nan"), unit, note=why)

    def setup(self, world: int, budget_s: float) -> workers.Setup:
        return workers.Setup(world, _free_port(), self.cuda, self.args.repeats, budget_s)


# ---- 1 + 2: bandwidth and the handoff -----------------------------------------------------------
def bandwidth_rows(ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    a = ctx.args
    byte_sizes = sizes(a.min_bytes, a.max_bytes)
    p2p_bytes = int(a.p2p_mb * (1 << 20)) if ctx.world >= 2 else 0
    got = _spawn(workers.bandwidth_and_p2p, ctx.world,
                 (ctx.setup(ctx.world, a.budget_s), byte_sizes, p2p_bytes, a.chunk_mb), a.budget_s + 300)
    if not got["correct"]:
        raise RuntimeError("dra's all-reduce returned a wrong sum")
    n = ctx.world
    factor, kind = (2.0 * (n - 1) / n, "busbw") if n > 1 else (1.0, "algbw")
    rows = [ctx.row("comm_init_s", got["dra_init_s"], "s", (f"{ctx.baseline} init_process_group", got["torch_init_s"]),
                    world=n, path=got["path"], nccl=got["runtime"] + (" (emulated)" if got["emulated"] else ""))]
    note = None if ctx.cuda else EMULATED_TRANSPORT
    for r in got["rows"]:
        b = r["bytes"]
        rows.append(ctx.row(f"allreduce_{kind}_{human(b)}", b / r["dra_s"] / 1e9 * factor, "GB/s",
                            (f"{ctx.baseline} all_reduce", b / r["torch_s"] / 1e9 * factor), bytes=b, world=n,
                            iters=r["iters"], dra_us=r["dra_s"] * 1e6, torch_us=r["torch_s"] * 1e6, note=note))
    skipped = [human(b) for b in byte_sizes[len(got["rows"]):]]
    if skipped:
        rows.append(ctx.missing("allreduce_sizes_skipped", "sizes", f"--budget-s ran out before {', '.join(skipped)}"))
    p2p = got.get("p2p")
    if p2p is None:
        rows += [ctx.missing(f"handoff_{w}", "GB/s", f"needs 2 ranks (world {n})") for w in ("vs_plain", "vs_torch")]
    else:
        gbs = p2p["bytes"] / p2p["handoff"] / 1e9
        common = {"bytes": p2p["bytes"], "tensors": p2p["tensors"], "chunk_mb": ctx.args.chunk_mb,
                  "note": None if ctx.cuda else EMULATED_TRANSPORT}
        rows.append(ctx.row(f"handoff_{human(p2p['bytes'])}_vs_plain", gbs, "GB/s",
                            ("dra send/recv of one flat tensor", p2p["bytes"] / p2p["plain"] / 1e9), **common))
        rows.append(ctx.row(f"handoff_{human(p2p['bytes'])}_vs_torch", gbs, "GB/s",
                            (f"{ctx.baseline} send/recv of one flat tensor", p2p["bytes"] / p2p["torch"] / 1e9),
                            **common))
    return rows, got["rows"]


# ---- 3 + 5: an elastic world through the NCCL backend --------------------------------------------
def resize_rows(ctx: Context) -> list[dict[str, Any]]:
    from dra_bench.resize import _run_direct

    n = ctx.world if ctx.cuda else max(ctx.args.resize_nproc, 2)
    if n < 2:
        why = (f"needs 2 ranks: {ctx.gpus} GPU(s) here (NCCL refuses two ranks on one GPU); one rank's "
               "synchronisations: elastic_gpu.json (benchmarks/gpu/check.sh)")
        return [ctx.missing(name, unit, why) for name, unit in
                (("shrink_s", "s"), ("grow_s", "s"), ("device_blocking_waits_per_step", "1/step"))]
    device = "cuda" if ctx.cuda else "cpu"
    backends = ["nccl"] if ctx.cuda else ["nccl", "gloo"]  # Gloo keeps CPU tensors: a CPU baseline only
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    reads = []
    with tempfile.TemporaryDirectory(prefix="dra-bench-nccl-") as tmp:
        for rep in range(ctx.args.resize_repeats):
            for backend in backends if rep % 2 == 0 else backends[::-1]:
                out = os.path.join(tmp, f"{backend}-{rep}")
                os.makedirs(out)
                print(f"[nccl] elastic {n} -> {n // 2} -> {n} on {backend} ({rep + 1}/{ctx.args.resize_repeats})",
                      flush=True)
                _run_direct("dra", ctx.args.resize_mb, out, ctx.args.chunk_mb, 300.0, nproc=n, backend=backend,
                            device=device)
                events = [json.loads(line) for line in Path(out, "events.jsonl").read_text().splitlines()]
                resizes = [e for e in events if e["event"] == "resize"]
                runs[backend].append({"shrink": next(e for e in resizes if e["after"] < e["before"]),
                                      "grow": next(e for e in resizes if e["after"] > e["before"])})
                if backend == "nccl":
                    reads.append(json.loads(Path(out, "reads.json").read_text()))
    rows = []
    for kind, name in (("shrink", f"shrink_{n}to{n // 2}_s"), ("grow", f"grow_{n // 2}to{n}_s")):
        ours = statistics.median(r[kind]["total_s"] for r in runs["nccl"])
        phases = {k: statistics.median(r[kind]["cost_s"][k] for r in runs["nccl"]) for k in runs["nccl"][0][kind]["cost_s"]}
        base = ("the same elastic world on Gloo", statistics.median(r[kind]["total_s"] for r in runs["gloo"])) \
            if "gloo" in runs else None
        rows.append(ctx.row(name, ours, "s", base, state_mb=ctx.args.resize_mb, repeats=len(runs["nccl"]),
                            phases_s=phases, nccl_path=runs["nccl"][0][kind].get("path")))
    steps = sum(r["steps"] for r in reads)
    rows.append(ctx.row("device_blocking_waits_per_step", sum(r["blocking_waits"] for r in reads) / steps, "1/step",
                        reads_per_step=sum(r["reads"] for r in reads) / steps, steps=steps, goal="0",
                        note="ctl.device_reads on rank 0: host reads of device values (read steps only) that had "
                             "to wait for the device" + ("" if ctx.cuda else "; emulated: the values live in host "
                             "memory, so 0 by construction (the GPU check measures it, elastic_gpu.py under "
                             "set_sync_debug_mode('error'))")))
    return rows


# ---- 4: a hung peer ---------------------------------------------------------------------------------
def watchdog_rows(ctx: Context) -> list[dict[str, Any]]:
    n = min(ctx.world, 3) if ctx.cuda else 3
    t = ctx.args.watchdog_timeout_s
    if n < 2:
        why = f"needs 2 ranks: {ctx.gpus} GPU(s) here"
        return [ctx.missing(name, "s", why) for name in ("watchdog_detect_s", "abortive_shrink_s")]
    got = _spawn(workers.hung_peer, n, (ctx.setup(n, 60.0), t), 180.0)
    if not got["correct"]:
        raise RuntimeError("the survivors' all-reduce after the abortive shrink returned a wrong sum")
    return [
        ctx.row("watchdog_detect_s", got["dra_detect_s"], "s", ("torch.distributed Gloo timeout, CPU tensors",
                                                               got["torch_detect_s"]),
                timeout_s=t, past_timeout_s=got["dra_detect_s"] - t, error=got["dra_error"],
                baseline_error=got["torch_error"], world=n),
        ctx.row(f"abortive_shrink_{n}to{n - 1}_s", got["shrink_s"], "s", path=got["shrink_path"],
                note="rebuild without the hung rank + the first all-reduce of the survivors"),
    ]


# ---- 6: dra.step ------------------------------------------------------------------------------------
class TinyLM(torch.nn.Module):
    """A small transformer LM (about 20 M parameters at the default size)."""

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


def step_call_rows(ctx: Context) -> list[dict[str, Any]]:
    """dra.step(0-d tensor) against the no-op binding call, the overhead suite's loops."""
    import dra
    from dra import _core
    from dra_bench.overhead import _median_pair, _noop_loop, _step_loop, _timed

    calls = 20_000 if ctx.args.quick else 200_000
    repeats = max(3, ctx.args.repeats)
    dra.reset()
    for t in range(500):
        dra.step(4.0 * (1.0 + t / 50.0) ** -0.5)
    base = _median_pair(_timed(_noop_loop(_core._testing.noop), calls), repeats)[0]
    cpu = _median_pair(_timed(_step_loop(dra.step, torch.tensor(1.0)), calls), repeats)[0]
    name = "no-op pybind11 call, same loop"
    rows = [ctx.row("dra_step_0d_cpu_tensor_ns", cpu, "ns", (name, base), clock="thread cpu time", goal="ratio < 3")]
    if ctx.cuda:
        loss = torch.tensor(1.0, device="cuda")
        torch.cuda.synchronize()
        gpu = _median_pair(_timed(_step_loop(dra.step, loss), calls // 4), repeats)[0]
        torch.cuda.synchronize()
        rows.append(ctx.row("dra_step_0d_cuda_tensor_ns", gpu, "ns", (name, base), clock="thread cpu time"))
    else:
        rows.append(ctx.missing("dra_step_0d_cuda_tensor_ns", "ns", "no GPU"))
    dra.reset()
    return rows


def train_step_rows(ctx: Context) -> list[dict[str, Any]]:
    """A training step with dra.step(loss) against the same loop reading loss.item() (a device
    synchronisation on a GPU) and one that never reads the loss; interleaved blocks, medians."""
    import dra

    device = "cuda" if ctx.cuda else "cpu"
    small = not ctx.cuda
    torch.manual_seed(0)
    vocab, seq, batch = (512, 32, 4) if small else (8192, 256, 32)
    model = (TinyLM(vocab=vocab, d_model=64, layers=2, heads=4, seq=seq) if small else TinyLM()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    targets = torch.randint(0, vocab, (batch, seq), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if ctx.cuda else (lambda: None)

    def train_step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    modes = {"plain": lambda loss: None, "item": lambda loss: loss.item(), "dra": lambda loss: dra.step(loss)}
    for _ in range(3):
        train_step()
    dra.reset()
    samples: dict[str, list[float]] = {m: [] for m in modes}
    order = list(modes)
    steps, rounds = ctx.args.steps, ctx.args.rounds
    for r in range(rounds):
        for mode in order[r % 3:] + order[: r % 3]:
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                modes[mode](train_step())
            sync()
            samples[mode].append((time.perf_counter() - t0) / steps)
    dra.reset()
    med = {m: statistics.median(v) for m, v in samples.items()}
    params = sum(p.numel() for p in model.parameters())
    return [
        ctx.row("train_step_ms_with_dra_step", med["dra"] * 1e3, "ms", ("same loop with loss.item()", med["item"] * 1e3),
                params=params, steps=steps * rounds),
        ctx.row("train_step_ms_with_dra_step_vs_no_read", med["dra"] * 1e3, "ms",
                ("same loop, loss never read", med["plain"] * 1e3), params=params),
    ]


# ---- the plot and main -------------------------------------------------------------------------------
def plot(report_rows: list[dict[str, Any]], path: str) -> None:
    """Bandwidth against size from the report's all-reduce rows (so a committed JSON can be re-plotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw = [r for r in report_rows if r["name"].startswith("allreduce_") and r.get("bytes")]
    if not bw:
        return
    emulated = bw[0].get("mode") == "emulated"
    x = [r["bytes"] for r in bw]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["value"] for r in bw], "o-",
            label="dra NCCL backend" + (" on the emulated library (shared memory)" if emulated else ""))
    ax.plot(x, [r["baseline"]["value"] for r in bw], "s--",
            label=bw[0]["baseline"]["name"] + (" (TCP loopback)" if emulated else ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)" if bw[0]["world"] > 1 else "algorithm bandwidth (GB/s)")
    what = ("emulated: dra's protocol on CPU processes, not NCCL; the transports differ" if emulated
            else bw[0]["label"])
    ax.set_title(f"all-reduce, {bw[0]['world']} ranks, {bw[0]['label']}: {what}" if not emulated
                 else f"all-reduce, {bw[0]['world']} ranks, {what}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mode(requested: str) -> str:
    import dra

    if not dra.build_info().get("backends", {}).get("nccl"):
        raise SystemExit("dra.bench nccl: this build of dra has no NCCL backend (configure with nccl.h present; "
                         "docs/design/nccl.md, Build)")
    gpu = torch.cuda.is_available()
    if requested == "real" and not gpu:
        raise SystemExit("dra.bench nccl: --mode real needs a CUDA GPU visible to torch; use --mode emulated")
    if requested == "auto":
        requested = "real" if gpu and not os.environ.get("DRA_NCCL_EMULATION") else "emulated"
    if requested == "emulated":
        os.environ.setdefault("DRA_NCCL_EMULATION", "1")  # before any NCCL use here or in a worker
    return requested


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dra.bench nccl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="write the JSON report here")
    p.add_argument("--plot", metavar="PNG", help="bandwidth plot (default: next to --json, .png)")
    p.add_argument("--mode", choices=("auto", "real", "emulated"), default="auto",
                   help="auto: real NCCL when a GPU is visible, else the emulated library")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--nproc", type=nonnegative_int_arg, default=0, help="ranks of the bandwidth part (0: all GPUs / 2 on the CPU)")
    p.add_argument("--min-bytes", type=count_arg, default=1 << 10)
    p.add_argument("--max-bytes", type=count_arg, default=None, help="default: 1 GiB on a GPU, 16 MiB emulated")
    p.add_argument("--p2p-mb", type=positive_arg, default=None, help="handoff state size (default 1024 on a GPU, 64 emulated)")
    p.add_argument("--chunk-mb", type=positive_arg, default=16.0, help="the handoff's chunk (the controller's default)")
    p.add_argument("--budget-s", type=positive_arg, default=150.0, help="time budget of the bandwidth sweep")
    p.add_argument("--repeats", type=count_arg, default=5, help="timed blocks per figure (medians)")
    p.add_argument("--resize-mb", type=positive_arg, default=10.0, help="model state of the elastic run")
    p.add_argument("--resize-nproc", type=count_arg, default=4, help="processes of the emulated elastic run")
    p.add_argument("--resize-repeats", type=count_arg, default=3)
    p.add_argument("--watchdog-timeout-s", type=positive_arg, default=None, help="default 2 (1 with --quick)")
    p.add_argument("--steps", type=count_arg, default=10, help="training steps per timed block")
    p.add_argument("--rounds", type=count_arg, default=6, help="timed blocks per mode of the training step")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: sizes to 64 KiB, a 4 MiB handoff, 2 elastic processes, one repeat")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"--parts: unknown {', '.join(bad)}; choose from {', '.join(PARTS)}")
    args.parts = parts
    if args.quick:
        args.max_bytes = args.max_bytes or (64 << 10)
        args.p2p_mb = args.p2p_mb or 4.0
        args.resize_nproc, args.resize_repeats, args.repeats = 2, 1, 1
        args.resize_mb, args.steps, args.rounds = 1.0, 2, 3
    if args.watchdog_timeout_s is None:
        args.watchdog_timeout_s = 1.0 if args.quick else 2.0
    if args.min_bytes < 4 or (args.max_bytes is not None and args.max_bytes < args.min_bytes):
        p.error("--min-bytes must be >= 4 and <= --max-bytes")
    if args.resize_nproc < 2:
        p.error(f"--resize-nproc: {args.resize_nproc} is not >= 2; give 2 or more processes (an elastic run shrinks "
                "to half and grows back)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.mode = _mode(args.mode)
    real = args.mode == "real"
    args.max_bytes = args.max_bytes or ((1 << 30) if real else (16 << 20))
    args.p2p_mb = args.p2p_mb or (1024.0 if real else 64.0)
    ctx = Context(args)
    print(f"[nccl] mode {args.mode} ({ctx.label}), {ctx.world} rank(s), parts {','.join(args.parts)}", flush=True)
    results: list[dict[str, Any]] = []
    bw: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for part in args.parts:
        print(f"[nccl] {part} ({time.monotonic() - t0:.0f} s)", flush=True)
        if part == "bandwidth":
            rows, bw = bandwidth_rows(ctx)
            results += rows
        elif part == "resize":
            results += resize_rows(ctx)
        elif part == "watchdog":
            results += watchdog_rows(ctx)
        elif part == "step":
            results += step_call_rows(ctx) + train_step_rows(ctx)
    for row in results:
        row["mode"] = args.mode
    write_report(SUITE, results, args.json)
    png = args.plot or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if png and bw:
        plot(results, png)
        print(f"  plot: {png}")
    bad = [r["name"] for r in results if isinstance(r["value"], float) and math.isnan(r["value"]) and not r.get("note")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
