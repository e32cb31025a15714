"""A fault event's ``left`` names only the processes that died, never a live member still on its way.

The fault campaign's trial ``8:kill_in_resize:py`` (the leader killed in the reshard of a shrink)
failed about once in ten runs on a loaded host: "fault event at step 10 lists live processes [2]
among those who left". The leader had finished its side of the new world's Gloo rendezvous and
died; member 1 failed at once and began the recovery, while member 2 was still connecting: Gloo
retries a connection that a vanished peer refuses for 5 x the rendezvous timeout (20 s for
fault_timeout_s = 2), and the survivors waited for a member that beats at most 3 x fault_timeout_s
+ 1 s (7 s). They left member 2 out and named it among those who left; it stood by.

A member that beats and is still inside the rebuild of a world is on its way to the recovery: the
survivors wait for it. Here member 2 stalls in its rebuild of the shrink's world longer than the
survivors' usual wait (the deterministic stand-in for the rendezvous that overran): the others'
rendezvous times out, they recover, and the world they agree on still holds member 2. The shrink's
leaver (3) stands by and is no fault's victim either, and healing (which grows a world back to its
size before a fault) does not re-admit it: the shrink was decided, so 3 is the size to heal to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_bench._faults.check import judge, load_events
from dra_bench._faults.spec import FaultSpec
from dra_bench._faults.trial import Fault, JobSpec, LocalLauncher, StoreProcess, TrialSpec, run_trial

pytestmark = pytest.mark.timeout(300)

FAULT_TIMEOUT_S = 1.0
# The survivors' wait for a member that beats: window (fault_timeout_s + 1 s) + late grace
# (2 x fault_timeout_s), from when their own rendezvous timed out (2 x fault_timeout_s).
USUAL_WAIT_S = 2 * FAULT_TIMEOUT_S + (FAULT_TIMEOUT_S + 1.0) + 2 * FAULT_TIMEOUT_S


@pytest.fixture(scope="module")
def store():
    s = StoreProcess()
    yield s
    s.close()


def test_a_member_held_in_its_rebuild_past_the_late_grace_is_waited_for_not_named_among_those_who_left(
    tmp_path: Path, store: StoreProcess
):
    job = JobSpec(language="py", nproc=4, start_size=4, max_size=4, schedule={6: 3}, fault_timeout_s=FAULT_TIMEOUT_S)
    stall = USUAL_WAIT_S + 1.5
    fault = Fault(
        "slow_rebuild",
        f"r2 stalls {stall:.1f} s in its rebuild of the shrink's world (shrink after step 6)",
        specs={"r2": [FaultSpec("sleep", "rebuild", 1, stall)]},
    )
    spec = TrialSpec(81, "slow_rebuild", job, fault)
    run = run_trial(spec, tmp_path / "trial", LocalLauncher(None), store, 150)
    v = judge(run)
    outputs = {p.stem[4:]: p.read_text(errors="replace") for p in run.out.glob("out-*.txt")}
    assert v.survived, (v.problems, outputs.get("r2", "")[-800:])
    faults = [e for e in load_events(run.out) if e["event"] == "fault"]
    assert faults, "the others' rendezvous timed out: a recovery was expected"
    for ev in faults:
        assert ev["left"] == [], ev  # nobody died: not member 2, not the shrink's leaver 3
    assert 2 in faults[0]["members"], faults[0]
    assert "left out" not in outputs["r2"], outputs["r2"][-800:]
    assert run.codes == {"r0": 0, "r1": 0, "r2": 0, "r3": 0}, run.codes
    # The fault interrupted a decided shrink: healing grows back to the shrink's 3, not to the 4
    # before it (it re-admitted the leaver the shrink had released, undoing the decision).
    events = load_events(run.out)
    after_fault = [e for e in events if e.get("step", -1) >= faults[0]["step"] and "after" in e]
    assert all(e["after"] <= 3 for e in after_fault), after_fault
    assert not [e for e in events if e["event"] == "resize" and "heal" in e.get("reason", "")], events
