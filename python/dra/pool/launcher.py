"""``dra run``: start one worker per lease and supervise each on its own (DESIGN.md §3.5).

    dra run --nproc 4 -- python train.py ...            # no pool: 4 workers on this machine
    dra run --pool http://127.0.0.1:8470 --job NAME      # a pool job: workers follow its leases

The launcher hosts the job's c10d store (``DRA_STORE=host:port``, so the job survives the loss of
any worker, rank 0 included) and starts each worker with ``DRA_JOB_ID``, ``RANK``/``WORLD_SIZE``
(the first world) or ``DRA_JOIN=1`` (a worker on a lease granted later joins the running world in
place), the lease's environment (``DRA_LEASE_ID``, its cgroups, ``CUDA_VISIBLE_DEVICES``...). A
worker that crashes is just reported: the others carry on (the elastic controller's survivors
shrink in place and redo the step), unlike a one-node torchrun whose agent stops every worker. Its
lease goes back to the pool at once.

When the pool wants a lease back, the launcher writes the job's ``capacity`` key (the contract of
docs/guide/pool.md) and gives the job ``shrink_grace_s`` to let a member go (it exits 0); a job whose
controller does not read that key yet has one worker stopped instead, which its survivors handle
as a fault (shrink in place, redo the step).

Python workers start from a fork server that imported torch once (``_zygote``), so a new lease
runs a worker within tens of milliseconds; ``--no-zygote`` starts plain processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def _is_python(cmd: list[str]) -> bool:
    return bool(cmd) and (os.path.basename(cmd[0]).startswith("python") or cmd[0] == sys.executable)


class _Spawner:
    """Starts worker processes, from the zygote (Python commands) or as plain processes."""

    def __init__(self, use_zygote: bool, preload: list[str], log: Path) -> None:
        self.zygote: subprocess.Popen[bytes] | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[tuple[str, int]] = []
        self.pids: dict[str, int] = {}
        self._pending: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        if use_zygote:
            self.zygote = subprocess.Popen([sys.executable, "-m", "dra.pool._zygote", ",".join(preload)],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=open(log, "ab"), start_new_session=True)
            assert self.zygote.stdout is not None
            first = json.loads(self.zygote.stdout.readline() or b"{}")
            if not first.get("ready"):
                raise RuntimeError(f"the worker fork server did not start (see {log})")
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.zygote is not None and self.zygote.stdout is not None
        for line in self.zygote.stdout:
            msg = json.loads(line)
            with self._lock:
                if "spawned" in msg:
                    self.pids[msg["spawned"]] = msg["pid"]
                    self._pending.pop(msg["spawned"], threading.Event()).set()
                elif "exited" in msg:
                    self.exits.append((msg["exited"], int(msg["code"])))

    def spawn(self, wid: str, cmd: list[str], env: dict[str, str], cgroups: list[str], log: Path,
              cwd: str | None) -> int:
        if self.zygote is not None and _is_python(cmd):
            ev = threading.Event()
            with self._lock:
                self._pending[wid] = ev
            msg = {"op": "spawn", "id": wid, "argv": cmd[1:], "env": env, "cwd": cwd, "cgroups": cgroups,
                   "log": str(log)}
            assert self.zygote.stdin is not None
            self.zygote.stdin.write((json.dumps(msg) + "\n").encode())
            self.zygote.stdin.flush()
            if not ev.wait(10):
                raise RuntimeError(f"the fork server did not start worker {wid}")
            return self.pids[wid]

        def enter() -> None:  # in the child, before exec: into the lease's cgroups
            for p in cgroups:
                with open(os.path.join(p, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))

        out = open(log, "ab")
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=enter if cgroups else None, start_new_session=True)
        out.close()
        self.procs[wid] = p
        self.pids[wid] = p.pid
        return p.pid

    def poll(self) -> list[tuple[str, int]]:
        with self._lock:
            out, self.exits = self.exits, []
        for wid, p in list(self.procs.items()):
            code = p.poll()
            if code is not None:
                out.append((wid, code))
                del self.procs[wid]
        return out

    def kill(self, wid: str, sig: int = signal.SIGKILL) -> None:
        pid = self.pids.get(wid)
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.zygote is not None:
            try:
                assert self.zygote.stdin is not None
                self.zygote.stdin.close()
            except OSError:
                pass
            try:
                self.zygote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.zygote.kill()


class Launcher:
    def __init__(self, command: list[str] | None, *, job: str, pool: str | None = None, nproc: int = 1,
                 store_host: str = "127.0.0.1", advertise: str | None = None, log_dir: str | Path = ".",
                 zygote: bool = True, preload: list[str] | None = None, shrink_grace_s: float | None = None,
                 poll_s: float = 0.05, cwd: str | None = None, env: dict[str, str] | None = None,
                 ray: str | None = None) -> None:
        from dra.pool.server import PoolClient

        self.job = job
        self.client = PoolClient(pool, retry_s=30.0) if pool else None
        spec: dict[str, Any] = self.client.job_spec(job) if self.client else {}
        self.command = command or spec.get("command")
        if not self.command:
            raise ValueError("command: nothing to run; give one after '--' or submit the job with a command")
        self.cwd = cwd or spec.get("cwd")
        self.extra_env = {**(spec.get("env") or {}), **(env or {})}
        self.nproc = nproc
        self.min_size = int(spec.get("min_size", 1))
        self.shrink_grace_s = shrink_grace_s if shrink_grace_s is not None else spec.get("shrink_grace_s")
        self.poll_s = poll_s
        self.log_dir = Path(spec.get("log") or log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        use_zygote = zygote and spec.get("zygote", True) and _is_python(self.command)
        preload = preload if preload is not None else spec.get("preload", ["torch", "dra", "dra.elastic"])
        import torch.distributed as dist

        self.store = dist.TCPStore(store_host, 0, None, True, timedelta(seconds=60), wait_for_workers=False)
        self.store_addr = f"{advertise or store_host}:{self.store.port}"
        self.prefix = f"dra/{job}/0/"
        ray = ray or spec.get("ray")
        if ray:  # workers on the lease's Ray node (a placement group per lease)
            from dra.pool.ray_cluster import RaySpawner

            self.spawner: Any = RaySpawner(ray)
        else:
            self.spawner = _Spawner(use_zygote, preload, self.log_dir / f"{job}.zygote.log")
        self.workers: dict[int, dict[str, Any]] = {}  # lease id -> worker
        self.ended: set[int] = set()
        self.handled: set[int] = set()  # leases the pool asked back that a worker is leaving for
        self.started_world = False
        self.events: list[dict[str, Any]] = []

    def _say(self, **ev: Any) -> None:
        ev = {"time": time.time(), "job": self.job, **ev}
        self.events.append(ev)
        print("[dra run] " + json.dumps(ev), flush=True)

    # -- store keys (the contract with the running job) -----------------------------------------
    # The controller's c10d PrefixStore joins its prefix "dra/<job>/0/" and a key with another
    # "/", so its keys read "dra/<job>/0//done"; both spellings are read and written.
    def _keys(self, key: str) -> list[str]:
        return [self.prefix + key, self.prefix + "/" + key]

    def _get(self, key: str) -> Any:
        for k in self._keys(key):
            try:
                if self.store.check([k]):
                    return json.loads(self.store.get(k))
            except Exception:  # noqa: BLE001 - a half-written or odd value is not fatal
                return None
        return None

    def _set(self, key: str, value: Any) -> None:
        for k in self._keys(key):
            try:
                self.store.set(k, json.dumps(value))
            except Exception:  # noqa: BLE001
                pass

    def _done(self) -> bool:
        try:
            return any(self.store.check([k]) for k in self._keys("done"))
        except Exception:  # noqa: BLE001
            return False

    # -- workers ---------------------------------------------------------------------------------
    def _start(self, lease: dict[str, Any], rank: int, world: int, join: bool) -> None:
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(lease.get("env", {}))
        env.update({"DRA_STORE": self.store_addr, "DRA_JOB_ID": self.job, "RANK": str(rank),
                    "WORLD_SIZE": str(world), "PYTHONUNBUFFERED": "1"})
        env.setdefault("OMP_NUM_THREADS", "1")
        if join:
            env["DRA_JOIN"] = "1"
        else:
            env.pop("DRA_JOIN", None)
        cgroups = [p for p in env.get("DRA_CGROUPS", "").split(":") if p]
        wid = f"{self.job}.{lease['id']}"
        log = self.log_dir / f"{wid}.log"
        pid = self.spawner.spawn(wid, list(self.command), env, cgroups, log, self.cwd)
        self.workers[lease["id"]] = {"wid": wid, "pid": pid, "lease": lease["id"], "device": lease.get("device"),
                                     "started": time.time(), "kill_at": None, "join": join}
        self._say(event="worker_start", lease=lease["id"], device=lease.get("device"), pid=pid, join=join,
                  rank=None if join else rank)

    def _reap(self) -> tuple[list[int], list[int]]:
        """Exited workers: (leases freed, exit codes)."""
        freed, codes = [], []
        by_wid = {w["wid"]: lid for lid, w in self.workers.items()}
        for wid, code in self.spawner.poll():
            lid = by_wid.get(wid)
            if lid is None:
                continue
            w = self.workers.pop(lid)
            self.ended.add(lid)
            freed.append(lid)
            codes.append(code)
            self._say(event="worker_exit", lease=lid, code=code, ran_s=time.time() - w["started"],
                      asked=w["kill_at"] is not None)
        return freed, codes

    def _shrink(self, lids: list[int], report: dict[str, Any] | None) -> None:
        self.handled &= set(lids)  # a lease no longer asked for (swapped, or given back) is forgotten
        asked = [lid for lid in lids if lid not in self.handled]
        if not asked:
            return
        self.handled |= set(asked)
        live = sum(1 for w in self.workers.values() if w["kill_at"] is None)
        target = max(self.min_size, live - len(asked))
        self._set("capacity", {"max_size": target, "min_size": self.min_size})
        grace = self.shrink_grace_s
        if grace is None:  # a controller that reports desired_size reads the capacity key (contract)
            grace = 5.0 if report and "desired_size" in report else 0.0
        # The newest workers go first (the scheduler asks back the newest leases; this keeps the
        # first world's ranks, rank 0 among them, in place).
        newest = sorted((w for w in self.workers.values() if w["kill_at"] is None), key=lambda w: -w["started"])
        for w in newest[: len(asked)]:
            w["kill_at"] = time.time() + grace
            self._say(event="shrink", lease=w["lease"], target=target, grace_s=grace)

    def _enforce_kills(self) -> None:
        now = time.time()
        for w in self.workers.values():
            if w["kill_at"] is not None and now >= w["kill_at"] and not w.get("killed"):
                w["killed"] = True
                self.spawner.kill(w["wid"], signal.SIGKILL)

    # -- main loop -------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run_pool() if self.client else self._run_local()
        finally:
            for w in list(self.workers.values()):
                self.spawner.kill(w["wid"], signal.SIGKILL)
            self.spawner.close()

    def _run_local(self) -> int:
        for i in range(self.nproc):
            self._start({"id": i, "env": {}}, i, self.nproc, join=False)
        codes: list[int] = []
        while self.workers:
            _, c = self._reap()
            codes += c
            time.sleep(self.poll_s)
        _, c = self._reap()
        codes += c
        ok = self._done() or any(code == 0 for code in codes)
        self._say(event="job_end", ok=ok, codes=codes)
        return 0 if ok else (next((c for c in codes if c != 0), 1) & 0xFF or 1)

    def _run_pool(self) -> int:
        assert self.client is not None
        released: list[int] = []
        codes: list[int] = []
        while True:
            freed, c = self._reap()
            released += freed
            codes += c
            report = self._get("report")
            done = self._done() or (self.started_world and not self.workers and any(x == 0 for x in codes))
            if done:  # the job finished: its workers end by themselves (the leader writes results)
                deadline = time.time() + 60
                while self.workers and time.time() < deadline:
                    freed, c = self._reap()
                    released += freed
                    codes += c
                    time.sleep(self.poll_s)
            failed = self.started_world and not self.workers and not done
            try:
                answer = self.client.sync(self.job, list(self.workers), released, report, done=done, failed=failed)
            except ConnectionError as e:
                self._say(event="pool_unreachable", error=str(e))
                return 3
            released = []
            if done or failed or answer["state"] in ("finished", "failed", "cancelled"):
                if answer["state"] == "cancelled":
                    for w in self.workers.values():
                        self.spawner.kill(w["wid"], signal.SIGTERM)
                self._say(event="job_end", state=answer["state"], codes=codes)
                return 0 if answer["state"] == "finished" or done else 1
            new = [l for l in answer["leases"] if l["id"] not in self.workers and l["id"] not in self.ended
                   and l["state"] == "active"]
            if new and not self.started_world:
                if len(new) >= answer["min_size"]:
                    for rank, lease in enumerate(new):
                        self._start(lease, rank, len(new), join=False)
                    self.started_world = True
            else:
                for lease in new:
                    self._start(lease, 0, 1, join=True)
            if answer["release"]:
                self._shrink(answer["release"], report)
            self._enforce_kills()
            time.sleep(self.poll_s)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="dra run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pool", help="pool URL (http://host:port); without it the job runs --nproc workers here")
    p.add_argument("--job", default=None, help="job name (a pool job's name; default: 'job')")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--store-host", default="127.0.0.1", help="address the job's store listens on")
    p.add_argument("--advertise", default=None, help="address workers reach the store at (default: --store-host)")
    p.add_argument("--log-dir", default="dra-logs")
    p.add_argument("--no-zygote", action="store_true", help="start plain processes instead of forking a warm one")
    p.add_argument("--preload", default=None, help="modules the fork server imports (default torch,dra,dra.elastic)")
    p.add_argument("--shrink-grace-s", type=float, default=None)
    p.add_argument("--ray", default=None, help="start workers on a Ray cluster (address, or 'auto')")
    args = p.parse_args(argv)
    if args.pool and not args.job:
        p.error("--job is required with --pool")
    if not args.pool and not command:
        p.error("give the worker command after '--', e.g. dra run --nproc 2 -- python train.py")
    if args.nproc < 1:
        p.error(f"--nproc must be >= 1, got {args.nproc}")
    launcher = Launcher(command or None, job=args.job or "job", pool=args.pool, nproc=args.nproc,
                        store_host=args.store_host, advertise=args.advertise, log_dir=args.log_dir,
                        zygote=not args.no_zygote, preload=args.preload.split(",") if args.preload else None,
                        shrink_grace_s=args.shrink_grace_s, ray=args.ray)
    return launcher.run()


if __name__ == "__main__":
    raise SystemExit(main())
