"""``python -m dra.bench pool``: the device pool against an operator's static allocation, measured.

Rows:
- From the main job (examples/pool/pool_at_work.py), run once per mode on the same host, one
  after the other: ``pool_avg_jct`` (baseline ``static_fcfs``: the operator's static baseline,
  priority FCFS with first-fit backfilling and a reservation for a job blocked aging_s, each job at
  its request, the same maximum sizes as dynamic) and
  ``pool_avg_jct.naive`` (baseline ``static_fcfs_naive``: the first baseline, priorities ignored),
  ``pool_avg_jct.tuned``, ``pool_utilization.tuned``, ``pool_inference_slo.tuned`` (baseline
  ``static_tuned``: the same scheduler with each job's and the service's best static size in
  hindsight, ``--tuned-sizes`` of the main job; reported apart, no goal),
  each with the JCT split into queueing, cold start and training; ``pool_utilization`` (busy CPU
  over slot quota over the makespan, the same definition in every mode, with how often the quota
  bound and where the slots' time went: idle, held before a worker ran, running per job, CPU per
  job); ``pool_inference_slo`` and
  ``pool_slo_vs_static`` (dynamic's SLO attainment minus static's, in points, same run),
  ``pool_inference_p99``, ``pool_inference_replica_seconds``, per-job accuracy, ``pool_moves``.
  Real processes in cgroup CPU slots (needs root and cgroups v1).
- ``pool_handover_s``: from the release of a lease by one job to the first committed step of
  another job on it (one slot, a job waiting with its launcher up; median over ``--handover-repeats``).
- ``pool_job_start_s``: from a job's submission to its first committed step on a free slot (its
  launcher started, its fork server importing torch and scikit-learn), with the time to the
  launcher's check-in; median over ``--handover-repeats``.
- ``pool_launch_busy_s`` (baseline ``no_control_cgroup``): a two-slot pool whose slots (1 core
  each, guaranteed) are both busy; seconds from a second job's submission to its launcher's
  check-in (``ready``: Python, dra and torch imported), with the launchers in the pool's
  control-plane cgroup (``control_cpus`` 0.5) and, alternating, left in the root cgroup as before;
  median over ``--launch-repeats`` each.
- ``pool_decision_ms`` and ``pool_decision_ms_100k``: one cluster-arbiter decision over 1,000 jobs
  x 6,000 devices and over 10,000 jobs x 100,000 devices (speedup curves of up to 64 devices
  each), median; baseline: the 50 ms goal.
- ``pool_security_escalations``: what an unprivileged user (``nobody``) got past the pool, from
  the attacks in ``security_check`` (needs root); goal 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dra._argtypes import count_arg
from dra_bench._report import result, write_report
from dra_bench.pool_security import security_check

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "pool"


def decision_ms(jobs: int = 1000, devices: int = 6000, repeats: int = 7) -> tuple[float, float]:
    """(CPU ms, wall ms) of one arbiter decision, medians over ``repeats``: the CPU time is what
    the decision costs; the wall time adds what the host's other processes took meanwhile."""
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
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        arbiter.allocate(batch, devices)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return 1000.0 * statistics.median(cpu), 1000.0 * statistics.median(wall)


#: What the main job's training jobs preload in their fork server (torch, scikit-learn).
PRELOAD = ["torch", "dra", "dra.elastic", "dra.pool.job", "sklearn.datasets", "sklearn.model_selection",
           "sklearn.preprocessing"]


@contextlib.contextmanager
def _one_slot_pool(state: Path, name: str) -> Iterator[Any]:
    """A served pool of one CPU slot at ``state``: its client, closed at the end."""
    from dra.pool.factory import make_service
    from dra.pool.server import PoolClient, PoolServer

    server = PoolServer(make_service("slots:1", state, name=name, scale_every_s=1.0)).start()
    try:
        yield PoolClient(server.url)
    finally:
        server.close()


