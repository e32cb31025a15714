"""A worker whose lease the pool took back (``taken``) is never picked to leave in another lease's
place. When the pool asks back the leader's lease, the launcher sends another member, the newest;
a taken worker is on its way out already (fenced: stopped; or its lease gone without a word), and
picking it would leave the job one member larger than the pool holds. A real launcher with its
real c10d store and real worker processes; the pool's answers are given to it directly, in the
shape ``sync`` returns them, so the one case is reached every time (on a live pool it needs a
resize to land in the second between a fence and the fenced worker's exit)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _launch_harness import running

from dra.pool.launcher import Launcher


def _answer(leases: list[int], release: list[int] = (), fence: dict[str, str] | None = None) -> dict:
    return {"leases": [{"id": i, "device": f"d{i}", "state": "active", "env": {}} for i in leases],
            "release": list(release), "fence": fence or {}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "gone_unsaid"])
def test_a_taken_worker_is_never_sent_to_leave_for_the_leaders_lease(tmp_path: Path, fenced: bool) -> None:
    launcher = Launcher([sys.executable, "-c", "import time; time.sleep(120)"], job="j", zygote=False,
                        log_dir=tmp_path)
    try:
        # Leader on lease 2, then lease 3, then lease 1: the taken worker (lease 1) is the newest.
        for rank, lid in enumerate((2, 3, 1)):
            launcher._start({"id": lid, "device": f"d{lid}", "env": {}}, rank, 3, join=False)
        launcher.started_world = True
        w = launcher.workers
        report = {"members": [w[2]["uid"], w[3]["uid"], w[1]["uid"]]}
        # The pool takes lease 1 back: fenced (its node lost), or gone without a fence.
        launcher._fence(_answer([2, 3], fence={"1": "node lost (a test)"} if fenced else None), report)
        assert w[1]["taken"] and (w[1]["fenced"] == "node lost (a test)") == fenced
        assert (w[1]["uid"] in launcher.leave_uids) == fenced  # a fenced non-leader is named in leave
        # Then it asks for the leader's lease (a shrink 2 -> 1): the leader stays, lease 3's worker goes.
        launcher._give_back(_answer([2, 3], release=[2]), report)
        assert launcher.leaving == {2: 3}, launcher.leaving
        assert w[3]["asked"] is not None and w[1]["asked"] is None
        assert w[3]["uid"] in launcher.leave_uids and w[2]["uid"] not in launcher.leave_uids
        # The taken worker still counts until it exited: the world is told 3 (2 leases + the taken one).
        assert (launcher.capacity["min_size"], launcher.capacity["max_size"]) == (3, 3), launcher.capacity
        assert running(w[2]["pid"]) and running(w[3]["pid"])  # a training member leaves on its own, unsignalled
    finally:
        for x in launcher.workers.values():
            launcher.spawner.kill(x["wid"], 9)
        for proc in launcher.spawner.procs.values():
            proc.wait(timeout=30)
        launcher.spawner.close()
