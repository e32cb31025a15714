"""The fault campaign (python -m dra.bench faults): its checker on records with known defects, its
fault specs, and a short fixed-seed subset of real trials (kill -9 of the leader, inside a resize,
of a waiting joiner; SIGSTOP past the timeout; the store killed; a slow peer), C++ workers too
when the example is built."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dra_bench._faults.check import exactly_once, landed_after_training, resume_time
from dra_bench._faults.kinds import KINDS, make_trial
from dra_bench._faults.spec import parse_specs
from dra_bench.faults import CPP_BINARY, percentile

pytestmark = pytest.mark.timeout(400)


def _attempt(step, epoch, rank, world, ids, data_epoch=0):
    return {
        "kind": "attempt",
        "step": step,
        "world_epoch": epoch,
        "rank": rank,
        "world": world,
        "ids": ids,
        "data_epoch": data_epoch,
        "uid": rank,
    }


def _commit(step, epoch, t=0.0, data_epoch=0):
    return {"kind": "commit", "step": step, "world_epoch": epoch, "data_epoch": data_epoch, "time": t}


def test_exactly_once_counts_the_committing_world_only():
    # 8 samples, 2 steps of 4. Step 1 failed in epoch 1 (rank 1 wrote its share, nobody committed)
    # and was redone in epoch 2 by a world of one.
    recs = [
        _attempt(0, 1, 0, 2, [0, 1]),
        _attempt(0, 1, 1, 2, [2, 3]),
        _commit(0, 1),
        _attempt(1, 1, 0, 2, [4, 5]),
        _attempt(1, 1, 1, 2, [6, 7]),
        _attempt(1, 2, 0, 1, [4, 5, 6, 7]),
        _commit(1, 2),
    ]
    assert exactly_once(recs, 8, 1) == (0, 0, [])


def test_exactly_once_reports_a_missing_share_and_repeats():
    # Rank 1's share of the committed step 0 is not in the records (a log written after the
    # step, by a process killed right after the reduction): its samples count as lost.
    recs = [
        _attempt(0, 1, 0, 2, [0, 1]),
        _commit(0, 1),
        _attempt(1, 1, 0, 2, [4, 5]),
        _attempt(1, 1, 1, 2, [6, 7, 0]),
        _commit(1, 1),
    ]
    lost, repeated, problems = exactly_once(recs, 8, 1)
    assert (lost, repeated) == (2, 1)
    assert any("ranks [1] missing" in p for p in problems) and any("2 samples lost, 1 repeated" in p for p in problems)


def test_resume_time_is_the_first_commit_of_a_later_world():
    recs = [_commit(5, 1, 10.0), _commit(6, 1, 10.5), _commit(6, 3, 14.0), _commit(7, 3, 14.2)]
    assert resume_time(recs, 10.6) == pytest.approx(3.4)
    assert resume_time(recs, 14.3) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0] * 99 + [9.0], 99) == 1.0


def test_a_fault_after_the_last_commit_is_told_apart_from_a_job_that_never_resumed():
    # A loaded driver can fire after training ended: nothing to resume, not a failure. A fault
    # before the last step with no commit after it stays a failure.
    recs = [_commit(0, 1, 1.0), _commit(1, 1, 2.0), _commit(2, 1, 3.0)]
    assert landed_after_training(recs, 3.5, total_steps=3)
    assert not landed_after_training(recs, 2.5, total_steps=3)
    assert not landed_after_training(recs[:2], 3.5, total_steps=3)


def test_fault_specs_parse_and_refuse_bad_ones():
    specs = parse_specs("kill:reshard:1, sleep:state_transfer:0:0.4,kill:after_reduce:25")
    assert [str(s) for s in specs] == ["kill:reshard:1", "sleep:state_transfer:0:0.4", "kill:after_reduce:25"]
    for bad in ("kill:forward:1", "nap:step:2", "sleep:step:2", "kill:step"):
        with pytest.raises(ValueError, match="ACTION:WHERE:INDEX"):
            parse_specs(bad)


def test_trials_reproduce_from_their_seed():
    a, b = make_trial(41, "kill_in_resize", "py"), make_trial(41, "kill_in_resize", "py")
    assert a.job == b.job and a.fault.description == b.fault.description
    assert {make_trial(s, "kill_leader", "py").fault.description for s in range(10)} != {a.fault.description}
    assert set(KINDS) >= {
        "kill_member",
        "kill_leader",
        "kill_two",
        "kill_in_resize",
        "kill_joiner",
        "kill_standby",
        "stop_past_timeout",
        "kill_store",
        "slow_peer",
    }


def _campaign(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "faults.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dra.bench", "faults", "--no-churn", "--fuzz-cases", "0", "--json", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    report = json.loads(out.read_text())
    assert report["suite"] == "faults"
    return {r["name"]: r for r in report["results"]}


def test_a_fixed_seed_subset_of_the_campaign_survives(tmp_path):
    # Python workers: the leader killed mid-step, a kill inside a resize, SIGSTOP past the timeout,
    # the store killed (training ends and the code after the loop runs: every process exits 0).
    kinds = "kill_leader,kill_in_resize,stop_past_timeout,kill_store"
    rows = _campaign(tmp_path, "--trials", "4", "--seed", "7", "--kinds", kinds, "--langs", "py")
    survived = rows["faults_survived"]
    assert (survived["value"], survived["trials"], survived["ratio"]) == (1.0, 4, 1.0), survived["failures"]
    assert survived["not_fired"] == 0, survived["by_kind"]
    assert sorted(survived["by_kind"]) == sorted(f"{k}/py" for k in kinds.split(","))
    assert rows["samples_lost"]["value"] == 0 and rows["samples_repeated"]["value"] == 0
    assert rows["hung"]["value"] == 0
    assert rows["resume_s_p50"]["samples"] == 1  # the leader killed mid-step
    assert rows["resume_any_kill_s_p99"]["samples"] == 2  # and the kill inside a resize
    assert rows["resume_stop_s_p50"]["samples"] == 1


def test_the_cpp_example_is_looked_for_in_this_repository_build():
    # It was looked for one folder above the repository: every campaign ran Python workers only and
    # the C++ tests were skipped.
    assert CPP_BINARY.parents[4] == Path(__file__).resolve().parents[2], CPP_BINARY


@pytest.mark.skipif(not CPP_BINARY.exists(), reason=f"C++ example not built: {CPP_BINARY}")
def test_a_fixed_seed_subset_survives_with_cpp_workers(tmp_path):
    # C++ workers, two trials at once: a member killed, a joiner killed, two kills within 100 ms,
    # a slow peer that nobody may declare dead.
    kinds = "kill_member,kill_joiner,kill_two,slow_peer"
    rows = _campaign(
        tmp_path, "--trials", "4", "--seed", "3", "--kinds", kinds, "--langs", "cpp", "--cpp-binary", str(CPP_BINARY),
        "--jobs", "2",
    )
    survived = rows["faults_survived"]
    assert survived["jobs"] == 2 and "2 trials at once" in survived["label"]
    assert (survived["value"], survived["not_fired"]) == (1.0, 0), survived["failures"]
    assert sorted(survived["by_kind"]) == sorted(f"{k}/cpp" for k in kinds.split(","))
    assert rows["samples_lost"]["value"] == 0 and rows["hung"]["value"] == 0


def test_the_benchmarks_store_keeps_serving_after_its_output_fills_a_pipe():
    # c10d logs ~100 bytes for each add() on a value that is not a counter (an outside writer's
    # doing). The store's output pipe was read for its "listening" line only; once it filled, the
    # store blocked on the write and every client waited out its timeout. The pipe is cut to one
    # page here (4 KiB, ~40 such lines) so that a few dozen bad add()s fill it.
    import fcntl
    from datetime import timedelta

    from torch.distributed import TCPStore

    from dra_bench._store import StoreProcess

    store = StoreProcess()
    try:
        fcntl.fcntl(store.proc.stdout.fileno(), 1031, 4096)  # F_SETPIPE_SZ
        TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10)).set("garbage", "xx")
        for _ in range(60):
            client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
            with pytest.raises(Exception):  # noqa: B017 - c10d raises DistNetworkError or DistStoreError
                client.add("garbage", 1)
        # The store wrote a line for each add() (more than the cut pipe holds); the drain thread reads
        # them as it gets the CPU: waited for, not read at once (a loaded host's drain lags behind).
        deadline = time.monotonic() + 30
        while store.output_tail().count("Error processing client message") < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.output_tail().count("Error processing client message") >= 40
        after = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
        after.set("still", "serving")
        assert after.get("still") == b"serving"
    finally:
        store.close()
