"""The cap a job's own policy puts on its speedup curve in the pool (an outside review of non-root
users' elastic jobs): a job the pool started on one slot, whose convergence policy wanted the size it
ran at and had never been measured larger, kept one slot for 100 s while two sat idle. The policy's
word caps the curve once it can know (it gave devices back, or it ran larger), not before."""

from __future__ import annotations

from dra.pool._spec import capped

RAW = [0.0, 1.0, 1.8, 2.5]


def test_a_policy_that_never_ran_larger_does_not_cap_the_job_at_its_size() -> None:
    started_small = {"policy": "convergence", "desired_size": 1, "rates": {"1": 9.93}}
    assert capped(RAW, started_small, current=1) == RAW


def test_a_policy_that_gave_devices_back_keeps_its_cap() -> None:
    gave_back = {"policy": "convergence", "desired_size": 1, "rates": {"1": 9.9, "2": 17.0}}
    assert capped(RAW, gave_back, current=2) == [0.0, 1.0, 1.0, 1.0]  # wants less than it holds
    assert capped(RAW, gave_back, current=1) == [0.0, 1.0, 1.0, 1.0]  # after the shrink: measured at 2 before
    assert capped(RAW, {"policy": "none", "desired_size": 1, "rates": {"1": 9.9, "2": 17.0}}, current=1) == RAW
