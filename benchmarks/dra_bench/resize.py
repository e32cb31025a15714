"""``python -m dra.bench resize --json PATH``: in-place resize latency vs the alternatives.

For model states of about 10 MB and 100 MB, on this machine, in one run:

* ``dra``: shrink 4->2 and grow 2->4 in place (4 real processes, a dedicated c10d store, Gloo),
  from the decision to the first all-reduce of the new world, split into agree / rebuild /
  state transfer / reshard (from the leader's events);
* ``pg_recreate``: by hand: destroy the process group, ``init_process_group`` again with the
  new size, re-wrap ``DistributedDataParallel`` (its constructor broadcasts the parameters), first
  all-reduce;
* ``torchrun_restart``: the TorchElastic way: save a checkpoint, start ``torchrun`` with the new
  size, every worker loads the checkpoint, joins the group, wraps DDP, first all-reduce;
* ``gloo_shrink_api``: torch's ``shrink_group`` on a Gloo group (the reconfigure/shrink API);
* ``torchft_reconfigure``: torchft's Lighthouse + one Manager per replica group shrinking 4->2 and
  growing 2->4 (its ``ProcessGroupGloo.configure`` and HTTP checkpoint transport), from
  ``dra_bench.torchft_baseline``; a NaN row saying how to install it when ``import torchft`` fails;
* ``loopback_ceiling``: one TCP stream over loopback; state transfer GB/s is reported against it;

dra's runs are repeated (``--dra-repeats``, default 3) and every dra figure is the median over
them. The per-step overhead of dra in training is its own suite: ``python -m dra.bench step``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from dra._argtypes import count_arg, finite_arg, positive_arg
from dra_bench._blob import blob_model
from dra_bench._report import result, write_report
from dra_bench._store import StoreProcess
from dra_bench.torchft_baseline import torchft_rows

_STEPS = 9


# ---------------------------------------------------------------------------------------------
# workers (one process of a measured job)
# ---------------------------------------------------------------------------------------------
def _loss(model, x):
    return model(x)


def _worker_dra(args: argparse.Namespace) -> None:
    import torch

    import dra
    import dra.elastic as de

    device = torch.device("cpu")
    if args.device == "cuda":  # one GPU per process (the NCCL suite on a machine with several)
        device = torch.device("cuda", int(os.environ["RANK"]))
        torch.cuda.set_device(device)
    model = blob_model(args.mb).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sampler = de.ElasticSampler(_STEPS * 8, 8, seed=0)
    n = args.nproc
    # Shrink n -> n/2 at step 3, grow back at step 6; the leavers wait in standby (also on a GPU).
    ctl = de.init(model, opt, sampler, start_size=n, resize_schedule={3: n // 2, 6: n}, decide_every=1000,
                  events_path=os.path.join(args.out, "events.jsonl"), fault_timeout_s=60.0, chunk_mb=args.chunk_mb,
                  backend=args.backend, release="standby")
    steps = 0
    for _ in ctl.epochs(1):
        for idx in sampler:
            loss = _loss(ctl.model, torch.tensor(float(len(idx)), device=device))
            ctl.optimizer.zero_grad()
            loss.backward()
            ctl.optimizer.step()
            dra.step(loss)
            steps += 1
            if steps == 5 and ctl.rank == 0:
                # The grow at step 6 admits the standbys registered by then: wait for them (bounded),
                # so that a loaded host's slow standby does not turn the grow into a hold.
                deadline = time.monotonic() + 60.0
                while len(ctl.registered_candidates()) < n - n // 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
    if os.environ["RANK"] == "0":  # host reads of device values (the NCCL suite's "syncs per step")
        Path(args.out, "reads.json").write_text(json.dumps(dict(ctl.device_reads, steps=steps)))


def _worker_pg(args: argparse.Namespace) -> None:
    """Baseline (a): destroy + re-create the process group and re-wrap DDP by hand."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timedelta(seconds=120))
    model = blob_model(args.mb)
    x = torch.tensor(1.0)

    def first_allreduce(ddp):
        _loss(ddp, x).backward()  # DDP's gradient all-reduce

    dist.init_process_group("gloo", store=dist.PrefixStore("a/", store), rank=rank, world_size=4)
    ddp = DDP(model)
    first_allreduce(ddp)
    out: dict[str, float] = {}
    # Gloo's own shrink API on the 4-rank group (ranks 2, 3 excluded must not call it).
    dist.barrier()
    if rank < 2:
        t0 = time.perf_counter()
        try:
            small = dist.shrink_group([2, 3], group=dist.group.WORLD)
            t_ = torch.ones(1)
            dist.all_reduce(t_, group=small)
            out["gloo_shrink_api_s"] = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001
            out["gloo_shrink_api_error"] = f"{type(err).__name__}: {err}"  # type: ignore[assignment]
    # shrink 4 -> 2: decision at a barrier
    dist.barrier()
    t0 = time.perf_counter()
    dist.destroy_process_group()
    if rank < 2:
        dist.init_process_group("gloo", store=dist.PrefixStore("b/", store), rank=rank, world_size=2)
        ddp = DDP(model)
        first_allreduce(ddp)
        out["shrink_s"] = time.perf_counter() - t0
        dist.barrier()
        if rank == 0:
            store.set("grow_t0", repr(time.time()))
        dist.destroy_process_group()
    # grow 2 -> 4: the two that left come back; decision time published by rank 0
    t_decision = float(store.get("grow_t0").decode())
    dist.init_process_group("gloo", store=dist.PrefixStore("c/", store), rank=rank, world_size=4)
    ddp = DDP(model)  # broadcasts rank 0's parameters to the joiners
    first_allreduce(ddp)
    out["grow_s"] = time.time() - t_decision
    dist.destroy_process_group()
    if rank == 0:
        Path(args.out, "pg.json").write_text(json.dumps(out))


