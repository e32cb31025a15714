"""What the pool shows: its status (devices, leases, jobs, the devices away with a Ray cluster's
head) and its metrics in Prometheus's text format. A mixin of ``dra.pool.service.PoolService``, read
under its lock.
"""

from __future__ import annotations

from typing import Any

from dra.pool import _clock
from dra.pool._auth import Caller
from dra.pool._metrics import prometheus


class PoolViews:
    def status(self, caller: Caller | None = None) -> dict[str, Any]:
        """Devices, leases and jobs; a job's report and why it ended only for its owner and
        operators (everyone sees names, owners, states and sizes, as a batch queue shows them)."""
        with self._lock:
            now = _clock.now()
            devices = []
            for d in self.inventory.devices:
                devices.append({"id": d.id, "type": d.type, "node": d.node, "group": d.group,
                                "memory_gb": d.memory_gb, "compute": d.compute, "enforcement": d.enforcement,
                                "free": self.book.free_share(d.id)})
            leases = [{"id": l.id, "job": l.job, "device": l.device, "share": l.share, "state": l.state,
                       "age_s": now - l.granted_at, "heartbeat_age_s": now - l.heartbeat_at} for l in self.book.all()]
            jobs = []
            for name, j in self.jobs.items():
                mine = self._may(name, caller)
                jobs.append({"name": name, "user": self._owner(name).user, "state": j["state"],
                             "kind": j["spec"]["kind"], "priority": j["spec"]["priority"],
                             "min_size": j["spec"]["min_size"], "max_size": j["spec"]["max_size"],
                             "elastic": j["spec"]["elastic"], "workers": self.book.count(name, False),
                             "submitted_at": j["submitted_at"], "started_at": j["started_at"],
                             "finished_at": j["finished_at"],
                             "first_grant_at": j["info"].get("first_grant_at"),
                             "first_step_at": j["info"].get("first_step_at"),
                             "report": self.reports.get(name) if mine else None,
                             "reason": j["info"].get("reason") if mine else None,
                             "restarts": j["info"].get("restarts", 0),
                             "max_restarts": j["spec"].get("max_restarts", 0),
                             "restart_in_s": max(0.0, float(j["info"].get("not_before", 0.0)) - now),
                             "last_failure": j["info"].get("last_failure") if mine else None,
                             **(self._service_view(name, now, mine) if j["spec"]["kind"] == "inference" else {})})
            usage = self.slots.usage_all() if self.slots is not None else {}
            # Devices of nodes away with a Ray cluster's head: not grantable, their leases kept.
            away = [{"id": d.id, "type": d.type, "node": d.node, "enforcement": d.enforcement,
                     "free": self.book.free_share(d.id)} for d in self.away.values()]
            lost = self.ray_head_lost_at
            return {"pool": self.name, "mode": self.mode, "draining": self.draining, "time": now,
                    "devices": devices, "leases": leases, "jobs": jobs, "counters": dict(self.counters),
                    "cpu_usage_s": usage, "away": away, "ray_head_lost_s": None if lost is None else now - lost}

    def _service_view(self, name: str, now: float, mine: bool) -> dict[str, Any]:
        """An inference service's autoscaler as an operator needs to see it: the replicas it wants
        (everyone sees sizes) and, for its owner and operators, the load, queue and age of the
        report it acts on (None: no report yet)."""
        report = self.reports.get(name) or {}
        at = self._load_at.get(name)
        return {"replicas_wanted": self.replicas_wanted.get(name),
                "load_rps": report.get("rate_rps") if mine else None,
                "queue": report.get("queue") if mine else None,
                "report_age_s": (now - at if at is not None else None) if mine else None,
                "report_stale": name in self._stale if mine else None}  # silent too long: counted as no load

    def metrics(self, caller: Caller | None = None) -> str:
        """Prometheus text exposition (format 0.0.4); a service's load and queue only for its owner
        and operators, as in the status."""
        return prometheus(self.status(caller))
