"""The device pool at work (the main job): training jobs and an inference service sharing CPU
slots on this machine, run under the operator's static baseline and under dra's dynamic pool,
side by side.

    .venv/bin/python examples/pool/pool_at_work.py --out outputs/pool

A pool of 4 CPU slots (cgroups: a hard quota of a quarter core each, pinned to a core, 2 GB each,
and a cpu.shares that reserves that quota against the machine's other processes; the rest of the
machine runs the daemon, the launchers and the inference front end). The same work runs in every
mode:

- real training jobs on scikit-learn's bundled data, one arriving every ``--gap-s``, each training
  a fixed sample budget with a fixed global batch, compute-bound on one thread (they use all of
  their slots' quota): a CNN on digits (1-2 slots), an MLP on digits (1-2 slots), a small MLP on
  breast-cancer data (1 slot, rigid, high priority), and again in that order for ``--rounds``
  rounds (default 2: training that needs its slots past the trace's end under the static
  baseline; 1: the light workload, whose training is done well before the trace, where the
  makespan is the trace's in every mode);
- an inference service (high priority, 1-2 replicas) serving a small language-model-shaped
  network to the request arrivals and sizes of the Azure LLM inference trace (code service, 2023;
  CC-BY-4.0, data/ holds the copy and its attribution), thinned and time-compressed. Its front end
  talks JSON lines to its replicas over a Unix socket whose peer credentials it checks.

static:        the operator's baseline, as a batch scheduler would run it: each job holds its
               request (max_size: the same maximum sizes as dynamic, each fitting the pool) for its
               whole life, by priority then arrival, with first-fit backfilling (a job blocked for
               aging_s, 120 s, holds the devices that come free until it starts; no time limits,
               so not Slurm's EASY backfill); the inference service holds the replicas its peak
               needs.
static_naive:  the same, first come first served (priorities and aging ignored, no reservation):
               the first baseline.
dynamic:       dra's pool: the inference service's scaling comes first (a training job shrinks in
               place when its SLO is at risk), jobs are admitted on their request and resized in
               place by the cluster arbiter from their live throughput.

static_tuned:  the static scheduler with each kind's best static size in hindsight (--tuned-sizes).
Each mode starts once the host's load average is below its cores (--settle-s, at most 60 s).

Reported per job: JCT (queueing, cold start, training) and accuracy; pool utilisation (the slots'
cgroup CPU over their quota and the makespan, how often the quota bound, where slot time went,
each job's CPU); inference p50/p99, SLO attainment, replica-seconds; the host's load. Writes
gantt-<mode>.png, events-<mode>.jsonl, summary.json; the last line is ``outputs: <dir>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRACE = ROOT / "data" / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_code.csv"
sys.path.insert(0, str(HERE))  # its sibling modules, also when it is loaded by path (the docs' tests)
from serving import Frontend, LoadSampler, load_trace, percentile  # noqa: E402


def calibrate(ctx_div: int, trace: list[tuple[float, int, int]], slot_cpus: float) -> float:
    """Requests per second one replica serves on a slot: the model timed here on one thread over
    a sample of the trace's requests, scaled by the slot's quota (an estimate for the autoscaler)."""
    import torch
    from replica import build, serve_one

    torch.set_num_threads(1)
    model = build()
    sample = trace[:: max(1, len(trace) // 60)][:60]
    serve_one(model, 16, 4)
    t = time.perf_counter()
    for _, ctx, gen in sample:
        serve_one(model, ctx, gen)
    per = (time.perf_counter() - t) / len(sample)
    return slot_cpus / per


def first_step(out: Path) -> float | None:
    """The time of a job's first committed step (its workers append it to first_steps.jsonl)."""
    path = out / "first_steps.jsonl"
    if not path.exists():
        return None
    return min(json.loads(x)["time"] for x in path.read_text().splitlines() if x.strip())


