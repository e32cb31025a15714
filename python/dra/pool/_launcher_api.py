"""The pool's side of its launchers (one per job, ``dra run --pool``): their periodic ``sync``
(heartbeats of the leases they run workers on, leases whose workers exited, the job's report, its
end) answered with the job's leases and the leases the pool wants back, and what a worker on a
lease is told. A mixin of ``dra.pool.service.PoolService``, whose state (jobs, lease book, lock)
it reads and changes under the service's lock.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from dra import _core
from dra.pool import _clock, _launchers
from dra.pool._auth import Caller
from dra.pool.client import Superseded

_INT_LIMIT = 2**53  # larger integers do not survive JSON's doubles in other readers
#: The most of a job's end reason kept (a launcher's failure line and a worker's last words fit in it).
REASON_LIMIT = 4000


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _shown(v: Any) -> str:
    return json.dumps(v)[:40]


#: A report's bounds: its JSON size, its nesting (the fields the pool reads are at most two deep),
#: and the size of what the pool keeps of a job's reports merged.
REPORT_LIMIT = 65536
REPORT_DEPTH = 8


def check_report(report: Any) -> dict[str, Any]:
    """A report is a JSON object of at most 64 kB. The fields the pool reads (the inference
    autoscaler's and those the arbiter fits a training job's speedup curve and remaining work to)
    have their types and ranges checked here, before any is kept: one job's malformed report would
    otherwise fail every scaling pass of the pool, for every job. Other fields are kept as they are."""
    if not isinstance(report, dict):
        raise ValueError("report: must be a JSON object")
    if len(json.dumps(report)) > REPORT_LIMIT:
        raise ValueError("report: larger than 64 kB; report rates, queue lengths and sizes only")
    # Bounded in depth too: a report nested 980 deep passed, and every status that showed it (an
    # operator's `dra pool status`, PoolClient.wait) nested it deeper and failed (RecursionError).
    stack: list[tuple[Any, int]] = [(report, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > REPORT_DEPTH and isinstance(value, (dict, list)):
            raise ValueError(f"report: nested deeper than {REPORT_DEPTH} levels; report flat fields")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)

    def number(where: str, v: Any, nullable: bool = False) -> None:
        if v is None and nullable:
            return
        if not _finite(v) or v < 0:
            raise ValueError(f"{where}: must be a finite number >= 0{' or null' if nullable else ''}, got {_shown(v)}")

    def integer(where: str, v: Any, low: int = 0) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _INT_LIMIT:
            raise ValueError(f"{where}: must be an integer in [{low}, 2^53], got {_shown(v)}")

    for k in ("rate_rps", "queue", "replica_rps", "samples_per_s", "time"):
        if k in report:
            number(f"report.{k}", report[k], nullable=k in ("samples_per_s", "time"))
    for k in ("step", "epoch", "world", "candidates", "global_batch"):
        if k in report and report[k] is not None:
            integer(f"report.{k}", report[k])
    if report.get("desired_size") is not None:
        integer("report.desired_size", report["desired_size"], low=-1)
    for k in ("loss", "gns"):  # a loss may be negative; NaN arrives as null
        v = report.get(k)
        if v is not None and not _finite(v):
            raise ValueError(f"report.{k}: must be a finite number or null, got {_shown(v)}")
    for k in ("policy", "phase"):
        if report.get(k) is not None and not isinstance(report[k], str):
            raise ValueError(f"report.{k}: must be a string, got {_shown(report[k])}")
    for k in ("rates", "rate_s"):  # {world size: samples/s (or seconds measured at that size)}
        v = report.get(k)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise ValueError(f"report.{k}: must be an object {{world size: number}}, got {_shown(v)}")
        for size, x in v.items():
            if not (size.isascii() and size.isdigit() and 1 <= int(size) <= 1_000_000):
                raise ValueError(f"report.{k}: keys are world sizes (\"1\" to \"1000000\"), got {_shown(size)}")
            number(f"report.{k}.{size}", x)
    tp = report.get("throughput")
    if tp is not None:
        if not isinstance(tp, dict):
            raise ValueError(f"report.throughput: must be an object of numbers, got {_shown(tp)}")
        for k in ("compute_fixed_s", "compute_per_sample_s", "sync_fixed_s", "sync_per_rank_s"):
            if k in tp and not _finite(tp[k]):
                raise ValueError(f"report.throughput.{k}: must be a finite number, got {_shown(tp[k])}")
        if "observations" in tp:
            integer("report.throughput.observations", tp["observations"])
    return report


class LauncherAPI:
    """``sync`` and its helpers (see the module's docstring)."""

    def lease_env(self, l: Any) -> dict[str, str]:
        """What a worker on this lease is told (and, where the platform can, held to)."""
        d = self.device(l.device)
        job = self.jobs.get(l.job) or {"info": {}, "spec": {}}
        env = {"DRA_LEASE_ID": str(l.id), "DRA_DEVICE": l.device, "DRA_DEVICE_SHARE": f"{l.share:g}",
               "DRA_RESTART_COUNT": str(job["info"].get("restarts", 0)),
               "DRA_MAX_RESTARTS": str(job["spec"].get("max_restarts", 0)),
               "DRA_ENFORCEMENT": d.enforcement, "DRA_NODE": d.node}
        if d.enforcement == "cgroup" and self.slots is not None:
            env["DRA_CGROUPS"] = ":".join(self.slots.paths(l.device, l.id))
            env["OMP_NUM_THREADS"] = str(max(1, math.ceil(d.compute * l.share)))
        elif d.enforcement in ("cuda_visible_devices", "mps"):
            # The GPU's index: the trailing number of the id's last part (gpu3, node2/gpu1, g0).
            digits = re.search(r"(\d+)$", l.device.split("/")[-1]) if "/mig" not in l.device else None
            env["CUDA_VISIBLE_DEVICES"] = digits.group(1) if digits else l.device
            if l.share < 1.0:
                # Memory fraction: the worker sets torch.cuda.set_per_process_memory_fraction (soft).
                env["DRA_CUDA_MEMORY_FRACTION"] = f"{l.share:g}"
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, int(100 * l.share)))
                env["DRA_ENFORCEMENT"] = "mps" if d.enforcement == "mps" else "soft"
        return env

    def sync_request(self, name: str, body: dict[str, Any], caller: Caller | None = None) -> dict[str, Any]:
        """``sync`` from an API body, every field checked for its type."""
        def ids(key: str) -> list[int]:
            v = body.get(key, [])
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise ValueError(f"{key}: must be a list of lease ids (integers)")
            return v

        for key in ("done", "failed"):
            if not isinstance(body.get(key, False), bool):
                raise ValueError(f"{key}: must be true or false")
        if body.get("world") is not None and not isinstance(body["world"], bool):
            raise ValueError("world: must be true, false or absent")
        for key in ("reason", "launcher"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise ValueError(f"{key}: must be a string")
        report, refused = body.get("report"), None
        if report is not None:
            # A malformed report is dropped, not the call: its heartbeats, exits and end still
            # count (the report is the job leader's store value, relayed). The job's events say
            # why, once per distinct problem.
            try:
                report = check_report(report)
            except ValueError as e:
                report, refused = None, str(e)
        reason = body.get("reason")
        if reason is not None and len(reason) > REASON_LIMIT:
            # Kept in the job's record and the pool's events: a 4 MiB reason per resubmission grew
            # events.jsonl by 100 MB in 20 s.
            reason = reason[:REASON_LIMIT] + f" ... ({len(reason) - REASON_LIMIT} characters more, cut)"
        exits = body.get("exits") or {}
        if not isinstance(exits, dict) or not all(
                isinstance(k, str) and k.isascii() and k.isdigit() and len(k) < 20 and isinstance(v, int) and not isinstance(v, bool)
                and -2**31 <= v < 2**31 for k, v in exits.items()):
            raise ValueError("exits: must map lease ids (as strings) to exit codes (integers)")
        answer = self.sync(name, ids("heartbeats"), ids("released"), report, body.get("done", False),
                           body.get("failed", False), reason, body.get("launcher"), caller,
                           world=body.get("world"), exits={int(k): v for k, v in exits.items()})
        if refused is not None:
            answer["report_refused"] = refused
            with self._lock:
                job = self.jobs.get(name)
                if job is not None and job["info"].get("report_refused") != refused:
                    job["info"]["report_refused"] = refused
                    self._event({"event": "report_refused", "job": name, "reason": refused})
        return answer

    def sync(self, name: str, heartbeats: list[int], released: list[int], report: dict[str, Any] | None,
             done: bool = False, failed: bool = False, reason: str | None = None, launcher: str | None = None,
             caller: Caller | None = None, world: bool | None = None,
             exits: dict[int, int] | None = None) -> dict[str, Any]:
        """A launcher's periodic call: its live leases, the leases its exited workers held, the
        job's report. Answers with the job's leases (new ones to start workers on) and the leases
        the pool wants back. ``launcher``: the caller's launch id (a second launcher is refused).
        ``world``: whether the job's processes formed a dra world; while a launcher says false (a
        script without dra, or one still starting), the job keeps the devices it holds: it is not
        grown, shrunk in place, or given back a device a worker of it gave up (_loop.py).
        ``exits``: the exit codes of the released leases' workers, said in their release events."""
        now = _clock.now()
        with self._lock:
            job = self._job(name)
            self._authorize(name, caller, "run")
            self._check_launcher(name, job, launcher, caller)
            if launcher is None and job["state"] == "waiting" and "launcher" not in job["info"] and job["info"].get("restarts"):
                # The end of the attempt before this restart, said again by a caller without a launch
                # id (a launcher started by hand): counted already, it must not use up another restart.
                done = failed = False
            if "ready_at" not in job["info"]:  # its launcher is up (store, warm fork server): it can run workers now
                job["info"]["ready_at"] = now
                self._event({"event": "ready", "job": name})
            changed, removed = [], []
            for lid in heartbeats:
                if self.book.contains(lid) and self.book.at(lid).job == name:
                    self.book.heartbeat(lid, now)
                    changed.append(self.book.at(lid))
                    if lid not in self._running:
                        self._running[lid] = now
                        # Kept with the job, so that a restarted daemon does not say it again.
                        info = job["info"]
                        info["running"] = [x for x in info.get("running", []) if self.book.contains(x)] + [lid]
                        self._event({"event": "worker_start", "job": name, "lease": lid,
                                     "device": self.book.at(lid).device})
            if self.node_check is not None and released:
                # A worker that ended may have ended with its node: asked now, before its device
                # could be granted again (the watcher would see it within a second).
                nodes = {self.inventory.at(self.book.at(lid).device).node for lid in released
                         if self.book.contains(lid) and self.inventory.contains(self.book.at(lid).device)}
                for node in sorted(nodes):
                    why = self.node_check(node)
                    if why:
                        self.remove_node(node, why)
            for lid in released:
                if self.book.contains(lid) and self.book.at(lid).job == name:
                    was = self.book.at(lid)
                    if was.state == "active":
                        # A member left on its own (its policy shrank it, or it was the one the job
                        # chose to let go): one lease the pool asked back is no longer owed.
                        for other in self.book.of_job(name):
                            if other.state == "releasing" and other.id != lid:
                                self._set_state(other.id, "active")
                                changed.append(self.book.at(other.id))
                                break
                    self._release(lid, "worker exited", removed, (exits or {}).get(lid))
            if world is not None and job["info"].get("world") != world:
                job["info"]["world"] = world
                if world:
                    self._event({"event": "world", "job": name, "workers": self.book.count(name, False)})
            if report:
                self._keep_report(name, report, now)
                self._observe_curve(name, report)
                if isinstance(report.get("step"), int) and report["step"] >= 1 and "first_step_at" not in job["info"]:
                    job["info"]["first_step_at"] = now
                    self._event({"event": "first_step", "job": name})
            if job["state"] == "waiting" and self.book.count(name) > 0:
                job["state"] = "running"
                job["started_at"] = now
                self._event({"event": "start", "job": name, "workers": self.book.count(name)})
            if (done or failed) and job["state"] in ("running", "waiting", "cancelled"):
                state = "cancelled" if job["state"] == "cancelled" else ("failed" if failed else "finished")
                self._end(name, state, reason, removed, now)
                steps = float((self.reports.get(name) or {}).get("step") or 0)
                if state == "finished" and steps > 0 and job["spec"].get("kind", "training") == "training":
                    spec = job["spec"]
                    self._history(name).record_completion(self._job_class(name), steps, float(spec.get("declared_steps") or 0),
                                                     self._curves.get(name, []))
            self._save_job(name)
            self._save_leases([c for c in changed if self.book.contains(c.id)], removed)
            leases = [{"id": l.id, "device": l.device, "share": l.share, "state": l.state, "env": self.lease_env(l)}
                      for l in self.book.of_job(name)]
            answer = {"state": job["state"], "leases": leases,
                      "release": [l.id for l in self.book.of_job(name) if l.state == "releasing"],
                      # leases taken back whose workers must stop if they still run (why, by id)
                      "fence": dict(job["info"].get("fence", {})),
                      "min_size": job["spec"]["min_size"], "max_size": job["spec"]["max_size"]}
        if removed or released:
            self._wake.set()
        return answer

    def _job_class(self, name: str) -> str:
        return str(self.jobs[name]["spec"].get("job_class") or name)

    def _history(self, name: str) -> Any:
        """The remaining-work estimator of the job's owner: the finished jobs of that user alone
        (their classes, and the calibration pooled over them). Not shared between users: one
        who finished jobs of another's class, or declared budgets far off, would otherwise move
        that user's estimates and so the devices the arbiter gives them."""
        uid = self._owner(name).uid
        if uid not in self.remaining:
            self.remaining[uid] = _core.RemainingWorkEstimator()
        return self.remaining[uid]

    def _observe_curve(self, name: str, report: dict[str, Any]) -> None:
        """The job's smoothed loss by step, as its reports give it (thinned to 256 points)."""
        step, loss = report.get("step"), report.get("loss")
        if not isinstance(step, (int, float)) or not isinstance(loss, (int, float)) or not math.isfinite(loss) or loss <= 0:
            return
        curve = self._curves.setdefault(name, [])
        if not curve or curve[-1][0] < step:
            curve.append((float(step), float(loss)))
            if len(curve) > 256:
                del curve[::2]

    def _check_launcher(self, name: str, job: dict[str, Any], launcher: str | None, caller: Caller | None) -> None:
        if launcher is None:
            return  # an in-process caller (tests, an embedding program)
        rec = job["info"].get("launcher")
        if launcher == job["info"].get("retired_launcher"):
            raise Superseded(f"job: '{name}' failed and starts again with a new launcher; this one stops")
        if rec is None and launcher.startswith(_launchers.DAEMON_LAUNCH_PREFIX):
            # A daemon started it, and not this pool's (whose every launch is on record): a launcher
            # that outlived a pool whose state directory is gone, reaching a new pool at the same
            # address with a job of the same name. It is not this job's.
            raise Superseded(f"job: '{name}': this launcher ({launcher}) was started by another pool, not this one "
                             "(its state directory was removed or replaced); this one stops")
        if rec is None:  # a launcher started by hand (dra run --pool ... --job NAME): the first one is the job's
            pid = caller.pid if caller is not None else 0
            if pid and not _launchers.owned_by(pid, caller.uid):
                pid = 0  # the caller is gone and its pid taken by another user's process: nothing to watch
            ref = _launchers.LauncherRef(launcher, pid, _launchers.proc_start(pid) if pid else None, by_hand=True)
            job["info"]["launcher"] = ref.to_json()
            if pid:
                self.launchers[name] = ref
            self._event({"event": "launcher", "job": name, "pid": pid, "by_hand": True})
        elif rec.get("id") != launcher:
            raise Superseded(f"job: '{name}' is run by another launcher (pid {rec.get('pid')}); this one stops")

