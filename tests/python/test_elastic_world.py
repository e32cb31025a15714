"""Real multi-process elastic jobs: a c10d TCPStore process, Gloo worlds, kill -9.

Each test launches tests/python/elastic_worker.py processes on loopback and asserts on what they
logged: world events, parameter digests after every world change, every committed step's samples.
"""

from __future__ import annotations

import re
import time

import pytest
from _elastic_harness import Job, check_exactly_once

N, EPOCHS = 192, 2
pytestmark = pytest.mark.timeout(300)


def _digests_after_changes(job: Job) -> None:
    """Every world change ended with bit-identical parameters on all members (hash all-reduce)."""
    events = [e for e in job.events() if e["event"] in ("start", "resize", "fault")]
    assert events and all(e["params_identical"] is True for e in events), events
    by_epoch: dict[int, set] = {}
    for rec in job.records("world"):
        by_epoch.setdefault(rec["epoch"], set()).add(rec["digest"])
    assert all(len(d) == 1 for d in by_epoch.values()), by_epoch


def _final_members_identical(job: Job, expect_uids: set[int]) -> None:
    finals = {r["uid"]: r for r in job.records("final")}
    members = {u for u, r in finals.items() if r["step"] == max(f["step"] for f in finals.values())}
    assert expect_uids <= members
    assert len({finals[u]["digest"] for u in expect_uids}) == 1


def test_grow_shrink_grow_with_standby_readmission(tmp_path):
    # chunk_mb ~1 KB: the handoff cuts tensors across chunks and packs small ones together.
    job = Job(tmp_path, 4, start_size=2, schedule={"4": 4, "8": 2, "12": 3}, epochs=EPOCHS, dataset_size=N,
              chunk_mb=0.001)
    job.start_all()
    codes = job.wait(240)
    assert codes == {"r0": 0, "r1": 0, "r2": 0, "r3": 0}, [job.output(n)[-2000:] for n in codes]
    sizes = [(e["event"], e["before"], e["after"]) for e in job.events()]
    assert sizes == [("start", 0, 2), ("resize", 2, 4), ("resize", 4, 2), ("resize", 2, 3)]
    # Decided at steps 4, 8, 12; flagged in the next step's all-reduce and applied after it. The
    # grow at 12 waits for process 2 to stand by again (retried at every step until it does).
    steps = [(e["step"], e.get("decided_step")) for e in job.events()[1:]]
    assert steps[:2] == [(5, 4), (9, 8)] and steps[2][1] >= 12 and steps[2][0] == steps[2][1] + 1, steps
    ev = job.events()
    # Both leavers stand by again; the grow takes the one that registered first (2 or 3: which one
    # is a race between the two processes, and the test asserted 2 and failed 1 run in 3-5 here).
    assert ev[1]["joined"] == [2, 3] and ev[2]["left"] == [2, 3] and ev[3]["joined"] in ([2], [3])
    back, other = (2, 3) if ev[3]["joined"] == [2] else (3, 2)
    assert set(ev[1]["cost_s"]) == {"agree", "rebuild", "state_transfer", "reshard"}
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    # One stood by after step 8 and was admitted again at step 12; the other stood by to the end.
    assert any(r["uid"] == back and r["epoch"] == 3 for r in job.records("world"))
    finals = {r["uid"]: r for r in job.records("final")}
    assert finals[other]["role"] == "finished" and finals[other]["step"] == 9
    _final_members_identical(job, {0, 1, back})


def test_release_and_exit_gives_devices_back(tmp_path):
    job = Job(tmp_path, 3, start_size=3, schedule={"5": 1}, release="exit", epochs=EPOCHS, dataset_size=N)
    job.start_all()
    codes = job.wait(240)
    assert codes == {"r0": 0, "r1": 0, "r2": 0}
    assert "exiting to give the device back" in job.output("r1") + job.output("r2")
    finals = {r["uid"] for r in job.records("final")}
    assert finals == {0}, "released processes exit inside dra.step, before the end of training"
    assert [e["after"] for e in job.events()] == [3, 1]
    check_exactly_once(job, N, EPOCHS)


