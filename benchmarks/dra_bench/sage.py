"""``python -m dra.bench sage``: communication compression, dynamic sparsity and energy (issues 13, 25).

Measured part: W ranks, each in its own network namespace, joined through a switch whose ports are
shaped with tc tbf (a 16 KiB bucket: less than one compressed step's payload) to 1 Gbit/s and
100 Mbit/s, with 20 ms added one way (netem, or the benchmark's delay switch on a kernel without
sch_netem; see _netns.py), made and removed by this benchmark. An MLP trained on scikit-learn's
digits (real data, bundled with scikit-learn), every method on the same batches, side by side:

- ``fp32_allreduce``: torch DDP (Gloo, bucketed, overlapped with backward), the bucket cap tuned
  for each link (a few short calibration runs; the fastest per step is used).
- ``torch_powersgd_hook``: DDP with PyTorch's PowerSGD hook at its recommended settings (error
  feedback, warm start, a dense warm-up), the same rank and warm-up as dra's.
- ``dra_powersgd``: dra's PowerSGD codec (dra.compress.GradientReducer): the small tensors and the
  loss ride with P, two all-reduces per step.
- ``dra_sparse90``: sparse training through the product: ``dra.Controller(compress="masked")``,
  RigL masks on the cubic ramp to 90 %, only active entries (and biases at the same keep fraction)
  on the wire, the dense gradient on mask-update steps.
- ``ao_pruning90``: torch.ao.pruning's WeightNormSparsifier on the same ramp, dense DDP sync: the
  sparsification baseline (accuracy; it is magnitude pruning, not sparse training).
- ``dra_sage``: PowerSGD whose rank follows the gradient noise scale + RigL sparsity following the
  training phase (dense sync on its mask-update steps).

Bytes are counted twice: the payload the method hands to its collective, and the bytes that left
rank 0's eth0 (``/sys/class/net/eth0/statistics/tx_bytes`` in its namespace: TCP/IP and Gloo
framing included). Time and steps to accuracy are rank 0's training time (evaluation excluded) and
step count until the test accuracy first reaches the target; medians over seeds with their
spread (min, quartiles, max). Energy on this machine is ``estimated`` (no RAPL, no GPU: CPU-seconds x
10 W per core). The Zeus replay (``replayed``) is dra.energy.zeus_replay, on every GPU's traces.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dra._argtypes import count_arg, nonnegative_arg, nonnegative_int_arg, positive_arg, probability_arg, seed32_arg
from dra_bench._report import result, write_report

RATES = ("1gbit", "100mbit")
METHODS_TTA = ("fp32_allreduce", "torch_powersgd_hook", "dra_powersgd", "dra_sage", "dra_sparse90")
METHODS_ONCE = ("ao_pruning90",)
DRA_METHODS = ("dra_powersgd", "dra_sage", "dra_sparse90")
BASELINES = ("fp32_allreduce", "torch_powersgd_hook")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_method(lan, method: str, args, seed: int, workdir: Path, steps: int | None = None,
               bucket_mb: float = 25.0, eval_every: int | None = None) -> list[dict]:
    out = workdir / f"{lan.rate}-{method}-{seed}-{steps or args.steps}-{bucket_mb}.jsonl"
    port = 29500 + (_free_port() % 20000)
    procs = []
    for r in range(lan.ranks):
        env = {"RANK": str(r), "WORLD_SIZE": str(lan.ranks), "MASTER_ADDR": lan.addresses[0], "MASTER_PORT": str(port),
               "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "DRA_HOST_STORE": "1" if r == 0 else "0",
               "DRA_JOB_ID": f"sage-{method}-{seed}"}
        env.update({k: os.environ[k] for k in ("PATH", "PYTHONPATH", "HOME") if k in os.environ})
        argv = [sys.executable, "-m", "dra_bench._sage_worker", "--method", method, "--steps", str(steps or args.steps),
                "--ramp-start", str(args.ramp_start), "--ramp-steps", str(args.ramp_steps),
                "--sparsify-every", str(args.sparsify_every), "--seed", str(seed), "--hidden", str(args.hidden),
                "--rank-psgd", str(args.rank), "--eval-every", str(eval_every or args.eval_every),
                "--bucket-mb", str(bucket_mb), "--out", str(out)]
        procs.append(subprocess.Popen(["nice", "-n", "10", *lan.command(r, ["env", *[f"{k}={v}" for k, v in env.items()],
                                                                              *argv])],
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
        raise RuntimeError(f"{method} at {lan.rate} seed {seed} failed:\n" + "\n".join(log[-3000:] for log in logs))
    return [json.loads(line) for line in out.read_text().splitlines()]


def reached(points: list[dict], target: float) -> tuple[float, int] | None:
    """(training time, step) when the test accuracy first reached `target`; None if never."""
    for p in points:
        if p["acc"] >= target:
            return p["time_s"], p["step"]
    return None


def per_step(points: list[dict], key: str, since: int = 0) -> float:
    """Bytes per step over steps (since, last]: the whole run, or a window where every method is in
    its steady regime (PowerSGD past its dense warm-up, the masks fixed at 90 %)."""
    start = next((p[key] for p in points if p["step"] == since), 0) if since else 0
    return (points[-1][key] - start) / (points[-1]["step"] - since)


def spread(values: list[float]) -> dict:
    """Median with the spread around it: min, quartiles, max, n."""
    v = sorted(values)
    if not v:
        return {"median": None, "n": 0}
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return {"median": statistics.median(v), "min": v[0], "q1": q[0], "q3": q[2], "max": v[-1], "n": len(v)}


def calibrate_buckets(lan, args, workdir: Path, progress) -> tuple[float, dict]:
    """fp32 DDP's bucket cap for this link: a short run per candidate (seed 0), the fastest per step."""
    per_step_s = {}
    for mb in args.bucket_candidates:
        pts = run_method(lan, "fp32_allreduce", args, 0, workdir, steps=args.calibration_steps, bucket_mb=mb,
                         eval_every=args.calibration_steps)
        per_step_s[mb] = pts[-1]["time_s"] / pts[-1]["step"]
        progress(f"{lan.rate} calibration: DDP bucket cap {mb} MB: {1000 * per_step_s[mb]:.1f} ms/step")
    best = min(per_step_s, key=per_step_s.get)
    return best, per_step_s


