"""``python -m dra.bench pool``: the device pool against static allocation, measured.

Rows:
- ``pool_avg_jct`` (baseline ``static_fcfs``), ``pool_utilization`` (baseline ``static_fcfs``),
  ``pool_inference_slo`` (baseline ``static_peak``), ``pool_inference_replica_seconds`` (baseline
  ``static_peak``) and per-job accuracy: the main job (examples/pool/pool_at_work.py), static and
  dynamic in one run, real processes in cgroup CPU slots (needs root and cgroups v1).
- ``pool_handover_s``: from the release of a lease by one job to the first committed step of
  another job on it (one slot, a job waiting; median over ``--handover-repeats``).
- ``pool_decision_ms``: one cluster-arbiter decision over 1,000 jobs and 6,000 devices (speedup
  curves of up to 64 devices each), median; baseline: the 50 ms goal.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dra_bench._report import median_time, result, write_report

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "pool"


def decision_ms(jobs: int = 1000, devices: int = 6000, repeats: int = 7) -> float:
    from dra._core import pool as P

    rng = random.Random(1)
    arbiter = P.ClusterArbiter()
    batch = []
    for _ in range(jobs):
        a = P.ArbiterJob()
        most = rng.randint(1, 64)
        sigma = rng.uniform(0.0, 0.3)
        scale = rng.uniform(0.5, 2.0)
        a.speedup = [0.0] + [scale * k / (1 + sigma * (k - 1)) for k in range(1, most + 1)]
        a.current = rng.randint(0, most)
        a.change_penalty = rng.uniform(0.7, 1.0)
        a.min_devices = 1 if rng.random() < 0.3 else 0
        batch.append(a)
    return 1000.0 * median_time(lambda: arbiter.allocate(batch, devices), repeats=repeats)


def handover_s(repeats: int, tmp: Path) -> list[float]:
    """A one-slot pool, job 'a' running, job 'b' waiting; 'a' ends: seconds from the release of
    its lease to b's first committed step on it."""
    from dra.pool.server import PoolClient, PoolServer
    from dra.pool.service import make_service

    out = []
    for r in range(repeats):
        state = tmp / f"handover-{r}"
        svc = make_service("slots:1", state, name=f"bench-handover-{r}", scale_every_s=1.0)
        server = PoolServer(svc).start()
        client = PoolClient(server.url)
        try:
            common = {"cwd": str(ROOT), "log": str(state / "logs"),
                      "preload": ["torch", "dra", "dra.elastic", "dra.pool.job", "sklearn.datasets",
                                  "sklearn.model_selection", "sklearn.preprocessing"]}
            cmd = [sys.executable, str(EXAMPLES / "train.py"), "--model", "logreg", "--data", "wine"]
            client.submit({"name": "a", **common, "command": cmd + ["--epochs", "20", "--out", str(state / "a")]})
            time.sleep(0.5)
            client.submit({"name": "b", **common, "command": cmd + ["--epochs", "2", "--out", str(state / "b")]})
            client.wait(["a", "b"], timeout_s=120)
        finally:
            server.close()
        events = [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]
        release = next(e for e in events if e["event"] == "release" and e["job"] == "a")
        first = json.loads((state / "b" / "first_steps.jsonl").read_text().splitlines()[0])
        out.append(first["time"] - release["time"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dra.bench pool")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--handover-repeats", type=int, default=3)
    p.add_argument("--skip-main", action="store_true", help="only the handover and decision rows")
    p.add_argument("--main-args", default="", help="extra arguments for the main job (space separated)")
    p.add_argument("--main-out", default=None, help="keep the main job's outputs (Gantt PNGs, events, summary) here")
    args = p.parse_args(argv)
    results = []
    ms = decision_ms()
    results.append(result("pool_decision_ms", ms, "ms", ("goal", 50.0), jobs=1000, devices=6000,
                          label="measured, median of 7"))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hs = handover_s(args.handover_repeats, tmp)
        results.append(result("pool_handover_s", statistics.median(hs), "s", ("goal", 1.0), samples=hs,
                              label=f"measured, median of {len(hs)}"))
        if not args.skip_main:
            out = Path(args.main_out).resolve() if args.main_out else tmp / "main"
            cmd = [sys.executable, str(EXAMPLES / "pool_at_work.py"), "--out", str(out), *args.main_args.split()]
            proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
            sys.stdout.write(proc.stdout[-3000:])
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"the main job failed (exit {proc.returncode})")
            s = json.loads((out / "summary.json").read_text())
            st, dy = s["static"], s["dynamic"]
            lab = {"label": "measured, one run per mode, side by side"}
            results.append(result("pool_avg_jct", dy["avg_jct_s"], "s", ("static_fcfs", st["avg_jct_s"]), **lab))
            results.append(result("pool_utilization", 100 * dy["utilisation"], "%",
                                  ("static_fcfs", 100 * st["utilisation"]), **lab))
            results.append(result("pool_inference_slo", 100 * dy["inference"]["slo_attainment"], "%",
                                  ("static_peak", 100 * st["inference"]["slo_attainment"]), **lab))
            results.append(result("pool_inference_replica_seconds", dy["inference"]["replica_seconds"], "s",
                                  ("static_peak", st["inference"]["replica_seconds"]), **lab))
            results.append(result("pool_inference_p99", 1000 * dy["inference"]["p99_s"], "ms",
                                  ("static_peak", 1000 * st["inference"]["p99_s"]), **lab))
            for name, j in dy["jobs"].items():
                results.append(result(f"pool_accuracy.{name}", 100 * (j["accuracy"] or 0), "%",
                                      ("static_fcfs", 100 * (st["jobs"][name]["accuracy"] or 0)), **lab))
            results.append(result("pool_moves", sum(dy["moves"].get(k, 0) for k in ("preempt", "shrink")), "moves",
                                  None, grants=dy["moves"].get("grant"), **lab))
    write_report("pool", results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