def test_late_joiner_admitted_and_mismatched_joiner_rejected(tmp_path):
    job = Job(tmp_path, 2, start_size=2, max_size=4, schedule={"3": 3, "6": 4}, wait_candidates=2, epochs=EPOCHS,
              dataset_size=N)
    job.start("late", DRA_JOIN=1)
    job.start("bad", DRA_JOIN=1, DRA_TEST_MISMATCH=1)
    job.start_all()
    codes = job.wait(240)
    assert codes["r0"] == 0 and codes["r1"] == 0 and codes["late"] == 0
    assert codes["bad"] != 0
    assert "admission refused" in job.output("bad") and "model mismatch" in job.output("bad")
    kinds = [(e["event"], e.get("after")) for e in job.events()]
    assert ("rejected", None) in kinds
    resizes = [e for e in job.events() if e["event"] == "resize"]
    # The bad joiner never entered a world: at step 6 no admissible candidate was left, so the
    # scheduled grow to 4 held.
    assert [(e["before"], e["after"]) for e in resizes] == [(2, 3)]
    assert resizes[0]["joined"][0] >= 2  # a late uid
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)


@pytest.mark.parametrize(
    "kills",
    [
        # (uid, step, point): before the forward, between forward and backward (the gradient
        # all-reduce then fails for the others), after the all-reduce but before the optimizer
        # step, after dra.step.
        [(3, 3, "forward"), (2, 9, "optimizer"), (1, 15, "after_step")],
        [(0, 5, "backward")],  # the leader itself (the store lives in its own process)
    ],
    ids=["three_points", "leader"],
)
def test_crash_mid_step_survivors_shrink_and_redo(tmp_path, kills):
    job = Job(tmp_path, 4, start_size=4, epochs=EPOCHS, dataset_size=N, fault_timeout_s=1.5)
    for uid, step, point in kills:
        job.cfg.setdefault("kills", []).append({"uid": uid, "step": step, "point": point})
    job.cfg["kill"] = None
    job.start_all()
    codes = job.wait(240)
    dead = {f"r{u}" for u, _, _ in kills}
    assert all(codes[n] == -9 for n in dead), codes
    assert all(codes[n] == 0 for n in codes if n not in dead), [job.output(n)[-3000:] for n in codes]
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert [f["left"] for f in faults] == [[u] for u, _, _ in kills]
    assert all(f["reason"].startswith("peer failure") for f in faults)
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    survivors = {0, 1, 2, 3} - {u for u, _, _ in kills}
    _final_members_identical(job, survivors)


def test_a_dead_member_is_known_by_its_stopped_heartbeat_before_the_window_ends(tmp_path):
    # fault_timeout_s=20: the survivors would wait 21 s for a member that never checks in; its
    # heartbeat stands still, so they take it for dead after half the fault timeout (10 s).
    job = Job(tmp_path, 3, start_size=3, epochs=1, dataset_size=N, fault_timeout_s=20.0,
              kill={"uid": 2, "step": 3, "point": "backward"})
    job.start_all()
    codes = job.wait(240)
    assert codes["r2"] == -9 and codes["r0"] == codes["r1"] == 0, [job.output(n)[-2000:] for n in codes]
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert len(faults) == 1 and faults[0]["left"] == [2], faults
    # Stale after 10 s, not the 21 s window. The bounds tell the two apart and leave a loaded host
    # room on both sides (were 9-16 s): the leader's agree counts from its own start of recovery, and
    # ends when the survivor that started first (and saw the beat stand still 10 s) decides.
    assert 5.0 < faults[0]["cost_s"]["agree"] < 20.0, faults[0]
    check_exactly_once(job, N, 1)
    _final_members_identical(job, {0, 1})


def test_crash_during_resize(tmp_path):
    # Process 1 dies while the world is being rebuilt to admit 2 and 3.
    job = Job(tmp_path, 4, start_size=2, schedule={"4": 4}, epochs=EPOCHS, dataset_size=N, fault_timeout_s=1.5,
              kill={"uid": 1, "epoch": 1, "point": "rebuild"})
    job.start_all()
    codes = job.wait(240)
    assert codes["r1"] == -9 and codes["r0"] == codes["r2"] == codes["r3"] == 0, codes
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert len(faults) == 1 and faults[0]["left"] == [1] and faults[0]["after"] == 3
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    _final_members_identical(job, {0, 2, 3})