def run_measured(args, progress, on_seed=None) -> tuple[dict, dict]:
    """Every method on every link and seed. `on_seed(runs, links, seeds)` is called after each
    seed of the last link (every earlier link then has all its seeds): a long run leaves a
    summary of the seeds done so far if it is stopped."""
    from dra_bench._netns import RateLimitedLan, available

    ok, why = available()
    if not ok:
        raise SystemExit(f"sage: the measured part needs network namespaces: {why}")
    runs: dict[str, dict[str, list[list[dict]]]] = {}
    links: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dra-sage-") as tmp:
        for rate in args.rates:
            with RateLimitedLan(args.world, rate, latency_ms=args.latency_ms, burst_bytes=args.burst_bytes) as lan:
                links[rate] = lan.measure()
                progress(f"{rate} link: {links[rate]}")
                bucket, calib = calibrate_buckets(lan, args, Path(tmp), progress)
                links[rate].update(ddp_bucket_mb=bucket, ddp_calibration_s_per_step=calib)
                runs[rate] = {}
                methods = METHODS_TTA + (METHODS_ONCE if rate == args.rates[0] else ())
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    for method in methods:
                        t0 = time.monotonic()
                        pts = run_method(lan, method, args, seed, Path(tmp), bucket_mb=bucket)
                        runs[rate].setdefault(method, []).append(pts)
                        hit = reached(pts, args.target)
                        progress(f"{rate} {method} seed {seed}: final acc {pts[-1]['acc']:.4f}, "
                                 f"{args.target:.0%} at " + (f"step {hit[1]} ({hit[0]:.1f} s)" if hit else "never") +
                                 f", wire {pts[-1]['wire_tx_bytes'] / 1e6:.2f} MB ({time.monotonic() - t0:.0f} s)")
                    if on_seed is not None and rate == args.rates[-1]:
                        on_seed(runs, links, seed + 1 - args.first_seed)
    return runs, links


