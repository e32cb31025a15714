"""``python -m dra.bench sage``: communication compression, dynamic sparsity and energy (issue 13).

Measured part: W ranks, each in its own network namespace, joined by veth pairs shaped with tc
(tbf) to 1 Gbit/s and 100 Mbit/s per port, made and removed by this benchmark; an MLP trained on
scikit-learn's digits (real data, bundled with scikit-learn) with, side by side in the same run:

- ``fp32_allreduce``: torch DDP (Gloo, bucketed, overlapped with backward): the uncompressed baseline.
- ``torch_powersgd_hook``: DDP with PyTorch's PowerSGD communication hook (same rank, warm start,
  error feedback, same dense warm-up steps as dra's).
- ``dra_powersgd``: dra's PowerSGD codec through dra.compress.GradientReducer.
- ``dra_sparse90``: RigL masks at 90 % sparsity (dra's rigl_update), gradients synced by dra's
  masked codec (only active entries travel).
- ``ao_pruning90``: torch.ao.pruning's WeightNormSparsifier at 90 % (magnitude), dense DDP sync:
  the sparsification baseline (accuracy).
- ``dra_sage``: PowerSGD whose rank follows the gradient noise scale + sparsity following the phase.

Bytes are counted twice: the payload the method hands to its collective, and the bytes that left
rank 0's eth0 (``/sys/class/net/eth0/statistics/tx_bytes`` in its namespace: TCP/IP and Gloo
framing included). Time to accuracy is rank 0's training time (evaluation excluded) until the
test accuracy first reaches the target. Energy on this machine is ``estimated`` (no RAPL, no GPU:
CPU-seconds x 10 W per core). The Zeus replay (``replayed``) is dra.energy.zeus_replay.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dra_bench._report import result, write_report

RATES = {"1gbit": "1gbit", "100mbit": "100mbit"}
METHODS_TTA = ("fp32_allreduce", "torch_powersgd_hook", "dra_powersgd", "dra_sage", "dra_sparse90")
METHODS_ONCE = ("ao_pruning90",)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_method(lan, method: str, args, seed: int, workdir: Path) -> list[dict]:
    out = workdir / f"{lan.rate}-{method}-{seed}.jsonl"
    port = 29500 + (_free_port() % 20000)
    procs = []
    for r in range(lan.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(lan.ranks), MASTER_ADDR=lan.addresses[0],
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
        argv = [sys.executable, "-m", "dra_bench._sage_worker", "--method", method, "--steps", str(args.steps),
                "--ramp-start", str(args.ramp_start), "--ramp-steps", str(args.ramp_steps),
                "--seed", str(seed), "--hidden", str(args.hidden), "--rank-psgd", str(args.rank),
                "--eval-every", str(args.eval_every), "--out", str(out)]
        procs.append(subprocess.Popen(["nice", "-n", "10", *lan.command(r, ["env", *[f"{k}={v}" for k, v in env.items()
                                                                              if k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                                                       "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS",
                                                                                       "PATH", "PYTHONPATH", "HOME")], *argv])],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + args.run_timeout
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{method} at {lan.rate} seed {seed}: ranks did not finish in {args.run_timeout} s") from None
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{method} at {lan.rate} seed {seed} failed:\n" + "\n".join(l[-3000:] for l in logs))
    return [json.loads(line) for line in out.read_text().splitlines()]


def time_to(points: list[dict], target: float) -> float | None:
    for p in points:
        if p["acc"] >= target:
            return p["time_s"]
    return None


def per_step(points: list[dict], key: str, steps: int, since: int = 0) -> float:
    """Bytes per step over steps (since, last]: the whole run, or the window where every method is
    in its steady regime (PowerSGD past its dense warm-up, sparsity at 90 %)."""
    start = next((p[key] for p in points if p["step"] == since), 0) if since else 0
    return (points[-1][key] - start) / (points[-1]["step"] - since)


def run_measured(args, progress) -> dict:
    from dra_bench._netns import RateLimitedLan, available

    ok, why = available()
    if not ok:
        raise SystemExit(f"sage: the measured part needs network namespaces: {why}")
    runs: dict[str, dict[str, list[list[dict]]]] = {}
    with tempfile.TemporaryDirectory(prefix="dra-sage-") as tmp:
        for rate_name in args.rates:
            with RateLimitedLan(args.world, RATES[rate_name]) as lan:
                runs[rate_name] = {}
                methods = METHODS_TTA + (METHODS_ONCE if rate_name == args.rates[0] else ())
                for seed in range(args.seeds):
                    for method in methods:
                        t0 = time.monotonic()
                        pts = run_method(lan, method, args, seed, Path(tmp))
                        runs[rate_name].setdefault(method, []).append(pts)
                        progress(f"{rate_name} {method} seed {seed}: final acc {pts[-1]['acc']:.4f}, "
                                 f"train {pts[-1]['time_s']:.1f} s, wire {pts[-1]['wire_tx_bytes'] / 1e6:.2f} MB "
                                 f"({time.monotonic() - t0:.0f} s)")
    return runs


def summarise_measured(runs, args) -> tuple[list[dict], dict]:
    rows, detail = [], {}
    first = args.rates[0]
    med = statistics.median

    window = args.ramp_start + args.ramp_steps  # from here on every method is in its steady regime

    def wire(method, rate=first, since=window):
        return med(per_step(p, "wire_tx_bytes", args.steps, since) for p in runs[rate][method])

    def payload(method, rate=first, since=window):
        return med(per_step(p, "payload_bytes", args.steps, since) for p in runs[rate][method])

    def final_acc(method, rate=first):
        return med(p[-1]["acc"] for p in runs[rate][method])

    fp32_wire = wire("fp32_allreduce")
    fp32_payload = payload("fp32_allreduce")
    for row, method in (("bytes_powersgd", "dra_powersgd"), ("bytes_sparse90", "dra_sparse90"), ("bytes_sage", "dra_sage")):
        rows.append(result(row, wire(method), "B/step", ("fp32_allreduce", fp32_wire), label="measured",
                           reduction_wire=fp32_wire / wire(method), reduction_payload=fp32_payload / payload(method),
                           payload_bytes_per_step=payload(method), rate=first, window_steps=[window, args.steps],
                           reduction_wire_whole_run=wire("fp32_allreduce", since=0) / wire(method, since=0),
                           note="steps after the dense warm-up / sparsity ramp; wire: bytes out of rank 0's eth0 per "
                                "step (TCP/IP + Gloo framing included); payload: bytes handed to the collective"))
    rows.append(result("bytes_torch_powersgd_hook", wire("torch_powersgd_hook"), "B/step", ("fp32_allreduce", fp32_wire),
                       label="measured", reduction_wire=fp32_wire / wire("torch_powersgd_hook"), rate=first,
                       window_steps=[window, args.steps]))
    for rate in args.rates:
        tta = {}
        for method in METHODS_TTA:
            times = [time_to(p, args.target) for p in runs[rate][method]]
            reached = [t for t in times if t is not None]
            tta[method] = {"median_s": med(reached) if len(reached) == len(times) else None, "per_seed": times}
        detail[f"time_to_accuracy_{rate}"] = tta
        best_base = min(("fp32_allreduce", "torch_powersgd_hook"),
                        key=lambda m: tta[m]["median_s"] if tta[m]["median_s"] is not None else float("inf"))
        for method in ("dra_powersgd", "dra_sage", "dra_sparse90"):
            name = f"time_to_accuracy_{rate}" + ("" if method == "dra_powersgd" else f"_{method}")
            v = tta[method]["median_s"]
            b = tta[best_base]["median_s"]
            if v is None or b is None:
                full = med(p[-1]["time_s"] for p in runs[rate][method])
                rows.append(result(name, full, "s", None, label="measured", reached=False, per_method=tta,
                                   note=f"target accuracy {args.target} not reached in every seed by {method} or the "
                                        "best baseline; value: the method's whole training time (a lower bound)"))
                continue
            rows.append(result(name, v, "s", (best_base, b), label="measured", target_accuracy=args.target,
                               baselines={m: tta[m]["median_s"] for m in ("fp32_allreduce", "torch_powersgd_hook")},
                               vs_fp32=v / tta["fp32_allreduce"]["median_s"] if tta["fp32_allreduce"]["median_s"] else None,
                               vs_torch_powersgd_hook=(v / tta["torch_powersgd_hook"]["median_s"]
                                                       if tta["torch_powersgd_hook"]["median_s"] else None)))
    base_acc = final_acc("fp32_allreduce")
    for method in ("dra_powersgd", "dra_sparse90", "dra_sage", "torch_powersgd_hook", "ao_pruning90"):
        name = "accuracy_delta_points" + ("" if method == "dra_powersgd" else f"_{method}")
        deltas = [100 * (a[-1]["acc"] - b[-1]["acc"]) for a, b in zip(runs[first][method], runs[first]["fp32_allreduce"])]
        rows.append(result(name, med(deltas), "points", None, label="measured", final_accuracy=final_acc(method),
                           fp32_final_accuracy=base_acc, per_seed=deltas, steps=args.steps,
                           note="final test accuracy minus fp32_allreduce's, same seed; median over seeds"))
    ao_deltas = [100 * (a[-1]["acc"] - b[-1]["acc"]) for a, b in zip(runs[first]["dra_sparse90"], runs[first]["ao_pruning90"])]
    rows.append(result("accuracy_sparse90_vs_torch_ao_points", med(ao_deltas), "points", None, label="measured",
                       per_seed=ao_deltas, note="dra's RigL masks minus torch.ao.pruning's magnitude sparsifier, same "
                                                "cubic ramp to 90 %, same seed"))
    energy = {m: med(p[-1]["energy_j"] for p in runs[args.rates[-1]][m]) for m in METHODS_TTA}
    rows.append(result(f"energy_rank0_{args.rates[-1]}_dra_powersgd", energy["dra_powersgd"], "J",
                       ("fp32_allreduce", energy["fp32_allreduce"]), label="estimated",
                       note="rank 0's process CPU-seconds x 10 W per core (no RAPL, no GPU here): an estimate"))
    return rows, detail


def run_replay(args, progress) -> tuple[list[dict], list[dict]]:
    from dra.energy import zeus_replay as zr

    ok, version = zr.zeus_available()
    if not ok:
        progress(f"zeus side by side unavailable: {version}")
    jobs = [j for j in zr.JOBS if not args.zeus_jobs or j.dataset in args.zeus_jobs]
    out = [zr.replay_job(j, args.gpu, args.eta, 2.0, list(range(args.zeus_seeds)), ok, progress) for j in jobs]
    rows = []
    if ok:
        import math

        ratio_knobs = [o["dra_knobs"]["energy_j_last"] / o["zeus"]["energy_j_last"] for o in out]
        ratio_dra = [o["dra"]["energy_j_last"] / o["zeus"]["energy_j_last"] for o in out]
        gm = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs))  # noqa: E731
        rows.append(result("energy_zeus_replay", gm([1 - o["dra_knobs"]["energy_saving_last"] for o in out]),
                           "x default", ("zeus", gm([1 - o["zeus"]["energy_saving_last"] for o in out])), label="replayed",
                           zeus_version=version, gpu=args.gpu, eta=args.eta,
                           note="energy per recurrence (last 10 % of recurrences) relative to Zeus's default (b0, max "
                                "power limit), geometric mean over jobs; dra with world size and sparsity as extra knobs",
                           dra_vs_zeus_same_knobs=gm(ratio_dra), dra_knobs_vs_zeus=gm(ratio_knobs)))
    return rows, out


def plot(runs, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.rates) + 1, figsize=(5 * (len(args.rates) + 1), 4))
    colors = {"fp32_allreduce": "black", "torch_powersgd_hook": "tab:orange", "dra_powersgd": "tab:blue",
              "dra_sage": "tab:green", "dra_sparse90": "tab:purple", "ao_pruning90": "tab:gray"}
    for ax, rate in zip(axes, args.rates):
        for method, seeds in runs[rate].items():
            p = seeds[0]
            ax.plot([x["time_s"] for x in p], [x["acc"] for x in p], label=method, color=colors.get(method))
        ax.axhline(args.target, ls=":", color="gray")
        ax.set_title(f"accuracy vs training time, {rate} per port (measured)")
        ax.set_xlabel("rank-0 training time (s)")
        ax.set_ylabel("test accuracy (digits)")
        ax.set_ylim(0.5, 1.0)
    ax = axes[-1]
    for method, seeds in runs[args.rates[0]].items():
        p = seeds[0]
        ax.plot([max(x["wire_tx_bytes"], 1) / 1e6 for x in p], [x["acc"] for x in p], label=method, color=colors.get(method))
    ax.set_xscale("log")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title("accuracy vs bytes sent by rank 0 (measured)")
    ax.set_xlabel("MB out of rank 0's eth0")
    ax.set_ylim(0.5, 1.0)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dra.bench sage", description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--plot", default="docs/img/sage/accuracy.png")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--ramp-start", type=int, default=50, help="sparsity ramp (dra_sparse90, ao_pruning90) start")
    ap.add_argument("--ramp-steps", type=int, default=200, help="sparsity ramp length; bytes are compared after it")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--rank", type=int, default=2, help="PowerSGD rank (dra and the torch hook)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.95, help="test accuracy for time to accuracy")
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument("--gpu", default="v100")
    ap.add_argument("--eta", type=float, default=0.5)
    ap.add_argument("--zeus-seeds", type=int, default=3)
    ap.add_argument("--zeus-jobs", default="", help="comma-separated datasets (default: all six)")
    ap.add_argument("--skip-measured", action="store_true")
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args(argv)
    # SIGTERM ends the run through the normal exit path, so the namespaces are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.rates = [r for r in args.rates.split(",") if r]
    for r in args.rates:
        if r not in RATES:
            ap.error(f"--rates: '{r}' unknown; use {', '.join(RATES)}")
    args.zeus_jobs = [j for j in args.zeus_jobs.split(",") if j]

    def progress(msg: str) -> None:
        print(f"[sage] {msg}", flush=True)

    rows: list[dict] = []
    extra: dict = {}
    if not args.skip_measured:
        runs = run_measured(args, progress)
        r, detail = summarise_measured(runs, args)
        rows += r
        extra["measured"] = {"detail": detail, "runs": runs, "config": {k: v for k, v in vars(args).items()}}
        if args.plot:
            plot(runs, args, Path(args.plot))
            progress(f"plot: {args.plot}")
    if not args.skip_replay:
        r, replay = run_replay(args, progress)
        rows += r
        extra["zeus_replay"] = replay
    report = write_report("sage", rows, None)
    if args.json:
        report.update(extra)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"  json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