def test_leader_dying_right_after_deciding_a_grow_keeps_the_waiting_joiner(tmp_path):
    # The leader decides a grow 2 -> 3 after 4 steps and dies before anyone applied it. The
    # survivor follows the published decision, and the joiner that still waits for its admission
    # is admitted into the recovered world: one fault event, only the dead in `left`, size 2 kept.
    job = Job(tmp_path, 3, start_size=2, schedule={"4": 3}, epochs=EPOCHS, dataset_size=N, fault_timeout_s=1.5,
              kill={"uid": 0, "step": 4, "point": "after_step"})
    job.start_all()
    codes = job.wait(240)
    assert codes["r0"] == -9 and codes["r1"] == 0 and codes["r2"] == 0, [job.output(n)[-2000:] for n in codes]
    changes = [(e["event"], e["before"], e["after"], e["left"], e["joined"]) for e in job.events() if e["event"] != "start"]
    assert changes == [("fault", 2, 2, [0], [2])], changes
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    _final_members_identical(job, {1, 2})


def test_hung_peer_is_treated_as_dead(tmp_path):
    job = Job(tmp_path, 3, start_size=3, epochs=1, dataset_size=N, fault_timeout_s=1.5,
              hang={"uid": 2, "step": 4, "point": "backward"})
    job.start_all()
    codes = job.wait(240, hung=("r2",))  # the hung process is killed by the harness at the end
    assert codes["r0"] == 0 and codes["r1"] == 0
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert len(faults) == 1 and faults[0]["left"] == [2]
    assert "all_reduce" in faults[0]["reason"]
    check_exactly_once(job, N, 1)


def test_store_host_going_away_is_a_clear_error_not_a_hang(tmp_path):
    job = Job(tmp_path, 3, start_size=2, epochs=1, dataset_size=N, kill_store={"uid": 0, "step": 4, "point": "after_step"})
    job.cfg["store_pid"] = job.store.pid
    job.start_all()
    codes = job.wait(240)  # bounded: every store operation has a timeout
    assert job.store.returncode == -9
    # Steps without a resize never touch the store, so the world trains to the end (the
    # leader's end-of-job notice is a fire-and-forget set); the standby process, which polls the
    # store for its admission, fails with an error naming the store instead of waiting forever.
    assert codes["r0"] == 0 and codes["r1"] == 0 and codes["r2"] != 0, codes
    text = job.output("r2")
    assert f"the store at 127.0.0.1:{job.port} failed" in text, text[-2000:]
    finals = {r["uid"]: r for r in job.records("final")}
    assert finals[0]["step"] == finals[1]["step"] == N // 16 and finals[0]["digest"] == finals[1]["digest"]


def test_store_dying_mid_training_leaves_the_end_of_training_and_the_code_after_it_intact(tmp_path):
    # The dedicated store dies after step 2. The leader keeps touching it: a scheduled shrink is
    # due at step 6 (the decision reads candidates and would publish it), and the outside limit,
    # candidates and report are read and written once a second while the world trains on for
    # about 2.5 s. Training completes, the end of the job (its 'done' key) cannot be announced, and
    # yet ctl.epochs() ends normally and rank 0's code after the loop (its final record: a final
    # checkpoint in a real job) runs; every process exits 0.
    job = Job(tmp_path, 2, start_size=2, epochs=1, dataset_size=N, schedule={"6": 1}, step_sleep_s=0.25,
              kill_store={"uid": 0, "step": 2, "point": "after_step"})
    job.cfg["store_pid"] = job.store.pid
    job.start_all()
    codes = job.wait(240)
    assert job.store.returncode == -9
    assert codes == {"r0": 0, "r1": 0}, [job.output(n)[-2000:] for n in codes]
    leader = job.output("r0")
    # A decision touched the dead store (the scheduled one at step 6, or an earlier look outside):
    # said once for the whole streak (issue 23: it used to be said at every step).
    skipped = re.findall(r"decision at step (\d+) skipped", leader)
    assert len(skipped) == 1 and 2 <= int(skipped[0]) <= 6, leader[-3000:]
    assert "the job's end could not be announced" in leader, leader[-3000:]
    finals = {r["uid"]: r for r in job.records("final")}
    assert sorted(finals) == [0, 1] and finals[0]["step"] == finals[1]["step"] == N // 16
    assert finals[0]["digest"] == finals[1]["digest"]
    check_exactly_once(job, N, 1)


