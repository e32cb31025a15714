"""The device pool at work (the main job): training jobs and an inference service sharing CPU
slots on this machine, run static and dynamic side by side.

    .venv/bin/python examples/pool/pool_at_work.py --out outputs/pool

A pool of 4 CPU slots (cgroups: a hard quota of half a core each, pinned to a core, 2 GB each).
The same work runs twice:

- three real training jobs on scikit-learn's bundled data, of different shapes, arriving over
  time: a CNN on digits (asks for 2 slots), an MLP on digits (2 slots, arrives later), a small MLP
  on breast-cancer data (1 slot, rigid, high priority, arrives last); each trains a fixed sample
  budget with a fixed global batch;
- an inference service serving a small language-model-shaped network to the request arrivals
  and sizes of the Azure LLM inference trace (code service, 2023; CC-BY-4.0, data/ holds the copy
  and its attribution), thinned and time-compressed.

static:  each job holds its requested slots for its whole life, first come first served (with
         backfilling); the inference service holds enough replicas for its peak.
dynamic: the pool (dra): jobs start at their minimum, the cluster arbiter re-plans every second
         from each job's live throughput, the inference service's replicas follow its load with
         hysteresis, a high-priority job shrinks a lower one in place.

Reported per job: JCT, queueing, training time, accuracy; pool utilisation from the slots' cgroup
CPU accounting (measured); inference p50/p99 latency, SLO attainment and replica-seconds; the
moves made. Writes gantt-static.png, gantt-dynamic.png, events-*.jsonl, summary.json; the last
line is ``outputs: <dir>``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import threading
import time
from collections import deque
from datetime import datetime
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRACE = ROOT / "data" / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_code.csv"


def load_trace(path: Path, duration_s: float, thin: int, ctx_div: int, gen_cap: int, minutes: float = 60.0,
               start_min: float = 0.0) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens / ctx_div, generated tokens) of every thin-th request in the
    trace's window [start_min, start_min + minutes), that window compressed into duration_s."""
    rows = list(csv.DictReader(open(path)))
    stamp = lambda s: datetime.fromisoformat(s[:26])  # noqa: E731 - microseconds: the first 26 characters
    t0 = stamp(rows[0]["TIMESTAMP"])
    lo, span = 60.0 * start_min, 60.0 * minutes
    window = [(t, r) for t, r in (((stamp(r["TIMESTAMP"]) - t0).total_seconds() - lo, r) for r in rows) if 0 <= t < span]
    return [(t / span * duration_s, max(1, int(r["ContextTokens"]) // ctx_div), min(gen_cap, int(r["GeneratedTokens"])))
            for t, r in window[::thin]]


class Frontend:
    """The inference service's front: replays the trace, queues requests, hands each to an idle
    replica, measures latency (arrival to answer). Replicas connect to it; one that goes away
    has its request re-queued at the front."""

    def __init__(self, trace: list[tuple[float, int, int]], pool: Any, job: str, slo_s: float) -> None:
        self.trace = trace
        self.pool, self.job, self.slo_s = pool, job, slo_s
        self.listener = Listener(("127.0.0.1", 0), authkey=b"dra")
        self.address = "%s:%d" % self.listener.address
        self.queue: deque[dict[str, Any]] = deque()
        self.cv = threading.Condition()
        self.latencies: list[float] = []
        self.compute: deque[float] = deque(maxlen=100)  # replicas' compute time per request (measured)
        self.arrivals: deque[float] = deque()
        self.replicas = 0
        self.stopping = False
        self.done_replaying = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Any) -> None:
        try:
            conn.recv()  # hello
        except (EOFError, OSError):
            return
        with self.cv:
            self.replicas += 1
        try:
            while True:
                with self.cv:
                    while not self.queue and not self.stopping:
                        self.cv.wait(0.2)
                    if self.stopping:
                        conn.send({"stop": True})
                        return
                    req = self.queue.popleft()
                try:
                    conn.send({"id": req["id"], "ctx": req["ctx"], "gen": req["gen"]})
                    answer = conn.recv()
                except (EOFError, OSError):
                    with self.cv:
                        self.queue.appendleft(req)
                        self.cv.notify()
                    return
                with self.cv:
                    self.latencies.append(time.time() - req["arrival"])
                    self.compute.append(float(answer["compute_s"]))
        finally:
            with self.cv:
                self.replicas -= 1

    def replay(self, t0: float) -> None:
        for i, (at, ctx, gen) in enumerate(self.trace):
            delay = t0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            now = time.time()
            with self.cv:
                self.queue.append({"id": i, "ctx": ctx, "gen": gen, "arrival": now})
                self.arrivals.append(now)
                self.cv.notify()
        self.done_replaying = True

    def report_loop(self) -> None:
        while not self.stopping:
            now = time.time()
            with self.cv:
                while self.arrivals and self.arrivals[0] < now - 2.0:
                    self.arrivals.popleft()
                rate, queue = len(self.arrivals) / 2.0, len(self.queue)
                # What one replica really serves now (slot quota and the machine's load included).
                per = len(self.compute) / sum(self.compute) if len(self.compute) >= 20 and sum(self.compute) > 0 else 0.0
            try:
                self.pool.report(self.job, {"rate_rps": rate, "queue": queue, "replicas_connected": self.replicas,
                                            "replica_rps": per})
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.25)

    def drained(self) -> bool:
        with self.cv:
            return self.done_replaying and not self.queue and len(self.latencies) >= len(self.trace)

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        self.listener.close()


