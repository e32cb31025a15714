"""The elastic test matrix of test_elastic_world.py, through the NCCL backend on the emulated NCCL
library (DRA_NCCL_EMULATION=1): real processes, a real c10d store, kill -9, and dra's NCCL backend
(rebuild routine with shrink/grow/abortive shrink, grouped send/recv for the state handoff, the
watchdog that revokes a hung collective) running against NCCL's API over shared memory.

This is a proof of the protocol against NCCL's API, not of NCCL: the emulated library takes CPU
tensors and completes every call in the calling thread (docs/design/nccl.md). What it does prove:
the same worlds form, resize, lose members and recover as on Gloo, with the same exactly-once data
and bit-identical state, on the asynchronous-communicator path (decisions read two steps late).
"""

from __future__ import annotations

import pytest
from _elastic_harness import Job, check_exactly_once
from test_elastic_world import _digests_after_changes, _final_members_identical

from dra import _core

N, EPOCHS = 192, 2
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not getattr(_core.comm, "nccl_compiled", False), reason="dra built without the NCCL backend"),
]


@pytest.fixture(autouse=True)
def _emulated_nccl(monkeypatch, tmp_path):
    monkeypatch.setenv("DRA_NCCL_EMULATION", "1")
    # The communicators' shared segments in a folder of the test's own (checked empty afterwards).
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("DRA_NCCL_EMULATION_DIR", str(shm))
    yield
    assert not list(shm.iterdir()), "a communicator's segment was left behind"


def _nccl_logs(job: Job, n: int) -> str:
    return "".join(job.output(f"r{r}") for r in range(n))


def test_grow_shrink_grow_with_standby_readmission_on_nccl(tmp_path):
    job = Job(
        tmp_path,
        4,
        start_size=2,
        schedule={"4": 4, "8": 2, "12": 3},
        epochs=EPOCHS,
        dataset_size=N,
        chunk_mb=0.001,
        backend="nccl",
        release="standby",
        wait_candidates_at={"12": 1},
    )
    job.start_all()
    codes = job.wait(240)
    assert codes == {"r0": 0, "r1": 0, "r2": 0, "r3": 0}, [job.output(n)[-2000:] for n in codes]
    sizes = [(e["event"], e["step"], e["before"], e["after"]) for e in job.events()]
    # Decided at steps 4, 8, 12; the flag rides from the next reduction on and is read one step
    # later on an asynchronous communicator: applied two steps after the decision.
    assert sizes == [("start", 0, 0, 2), ("resize", 6, 2, 4), ("resize", 10, 4, 2), ("resize", 14, 2, 3)]
    assert [e.get("decided_step") for e in job.events()[1:]] == [4, 8, 12]
    assert all(e["backend"] == "nccl" for e in job.events())
    logs = _nccl_logs(job, 4)
    # The NCCL fast paths were taken: grow for the admitted, shrink for the survivors.
    assert '"nccl_rebuild_done"' in logs and '"path":"grow"' in logs and '"path":"shrink"' in logs
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    _final_members_identical(job, {0, 1, 2})


def test_late_joiner_admitted_on_nccl(tmp_path):
    job = Job(
        tmp_path,
        2,
        start_size=2,
        max_size=3,
        schedule={"3": 3},
        wait_candidates=1,
        epochs=EPOCHS,
        dataset_size=N,
        backend="nccl",
    )
    job.start("late", DRA_JOIN=1)
    job.start_all()
    codes = job.wait(240)
    assert codes == {"late": 0, "r0": 0, "r1": 0}, [job.output(n)[-2000:] for n in codes]
    resizes = [e for e in job.events() if e["event"] == "resize"]
    assert [(e["before"], e["after"]) for e in resizes] == [(2, 3)] and resizes[0]["joined"][0] >= 10000
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)


def test_crash_mid_step_survivors_shrink_abortively_on_nccl(tmp_path):
    kills = [(3, 3, "forward"), (2, 9, "optimizer"), (0, 15, "backward")]
    job = Job(
        tmp_path,
        4,
        start_size=4,
        epochs=EPOCHS,
        dataset_size=N,
        fault_timeout_s=1.5,
        backend="nccl",
        kills=[{"uid": u, "step": s, "point": p} for u, s, p in kills],
    )
    job.start_all()
    codes = job.wait(240)
    dead = {f"r{u}" for u, _, _ in kills}
    assert all(codes[n] == -9 for n in dead), codes
    assert all(codes[n] == 0 for n in codes if n not in dead), [job.output(n)[-3000:] for n in codes]
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert [f["left"] for f in faults] == [[u] for u, _, _ in kills]
    # A dead peer makes NCCL hang: the watchdog revoked the collective, the survivors shrank abortively.
    assert all("did not complete within 1500 ms" in f["reason"] for f in faults), [f["reason"] for f in faults]
    assert '"path":"shrink","abortive":true' in _nccl_logs(job, 4)
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    _final_members_identical(job, {1})


def test_crash_during_resize_on_nccl(tmp_path):
    job = Job(
        tmp_path,
        4,
        start_size=2,
        schedule={"4": 4},
        epochs=EPOCHS,
        dataset_size=N,
        fault_timeout_s=1.5,
        backend="nccl",
        kill={"uid": 1, "epoch": 1, "point": "rebuild"},
    )
    job.start_all()
    codes = job.wait(240)
    assert codes["r1"] == -9 and codes["r0"] == codes["r2"] == codes["r3"] == 0, [job.output(n)[-2000:] for n in codes]
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert len(faults) == 1 and faults[0]["left"] == [1] and faults[0]["after"] == 3
    _digests_after_changes(job)
    check_exactly_once(job, N, EPOCHS)
    _final_members_identical(job, {0, 2, 3})


def test_hung_peer_is_revoked_by_the_watchdog_on_nccl(tmp_path):
    job = Job(
        tmp_path,
        3,
        start_size=3,
        epochs=1,
        dataset_size=N,
        fault_timeout_s=1.5,
        backend="nccl",
        hang={"uid": 2, "step": 4, "point": "backward"},
    )
    job.start_all()
    codes = job.wait(240, hung=("r2",))
    assert codes["r0"] == 0 and codes["r1"] == 0, [job.output(n)[-2000:] for n in ("r0", "r1")]
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert len(faults) == 1 and faults[0]["left"] == [2]
    assert "all_reduce" in faults[0]["reason"]
    check_exactly_once(job, N, 1)