def test_store_dying_between_a_decision_and_its_reading_skips_the_decision_on_every_member(tmp_path):
    # Issue 23's rerun lost 4 kill_store jobs in 1,000 trials: the leader published a decision
    # (dec/0), the store died before the members read it, and every member failed on 'dec/0'. Here
    # the store dies right after the step whose boundary decided the scheduled shrink: the members
    # learn of the decision from the next reduction, cannot read it, and every member (the leader
    # too) skips it together; the world trains on at its size to the end.
    job = Job(tmp_path, 2, start_size=2, epochs=1, dataset_size=N, schedule={"6": 1}, step_sleep_s=0.05,
              kill_store={"uid": 0, "step": 6, "point": "after_step"})
    job.cfg["store_pid"] = job.store.pid
    job.start_all()
    codes = job.wait(240)
    assert job.store.returncode == -9
    said = {n: [line for line in job.output(n).splitlines() if "[dra]" in line or "Error" in line] for n in codes}
    assert codes == {"r0": 0, "r1": 0}, said
    for name in ("r0", "r1"):
        assert "skipped on every member" in job.output(name), said
    finals = {r["uid"]: r for r in job.records("final")}
    assert sorted(finals) == [0, 1] and finals[0]["step"] == finals[1]["step"] == N // 16
    assert finals[0]["digest"] == finals[1]["digest"]
    check_exactly_once(job, N, 1)


@pytest.mark.parametrize("case", ["done", "done-and-cands", "stood-by-member", "never-seen-candidate"])
def test_a_standby_learns_the_end_though_another_client_writes_over_done(tmp_path, case):
    # Issue 23 (trials of outside store writers hung): a standby learns the job's end from the
    # "done" key. Another client that wrote over it right after the leader set it left the standby
    # waiting for an admission forever. The leader now writes "done" again while a candidate still
    # waits. Here a writer overwrites it every 20 ms from the moment it appears, and:
    # - done-and-cands: the candidates' list too, from then on (a rerun of the campaign hung so:
    #   the list read as empty, the leader saw nobody waiting and left at once);
    # - stood-by-member: the list reads as empty from the start (a valid value: nothing warned), and
    #   the standby is a member a shrink stood by: the leader looks for its former members too;
    # - never-seen-candidate: the list is garbage from the start, so the leader never sees the
    #   candidate; having read a foreign value, it keeps "done" for 1.5 s, longer than a candidate
    #   takes to register again (the third rerun hung so on 380:store_fuzz:cpp).
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    if case == "stood-by-member":
        job = Job(tmp_path, 3, start_size=3, max_size=3, schedule={"4": 2}, epochs=1, dataset_size=N,
                  fault_timeout_s=2.0)
    else:
        job = Job(tmp_path, 3, start_size=2, max_size=2, epochs=1, dataset_size=N, fault_timeout_s=2.0)
    early_cands = {"stood-by-member": "", "never-seen-candidate": "garbage"}.get(case)
    store = TCPStore("127.0.0.1", job.port, is_master=False, timeout=timedelta(seconds=10))
    stop, overwrites = threading.Event(), []

    def writer():
        try:
            while not stop.is_set() and not store.check(["dra/t/0/done"]):
                if early_cands is not None:
                    store.set("dra/t/0/cands", early_cands)
                time.sleep(0.005)
            while not stop.is_set():
                if case != "done":
                    store.set("dra/t/0/cands", early_cands if early_cands is not None else "garbage")
                store.set("dra/t/0/done", "garbage")
                overwrites.append(time.monotonic())
                time.sleep(0.02)
        except Exception:  # noqa: BLE001 - job.wait() closes the store once every process exited
            return

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    job.start_all()
    try:
        codes = job.wait(120)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert codes == {"r0": 0, "r1": 0, "r2": 0}, [job.output(n)[-2000:] for n in codes]
    assert overwrites, "the writer never saw the job's end"
    finals = {r["uid"]: r for r in job.records("final")}
    assert sorted(finals) == [0, 1, 2] and finals[2]["role"] != "member"
