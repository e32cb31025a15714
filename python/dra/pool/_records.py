"""What the pool keeps of its jobs, and what it forgets: a name used again replaces its ended
job's record (``_forget``), and ended jobs past the pool's bounds are forgotten, oldest first
(``_retain``): a user's beyond ``--max-kept-per-user`` (64 MB of specs a user at most), everyone's
beyond ``--max-ended``. Without the second, a pool's records only grew: its scheduling tick and
every status call went through all of them (an outside long-run review: 20,000 ended jobs, 11 % of
a core idle, 268 ms a status), and a user at the limit was refused for good."""

from __future__ import annotations

from typing import Any

from dra.pool import _quota

ENDED = ("finished", "failed", "cancelled")


class JobRecords:
    """A mixin of PoolService (its ``jobs``, ``_requests``, tables by job name, state database,
    logs and events)."""

    def _per_job(self) -> tuple[dict[str, Any], ...]:
        """Every table the pool keeps by job name besides the job's record (``jobs``, ``_requests``,
        replaced by a new job of the name): what reusing a name forgets. A new one belongs here."""
        return (self.launchers, self.reports, self.autoscalers, self.replicas_wanted, self._planned,
                self._resized_at, self._recent_peak, self._curves, self._speedups, self._load_at, self._stale)

    def _earlier_logs(self, name: str) -> list[Any]:
        """The launcher logs of earlier jobs of this name (``<name>.launcher.log.<order>``)."""
        prefix = f"{name}.launcher.log."
        return [p for p in self.logs_dir.glob(f"{name}.launcher.log.*") if p.name[len(prefix):].isdigit()]

    def _forget(self, name: str, old: dict[str, Any]) -> None:
        """A name used again once its job ended: the old job's record is replaced and everything
        kept about it (its report, loss curve, autoscaler, plans) forgotten; its events stay in
        events.jsonl, its launcher log is kept as ``<name>.launcher.log.<order>``, and a finished
        job's completion stays in its class's remaining-work history (one user's jobs of a class
        share it; a job's class is its ``job_class``, else its name)."""
        log = self.logs_dir / f"{name}.launcher.log"
        for earlier in self._earlier_logs(name):
            earlier.unlink(missing_ok=True)  # one previous job's log is kept (each reuse left one more)
        if log.exists():
            log.rename(self.logs_dir / f"{name}.launcher.log.{old['order']}")
        for d in self._per_job():
            d.pop(name, None)
        self._event({"event": "reuse", "job": name, "previous_order": old["order"], "previous_state": old["state"]})

    def _retain(self, new: str, owned: list[dict[str, Any]] | None) -> None:
        """Before ``new`` is recorded: the oldest ended of ``owned`` (its owner's jobs; None for an
        operator, not bounded per user) past ``kept``, then everyone's past ``ended``, are
        forgotten. A job still holding leases or a launcher is kept whatever its state (its end is
        not over)."""
        gone = [] if owned is None else _quota.to_forget(owned, ENDED, self.user_limits.kept)
        gone += _quota.to_forget(list(self.jobs.values()), ENDED, self.user_limits.ended, skip=set(gone), adding=False)
        for name in gone:
            if name != new and self.book.count(name) == 0 and name not in self.launchers:
                self._drop(name)

    def _let_go(self, name: str, why: str, removed: list[int]) -> None:
        """A job's run is over (it ended, or failed and restarts): its leases go back, and its
        launcher, if still alive (it reported the end and is on its way out), is reaped by the loop."""
        for l in self.book.of_job(name):
            self._release(l.id, why, removed)
        ref = self.launchers.pop(name, None)
        if ref is not None and ref.popen is not None and ref.popen.poll() is None:
            self._exiting.append(ref.popen)

    def _requeue(self, name: str, reason: str, removed: list[int], now: float) -> None:
        """A failed job with restarts left waits to start again from its command, as a new world
        (its script resumes from its own checkpoint, if it keeps one): its leases go back, its
        launcher is let go, what the pool kept about its run is forgotten (its report, plans,
        curves; each attempt has its own ``launch``, ``ready``, ``start`` events), and it keeps its
        place in the queue, not launched nor granted anything for ``restart_backoff_s`` doubling
        with each restart (at most 300 s). Event ``requeue``; its workers see the attempt in
        ``DRA_RESTART_COUNT``."""
        j = self.jobs[name]
        self._let_go(name, "job restarts", removed)
        for d in self._per_job():
            d.pop(name, None)
        restarts = int(j["info"].get("restarts", 0)) + 1
        # As Kubernetes backs a failing pod off: a job that fails at once (a missing directory, a
        # device its last attempt still holds) would spend every restart within seconds.
        delay = min(300.0, self.restart_backoff_s * 2 ** (restarts - 1))
        old = (j["info"].get("launcher") or {}).get("id")  # told to stop if it calls again
        j["info"] = {"owner": j["info"]["owner"], "restarts": restarts, "last_failure": reason,
                     "retired_launcher": old, "not_before": now + delay}
        j["state"], j["started_at"] = "waiting", None
        self._save_job(name)
        self._event({"event": "requeue", "job": name, "restart": restarts, "of": int(j["spec"]["max_restarts"]),
                     "delay_s": delay, "reason": reason})

    def _drop(self, name: str) -> None:
        old = self.jobs.pop(name)
        self._requests.pop(name, None)
        for d in self._per_job():
            d.pop(name, None)
        self.db.delete_job(name)
        (self.logs_dir / f"{name}.launcher.log").unlink(missing_ok=True)
        for earlier in self._earlier_logs(name):
            earlier.unlink(missing_ok=True)
        self._event({"event": "forget", "job": name, "state": old["state"], "order": old["order"]})
