"""Gradient codecs inside the elastic controller (option ``compress``), with their state across a
grow, a shrink and a kill -9, and the world's energy in the events and the status line.

Real processes on real Gloo (tests/python/elastic_worker.py, as test_elastic_world.py), checked
on what they logged: bit-identical parameters after every world change, the codec state every
member shares (PowerSGD's warm start and step counters) identical on every member, the rule for
each rank's error feedback (docs/guide/sage.md), exactly-once data, and a loss that still falls.
"""

from __future__ import annotations

import math
import re

import pytest
from _elastic_harness import Job, check_exactly_once

import dra

N, EPOCHS = 192, 2
pytestmark = pytest.mark.timeout(300)


def _codec_records_by_epoch(job: Job) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for rec in job.records("world"):
        out.setdefault(rec["epoch"], []).append(rec)
    return out


# `masked`: RigL masks updated every 3 steps (3, 6, ..., 18) on a cubic ramp to 80 % over the first
# 9 steps (a short job), so masks change before the grow, between the shrink and the crash, and
# after it. Not every 2: a mask-update step sends the dense gradient plus the residual, leaving
# none, and the world changes land after steps 4, 8 and 12, so no residual would be there to keep.
SPARSITY = {"every": 3, "ramp_start": 0, "ramp_steps": 9, "max_sparsity": 0.8, "end_step": 20}
D, HIDDEN = 8, 32  # tests/python/elastic_worker.py's MLP: Linear(8, 32), ReLU, Linear(32, 1)


def _masked_payload(step: int, sparsity: float) -> int:
    """Bytes the `masked` codec hands to the communicator at codec step `step` (one bucket), as
    docs/design/sustainable.md states them: on a mask-update step the dense gradient and the target
    (4 n + 4); otherwise each matrix's active entries (round((1 - s) n), at least one) and the same
    share of each bias."""
    tensors = [(HIDDEN * D, True), (HIDDEN, False), (HIDDEN, True), (1, False)]  # (numel, sparsified)
    if step > 0 and step % SPARSITY["every"] == 0 and step < SPARSITY["end_step"]:
        return 4 * (sum(n for n, _ in tensors) + 1)
    share = [max(1, math.floor((1.0 - sparsity) * n + 0.5)) for n, _ in tensors]  # llround, at least one
    return 4 * sum(k if sparse else min(k, n) for k, (n, sparse) in zip(share, tensors))


