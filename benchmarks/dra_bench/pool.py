"""``python -m dra.bench pool``: the device pool against an operator's static allocation, measured.

Rows:
- From the main job (examples/pool/pool_at_work.py), run once per mode on the same host, one
  after the other: ``pool_avg_jct`` (baseline ``static_fcfs``: the operator's static baseline,
  priority FCFS with backfilling, each job at its request, the same maximum sizes as dynamic) and
  ``pool_avg_jct.naive`` (baseline ``static_fcfs_naive``: the first baseline, priorities ignored),
  each with the JCT split into queueing, cold start and training; ``pool_utilization`` (busy CPU
  over slot quota over the makespan, with how often the quota bound); ``pool_inference_slo`` and
  ``pool_slo_vs_static`` (dynamic's SLO attainment minus static's, in points, same run),
  ``pool_inference_p99``, ``pool_inference_replica_seconds``, per-job accuracy, ``pool_moves``.
  Real processes in cgroup CPU slots (needs root and cgroups v1).
- ``pool_handover_s``: from the release of a lease by one job to the first committed step of
  another job on it (one slot, a job waiting; median over ``--handover-repeats``).
- ``pool_decision_ms`` and ``pool_decision_ms_100k``: one cluster-arbiter decision over 1,000 jobs
  x 6,000 devices and over 10,000 jobs x 100,000 devices (speedup curves of up to 64 devices
  each), median; baseline: the 50 ms goal.
- ``pool_security_escalations``: what an unprivileged user (``nobody``) got past the pool, from
  the attacks in ``security_check`` (needs root); goal 0.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra_bench._report import result, write_report

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


# -- security -----------------------------------------------------------------------------------------
_ATTACKER = r"""
import json, os, sys
from dra.pool.server import PoolClient
url, victim, tcp, state, ports = sys.argv[1:6]
c = PoolClient(url)
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except (PermissionError, ValueError, OSError, RuntimeError) as e:
        out[name] = "refused: " + str(e)[:160]
attempt("read another's job spec", lambda: c.job_spec(victim))
attempt("cancel another's job", lambda: c.cancel(victim))
attempt("report for another's job", lambda: c.report(victim, {"rate_rps": 1e6}))
attempt("sync as another's launcher", lambda: c.sync(victim, [], [], None, failed=True, reason="attack"))
attempt("drain the pool", lambda: c.drain())
attempt("submit as root", lambda: c.submit({"name": "as-root", "user": "root", "command": ["id"], "cwd": "/tmp"}))
attempt("submit into a directory it cannot enter", lambda: c.submit({"name": "cwd", "command": ["id"], "cwd": "/root"}))
attempt("TCP without the token", lambda: PoolClient(tcp, token="").status())
attempt("TCP with a wrong token", lambda: PoolClient(tcp, token="x" * 43).status())
for f in ("pool.sqlite", "events.jsonl", "logs/" + victim + ".launcher.log", "token"):
    attempt("read state " + f, lambda f=f: open(os.path.join(state, f)).read(1))
import socket
for port in [int(p) for p in ports.split(",") if p]:
    attempt("connect to the root job's port " + str(port), lambda port=port: socket.create_connection(("127.0.0.1", port), timeout=2).close())
others = [j for j in c.status()["jobs"] if j["name"] == victim]
out["see another's report"] = "allowed" if others and others[0]["report"] is not None else "refused"
print(json.dumps(out))
"""

_JOB = r"""
import json, os, sys
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except OSError as e:
        out[name] = "refused: " + e.strerror
attempt("read /etc/shadow", lambda: open("/etc/shadow").read(1))
attempt("write into /etc", lambda: open("/etc/dra-escalation-probe", "w").write("x"))
cgroups = [p for p in os.environ.get("DRA_CGROUPS", "").split(":") if p]
cpu = next((p for p in cgroups if "/cpu/" in p), None)
if cpu:
    attempt("raise its own CPU quota", lambda: open(os.path.join(cpu, "cpu.cfs_quota_us"), "w").write("-1"))
    root = cpu.split("/dra/")[0]
    attempt("leave its cgroup for the root one", lambda: open(os.path.join(root, "cgroup.procs"), "w").write(str(os.getpid())))
import socket
for port in [int(p) for p in os.environ.get("VICTIM_PORTS", "").split(",") if p]:
    attempt("connect to the root job's port " + str(port), lambda port=port: socket.create_connection(("127.0.0.1", port), timeout=2).close())
