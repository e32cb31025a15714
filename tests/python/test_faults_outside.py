"""Nothing from outside the training processes kills a job (issue 23): a fixed-seed trial of each
class of the fault campaign that issue added (``dra_bench._faults.outside``), each of which failed
before its fix, and the store fuzzer on a few hundred values.

- the store fuzzer: no value in any key makes the protocol raise anything it does not handle;
- another client writing bad values into the job's keys while it trains and resizes;
- a trainer that catches an exception in its step and goes on (before and after backward): the
  step is refused on every rank and redone, or the process takes the world's state again;
- an exception nobody catches: the others resume within fault_timeout_s + 1.5 s;
- a late joiner with another optimizer class: refused at admission, the world untouched;
- the events folder read-only, full (a real tmpfs: root only) or replaced by a file;
- a recovery retried after a second death names both victims in its fault event;
- with the store gone, "decision skipped" is printed once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from dra_bench._faults.check import judge, load_events
from dra_bench._faults.kinds import make_trial
from dra_bench._faults.spec import FaultSpec
from dra_bench._faults.tamper import mount_unavailable
from dra_bench._faults.trial import Action, Fault, JobSpec, LocalLauncher, StoreProcess, TrialSpec, run_trial
from dra_bench.faults import CPP_BINARY

pytestmark = pytest.mark.timeout(300)
FAULT_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def store():
    s = StoreProcess()
    yield s
    s.close()


def _run(spec: TrialSpec, tmp: Path, store: StoreProcess, language_binary: Path | None = None):
    run = run_trial(spec, tmp / f"trial-{spec.seed}-{spec.kind}", LocalLauncher(language_binary), store, 120)
    return run, judge(run)


def _outputs(run) -> dict[str, str]:
    return {p.stem[4:]: p.read_text(errors="replace") for p in run.out.glob("out-*.txt")}


def test_the_store_fuzzer_finds_no_value_the_protocol_does_not_handle(store):
    pytest.importorskip("hypothesis")
    from dra_bench._faults import fuzz

    result = fuzz.run(store.address, cases=340, seed=3)
    assert result["crashes"] == [], result["crashes"]
    assert result["cases"] >= 340 and result["families"] >= 17
    assert result["ignored"] > 0 and result["read"] > 0  # both answers were exercised


def test_another_client_writing_bad_values_into_every_key_does_not_stop_the_job(tmp_path, store):
    spec = make_trial(5, "store_fuzz", "py", FAULT_TIMEOUT_S)
    run, v = _run(spec, tmp_path, store)
    assert v.survived and v.fired, v.problems
    # One bad value every 20 ms from step 1 to the end (32 steps and two resizes: about 4 s here,
    # about 200 values; fewer on a slower host, where each write takes longer).
    assert run.fuzz_writes > 100
    assert (v.samples_lost, v.samples_repeated) == (0, 0)
    assert any("ignoring the store value" in text for text in _outputs(run).values())


# Which rank catches an exception where in step 6: "step" is before the forward, "after_reduce"
# after backward (no optimizer step, no dra.step), "after_update" after the optimizer step (no
# dra.step).
CATCHES = {
    "member-before-backward": {"r1": "step"},
    "leader-after-backward": {"r0": "after_reduce"},
    "every-rank-after-backward": {"r0": "after_reduce", "r1": "after_reduce", "r2": "after_reduce"},
    "member-after-its-update": {"r1": "after_update"},
    "every-rank-leader-updated": {"r0": "after_update", "r1": "after_reduce", "r2": "after_reduce"},
}


@pytest.mark.parametrize("case", list(CATCHES))
def test_a_trainer_that_catches_an_exception_and_goes_on_loses_no_sample(tmp_path, store, case):
    # Before backward the rank skips the batch it was handed: the next step's reduction shows it,
    # every rank refuses that step and redoes it. After backward the world committed the step; the
    # rank commits it too, and the next reduction compares the states with the first rank that did
    # call dra.step (rank 0 when none did). One rank without its update: its state differs, and it
    # takes the world's again. One rank with its update: identical, nothing to do. Every rank
    # without the update (as on a non-finite gradient norm): identical, the job goes on (it used to
    # end with "the training state is lost"). Every rank, the leader alone updated: the others
    # take the leader's state.
    catches = CATCHES[case]
    job = JobSpec(language="py", nproc=3, start_size=3, max_size=3, fault_timeout_s=FAULT_TIMEOUT_S)
    fault = Fault("exception_caught", f"{catches} in step 6",
                  specs={r: [FaultSpec("catch", where, 6)] for r, where in catches.items()})
    run, v = _run(TrialSpec(11, "exception_caught", job, fault), tmp_path, store)
    assert v.survived, v.problems
    assert (v.samples_lost, v.samples_repeated) == (0, 0)  # the judge also compares the final digests
    outputs = _outputs(run)
    first = next(iter(catches))
    text, leader = outputs[first], outputs["r0"]
    events = load_events(run.out)
    recovered = [e for e in events if e["event"] == "fault"]
    if case == "member-before-backward":
        assert "did not train 1 batch(es) before step 6" in text, text[-2000:]
        assert any(e["event"] == "refused" and e["step"] == 6 for e in events)
    elif case == "leader-after-backward":
        assert "did not apply step 6's update (no optimizer step, or no step()): its state differs from rank 1's" in text, text[-2000:]
        assert len(recovered) == 1, events
    elif case == "every-rank-leader-updated":
        for r in ("r1", "r2"):
            assert "did not apply step 6's update (no optimizer step, or no step()): its state differs from rank 0's" in outputs[r]
        assert "its state differs" not in leader
        assert len(recovered) == 1 and "differs from rank 0's" in recovered[0]["reason"], events
    else:
        n = len(catches)
        assert f"{n} of 3 rank(s) did not apply step 6's update" in leader, leader[-2000:]
        assert "every rank's state is still identical" in leader
        assert not recovered and not [e for e in events if e["event"] == "refused"], events


@pytest.mark.skipif(not CPP_BINARY.exists(), reason=f"C++ example not built: {CPP_BINARY}")
@pytest.mark.parametrize("who", ["r1", "r0 r1 r2"], ids=["one-rank", "every-rank"])
def test_a_cpp_trainer_that_skips_step_after_its_reduction_loses_no_sample(tmp_path, store, who):
    # A C++ trainer takes its next batch before the controller learns of the miss (at the next
    # reduction): that step is computed on the missed step's batch again, refused and redone. One
    # rank: its state differs and it takes the world's again. Every rank: the job goes on.
    job = JobSpec(language="cpp", nproc=3, start_size=3, max_size=3, fault_timeout_s=FAULT_TIMEOUT_S)
    ranks = who.split()
    fault = Fault("exception_caught", f"{who} catch after backward of step 6",
                  specs={r: [FaultSpec("catch", "after_reduce", 6)] for r in ranks})
    run, v = _run(TrialSpec(12, "exception_caught", job, fault), tmp_path, store, CPP_BINARY)
    assert v.survived, v.problems
    assert (v.samples_lost, v.samples_repeated) == (0, 0)
    events = load_events(run.out)
    if len(ranks) == 3:
        assert "every rank's state is still identical" in _outputs(run)["r0"]
        assert not [e for e in events if e["event"] == "fault"], events
        assert any(e["event"] == "refused" and e["step"] == 7 for e in events), events


def test_an_uncaught_exception_in_the_leader_costs_no_more_than_a_kill(tmp_path, store):
    who = "r0"
    # The process leaves the job as the exception leaves the loop: its peers' step fails at once and
    # their recovery does not wait for it (it used to meet them at finish() at exit: ~7 s).
    job = JobSpec(language="py", nproc=3, start_size=3, max_size=3, fault_timeout_s=FAULT_TIMEOUT_S)
    fault = Fault(
        "exception_uncaught",
        f"{who} raises at step 7",
        specs={who: [FaultSpec("raise", "step", 7)]},
        expect_codes={who: 1},
        measure_resume=True,
    )
    run, v = _run(TrialSpec(13, "exception_uncaught", job, fault), tmp_path, store)
    assert v.survived, v.problems
    # The old wait ended at finish() at exit (~7 s); a loaded host adds up to ~1-2 s to a recovery.
    assert v.resume_s is not None and v.resume_s <= FAULT_TIMEOUT_S + 3.0, v.resume_s
    text = _outputs(run)[who]
    assert "leaves the job mid-training: uncaught RuntimeError" in text
    assert "finished" not in text


def test_a_joiner_with_another_optimizer_is_refused_before_anything_is_sent(tmp_path, store):
    spec = make_trial(2, "joiner_mismatch", "py", FAULT_TIMEOUT_S)
    spec.job.variants = {"j0": "optimizer"}
    run, v = _run(spec, tmp_path, store)
    assert v.survived, v.problems
    events = load_events(run.out)
    rejected = [e for e in events if e["event"] == "rejected"]
    assert len(rejected) == 1 and "the optimizer differs" in rejected[0]["reason"], events
    assert "Adam" in rejected[0]["reason"] and "SGD" in rejected[0]["reason"]
    assert not [e for e in events if e["event"] in ("resize", "fault")]
    assert "StateMismatchError" in _outputs(run)["j0"]


@pytest.mark.parametrize("kind", ["fs_readonly", "fs_full", "fs_notdir"])
def test_a_failing_events_and_checkpoint_folder_never_stops_training(tmp_path, store, kind):
    if kind != "fs_notdir" and mount_unavailable():
        pytest.skip(mount_unavailable())
    spec = make_trial(4, kind, "py", FAULT_TIMEOUT_S)
    run, v = _run(spec, tmp_path, store)
    assert v.survived, v.problems
    outputs = _outputs(run)
    assert sum("cannot append to events_path" in t for t in outputs.values()) >= 1  # the leader warned
    checkpoints = [json.loads(l) for f in run.out.glob("samples-*.jsonl") for l in f.read_text().splitlines()]
    assert any(r["kind"] == "checkpoint" and not r["ok"] for r in checkpoints)  # the trainer's save failed too


def test_a_retried_recovery_names_every_process_it_lost(tmp_path, store):
    # r3 is killed mid-step; r2 dies inside the rebuild of the recovery (its second world change):
    # the recovery is retried, and its fault event names both.
    job = JobSpec(language="py", nproc=4, start_size=4, max_size=4, fault_timeout_s=FAULT_TIMEOUT_S)
    fault = Fault(
        "kill_two",
        "r3 killed at step 6, r2 in the recovery's rebuild",
        specs={"r2": [FaultSpec("kill", "rebuild", 1)]},
        actions=[Action("r3", 6, 0.01)],
    )
    run, v = _run(TrialSpec(17, "kill_two", job, fault), tmp_path, store)
    assert v.survived, v.problems
    faults = [e for e in load_events(run.out) if e["event"] == "fault"]
    assert faults and sorted(faults[-1]["left"]) == [2, 3], faults


def test_with_the_store_gone_a_skipped_decision_is_said_once(tmp_path):
    spec = make_trial(3, "kill_store", "py", FAULT_TIMEOUT_S)
    store = StoreProcess()
    try:
        run, v = _run(spec, tmp_path, store)
    finally:
        store.close()
    assert v.survived, v.problems
    leader = _outputs(run)["r0"]
    assert leader.count("decision at step") <= 1, leader[-3000:]


def test_the_fault_kinds_of_every_class_are_registered():
    from dra_bench._faults.kinds import CLASSES, KINDS

    assert {k.klass for k in KINDS.values()} == set(CLASSES)
    for name in ("fs_readonly", "fs_full", "fs_notdir", "store_fuzz", "exception_uncaught", "exception_caught",
                 "joiner_mismatch", "launcher_sigterm", "launcher_sigkill", "agent_rdzv_host"):  # fmt: skip
        assert name in KINDS
        assert make_trial(1, name, "py").fault.description


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("other_beats", [True, False], ids=["holder-alive-elsewhere", "holder-dead"])
def test_a_process_led_into_a_room_of_its_own_steps_out_when_the_holders_beat_elsewhere(store, other_beats):
    # Issue 23's third rerun (trial 57:store_fuzz:py): a decision another client wrote led a
    # process that held no state into a recovery room nobody else came to, and it ended with
    # "the training state is lost" while the world trained on. In the room, the member that holds
    # the state beats but never comes: the process steps out ("elsewhere"). A holder whose
    # heartbeat stood still is dead, and then the state is lost indeed.
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    from dra import _core

    job = f"dra/split-{int(other_beats)}/0"
    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set(f"{job}/beat/1", "1")
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            if other_beats:
                client.add(f"{job}/beat/1", 1)
            time.sleep(0.02)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        # stale_ms: a beat not seen to move for that long is a dead holder. 1 s, not 0.3 s: with three
        # copies of the tests at once the beating thread was once not scheduled for 0.3 s.
        got = _core._testing.agree_after_failure("127.0.0.1", store.port, job, uid=3, old_members=[1, 3],
                                                 holds_state=False, window_ms=600, stale_ms=1000)
        took = time.monotonic() - t0
    finally:
        stop.set()
        thread.join(timeout=5)
    if other_beats:
        assert got == "elsewhere 1", got
        assert took >= 1.1  # waited the window and the late grace for a member that beats
    else:
        assert got.startswith("handled: dra: the training state is lost"), got


def test_a_member_whose_beats_come_further_apart_than_the_stale_time_is_waited_for(store):
    # Issue 23's campaign (trial 278:kill_standby:cpp, 5 trials sharing one store at load 16): a
    # recovery left out two live members. A member this process saw beat is alive: its beats may
    # come further apart than the stale time on a loaded host, and it is given the late grace
    # between two beats. Here member 1 beats at 0.1 s, then every 0.6 s (the stale time is 0.3 s,
    # the window and the grace 1 s), and checks in at 1.6 s: it is a member of the agreed world.
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    from dra import _core

    job = "dra/slow-beats/0"
    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set(f"{job}/beat/1", "1")
    stop = threading.Event()

    def slow_member():
        for pause in (0.1, 0.6, 0.6):  # beats at 0.1, 0.7 and 1.3 s
            if stop.wait(pause):
                return
            client.add(f"{job}/beat/1", 1)
        if not stop.wait(0.3):
            client.set(f"{job}/fault/1/alive/1", "1")  # checks in at 1.6 s, holding the state

    thread = threading.Thread(target=slow_member, daemon=True)
    thread.start()
    try:
        got = _core._testing.agree_after_failure("127.0.0.1", store.port, job, uid=3, old_members=[1, 3],
                                                 holds_state=True, window_ms=1000, stale_ms=300)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert got == "members 1 3", got