def slot_seconds(events: list[dict[str, Any]], t0: float, end: float, devices: list[str]) -> dict[str, Any]:
    """Where the slots' time over [t0, end] went, from the event log: ``idle`` (no lease),
    ``held_not_running`` per job (a lease granted, its worker not started yet: cold start,
    handover), ``running`` per job (a worker on the lease); and ``cpu_s`` per job (what its leases'
    cgroups used over their whole life). The same for every mode: why utilisation differs."""
    def within(a: float, b: float) -> float:
        return max(0.0, min(b, end) - max(a, t0))

    held: dict[int, list[Any]] = {}  # lease -> [device, job, granted, worker started]
    out: dict[str, Any] = {"idle": 0.0, "held_not_running": {}, "running": {}, "cpu_s": {}}
    leased = dict.fromkeys(devices, 0.0)

    def close(lease: int, at: float) -> None:
        device, job, granted, started = held.pop(lease)
        started = at if started is None else started
        out["held_not_running"][job] = out["held_not_running"].get(job, 0.0) + within(granted, started)
        out["running"][job] = out["running"].get(job, 0.0) + within(started, at)
        leased[device] = leased.get(device, 0.0) + within(granted, at)

    for e in events:
        if e["event"] == "grant":
            held[e["lease"]] = [e["device"], e["job"], e["time"], None]
        elif e["event"] == "worker_start" and e["lease"] in held and held[e["lease"]][3] is None:
            held[e["lease"]][3] = e["time"]
        elif e["event"] == "release" and e["lease"] in held:
            close(e["lease"], e["time"])
            if "cpu_s" in e:
                out["cpu_s"][e["job"]] = out["cpu_s"].get(e["job"], 0.0) + e["cpu_s"]
    for lease in list(held):
        close(lease, end)
    out["idle"] = sum(max(0.0, (end - t0) - v) for v in leased.values())
    return out


KINDS = ["cnn-digits", "mlp-digits", "mlp-cancer"]  # one round of the training workload, in order of arrival


def job_names(args: argparse.Namespace) -> list[str]:
    """The training jobs' names in order of arrival: round 1 is cnn-digits, mlp-digits, mlp-cancer;
    round r > 1 the same kinds again, named kind-r."""
    return [k if r == 1 else f"{k}-{r}" for r in range(1, args.rounds + 1) for k in KINDS]


def tuned_sizes(text: str) -> dict[str, int]:
    """``--tuned-sizes``: kind=size pairs (the kinds of KINDS and serve), each size >= 1."""
    sizes: dict[str, int] = {}
    for part in (x for x in text.split(",") if x):
        kind, _, size = part.partition("=")
        if kind not in (*KINDS, "serve") or not size.isdigit() or int(size) < 1:
            raise ValueError(f"--tuned-sizes: {part!r} is not KIND=SIZE with KIND one of {', '.join((*KINDS, 'serve'))} "
                             "and SIZE a whole number >= 1; e.g. cnn-digits=2,mlp-digits=1,serve=1")
        sizes[kind] = int(size)
    return sizes


def workload(args: argparse.Namespace, state: Path, mode: str) -> list[tuple[float, dict[str, Any]]]:
    """(arrival s, spec) of every training job: requests as a user would write them (the static
    baselines hold max_size for life), one every ``gap_s``, the three kinds in turn. In
    ``static_tuned`` each kind asks for its size of ``--tuned-sizes`` (the best static size in
    hindsight) instead."""
    py, train = sys.executable, str(HERE / "train.py")

    def spec(kind: str, name: str) -> dict[str, Any]:
        out = ["--out", str(state / name)]
        if kind == "cnn-digits":
            return {"name": name, "min_size": 1, "max_size": 2, "priority": "normal",
                    "command": [py, train, "--model", "cnn", "--data", "digits", "--epochs", str(args.epochs_cnn),
                                "--global-batch", "128", "--lr", "0.05", *out]}
        if kind == "mlp-digits":
            return {"name": name, "min_size": 1, "max_size": 2, "priority": "normal",
                    "command": [py, train, "--model", "mlp", "--data", "digits", "--epochs", str(args.epochs_mlp),
                                "--global-batch", "128", "--lr", "0.05", *out]}
        return {"name": name, "min_size": 1, "max_size": 1, "elastic": False, "priority": "high",
                "command": [py, train, "--model", "mlp", "--data", "breast_cancer", "--epochs", str(args.epochs_small),
                            "--global-batch", "64", "--lr", "0.02", *out]}

    def sized(kind: str, name: str) -> dict[str, Any]:
        sp = spec(kind, name)
        if mode == "static_tuned" and kind in args.tuned:
            sp["max_size"] = args.tuned[kind]
            sp["min_size"] = min(sp["min_size"], sp["max_size"])
        return sp

    names = job_names(args)
    return [(i * args.gap_s, sized(KINDS[i % len(KINDS)], n)) for i, n in enumerate(names)]