def summarise_measured(runs, links, args) -> tuple[list[dict], dict]:
    rows, detail = [], {"links": links}
    first = args.rates[0]
    med = statistics.median
    window = max(args.ramp_start + args.ramp_steps, int(0.75 * args.steps))  # masks fixed, warm-ups over

    def wire(method, rate=first, since=window):
        return med(per_step(p, "wire_tx_bytes", since) for p in runs[rate][method])

    def payload(method, rate=first, since=window):
        return med(per_step(p, "payload_bytes", since) for p in runs[rate][method])

    fp32_wire, fp32_payload = wire("fp32_allreduce"), payload("fp32_allreduce")
    for row, method in (("bytes_powersgd", "dra_powersgd"), ("bytes_sparse90", "dra_sparse90"), ("bytes_sage", "dra_sage")):
        rows.append(result(row, wire(method), "B/step", ("fp32_allreduce", fp32_wire), label="measured",
                           reduction_wire=fp32_wire / wire(method), reduction_payload=fp32_payload / payload(method),
                           payload_bytes_per_step=payload(method), rate=first, window_steps=[window, args.steps],
                           reduction_wire_whole_run=wire("fp32_allreduce", since=0) / wire(method, since=0),
                           reduction_payload_whole_run=payload("fp32_allreduce", since=0) / payload(method, since=0),
                           note="steps after the masks are fixed (RigL's end) and every warm-up; wire: bytes out of rank "
                                "0's eth0 per step (TCP/IP + Gloo framing, and the controller's store traffic for "
                                "dra_sparse90); payload: bytes handed to the collective, biases included"))
    rows.append(result("bytes_torch_powersgd_hook", wire("torch_powersgd_hook"), "B/step", ("fp32_allreduce", fp32_wire),
                       label="measured", reduction_wire=fp32_wire / wire("torch_powersgd_hook"), rate=first,
                       window_steps=[window, args.steps]))
    for rate in args.rates:
        tta, sta = {}, {}
        for method in METHODS_TTA:
            hits = [reached(p, args.target) for p in runs[rate][method]]
            complete = all(h is not None for h in hits)
            tta[method] = {**spread([h[0] for h in hits if h]), "per_seed": [h[0] if h else None for h in hits],
                           "all_reached": complete}
            sta[method] = {**spread([h[1] for h in hits if h]), "per_seed": [h[1] if h else None for h in hits],
                           "all_reached": complete}
        detail[f"time_to_accuracy_{rate}"] = tta
        detail[f"steps_to_accuracy_{rate}"] = sta

        def median_or_inf(stats):
            return stats["median"] if stats["all_reached"] else math.inf

        best_base = min(BASELINES, key=lambda m: median_or_inf(tta[m]))
        for method in DRA_METHODS:
            name = f"time_to_accuracy_{rate}" + ("" if method == "dra_powersgd" else f"_{method}")
            t, b = tta[method], tta[best_base]
            common = {"spread": {k: t[k] for k in ("min", "q1", "q3", "max", "n") if k in t}, "per_seed": t["per_seed"],
                      "steps": sta[method], "per_method": {m: {"time": tta[m], "steps": sta[m]} for m in METHODS_TTA},
                      "link": links.get(rate)}
            if not t["all_reached"] or not b["all_reached"]:
                full = med(p[-1]["time_s"] for p in runs[rate][method])
                rows.append(result(name, full, "s", None, label="measured", reached=False, **common,
                                   note=f"target accuracy {args.target} not reached in every seed by {method} or the "
                                        "best baseline; value: the method's whole training time (a lower bound)"))
                continue
            rows.append(result(name, t["median"], "s", (best_base, b["median"]), label="measured",
                               target_accuracy=args.target,
                               baselines={m: tta[m]["median"] for m in BASELINES},
                               vs_fp32=t["median"] / tta["fp32_allreduce"]["median"],
                               vs_torch_powersgd_hook=t["median"] / tta["torch_powersgd_hook"]["median"], **common))
        if rate == "100mbit":
            reached_all = [m for m in DRA_METHODS if tta[m]["all_reached"]]
            best = min(reached_all, key=lambda m: tta[m]["median"]) if reached_all else "dra_powersgd"
            hook = sta["torch_powersgd_hook"]
            value = sta[best]["median"] if sta[best]["all_reached"] else args.steps
            rows.append(result("steps_to_accuracy_100mbit", value, "steps",
                               ("torch_powersgd_hook", hook["median"]) if hook["all_reached"] else None,
                               label="measured", method=best, target_accuracy=args.target,
                               spread={k: sta[best].get(k) for k in ("min", "q1", "q3", "max", "n")},
                               per_method=sta, time_per_method={m: tta[m]["median"] for m in METHODS_TTA},
                               note="dra's codec with the lowest median time to accuracy at 100 Mbit/s (chosen after the "
                                    "run, among dra_powersgd, dra_sage, dra_sparse90); steps counted at the evaluation "
                                    f"points (every {args.eval_every} steps)"))
            fastest_base = min(tta[m]["median"] if tta[m]["all_reached"] else math.inf for m in BASELINES)
            detail["goals_100mbit"] = {
                "best_dra_method": best,
                "faster_than_both_baselines": tta[best]["all_reached"] and tta[best]["median"] < fastest_base,
                "no_more_steps_than_hook": sta[best]["all_reached"] and hook["all_reached"]
                and sta[best]["median"] <= hook["median"],
            }
    base_acc = {m: [p[-1]["acc"] for p in runs[first][m]] for m in runs[first]}
    for method in ("dra_powersgd", "dra_sparse90", "dra_sage", "torch_powersgd_hook", "ao_pruning90"):
        name = "accuracy_delta_points" + ("" if method == "dra_powersgd" else f"_{method}")
        deltas = [100 * (a - b) for a, b in zip(base_acc[method], base_acc["fp32_allreduce"])]
        rows.append(result(name, med(deltas), "points", None, label="measured", final_accuracy=med(base_acc[method]),
                           fp32_final_accuracy=med(base_acc["fp32_allreduce"]), per_seed=deltas,
                           spread=spread(deltas), steps=args.steps, rate=first,
                           note="final test accuracy minus fp32_allreduce's, same seed; median over seeds"))
    ao_deltas = [100 * (a - b) for a, b in zip(base_acc["dra_sparse90"], base_acc["ao_pruning90"])]
    rows.append(result("accuracy_sparse90_vs_torch_ao_points", med(ao_deltas), "points", None, label="measured",
                       per_seed=ao_deltas, spread=spread(ao_deltas),
                       note="dra's RigL sparse training (masks from the dense gradient, sparse sync) minus "
                            "torch.ao.pruning's magnitude sparsifier (dense sync), same cubic ramp to 90 %, same seed"))
    last = args.rates[-1]
    energy = {m: med(p[-1]["energy_j"] for p in runs[last][m]) for m in METHODS_TTA}
    rows.append(result(f"energy_rank0_{last}_dra_powersgd", energy["dra_powersgd"], "J",
                       ("fp32_allreduce", energy["fp32_allreduce"]), label="estimated", per_method=energy,
                       note="rank 0's process CPU-seconds x 10 W per core (no RAPL, no GPU here): an estimate"))
    return rows, detail