def calibrate(ctx_div: int, trace: list[tuple[float, int, int]], slot_cpus: float) -> float:
    """Requests per second one replica serves on a slot: the model timed here on one thread over
    a sample of the trace's requests, scaled by the slot's quota (an estimate for the autoscaler)."""
    sys.path.insert(0, str(HERE))
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


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def run_mode(mode: str, args: argparse.Namespace, trace: list[tuple[float, int, int]], replica_rps: float,
             out: Path) -> dict[str, Any]:
    from dra.pool.gantt import plot
    from dra.pool.server import PoolClient, PoolServer
    from dra.pool.service import make_service

    state = out / mode
    for f in ("events.jsonl", "pool.sqlite", "pool.sqlite-wal", "pool.sqlite-shm"):
        (state / f).unlink(missing_ok=True)
    svc = make_service(f"slots:{args.slots}", state, mode=mode, name=f"main-{mode}-{os.getpid()}",
                       scale_every_s=1.0, heartbeat_timeout_s=3.0)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    preload = ["torch", "dra", "dra.elastic", "dra.pool.job", "sklearn.datasets", "sklearn.model_selection",
               "sklearn.preprocessing"]
    common = {"cwd": str(ROOT), "preload": preload, "log": str(state / "logs")}
    py = sys.executable
    train = str(HERE / "train.py")
    jobs = [  # (arrival s, spec): requests as a user would write them; static holds max_size (the request)
        (0.0, {"name": "cnn-digits", "min_size": 1, "max_size": 3, "priority": "normal",
               "command": [py, train, "--model", "cnn", "--data", "digits", "--epochs", str(args.epochs_cnn),
                           "--global-batch", "128", "--lr", "0.05", "--out", str(state / "cnn-digits")]}),
        (args.gap_s, {"name": "mlp-digits", "min_size": 1, "max_size": 2, "priority": "normal",
                      "command": [py, train, "--model", "mlp", "--data", "digits", "--epochs", str(args.epochs_mlp),
                                  "--global-batch", "128", "--lr", "0.05", "--out", str(state / "mlp-digits")]}),
        (2 * args.gap_s, {"name": "mlp-cancer", "min_size": 1, "max_size": 1, "elastic": False, "priority": "high",
                          "command": [py, train, "--model", "mlp", "--data", "breast_cancer", "--epochs",
                                      str(args.epochs_small), "--global-batch", "64", "--lr", "0.02",
                                      "--out", str(state / "mlp-cancer")]}),
    ]
    if mode == "static":  # the request is what static holds for life
        jobs[0][1]["min_size"] = jobs[0][1]["max_size"] = args.cnn_request
    frontend = Frontend(trace, client, "serve", args.slo_s)
    serve_spec = {"name": "serve", "kind": "inference", "min_size": 1, "max_size": args.peak_replicas,
                  "priority": "high", "env": {"DRA_SERVICE": frontend.address}, "zygote": True,
                  "preload": ["torch"], "command": [py, str(HERE / "replica.py")],
                  "autoscale": {"replica_rps": replica_rps, "up_utilisation": 0.5, "target_utilisation": 0.4,
                                "down_utilisation": 0.15, "down_delay_s": 15.0, "queue_per_replica": 4.0},
                  "cwd": str(ROOT), "log": str(state / "logs")}
    if mode == "static":
        serve_spec["min_size"] = args.peak_replicas  # sized for the peak, all the time
    client.submit(serve_spec)
    # The clock starts when the service is up (its replicas connected), in both modes alike.
    ready_by = time.time() + 120
    while frontend.replicas < serve_spec["min_size"] and time.time() < ready_by:
        time.sleep(0.1)
    usage0 = svc.slots.usage_all() if svc.slots else {}
    load0 = os.getloadavg()[0]
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
                  f"{percentile(frontend.latencies, 0.99):.3f}s", flush=True)
        if frontend.drained() and not frontend.stopping:
            # The service ends with its traffic (in both modes): its replicas exit, its slots
            # return to the pool, and its replica-seconds cover the same trace in both modes.
            frontend.stop()
        if not pending and all(states.get(n) in ("finished", "failed", "cancelled") for n in names) and frontend.drained():
            break
        if now > args.timeout_s:
            print(f"[pool {mode}] timed out after {now:.0f} s: {states}", file=sys.stderr)
            break
        time.sleep(0.5)
    end = time.time()
    usage1 = svc.slots.usage_all() if svc.slots else {}
    if not frontend.stopping:
        frontend.stop()
    try:
        client.wait(["serve"], timeout_s=20)
    except TimeoutError:
        client.cancel("serve")
    st = client.status()
    server.close()
    makespan = end - t0
    used = sum(usage1.get(s, 0.0) - usage0.get(s, 0.0) for s in usage1)
    quota = sum(d["compute"] for d in st["devices"])
    events = [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]
    per_job = {}
    for name in names:
        j = next(x for x in st["jobs"] if x["name"] == name)
        result_path = state / name / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        per_job[name] = {"state": j["state"], "jct_s": (j["finished_at"] or end) - j["submitted_at"],
                         "queueing_s": (j["started_at"] or end) - j["submitted_at"],
                         "training_s": (j["finished_at"] or end) - (j["started_at"] or end),
                         "accuracy": result.get("accuracy"), "resizes": result.get("resizes")}
    serve = next(x for x in st["jobs"] if x["name"] == "serve")
    lat = frontend.latencies
    replica_s = sum(e.get("held_s", 0.0) for e in events if e["event"] == "release" and e["job"] == "serve")
    moves = {k: sum(1 for e in events if e["event"] == k) for k in ("grant", "release", "preempt", "shrink", "plan")}
    png = plot(state / "events.jsonl", out / f"gantt-{mode}.png", title=f"{mode}: slots over time (measured)", t0=t0,
               devices=[d["id"] for d in st["devices"]])
    (out / f"events-{mode}.jsonl").write_text((state / "events.jsonl").read_text())
    return {
        "mode": mode, "makespan_s": makespan, "jobs": per_job,
        "avg_jct_s": sum(j["jct_s"] for j in per_job.values()) / len(per_job),
        "utilisation": used / (quota * makespan) if quota and makespan else float("nan"),
        "cpu_used_s": used, "cpu_quota_s": quota * makespan,
        "inference": {"requests": len(trace), "served": len(lat), "p50_s": percentile(lat, 0.5),
                      "p99_s": percentile(lat, 0.99), "slo_s": args.slo_s,
                      "slo_attainment": sum(1 for x in lat if x <= args.slo_s) / max(1, len(trace)),
                      "replica_seconds": replica_s, "state": serve["state"]},
        "moves": moves, "gantt": str(png),
        "machine_load_1min": [load0, os.getloadavg()[0]],  # the host's load average at start and end (shared)
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="outputs/pool")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--trace-start-min", type=float, default=0.0, help="the trace window's start (minutes)")
    p.add_argument("--trace-minutes", type=float, default=60.0, help="the trace window's length (minutes)")
    p.add_argument("--duration-s", type=float, default=100.0, help="the trace window compressed into this")
    p.add_argument("--thin", type=int, default=8, help="every thin-th request of the trace")
    p.add_argument("--ctx-div", type=int, default=16)
    p.add_argument("--gen-cap", type=int, default=256)
    p.add_argument("--slo-s", type=float, default=1.0)
    p.add_argument("--peak-replicas", type=int, default=2)
    p.add_argument("--cnn-request", type=int, default=2)
    p.add_argument("--gap-s", type=float, default=12.0, help="between training job arrivals")
    p.add_argument("--epochs-cnn", type=int, default=120)
    p.add_argument("--epochs-mlp", type=int, default=150)
    p.add_argument("--epochs-small", type=int, default=400)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--modes", default="static,dynamic")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trace = load_trace(TRACE, args.duration_s, args.thin, args.ctx_div, args.gen_cap, args.trace_minutes,
                       args.trace_start_min)
    slot_cpus = len(os.sched_getaffinity(0)) / args.slots
    replica_rps = calibrate(args.ctx_div, trace, slot_cpus)
    print(f"[pool] {len(trace)} inference requests over {args.duration_s:g} s (Azure code trace, every "
          f"{args.thin}th); one replica on a slot serves ~{replica_rps:.0f} req/s (estimated)", flush=True)
    results = {m: run_mode(m, args, trace, replica_rps, out) for m in args.modes.split(",")}
    for m, r in results.items():
        print(f"[pool {m}] machine load average (1 min) at start/end: {r['machine_load_1min'][0]:.1f} / "
              f"{r['machine_load_1min'][1]:.1f} on {os.cpu_count()} cores (other processes share them)")
    summary: dict[str, Any] = {"label": "measured (real processes, cgroup CPU accounting), one run per mode",
                               "config": vars(args), "replica_rps_estimate": replica_rps, **results}
    if "static" in results and "dynamic" in results:
        s, d = results["static"], results["dynamic"]
        summary["comparison"] = {
            "avg_jct_change": d["avg_jct_s"] / s["avg_jct_s"] - 1.0,
            "utilisation_points": 100 * (d["utilisation"] - s["utilisation"]),
            "accuracy_delta_points": {n: 100 * ((d["jobs"][n]["accuracy"] or 0) - (s["jobs"][n]["accuracy"] or 0))
                                      for n in s["jobs"]},
            "inference_replica_seconds_change": d["inference"]["replica_seconds"] / max(1e-9, s["inference"]["replica_seconds"]) - 1.0,
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{'job':<12} {'mode':<8} {'JCT s':>7} {'queue s':>8} {'train s':>8} {'accuracy':>9}")
    for m, r in results.items():
        for n, j in r["jobs"].items():
            acc = f"{100 * j['accuracy']:.2f}%" if j["accuracy"] is not None else "-"
            print(f"{n:<12} {m:<8} {j['jct_s']:7.1f} {j['queueing_s']:8.1f} {j['training_s']:8.1f} {acc:>9}")
    for m, r in results.items():
        i = r["inference"]
        print(f"{m}: avg JCT {r['avg_jct_s']:.1f} s, utilisation {100 * r['utilisation']:.1f}% (cgroup CPU), "
              f"inference p50 {1000 * i['p50_s']:.0f} ms p99 {1000 * i['p99_s']:.0f} ms, SLO {i['slo_s']:g} s met "
              f"{100 * i['slo_attainment']:.1f}%, replica-seconds {i['replica_seconds']:.0f}, moves {r['moves']}")
    if "comparison" in summary:
        c = summary["comparison"]
        print(f"dynamic vs static: avg JCT {100 * c['avg_jct_change']:+.1f}%, utilisation "
              f"{c['utilisation_points']:+.1f} points, inference replica-seconds {100 * c['inference_replica_seconds_change']:+.1f}%")
    print(f"plots: {out / 'gantt-static.png'} {out / 'gantt-dynamic.png'}")
    print(f"outputs: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
