"""A step's reduction that finished on some members and failed on another (a time-out on its last
receive: the others already had every contribution) is committed once, by the whole world.

Before, the recovery took rank 0's state: where rank 0 was a member that had applied the step, the
one that failed took it and reported nothing for its batch; where rank 0 had failed, the others'
update was undone and the step redone with the same samples, which the members that had finished
first then reported committed twice (seen in a fresh clone's test: 64 samples counted twice).
The failure is injected at the end of the reduction on one process (the "reduced" phase hook
raises), the moment a Gloo time-out on the last receive strikes; everything after it is real: the
store's agreement, the state handed over by the member furthest on, the loop going on.
"""

from __future__ import annotations

import collections

import pytest
from _elastic_harness import Job, check_exactly_once

N, EPOCHS = 192, 2


def _each_step_committed_in_one_world(job: Job) -> None:
    """Every (data epoch, step) is reported committed from one world epoch only, by ranks whose
    shares are disjoint and together make the step's global batch: no process saw it twice."""
    worlds: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    shares: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    batch: dict[tuple[int, int], list[int]] = {}
    for rec in job.records("commit"):
        key = (rec["data_epoch"], rec["step"])
        worlds[key].add(rec["epoch"])
        shares[key] += rec["share"]
        batch[key] = rec["batch"]
    twice = {k: sorted(v) for k, v in worlds.items() if len(v) > 1}
    assert not twice, f"steps reported committed in two world epochs (redone after being committed): {twice}"
    for key, ids in shares.items():
        assert sorted(ids) == sorted(batch[key]), f"step {key}: the ranks' reports do not make its batch once"


@pytest.mark.parametrize("uid", [0, 2], ids=["leader_fails", "member_fails"])
def test_a_reduction_that_failed_on_one_member_after_the_others_finished_commits_once(tmp_path, uid):
    job = Job(tmp_path, 3, start_size=3, epochs=EPOCHS, dataset_size=N, fault_timeout_s=2.0,
              fail={"uid": uid, "step": 5, "point": "reduced"})
    job.start_all()
    codes = job.wait(240)
    assert all(c == 0 for c in codes.values()), [job.output(n)[-3000:] for n in codes]
    faults = [e for e in job.events() if e["event"] == "fault"]
    assert len(faults) == 1 and faults[0]["left"] == [] and faults[0]["after"] == 3, faults
    # The world's record of the step count: the fault's event is at step 6 (step 5 kept), not 5.
    assert faults[0]["step"] == 6, faults[0]
    _each_step_committed_in_one_world(job)
    check_exactly_once(job, N, EPOCHS)
    finals = [r for r in job.records("final")]
    assert len(finals) == 3 and len({r["digest"] for r in finals}) == 1, finals
    assert {r["step"] for r in finals} == {EPOCHS * N // 16}, finals
    out = job.output(f"r{uid}")
    assert "injected failure at reduced of step 5" in out, out[-3000:]
    assert f"process {uid}: step 5's reduction failed here" in out and "the step is not redone" in out, out[-3000:]