def run_replay(args, progress) -> tuple[list[dict], dict]:
    """The Zeus replay on every GPU's traces: one row per GPU (`energy_zeus_replay.<gpu>`) and the
    V100 one under its old name (`energy_zeus_replay`)."""
    from dra.energy import zeus_replay as zr

    ok, version = zr.zeus_available()
    if not ok:
        progress(f"zeus side by side unavailable: {version}")
    jobs = [j for j in zr.JOBS if not args.zeus_jobs or j.dataset in args.zeus_jobs]
    rows, out = [], {}
    gm = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs))  # noqa: E731
    for gpu in args.gpus:
        out[gpu] = [zr.replay_job(j, gpu, args.eta, 2.0, list(range(args.zeus_seeds)), ok, progress) for j in jobs]
        if not ok:
            continue
        o = out[gpu]
        dra_same = gm([1 - x["dra"]["energy_saving_last"] for x in o])
        zeus = gm([1 - x["zeus"]["energy_saving_last"] for x in o])
        # Over every recurrence (exploration included): less noisy than the last 10 %, which holds only
        # 2-21 recurrences a seed and so depends on which traced runs were drawn there.
        whole = {k: gm([1 - x[k]["energy_saving_all"] for x in o]) for k in ("zeus", "dra", "dra_knobs")}
        extra = dict(label="replayed", zeus_version=version, gpu=gpu, eta=args.eta, seeds=args.zeus_seeds,
                     default_batch={x["job"]: x["default"]["bs"] for x in o},
                     dra_same_knobs=dra_same, dra_vs_zeus_same_knobs=dra_same / zeus,
                     all_recurrences=whole, all_recurrences_dra_vs_zeus=whole["dra"] / whole["zeus"],
                     per_seed_dra_vs_zeus=[gm([x["dra"]["per_seed_last"][i] / x["zeus"]["per_seed_last"][i] for x in o])
                                           for i in range(args.zeus_seeds)],
                     dra_knobs_vs_zeus=gm([x["dra_knobs"]["energy_j_last"] / x["zeus"]["energy_j_last"] for x in o]),
                     per_job={x["job"]: {k: x[k]["energy_saving_last"] for k in ("zeus", "dra", "dra_knobs")} for x in o},
                     note="energy per recurrence (last 10 % of recurrences) relative to Zeus's default (b0 capped at "
                          "the GPU's largest traced batch, as Zeus's own runs do; max power limit), geometric mean over "
                          "jobs; value: dra with world size and sparsity as extra knobs")
        value = gm([1 - x["dra_knobs"]["energy_saving_last"] for x in o])
        rows.append(result(f"energy_zeus_replay.{gpu}", value, "x default", ("zeus", zeus), **extra))
        if gpu == "v100":
            rows.append(result("energy_zeus_replay", value, "x default", ("zeus", zeus), **extra))
    return rows, out