@pytest.mark.parametrize("codec", ["powersgd:2", "topk:0.25", "masked"])
def test_codec_state_follows_grow_shrink_and_a_crash(tmp_path, codec):
    # 2 -> 4 (joiners receive the shared codec state) -> 3 (survivors keep theirs) -> a kill -9
    # of process 1 mid-step (the world re-forms with the leader's codec state, residuals cleared).
    # heal=False: the standby the shrink released would otherwise refill the world after the crash
    # whenever the leader looks before the end (timing); test_elastic_heal.py covers healing.
    job = Job(tmp_path, 4, start_size=2, schedule={"4": 4, "8": 3}, epochs=EPOCHS, dataset_size=N, hidden=HIDDEN,
              compress=codec, status_every=5, fault_timeout_s=1.5, heal=False,
              sparsity=SPARSITY if codec == "masked" else None,
              kill={"uid": 1, "step": 13, "point": "backward"})
    job.start_all()
    codes = job.wait(240)
    assert codes["r1"] == -9, codes
    assert all(codes[n] == 0 for n in codes if n != "r1"), [job.output(n)[-3000:] for n in codes]
    events = job.events()
    kinds = [(e["event"], e.get("before"), e.get("after")) for e in events]
    assert kinds[:3] == [("start", 0, 2), ("resize", 2, 4), ("resize", 4, 3)], kinds
    assert ("fault", 3, 2) in kinds, kinds
    changes = [e for e in events if e["event"] in ("start", "resize", "fault")]
    assert all(e["params_identical"] is True for e in changes), changes
    # Bytes at the codec's hand-off to the communicator, in every event after the first steps.
    later = [e for e in events if e["event"] != "start"]
    assert all(e["compress"]["codec"] == codec and e["compress"]["bytes_sent"] > 0 for e in later), later
    assert later[-1]["compress"]["ratio"] > 1.5, later[-1]

    by_epoch = _codec_records_by_epoch(job)
    for epoch, recs in by_epoch.items():
        # After every change the shared part (step counters, warm start) is identical on all members.
        assert len({r["codec"]["shared"] for r in recs}) == 1, (epoch, recs)
        assert len({r["digest"] for r in recs}) == 1, (epoch, recs)
    grow = next(e for e in events if e["event"] == "resize" and e["after"] == 4)
    fault = next(e for e in events if e["event"] == "fault")
    grow_recs = {r["uid"]: r for r in by_epoch[grow["epoch"]]}
    for uid in grow["joined"]:
        assert grow_recs[uid]["codec"]["ef"] == 0.0  # joiners start with no residual
    assert all(grow_recs[u]["codec"]["ef"] > 0.0 for u in (0, 1)), grow_recs  # survivors keep theirs
    shrink = next(e for e in events if e["event"] == "resize" and e["after"] == 3)
    survivors = {r["uid"]: r for r in by_epoch[shrink["epoch"]]}
    assert all(r["codec"]["ef"] > 0.0 for r in survivors.values()), survivors
    assert all(r["codec"]["ef"] == 0.0 for r in by_epoch[fault["epoch"]]), by_epoch[fault["epoch"]]

    check_exactly_once(job, N, EPOCHS)
    finals = {r["uid"]: r for r in job.records("final") if r["role"] == "finished" and r["step"] == N // 16 * EPOCHS}
    members = set(fault["members"])
    assert members <= set(finals), finals
    assert len({finals[u]["digest"] for u in members}) == 1
    assert len({finals[u]["codec"]["shared"] for u in members}) == 1
    if codec == "masked":
        # The masks (in the shared state above) reached 80 %; the pruned weights are exactly zero on
        # every member, with no optimizer state left; masks changed across the world changes.
        for u in members:
            c = finals[u]["codec"]
            assert c["sparsity"] == pytest.approx(0.8, abs=0.01), c
            assert c["zero_fraction"] == pytest.approx(c["sparsity"], abs=0.01), c
            assert c["pruned_state_clean"], c
        sparsities = [r["codec"]["sparsity"] for e in sorted(by_epoch) for r in by_epoch[e]]
        assert sparsities[0] == 0.0 and max(sparsities) > 0.5, sparsities
        # Bytes counted as the design states them, dense update steps included, biases at the same
        # keep fraction: the leader's payload from the re-formed world (step 13, sparsity 0.8 since
        # step 9) to the end, byte for byte; the update steps 15 and 18 send 4 n + 4.
        since = next(r for r in by_epoch[fault["epoch"]] if r["uid"] == 0)
        window = range(since["step"], finals[0]["step"])
        sent = finals[0]["codec"]["sent"] - since["codec"]["sent"]
        dense = finals[0]["codec"]["dense"] - since["codec"]["dense"]
        assert dense == 4 * (D * HIDDEN + 2 * HIDDEN + 1) * len(window), (dense, window)
        assert sent == sum(_masked_payload(s, 0.8) for s in window), (sent, window)
        assert dense / sent > 2.5, (dense, sent)  # with two dense steps in 11; a sparse step alone: 5x
    # Training still converges: the mean loss of the last steps is at most half the first steps'.
    losses: dict[int, list[float]] = {}
    for rec in job.records("commit"):
        losses.setdefault(rec["step"], []).append(rec["loss"])
    steps = sorted(losses)
    first = sum(sum(losses[s]) / len(losses[s]) for s in steps[:3]) / 3
    last = sum(sum(losses[s]) / len(losses[s]) for s in steps[-3:]) / 3
    assert last < 0.5 * first, (first, last)

    # Energy: every process meters itself (this machine: the CPU model, labelled estimated); the
    # world's running total rides with the reductions and grows, and reaches the events and status line.
    totals = [e["energy_job_j"] for e in later]
    assert all(t is not None and t > 0 for t in totals) and totals == sorted(totals), totals
    assert {e["energy_source"] for e in later} == {"estimated"}
    leader_out = job.output("r0")
    assert "J/step (" in leader_out and "fewer bytes" in leader_out, leader_out[-2000:]
    end = re.search(r"\[dra\] job finished at step (\d+) world 2 energy ([0-9.e+-]+) J \(estimated\) " + re.escape(codec)
                    + r": (\d+) bytes sent for (\d+) dense", leader_out)
    assert end and int(end[1]) == N // 16 * EPOCHS and float(end[2]) >= totals[-1], leader_out[-2000:]
    assert int(end[3]) < int(end[4])
    leader_final = finals[0]
    assert leader_final["energy"]["source"] == "estimated" and leader_final["energy"]["job_j"] > 0
    assert leader_final["energy"]["reader"] == "cpu-model"


def test_compress_option_is_validated_with_the_fix():
    assert dra.Options(compress="powersgd:4").compress == "powersgd:4"
    assert dra.Options().compress == ""
    with pytest.raises(ValueError, match=r"compress.*'zip:3' is not a codec.*powersgd:<rank>"):
        dra.Options(compress="zip:3")
    with pytest.raises(ValueError, match=r"compress.*'powersgd:x'.*not a number"):
        dra.Options(compress="powersgd:x")
    assert dra.Options(compress="masked").compress == "masked"
    opts = dra.Options(compress="masked:0.8", sparsity={"every": 50, "ramp_steps": 200})
    assert opts.sparsity["every"] == 50 and opts.sparsity["ramp_steps"] == 200 and opts.sparsity["alpha"] == 0.3
    with pytest.raises(ValueError, match=r"compress.*'masked:1.5'.*max_sparsity"):
        dra.Options(compress="masked:1.5")
    with pytest.raises(ValueError, match=r"sparsity: unknown key 'evry'; valid:.*every"):
        dra.Options(compress="masked", sparsity={"evry": 3})
    with pytest.raises(ValueError, match=r"sparsity.every.*must lie in"):
        dra.Options(compress="masked", sparsity={"every": 0})
    with pytest.raises(ValueError, match=r"compress: expected a string"):
        dra.Options(compress=4)


def test_a_world_of_one_reports_its_energy_and_codec(tmp_path):
    # One process: the codec is never run (nothing to reduce), its energy is still metered.
    job = Job(tmp_path, 1, start_size=1, epochs=1, dataset_size=64, compress="fp16")
    job.start_all()
    codes = job.wait(120)
    assert codes == {"r0": 0}, job.output("r0")[-2000:]
    end = re.search(r"\[dra\] job finished at step 4 world 1 energy ([0-9.e+-]+) J \(estimated\) fp16: 0 bytes sent "
                    r"for 0 dense", job.output("r0"))
    assert end and float(end[1]) > 0, job.output("r0")[-2000:]
    assert [e["energy_source"] for e in job.events()] == [None]  # the start: no step yet


def test_masked_sparsity_follows_the_training_phase(tmp_path):
    # Without a ramp, the `masked` codec's target follows the controller's convergence phase: the
    # masks stay dense while the loss warms up or falls fast, get sparser by step_up at a mask
    # update taken while it is steady or on a plateau (up to a ceiling learned from divergence),
    # and denser while it diverges (docs/guide/sage.md). Two ranks on real Gloo; the phase comes from the world's mean loss, so
    # every rank proposes the same target.
    sparsity = {"every": 4, "max_sparsity": 0.6, "step_up": 0.2, "step_down": 0.3, "end_step": 100000}
    job = Job(tmp_path, 2, start_size=2, epochs=50, dataset_size=N, hidden=HIDDEN, compress="masked",
              sparsity=sparsity, status_every=100)
    job.start_all()
    codes = job.wait(240)
    assert all(c == 0 for c in codes.values()), [job.output(n)[-3000:] for n in codes]
    recs = sorted((r for r in job.records("commit") if r["uid"] == 0), key=lambda r: r["step"])
    assert recs and all("phase" in r and "sparsity" in r for r in recs), recs[:3]
    trace = [(r["step"], r["phase"], round(r["sparsity"], 3)) for r in recs]
    first_calm = next((r["step"] for r in recs if r["phase"] not in ("warmup", "fast")), None)
    assert first_calm is not None, sorted({r["phase"] for r in recs})  # the run gets past fast learning
    assert all(r["sparsity"] == 0.0 for r in recs if r["step"] < first_calm), trace[:first_calm]
    changes = [(p, r) for p, r in zip(recs, recs[1:]) if r["sparsity"] != p["sparsity"]]
    assert any(r["sparsity"] > p["sparsity"] for p, r in changes), trace  # it did get sparser
    for p, r in changes:
        assert r["step"] % 4 == 0, (p, r)  # only at mask updates
        # The phase that proposed it: the one in force at the update (this step's or the last's).
        phases = {p["phase"], r["phase"]}
        if r["sparsity"] > p["sparsity"]:
            assert phases & {"steady", "plateau"}, (p, r)
            assert r["sparsity"] == pytest.approx(min(0.6, p["sparsity"] + 0.2), abs=0.01), (p, r)
        else:  # back to the level before the last rise, or step_down below a level held before
            assert "diverging" in phases, (p, r)
            assert p["sparsity"] - 0.3 - 0.01 <= r["sparsity"] < p["sparsity"], (p, r)
    # It settles: a divergence right after a rise caps later rises at the level before it (the rule
    # alone cycled 0 -> 0.6 -> 0 every ~200 steps here). Later rises never pass the first cap.
    first_fall = next((i for i, (p, r) in enumerate(changes) if r["sparsity"] < p["sparsity"]), None)
    if first_fall is not None:
        cap = changes[first_fall][1]["sparsity"]
        assert all(r["sparsity"] <= cap + 0.01 for _, r in changes[first_fall:]), trace