def handover_s(repeats: int, tmp: Path) -> list[float]:
    """A one-slot pool, job 'a' running, job 'b' waiting with its launcher up; 'a' ends: seconds
    from the release of its lease to b's first committed step on it. 'a' holds the slot until b's
    launcher has checked in (event ``ready``) and b's fork server has imported what b preloads
    (its log says so), so the figure is the pool's handover and not b's start-up (seconds of
    importing torch on a loaded host: part of b's queueing, ``pool_job_start_s``)."""
    out = []
    for r in range(repeats):
        state = tmp / f"handover-{r}"
        with _one_slot_pool(state, f"bench-handover-{r}") as client:
            common = {"cwd": str(ROOT), "log": str(state / "logs"), "preload": PRELOAD}
            go = state / "a-may-end"
            hold = f"import os, time\nt = time.time()\nwhile not os.path.exists({str(go)!r}) and time.time() - t < 120: time.sleep(0.02)"
            client.submit({"name": "a", **common, "command": [sys.executable, "-c", hold]})
            deadline = time.time() + 120

            def seen(event: str, job: str) -> bool:
                return any(json.loads(x).get("event") == event and json.loads(x).get("job") == job
                           for x in (state / "events.jsonl").read_text().splitlines())

            while time.time() < deadline and not seen("worker_start", "a"):  # a holds the one slot first
                time.sleep(0.1)
            cmd = [sys.executable, str(EXAMPLES / "train.py"), "--model", "logreg", "--data", "wine"]
            client.submit({"name": "b", **common, "command": cmd + ["--epochs", "2", "--out", str(state / "b")]})
            zygote_log = state / "logs" / "b.zygote.log"  # the fork server says there when workers can start
            while time.time() < deadline and not (
                    seen("ready", "b") and zygote_log.exists()
                    and "fork server ready" in zygote_log.read_text(errors="replace")):
                time.sleep(0.1)
            time.sleep(1.0)  # a look of the pool's loop or two: b waits for the slot with its launcher up
            go.touch()
            client.wait(["a", "b"], timeout_s=120)
        events = [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]
        release = next(e for e in events if e["event"] == "release" and e["job"] == "a")
        first = json.loads((state / "b" / "first_steps.jsonl").read_text().splitlines()[0])
        out.append(first["time"] - release["time"])
    return out