# Settings that must agree between merged reports (the seeds, outputs and calibration may differ).
MERGE_KEYS = ("world", "steps", "ramp_start", "ramp_steps", "sparsify_every", "hidden", "rank", "eval_every", "target",
              "rates", "latency_ms", "burst_bytes")


def merge_reports(args, ap) -> tuple[dict, dict]:
    """The runs of several reports (other seeds of the same settings), joined: every seed once."""
    runs: dict[str, dict[str, list]] = {}
    links: dict = {}
    seen: set[int] = set()
    for path in args.merge:
        with open(path) as fh:
            report = json.load(fh)
        measured = report.get("measured") or {}
        config = measured.get("config")
        if not config or "runs" not in measured:
            ap.error(f"--merge: {path} holds no measured runs")
        for k in MERGE_KEYS:
            if config.get(k) != getattr(args, k):
                ap.error(f"--merge: {path} ran with {k}={config.get(k)!r}, this command has {getattr(args, k)!r}; "
                         "give the same settings")
        first = config.get("first_seed", 0)
        done = report.get("seeds_done", config["seeds"]) if report.get("complete") is False else config["seeds"]
        seeds = set(range(first, first + done))
        if seeds & seen:
            ap.error(f"--merge: {path} repeats seeds {sorted(seeds & seen)}")
        seen |= seeds
        for rate, methods in measured["runs"].items():
            for method, per_seed in methods.items():
                runs.setdefault(rate, {}).setdefault(method, []).extend(per_seed[:done])
        for rate, link in (measured.get("links") or (measured.get("detail") or {}).get("links") or {}).items():
            links.setdefault(rate, {**link, "merged_from": []})["merged_from"].append(
                {"file": os.path.basename(path), "seeds": sorted(seeds), "effective_mbit": link.get("effective_mbit"),
                 "rtt_ms": link.get("rtt_ms"), "ddp_bucket_mb": link.get("ddp_bucket_mb")})
    args.seeds, args.first_seed = len(seen), min(seen)
    return runs, links