ENDED = ("finished", "failed", "cancelled")


def end_run(client: Any, server: Any, frontend: Frontend | None, wait_s: float = 30.0) -> None:
    """Ends what a run left: cancels its jobs that have not ended, waits (at most ``wait_s``) until
    the pool has released their leases (their workers gone), then closes the pool, which removes
    its cgroups. A run that ended normally has nothing left and closes at once."""
    if frontend is not None and not frontend.stopping:
        frontend.stop()
    try:
        live = [j["name"] for j in client.status()["jobs"] if j["state"] not in ENDED]
        for name in live:
            client.cancel(name)
        if live:
            print(f"[pool] ending the run's jobs that had not ended: {', '.join(live)}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + wait_s
        while live and client.status()["leases"] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.close()


def run_mode(mode: str, args: argparse.Namespace, trace: list[tuple[float, int, int]], replica_rps: float,
             out: Path) -> dict[str, Any]:
    from dra.pool.factory import make_service
    from dra.pool.gantt import plot
    from dra.pool.server import PoolClient, PoolServer

    state = out / mode
    for f in ("events.jsonl", "pool.sqlite", "pool.sqlite-wal", "pool.sqlite-shm"):
        (state / f).unlink(missing_ok=True)
    for name in job_names(args):
        shutil.rmtree(state / name, ignore_errors=True)
    svc = make_service(f"slots:{args.slots}x{args.slot_cpus:g}", state,
                       mode="static" if mode == "static_tuned" else mode, name=f"main-{mode}-{os.getpid()}",
                       scale_every_s=1.0, heartbeat_timeout_s=3.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    frontend: Frontend | None = None
    try:
        preload = ["torch", "dra", "dra.elastic", "dra.pool.job", "sklearn.datasets", "sklearn.model_selection",
                   "sklearn.preprocessing"]
        common = {"cwd": str(ROOT), "preload": preload, "log": str(state / "logs")}
        py = sys.executable
        jobs = workload(args, state, mode)
        frontend = Frontend(trace, client, "serve", args.slo_s)
        replicas = args.tuned.get("serve", args.peak_replicas) if mode == "static_tuned" else args.peak_replicas
        serve_spec = {"name": "serve", "kind": "inference", "min_size": 1, "max_size": replicas,
                      "priority": "high", "env": {"DRA_SERVICE": frontend.address}, "zygote": True,
                      "preload": ["torch"], "command": [py, str(HERE / "replica.py")],
                      "autoscale": {"replica_rps": replica_rps, "up_utilisation": 0.5, "target_utilisation": 0.4,
                                    "down_utilisation": 0.15, "down_delay_s": 15.0, "queue_per_replica": 4.0},
                      "cwd": str(ROOT), "log": str(state / "logs")}
        client.submit(serve_spec)
        # The clock starts when the service is up (its first replicas connected), in every mode alike.
        ready_by = time.time() + 120
        want = serve_spec["min_size"] if mode == "dynamic" else serve_spec["max_size"]
        while frontend.replicas < want and time.time() < ready_by:
            time.sleep(0.1)
        usage0 = svc.slots.usage_all() if svc.slots else {}
        throttle0 = {s: svc.slots.throttling(s) for s in svc.slots.specs} if svc.slots else {}
        load = LoadSampler()
        t0 = time.time()
        threading.Thread(target=frontend.report_loop, daemon=True).start()
        replay = threading.Thread(target=frontend.replay, args=(t0,), daemon=True)
        replay.start()
        pending = list(jobs)
        names = [s["name"] for _, s in jobs]
        last = 0.0
        states: dict[str, str] = {}
        while True:
            now = time.time() - t0
            while pending and pending[0][0] <= now:
                client.submit({**pending[0][1], **common})
                pending.pop(0)
            st = client.status()
            states = {j["name"]: j["state"] for j in st["jobs"]}
            if now - last >= 10:
                last = now
                workers = " ".join(f"{j['name']}={j['workers']}" for j in st["jobs"] if j["state"] in ("waiting", "running"))
                print(f"[pool {mode}] t={now:5.0f}s {workers} inference p99 so far "
                      f"{percentile(frontend.latencies, 0.99):.3f}s, host load {os.getloadavg()[0]:.1f}", flush=True)
            if frontend.drained() and not frontend.stopping:
                # The service ends with its traffic (in every mode): its replicas exit, its slots
                # return to the pool, and its replica-seconds cover the same trace in every mode.
                frontend.stop()
            if not pending and all(states.get(n) in ENDED for n in names) and frontend.drained():
                break
            if now > args.timeout_s:
                print(f"[pool {mode}] timed out after {now:.0f} s: {states}", file=sys.stderr)
                break
            time.sleep(0.5)
        end = time.time()
        usage1 = svc.slots.usage_all() if svc.slots else {}
        throttle1 = {s: svc.slots.throttling(s) for s in svc.slots.specs} if svc.slots else {}
        host_load = load.stop()
        if not frontend.stopping:
            frontend.stop()
        try:
            client.wait(["serve"], timeout_s=20)
        except TimeoutError:
            client.cancel("serve")
        st = client.status()
    finally:
        # However the run ends (its end, its time-out, Ctrl-C, SIGTERM), the jobs it submitted end
        # with it and the pool lets go of its cgroups: nothing of the run outlives it.
        end_run(client, server, frontend)
    makespan = end - t0
    used = sum(usage1.get(s, 0.0) - usage0.get(s, 0.0) for s in usage1)
    quota = sum(d["compute"] for d in st["devices"])
    periods = sum(throttle1[s][0] - throttle0[s][0] for s in throttle1)
    throttled = sum(throttle1[s][1] - throttle0[s][1] for s in throttle1)
    events = [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]
    per_job = {}
    for name in names:
        j = next(x for x in st["jobs"] if x["name"] == name)
        result_path = state / name / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        granted = j["first_grant_at"] or end
        stepped = first_step(state / name) or granted
        finished = j["finished_at"] or end
        per_job[name] = {"state": j["state"], "jct_s": finished - j["submitted_at"],
                         "queueing_s": granted - j["submitted_at"], "cold_start_s": max(0.0, stepped - granted),
                         "training_s": finished - max(stepped, granted),
                         "accuracy": result.get("accuracy"), "resizes": result.get("resizes")}
    serve = next(x for x in st["jobs"] if x["name"] == "serve")
    lat = frontend.latencies
    replica_s = sum(e.get("held_s", 0.0) for e in events if e["event"] == "release" and e["job"] == "serve")
    moves = {k: sum(1 for e in events if e["event"] == k) for k in ("grant", "release", "preempt", "shrink", "plan")}
    png = plot(state / "events.jsonl", out / f"gantt-{mode}.png", title=f"{mode}: slots over time (measured)", t0=t0,
               devices=[d["id"] for d in st["devices"]], jobs=["serve", *names], load=host_load, cores=os.cpu_count(),
               late=[a for a, _, _ in frontend.late])
    (out / f"events-{mode}.jsonl").write_text((state / "events.jsonl").read_text())
    loads = [v for _, v in host_load] or [os.getloadavg()[0]]
    return {
        "mode": mode, "makespan_s": makespan, "jobs": per_job,
        "avg_jct_s": sum(j["jct_s"] for j in per_job.values()) / len(per_job),
        "utilisation": used / (quota * makespan) if quota and makespan else float("nan"),
        "cpu_used_s": used, "cpu_quota_s": quota * makespan,
        "quota_bound": throttled / periods if periods else 0.0,  # share of enforcement periods the quota held a slot back
        "inference": {"requests": len(trace), "served": len(lat), "p50_s": percentile(lat, 0.5),
                      "p99_s": percentile(lat, 0.99), "slo_s": args.slo_s,
                      "slo_attainment": sum(1 for x in lat if x <= args.slo_s) / max(1, len(trace)),
                      "replica_seconds": replica_s, "state": serve["state"], "refused_peers": frontend.refused,
                      # When the SLO was missed: seconds since the clock started, latency, replicas then.
                      "late": [[round(a - t0, 2), round(x, 3), n] for a, x, n in frontend.late]},
        "moves": moves, "gantt": str(png),
        "slot_seconds": slot_seconds(events, t0, end, [d["id"] for d in st["devices"]]),
        "host_load": {"mean": sum(loads) / len(loads), "max": max(loads), "cores": os.cpu_count()},
    }


def compare(d: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """Dynamic's run ``d`` against a baseline's ``s``."""
    return {
        "avg_jct_ratio": d["avg_jct_s"] / s["avg_jct_s"],
        "avg_jct_change": d["avg_jct_s"] / s["avg_jct_s"] - 1.0,
        "utilisation_points": 100 * (d["utilisation"] - s["utilisation"]),
        "slo_points": 100 * (d["inference"]["slo_attainment"] - s["inference"]["slo_attainment"]),
        "accuracy_delta_points": {n: 100 * ((d["jobs"][n]["accuracy"] or 0) - (s["jobs"][n]["accuracy"] or 0))
                                  for n in s["jobs"]},
        "inference_replica_seconds_change": d["inference"]["replica_seconds"] / max(1e-9, s["inference"]["replica_seconds"]) - 1.0,
    }


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="outputs/pool")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--slot-cpus", type=float, default=0.25, help="each slot's CPU quota (cores)")
    p.add_argument("--trace-start-min", type=float, default=0.0, help="the trace window's start (minutes)")
    p.add_argument("--trace-minutes", type=float, default=60.0, help="the trace window's length (minutes)")
    p.add_argument("--duration-s", type=float, default=100.0, help="the trace window compressed into this")
    p.add_argument("--thin", type=int, default=8, help="every thin-th request of the trace")
    p.add_argument("--ctx-div", type=int, default=16)
    p.add_argument("--gen-cap", type=int, default=256)
    p.add_argument("--slo-s", type=float, default=1.0)
    p.add_argument("--peak-replicas", type=int, default=2)
    p.add_argument("--gap-s", type=float, default=12.0, help="between training job arrivals")
    p.add_argument("--epochs-cnn", type=int, default=120)
    p.add_argument("--epochs-mlp", type=int, default=150)
    p.add_argument("--epochs-small", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2,
                   help="how many times the three training jobs arrive (round r > 1 named kind-r); 1 is the "
                        "light workload, whose training ends well before the trace")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--settle-s", type=float, default=60.0,
                   help="before each mode, wait up to this long for the host's load average to fall below its core "
                        "count (the first mode ran on the load of the build or tests before it); 0: no wait")
    p.add_argument("--modes", default="static,static_tuned,dynamic",
                   help="any of static_naive, static, static_tuned, dynamic (run in the order given; default: the "
                        "operator's baseline, the best static sizes in hindsight, and dra's pool)")
    p.add_argument("--tuned-sizes", default="cnn-digits=2,mlp-digits=1,mlp-cancer=1,serve=1",
                   help="static_tuned's sizes, kind=size: the best static size of each kind in hindsight (default: "
                        "measured on this machine: the MLP on digits trains faster on 1 slot than on 2, the CNN faster "
                        "on 2; one replica met the SLO through the trace at a host load of 5-7)")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("static", "static_naive", "static_tuned", "dynamic")]
    if bad:
        p.error(f"--modes: unknown {bad[0]!r}; use static_naive, static, static_tuned, dynamic")
    try:
        args.tuned = tuned_sizes(args.tuned_sizes)
    except ValueError as e:
        p.error(str(e))
    if args.rounds < 1:
        p.error(f"--rounds: {args.rounds} is not a whole number >= 1; use 1 for the light workload, 2 (default) or more")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trace = load_trace(TRACE, args.duration_s, args.thin, args.ctx_div, args.gen_cap, args.trace_minutes,
                       args.trace_start_min)
    replica_rps = calibrate(args.ctx_div, trace, args.slot_cpus)
    print(f"[pool] {len(trace)} inference requests over {args.duration_s:g} s (Azure code trace, every "
          f"{args.thin}th); one replica on a slot serves ~{replica_rps:.0f} req/s (estimated)", flush=True)
    # SIGTERM (and a closed terminal) end the run as Ctrl-C does: its jobs end and its cgroups go.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    try:
        results = {}
        for m in modes:
            at_start = LoadSampler.settle(args.settle_s)
            print(f"[pool {m}] starts at a host load of {at_start:.1f} ({os.cpu_count()} cores)", flush=True)
            results[m] = {**run_mode(m, args, trace, replica_rps, out), "host_load_at_start": at_start}
    except KeyboardInterrupt:
        print("[pool] interrupted: the run's jobs were ended and its pool closed; no results written", file=sys.stderr)
        return 130
    for m, r in results.items():
        h = r["host_load"]
        print(f"[pool {m}] host load average (1 min) over the run: mean {h['mean']:.1f}, max {h['max']:.1f} on "
              f"{h['cores']} cores (other processes share them); slot quota bound in {100 * r['quota_bound']:.0f}% "
              "of enforcement periods")
    for m, r in results.items():
        ss = r["slot_seconds"]
        print(f"[pool {m}] slot-seconds over the makespan ({r['makespan_s']:.0f} s x {args.slots}): idle {ss['idle']:.0f}, "
              f"held before a worker ran {sum(ss['held_not_running'].values()):.0f}, running "
              + ", ".join(f"{j} {v:.0f}" for j, v in ss["running"].items())
              + "; CPU s by job " + ", ".join(f"{j} {v:.1f}" for j, v in ss["cpu_s"].items()))
    summary: dict[str, Any] = {"label": "measured (real processes, cgroup CPU accounting), one run per mode",
                               "config": vars(args), "replica_rps_estimate": replica_rps, **results}
    for base, key in (("static", "comparison"), ("static_tuned", "comparison_tuned")):
        if base in results and "dynamic" in results:
            summary[key] = compare(results["dynamic"], results[base])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{'job':<12} {'mode':<13} {'JCT s':>7} {'queue s':>8} {'cold s':>7} {'train s':>8} {'accuracy':>9}")
    for m, r in results.items():
        for n, j in r["jobs"].items():
            acc = f"{100 * j['accuracy']:.2f}%" if j["accuracy"] is not None else "-"
            print(f"{n:<12} {m:<13} {j['jct_s']:7.1f} {j['queueing_s']:8.1f} {j['cold_start_s']:7.1f} "
                  f"{j['training_s']:8.1f} {acc:>9}")
    for m, r in results.items():
        i = r["inference"]
        print(f"{m}: avg JCT {r['avg_jct_s']:.1f} s, utilisation {100 * r['utilisation']:.1f}% (cgroup CPU / slot "
              f"quota), inference p50 {1000 * i['p50_s']:.0f} ms p99 {1000 * i['p99_s']:.0f} ms, SLO {i['slo_s']:g} s "
              f"met {100 * i['slo_attainment']:.1f}%, replica-seconds {i['replica_seconds']:.0f}, moves {r['moves']}")
    for base, key in (("static", "comparison"), ("static_tuned", "comparison_tuned")):
        if key in summary:
            c = summary[key]
            print(f"dynamic vs {base}: avg JCT x{c['avg_jct_ratio']:.2f} ({100 * c['avg_jct_change']:+.1f}%), utilisation "
                  f"{c['utilisation_points']:+.1f} points, SLO {c['slo_points']:+.1f} points, inference replica-seconds "
                  f"{100 * c['inference_replica_seconds_change']:+.1f}%")
    print("plots: " + " ".join(str(out / f"gantt-{m}.png") for m in results))
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