def job_start_s(repeats: int, tmp: Path) -> dict[str, list[float]]:
    """A one-slot pool, one job preloading what the main job's preload (torch, scikit-learn):
    seconds from its submission to its launcher's check-in (event ``ready``) and to its first
    committed step."""
    out: dict[str, list[float]] = {"ready": [], "first_step": []}
    for r in range(repeats):
        state = tmp / f"start-{r}"
        with _one_slot_pool(state, f"bench-start-{r}") as client:
            client.submit({"name": "b", "cwd": str(ROOT), "log": str(state / "logs"), "preload": PRELOAD,
                           "command": [sys.executable, str(EXAMPLES / "train.py"), "--model", "logreg", "--data", "wine",
                                       "--epochs", "2", "--out", str(state / "b")]})
            client.wait(["b"], timeout_s=120)
        first: dict[str, float] = {}
        for line in (state / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            first.setdefault(e["event"], e["time"])
        out["ready"].append(first["ready"] - first["submit"])
        out["first_step"].append(first["first_step"] - first["submit"])
    return out


def launch_busy_s(control_cpus: float | None, tmp: Path, tag: str, limit_s: float = 150.0) -> float:
    """Two 1-core slots on this machine's cores, guaranteed and both busy with job 'a' (two workers
    spinning, bounded by a stop file and 200 s); seconds from job 'b''s submission to its
    launcher's check-in (``ready``), or ``limit_s`` when it never came within that (a lower bound)."""
    from dra.pool.factory import make_service
    from dra.pool.server import PoolClient, PoolServer

    state = tmp / f"launch-{tag}"
    stop = state / "stop"
    cores = len(os.sched_getaffinity(0))
    svc = make_service(f"slots:2x{cores / 2:g}", state, name=f"bench-launch-{tag}", scale_every_s=1.0,
                       control_cpus=control_cpus)
    server = PoolServer(svc).start()
    client = PoolClient(server.url)
    spin = (f"import os, time\nt = time.time()\nwhile not os.path.exists({str(stop)!r}) and time.time() - t < 200:\n"
            "    for _ in range(100000): pass\n")

    def first(event: str, job: str) -> float | None:
        for line in (state / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == event and e.get("job") == job:
                return float(e["time"])
        return None

    try:
        common = {"cwd": str(ROOT), "log": str(state / "logs"), "elastic": False, "zygote": False}
        client.submit({"name": "a", "min_size": 2, "max_size": 2, **common, "command": [sys.executable, "-c", spin]})
        deadline = time.time() + 120
        while time.time() < deadline and sum(
                json.loads(x).get("event") == "worker_start" for x in (state / "events.jsonl").read_text().splitlines()) < 2:
            time.sleep(0.1)
        time.sleep(2.0)  # both slots spinning
        client.submit({"name": "b", "min_size": 1, "max_size": 1, **common, "command": [sys.executable, "-c", "pass"]})
        submitted = first("submit", "b")
        deadline = time.time() + limit_s
        while time.time() < deadline and first("ready", "b") is None:
            time.sleep(0.1)
        ready = first("ready", "b")
        stop.touch()
        client.wait(["a", "b"], timeout_s=120)
    finally:
        stop.touch()
        server.close()
    assert submitted is not None
    return limit_s if ready is None else ready - submitted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dra.bench pool")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--handover-repeats", type=count_arg, default=3)
    p.add_argument("--launch-repeats", type=int, default=3, help="pool_launch_busy_s repeats per arm (0: skip the row)")
    p.add_argument("--skip-main", action="store_true", help="only the handover, decision and security rows")
    p.add_argument("--main-args", default="", help="extra arguments for the main job (space separated)")
    p.add_argument("--main-out", default=None, help="keep the main job's outputs (Gantt PNGs, events, summary) here")
    args = p.parse_args(argv)
    results = []
    load = os.getloadavg()[0]
    cpu, wall = decision_ms()
    results.append(result("pool_decision_ms", cpu, "ms", ("goal", 50.0), jobs=1000, devices=6000, wall_ms=wall,
                          host_load=load, label="measured CPU time, median of 7"))
    cpu, wall = decision_ms(10_000, 100_000, repeats=7)
    results.append(result("pool_decision_ms_100k", cpu, "ms", ("goal", 50.0), jobs=10_000, devices=100_000,
                          wall_ms=wall, host_load=load, label="measured CPU time, median of 7"))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if os.geteuid() == 0:
            sec = security_check(tmp / "security")
            results.append(result("pool_security_escalations", sec["escalations"], "escalations", ("goal", 0.0),
                                  attempts=sec["attempts"], python=sec["python"],
                                  label="measured: nobody against a root pool"))
        hs = handover_s(args.handover_repeats, tmp)
        results.append(result("pool_handover_s", statistics.median(hs), "s", ("goal", 1.0), samples=hs,
                              label=f"measured, median of {len(hs)}"))
        if args.launch_repeats > 0 and os.geteuid() == 0:
            arms: dict[str, list[float]] = {"control_cgroup": [], "no_control_cgroup": []}
            for r in range(args.launch_repeats):  # alternating, so that the host's load falls on both
                for arm, cpus in (("control_cgroup", 0.5), ("no_control_cgroup", None))[::1 if r % 2 == 0 else -1]:
                    arms[arm].append(launch_busy_s(cpus, tmp, f"{arm}-{r}"))
            results.append(result("pool_launch_busy_s", statistics.median(arms["control_cgroup"]), "s",
                                  ("no_control_cgroup", statistics.median(arms["no_control_cgroup"])), samples=arms,
                                  host_load=os.getloadavg()[0],
                                  label=f"measured, medians of {args.launch_repeats} per arm, alternating; 150 s "
                                        "stands for a launcher not ready within 150 s"))
        st = job_start_s(args.handover_repeats, tmp)
        results.append(result("pool_job_start_s", statistics.median(st["first_step"]), "s", None, samples=st,
                              ready_s=statistics.median(st["ready"]), host_load=os.getloadavg()[0],
                              label=f"measured: submit to first step, median of {len(st['first_step'])}"))
        if not args.skip_main:
            out = Path(args.main_out).resolve() if args.main_out else tmp / "main"
            cmd = [sys.executable, str(EXAMPLES / "pool_at_work.py"), "--out", str(out),
                   "--modes", "static_naive,static,static_tuned,dynamic", *args.main_args.split()]
            proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
            sys.stdout.write(proc.stdout[-4000:])
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"the main job failed (exit {proc.returncode})")
            s = json.loads((out / "summary.json").read_text())
            st, dy = s["static"], s["dynamic"]
            lab = {"label": "measured, one run per mode, side by side",
                   "host_load": {m: s[m]["host_load"] for m in ("static_naive", "static", "static_tuned", "dynamic")
                                 if m in s}}

            def split(r: dict[str, Any]) -> dict[str, float]:
                n = len(r["jobs"])
                return {k: sum(j[k] for j in r["jobs"].values()) / n for k in ("queueing_s", "cold_start_s", "training_s")}

            results.append(result("pool_avg_jct", dy["avg_jct_s"], "s", ("static_fcfs", st["avg_jct_s"]),
                                  goal_ratio=0.75, split={"dynamic": split(dy), "static_fcfs": split(st)}, **lab))
            if "static_naive" in s:
                nv = s["static_naive"]
                results.append(result("pool_avg_jct.naive", dy["avg_jct_s"], "s", ("static_fcfs_naive", nv["avg_jct_s"]),
                                      split={"dynamic": split(dy), "static_fcfs_naive": split(nv)}, **lab))
            results.append(result("pool_utilization", 100 * dy["utilisation"], "%",
                                  ("static_fcfs", 100 * st["utilisation"]), goal_points=10.0,
                                  quota_bound={"dynamic": dy["quota_bound"], "static_fcfs": st["quota_bound"]},
                                  cpu_used_s={"dynamic": dy["cpu_used_s"], "static_fcfs": st["cpu_used_s"]},
                                  makespan_s={"dynamic": dy["makespan_s"], "static_fcfs": st["makespan_s"]},
                                  slot_seconds={"dynamic": dy["slot_seconds"], "static_fcfs": st["slot_seconds"]}, **lab))
            if "static_tuned" in s:  # the best static sizes in hindsight: reported apart, not a goal's baseline
                tu = s["static_tuned"]
                results.append(result("pool_avg_jct.tuned", dy["avg_jct_s"], "s", ("static_tuned", tu["avg_jct_s"]),
                                      split={"dynamic": split(dy), "static_tuned": split(tu)},
                                      sizes=s["config"]["tuned"], **lab))
                results.append(result("pool_utilization.tuned", 100 * dy["utilisation"], "%",
                                      ("static_tuned", 100 * tu["utilisation"]),
                                      makespan_s={"dynamic": dy["makespan_s"], "static_tuned": tu["makespan_s"]},
                                      cpu_used_s={"dynamic": dy["cpu_used_s"], "static_tuned": tu["cpu_used_s"]},
                                      **lab))
                results.append(result("pool_inference_slo.tuned", 100 * dy["inference"]["slo_attainment"], "%",
                                      ("static_tuned", 100 * tu["inference"]["slo_attainment"]), **lab))
            results.append(result("pool_inference_slo", 100 * dy["inference"]["slo_attainment"], "%",
                                  ("static_peak", 100 * st["inference"]["slo_attainment"]), **lab))
            results.append(result("pool_slo_vs_static",
                                  100 * (dy["inference"]["slo_attainment"] - st["inference"]["slo_attainment"]),
                                  "points", ("goal", 0.0), **lab))
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