json.dump(out, open(sys.argv[1], "w"))
"""


def _listening_ports(pid: int, own: bool = False) -> list[int]:
    """TCP ports listening in the network namespace of a process; ``own``: only its own sockets
    (a launcher's: its job's store)."""
    inodes = None
    if own:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and (inodes is None or fields[9] in inodes):  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def security_check(tmp: Path, user: str = "nobody", timeout_s: float = 150.0) -> dict[str, Any]:
    """An unprivileged user attacks a pool run by root that runs a root job: through the API
    (another's job, the operator's acts, TCP without the token), the state files, the root job's
    network (its store), and from inside a job of its own (who it runs as, /etc/shadow, its
    cgroup's limits). Returns {"escalations": n, "attempts": {what: outcome}}: every attempt must
    be refused and the user's job must run as that user. Needs root (RuntimeError otherwise)."""
    from dra.pool import _auth
    from dra.pool.server import PoolClient, PoolServer
    from dra.pool.service import make_service

    if os.geteuid() != 0:
        raise RuntimeError("the security check needs root (it runs a pool as root and attacks it as another user)")
    pw = pwd.getpwnam(user)
    base = Path(tempfile.mkdtemp(prefix="dra-sec-", dir="/tmp"))
    os.chmod(base, 0o711)  # the attacker reaches the pool's socket through it
    state = base / "state"
    state.mkdir()
    work = base / "work"  # the attacker's own directory
    work.mkdir()
    os.chown(work, pw.pw_uid, pw.pw_gid)
    token = _auth.load_token(state / "token", create=True)
    svc = make_service("slots:2", state, name=f"sec-{os.getpid()}", scale_every_s=1.0)
    server = PoolServer(svc, port=0, token=token).start()
    client = PoolClient(server.url)
    attempts: dict[str, str] = {}
    victim = "root-job"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        client.submit({"name": victim, "min_size": 1, "max_size": 1, "cwd": str(tmp), "log": str(tmp / "logs"),
                       "env": {"SECRET": "s3cr3t"}, "preload": ["torch", "dra", "dra.elastic", "sklearn.datasets"],
                       "command": [sys.executable, str(EXAMPLES / "train.py"), "--model", "mlp", "--data", "digits",
                                   "--epochs", "5000", "--out", str(tmp / "victim")]})
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if next(j for j in client.status()["jobs"] if j["name"] == victim)["report"]:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError("the root job never reported")
        # The root job's store (its launcher's listening socket). In a namespace of its own, a port
        # number something here happens to listen on too could not tell anything apart: left out.
        pid = svc.launchers[victim].pid
        ports = _listening_ports(pid, own=True)
        if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
            ports = sorted(set(ports) - set(_listening_ports(os.getpid())))
        setpriv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)}
        r = subprocess.run([*setpriv, sys.executable, "-c", _ATTACKER, server.url, victim, server.tcp_url or "",
                            str(state), ",".join(map(str, ports))], capture_output=True, text=True, timeout=120,
                           env=env, cwd=str(work))
        if r.returncode != 0:
            raise RuntimeError(f"the attacker could not run: {r.stderr[-2000:]}")
        for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items():
            attempts[f"api: {k}"] = v
        # The attacker's own job, submitted with the CLI as the attacker (the socket says who).
        script = work / "probe.py"
        script.write_text(_JOB)
        os.chown(script, pw.pw_uid, pw.pw_gid)
        spec = {"name": "mine", "cwd": str(work), "log": str(work / "logs"), "zygote": False,
                "env": {"VICTIM_PORTS": ",".join(map(str, ports))},
                "command": [sys.executable, str(script), str(work / "probe.json")]}
        spec_file = work / "mine.json"  # the attacker's own file (a pipe from this root process is not its to open)
        spec_file.write_text(json.dumps(spec))
        os.chown(spec_file, pw.pw_uid, pw.pw_gid)
        r = subprocess.run([*setpriv, sys.executable, "-m", "dra", "pool", "submit", "--pool", server.url, "--spec",
                            str(spec_file)], capture_output=True, text=True, timeout=60, env=env, cwd=str(work))
        if r.returncode != 0:
            raise RuntimeError(f"the attacker's job was refused: {r.stderr[-2000:]}")
        states = client.wait(["mine"], timeout_s=max(10.0, deadline - time.time()))
        probe = json.loads((work / "probe.json").read_text()) if (work / "probe.json").exists() else {}
        ran_as = (probe.get("uid"), probe.get("euid"), probe.get("gid"), probe.get("groups"))
        want = (pw.pw_uid, pw.pw_uid, pw.pw_gid, [pw.pw_gid])
        attempts["job ran as its submitter"] = "yes" if ran_as == want else f"no: {ran_as} ({states})"
        for k, v in probe.items():
            if k not in ("uid", "euid", "gid", "groups"):
                attempts[f"job: {k}"] = v
        victim_state = next(j["state"] for j in client.status()["jobs"] if j["name"] == victim)
        attempts["the root job still runs"] = "yes" if victim_state == "running" else f"no: {victim_state}"
    finally:
        try:
            client.cancel(victim)
            client.wait([victim], timeout_s=20)
        except Exception:  # noqa: BLE001 - the pool goes anyway
            pass
        server.close()
        shutil.rmtree(base, ignore_errors=True)
    escalations = sum(v.startswith("allowed") if k.startswith(("api:", "job:")) else not v.startswith("yes")
                      for k, v in attempts.items())
    return {"escalations": escalations, "attempts": attempts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dra.bench pool")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--handover-repeats", type=int, default=3)
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
                                  attempts=sec["attempts"], label="measured: nobody against a root pool"))
        hs = handover_s(args.handover_repeats, tmp)
        results.append(result("pool_handover_s", statistics.median(hs), "s", ("goal", 1.0), samples=hs,
                              label=f"measured, median of {len(hs)}"))
        if not args.skip_main:
            out = Path(args.main_out).resolve() if args.main_out else tmp / "main"
            cmd = [sys.executable, str(EXAMPLES / "pool_at_work.py"), "--out", str(out),
                   "--modes", "static_naive,static,dynamic", *args.main_args.split()]
            proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
            sys.stdout.write(proc.stdout[-4000:])
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"the main job failed (exit {proc.returncode})")
            s = json.loads((out / "summary.json").read_text())
            st, dy = s["static"], s["dynamic"]
            lab = {"label": "measured, one run per mode, side by side",
                   "host_load": {m: s[m]["host_load"] for m in ("static_naive", "static", "dynamic") if m in s}}

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
                                  quota_bound={"dynamic": dy["quota_bound"], "static_fcfs": st["quota_bound"]}, **lab))
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