def _worker_restart(args: argparse.Namespace) -> None:
    """Baseline (b): a torchrun restart from a checkpoint."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = blob_model(args.mb)
    model.load_state_dict(torch.load(args.ckpt))
    ddp = DDP(model)
    _loss(ddp, torch.tensor(1.0)).backward()
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"latency_s": time.time() - args.t0}))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# the parent: launches the jobs and measures
# ---------------------------------------------------------------------------------------------
def _run_direct(mode: str, mb: float, out: str, chunk_mb: float, timeout: float, *, nproc: int = 4,
                backend: str = "gloo", device: str = "cpu") -> None:
    """Runs one measured job of `nproc` processes (the dra worker: shrink nproc -> nproc/2 -> back)."""
    store = StoreProcess()
    port = store.port
    try:
        procs = []
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), DRA_JOB_ID=f"bench-{mode}-{backend}-{mb}", OMP_NUM_THREADS="1")
            cmd = [sys.executable, "-m", "dra_bench", "resize", "--worker", mode, "--mb", str(mb), "--out", out,
                   "--chunk-mb", str(chunk_mb), "--nproc", str(nproc), "--backend", backend, "--device", device]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + timeout
        for p in procs:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"{mode} worker failed ({p.returncode}):\n{text[-3000:]}")
    finally:
        store.close()


def _torchrun_restart(mb: float, nproc: int, tmp: str, timeout: float) -> float:
    import torch

    t0 = time.time()  # the decision
    ckpt = os.path.join(tmp, f"ckpt-{mb}.pt")
    torch.save(blob_model(mb).state_dict(), ckpt)
    out = os.path.join(tmp, f"restart-{mb}-{nproc}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
           "-m", "dra_bench", "resize", "--worker", "restart", "--mb", str(mb), "--ckpt", ckpt, "--t0", repr(t0), "--out", out]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun restart failed:\n{proc.stdout[-3000:]}")
    return float(json.loads(Path(out).read_text())["latency_s"])


def _sink(port_queue, nbytes: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_queue.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        n = conn.recv_into(view)
        if n == 0:
            break
        got += n
    conn.sendall(b"k")
    conn.close()
    srv.close()


def loopback_ceiling(nbytes: int = 1 << 30, trials: int = 3) -> float:
    """GB/s of one TCP stream over loopback between two processes (sender timed to the ack),
    the best of `trials`: the transport ceiling a state transfer could reach on this machine."""
    ctx = get_context("spawn")
    best = 0.0
    for _ in range(trials):
        q = ctx.Queue()
        p = ctx.Process(target=_sink, args=(q, nbytes))
        p.start()
        port = q.get(timeout=60)
        payload = memoryview(bytearray(16 << 20))
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            t0 = time.perf_counter()
            sent = 0
            while sent < nbytes:
                s.sendall(payload)
                sent += len(payload)
            s.recv(1)
            dt = time.perf_counter() - t0
        p.join(timeout=30)
        best = max(best, sent / dt / 1e9)
    return best


def _median_event(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One event whose timings are the medians over repeated runs (other fields: the first run's)."""
    out = dict(events[0])
    out["total_s"] = statistics.median(e["total_s"] for e in events)
    out["cost_s"] = {k: statistics.median(e["cost_s"][k] for e in events) for k in events[0]["cost_s"]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench resize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None)
    parser.add_argument("--sizes-mb", default="10,100")
    parser.add_argument("--chunk-mb", type=positive_arg, default=16.0)
    parser.add_argument("--timeout", type=positive_arg, default=600.0)
    parser.add_argument("--dra-repeats", type=count_arg, default=3, help="runs of dra per size (medians)")
    parser.add_argument("--skip-digits", action="store_true",
                        help="accepted for old command lines; the step overhead is `python -m dra.bench step`")
    parser.add_argument("--torchft-repeats", type=count_arg, default=3, help="runs of the torchft baseline per size (median)")
    parser.add_argument("--worker", choices=["dra", "pg", "restart"], help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=positive_arg, default=10.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=finite_arg, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=count_arg, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "dra":
        _worker_dra(args)
        return 0
    if args.worker == "pg":
        _worker_pg(args)
        return 0
    if args.worker == "restart":
        _worker_restart(args)
        return 0
    try:
        sizes_mb = [positive_arg(s) for s in args.sizes_mb.split(",")]
    except argparse.ArgumentTypeError as e:
        parser.error(f"--sizes-mb: {e} (comma-separated sizes in MB, e.g. 10,100)")

    results: list[dict[str, Any]] = []
    ceiling = loopback_ceiling()
    print(f"[resize] loopback ceiling {ceiling:.2f} GB/s", flush=True)
    results.append(result("loopback_ceiling", ceiling, "GB/s"))
    with tempfile.TemporaryDirectory(prefix="dra-bench-resize-") as tmp:
        for mb in sizes_mb:
            tag = f"{mb:g}MB"
            out = os.path.join(tmp, f"dra-{tag}")
            os.makedirs(out)
            shrinks, grows = [], []
            for rep in range(max(1, args.dra_repeats)):
                out = os.path.join(tmp, f"dra-{tag}-{rep}")
                os.makedirs(out)
                print(f"[resize] {tag}: dra in place ({rep + 1}/{args.dra_repeats})", flush=True)
                _run_direct("dra", mb, out, args.chunk_mb, args.timeout)
                events = [json.loads(line) for line in Path(out, "events.jsonl").read_text().splitlines()]
                shrinks.append(next(e for e in events if e["event"] == "resize" and e["after"] < e["before"]))
                grows.append(next(e for e in events if e["event"] == "resize" and e["after"] > e["before"]))
            shrink, grow = _median_event(shrinks), _median_event(grows)
            print(f"[resize] {tag}: pg_recreate", flush=True)
            pg_out = os.path.join(tmp, f"pg-{tag}")
            os.makedirs(pg_out)
            _run_direct("pg", mb, pg_out, args.chunk_mb, args.timeout)
            pg = json.loads(Path(pg_out, "pg.json").read_text())
            print(f"[resize] {tag}: torchrun_restart", flush=True)
            restart_shrink = _torchrun_restart(mb, 2, tmp, args.timeout)
            restart_grow = _torchrun_restart(mb, 4, tmp, args.timeout)
            for kind, ev, base_pg, base_restart in (("shrink_4to2", shrink, pg["shrink_s"], restart_shrink),
                                                     ("grow_2to4", grow, pg["grow_s"], restart_grow)):
                name = f"{kind}_{tag}"
                results.append(result(name, ev["total_s"], "s", ("torchrun_restart", base_restart)))
                results.append(result(f"{name}_vs_pg", ev["total_s"], "s", ("pg_recreate", base_pg)))
                for phase, value in ev["cost_s"].items():
                    results.append(result(f"{name}_{phase}", value, "s"))
            if "gloo_shrink_api_s" in pg:
                results.append(result(f"gloo_shrink_api_4to2_{tag}", pg["gloo_shrink_api_s"], "s",
                                      ("dra_rebuild", shrink["cost_s"]["rebuild"])))
            else:
                results.append(result(f"gloo_shrink_api_4to2_{tag}", float("nan"), "s",
                                      note=f"shrink_group on Gloo failed: {pg.get('gloo_shrink_api_error')}"))
            receivers = len(grow["joined"])
            # The members that stay share the sending, so the leader's own transfer time is not the
            # whole story: count until every joiner holds its state and the new world's first
            # all-reduce is done (transfer + reshard), a conservative bound.
            span = grow["cost_s"]["state_transfer"] + grow["cost_s"]["reshard"]
            aggregate = grow["state_bytes"] * receivers / span / 1e9
            results.append(result(f"state_transfer_{tag}", aggregate, "GB/s", ("loopback_ceiling", ceiling),
                                  note=f"state bytes to {receivers} joiners / (transfer + reshard), median of "
                                       f"{len(grows)} runs"))
        # (c) torchft's reconfiguration (optional dependency: requirements-bench.txt)
        results.extend(torchft_rows(sizes_mb, results,
                                    repeats=args.torchft_repeats, timeout=args.timeout))
    write_report("resize", results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