def plot(runs, links, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fp32_allreduce": "black", "torch_powersgd_hook": "tab:orange", "dra_powersgd": "tab:blue",
              "dra_sage": "tab:green", "dra_sparse90": "tab:purple", "ao_pruning90": "tab:gray"}
    fig, axes = plt.subplots(1, len(args.rates) + 2, figsize=(5 * (len(args.rates) + 2), 4.2))
    for ax, rate in zip(axes, args.rates):
        for method, seeds in runs[rate].items():
            p = seeds[0]
            ax.plot([x["time_s"] for x in p], [x["acc"] for x in p], label=method, color=colors.get(method))
        ax.axhline(args.target, ls=":", color="gray")
        link = links.get(rate, {})
        ax.set_title(f"{rate}, +{args.latency_ms:g} ms one way (seed 0, measured)\n"
                     f"carried {link.get('effective_mbit', float('nan')):.0f} Mbit/s, RTT {link.get('rtt_ms', 0):.0f} ms",
                     fontsize=9)
        ax.set_xlabel("rank-0 training time (s)")
        ax.set_ylabel("test accuracy (digits)")
        ax.set_ylim(0.5, 1.0)
    # Time to the target at the slowest link, every seed: the median and the spread.
    ax = axes[len(args.rates)]
    slow = args.rates[-1]
    names = [m for m in METHODS_TTA if m in runs[slow]]
    for i, m in enumerate(names):
        hits = [reached(p, args.target) for p in runs[slow][m]]
        times = [h[0] for h in hits if h]
        ax.scatter([i] * len(times), times, color=colors[m], s=14)
        if times:
            ax.hlines(statistics.median(times), i - 0.3, i + 0.3, color=colors[m])
    ax.set_xticks(range(len(names)), [n.replace("_", "\n", 1) for n in names], fontsize=7)
    ax.set_ylabel(f"time to {args.target:.0%} (s)")
    ax.set_title(f"{slow}: every seed (dots), median (bar)", fontsize=9)
    ax = axes[-1]
    for method, seeds in runs[args.rates[0]].items():
        p = seeds[0]
        ax.plot([max(x["wire_tx_bytes"], 1) / 1e6 for x in p], [x["acc"] for x in p], label=method, color=colors.get(method))
    ax.set_xscale("log")
    ax.set_title("accuracy vs bytes out of rank 0 (seed 0, measured)", fontsize=9)
    ax.set_xlabel("MB out of rank 0's eth0")
    ax.set_ylim(0.5, 1.0)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dra.bench sage", description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--plot", default="docs/img/sage/accuracy.png")
    ap.add_argument("--world", type=count_arg, default=2)
    ap.add_argument("--steps", type=count_arg, default=400)
    ap.add_argument("--ramp-start", type=nonnegative_int_arg, default=50, help="sparsity ramp (dra_sparse90, ao_pruning90) start")
    ap.add_argument("--ramp-steps", type=nonnegative_int_arg, default=200, help="sparsity ramp length")
    ap.add_argument("--sparsify-every", type=count_arg, default=50, help="steps between mask updates")
    ap.add_argument("--seeds", type=count_arg, default=5)
    ap.add_argument("--first-seed", type=seed32_arg, default=0,
                    help="run seeds first-seed .. first-seed + seeds - 1 (a long run split over processes)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no new runs: summarise the measured runs of these reports (same settings, other seeds) "
                         "together, with this command's settings checked against theirs")
    ap.add_argument("--hidden", type=count_arg, default=512)
    ap.add_argument("--rank", type=count_arg, default=2, help="PowerSGD rank (dra and the torch hook)")
    ap.add_argument("--eval-every", type=count_arg, default=5)
    ap.add_argument("--target", type=probability_arg, default=0.95, help="test accuracy for time and steps to accuracy")
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--latency-ms", type=nonnegative_arg, default=20.0, help="added one way (round trip: twice)")
    ap.add_argument("--burst-bytes", type=count_arg, default=16 * 1024, help="tbf bucket: at most one compressed step's payload")
    ap.add_argument("--bucket-candidates", default="1,4,25,256", help="DDP bucket caps (MB) tried per link")
    ap.add_argument("--calibration-steps", type=count_arg, default=30)
    ap.add_argument("--run-timeout", type=positive_arg, default=600.0)
    ap.add_argument("--gpus", default="v100,a40,p100,rtx6000", help="Zeus trace sets to replay")
    ap.add_argument("--eta", type=probability_arg, default=0.5)
    ap.add_argument("--zeus-seeds", type=count_arg, default=10)
    ap.add_argument("--zeus-jobs", default="", help="comma-separated datasets (default: all six)")
    ap.add_argument("--skip-measured", action="store_true")
    ap.add_argument("--skip-replay", action="store_true")
    args = ap.parse_args(argv)
    if args.first_seed + args.seeds > 2**32:
        ap.error(f"--first-seed {args.first_seed} + --seeds {args.seeds}: the last seed passes 2^32 - 1 (NumPy's "
                 "limit); give a smaller --first-seed")
    if args.burst_bytes < 2 * 1514:
        ap.error(f"--burst-bytes: {args.burst_bytes} is below two full frames; give 3028 or more")
    # SIGTERM ends the run through the normal exit path, so the namespaces are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.rates = [r for r in args.rates.split(",") if r]
    for r in args.rates:
        if r not in RATES:
            ap.error(f"--rates: '{r}' unknown; use {', '.join(RATES)}")
    if args.merge and args.skip_measured:
        ap.error("--merge summarises measured runs: drop --skip-measured")
    args.bucket_candidates = [float(x) for x in args.bucket_candidates.split(",") if x]
    args.zeus_jobs = [j for j in args.zeus_jobs.split(",") if j]
    args.gpus = [g for g in args.gpus.split(",") if g]

    def progress(msg: str) -> None:
        print(f"[sage] {msg}", flush=True)

    rows: list[dict] = []
    extra: dict = {}
    merged = merge_reports(args, ap) if args.merge else None

    def save(report: dict) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json + ".tmp", "w") as fh:
            json.dump(report, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)

    def partial(runs, links, seeds: int) -> None:
        """The summary of the seeds done so far, marked incomplete (replaced by the full report)."""
        if not args.json:
            return
        report = {"suite": "sage", "complete": False, "seeds_done": seeds,
                  "measured": {"runs": runs, "links": links, "config": dict(vars(args))}}
        try:  # the raw runs are kept even if the summary of a partial set fails
            r, detail = summarise_measured(runs, links, args)
            report.update(write_report("sage", r, None), complete=False)
            report["measured"]["detail"] = detail
        except Exception as exc:  # noqa: BLE001
            report["summary_error"] = repr(exc)
            progress(f"partial summary failed: {exc!r}")
        save(report)
        progress(f"partial report ({seeds} of {args.seeds} seeds): {args.json}")

    if not args.skip_measured:
        runs, links = merged if merged else run_measured(args, progress, partial)
        r, detail = summarise_measured(runs, links, args)
        rows += r
        extra["measured"] = {"detail": detail, "runs": runs, "config": {k: v for k, v in vars(args).items()}}
        if args.plot:
            plot(runs, links, args, Path(args.plot))
            progress(f"plot: {args.plot}")
    if not args.skip_replay:
        r, replay = run_replay(args, progress)
        rows += r
        extra["zeus_replay"] = replay
    report = write_report("sage", rows, None)
    if args.json:
        report.update(extra, complete=True)
        save(report)
        print(f"  json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
