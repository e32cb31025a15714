"""The LibTorch example examples/cpp/elastic_train.cpp: a C++ trainer on dra::elastic::controller.

Under ``torchrun --no-python`` (3 processes, the agent hosts the store) the world grows 2 -> 3 and
shrinks 3 -> 2 in place; a released process stands by or exits 0. Started by hand (rank 0 hosts
the store), a process killed with SIGKILL mid-step is survived. Every test checks what the
processes logged: the leader's events.jsonl, each process's committed sample ids
(``--log-samples``) and the final lines (parameter and momentum hashes).

The binary is not built here: it comes from the C++ build (`cmake -S . -B build/cpp` with
DRA_BUILD_EXAMPLES on, then `cmake --build build/cpp --target dra_elastic_train`).
DRA_CPP_EXAMPLE_DIR points at another build's examples/cpp folder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dra_bench._faults.check import exactly_once, load_records

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = Path(os.environ.get("DRA_CPP_EXAMPLE_DIR", ROOT / "build" / "cpp" / "examples" / "cpp"))
BINARY = EXAMPLE_DIR / "dra_elastic_train"
DATASET, BATCH = 640, 32
STEPS_PER_EPOCH = DATASET // BATCH  # 20

pytestmark = pytest.mark.skipif(
    not BINARY.exists(),
    reason=f"C++ example not built: {BINARY} is missing (cmake --build build/cpp --target dra_elastic_train)",
)

FINAL = re.compile(r"\[dra-cpp\] final uid (\d+) role (\w+) rank (-?\d+) world (\d+) steps (\d+) resizes (\d+) "
                   r"hash ([0-9a-f]{16}) momentum ([0-9a-f]{16})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Processes of one test, each carrying a unique environment token so that ``close`` finds and
    kills exactly these (torchrun starts its workers in their own sessions), whatever they do."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.token = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen] = {}
        self._files = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCHELASTIC_", "DRA_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update({"OMP_NUM_THREADS": "1", "DRA_CPP_TEST_TOKEN": self.token})
        env.update(extra)
        return env

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        out = open(self.tmp / f"out-{name}.txt", "w")
        self._files.append(out)
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        return {name: p.wait(timeout=max(0.1, deadline - time.monotonic())) for name, p in self.procs.items()}

    def output(self, name: str) -> str:
        return (self.tmp / f"out-{name}.txt").read_text()

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for pid in self._tagged_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for f in self._files:
            f.close()

    def _tagged_pids(self) -> list[int]:
        needle = f"DRA_CPP_TEST_TOKEN={self.token}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
        return pids


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.close()


def _torchrun(p: Processes, *args: str, timeout: float = 150) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--no-python", "--nproc-per-node=3", "--max-restarts=0",
           "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(BINARY), *args]
    p.start("torchrun", cmd, p.env())
    try:
        code = p.wait(timeout)["torchrun"]
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish within {timeout} s:\n{p.output('torchrun')[-4000:]}")
    return code, p.output("torchrun")


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finals(out: str) -> dict[int, dict]:
    finals = {}
    for uid, role, rank, world, steps, resizes, h, m in FINAL.findall(out):
        finals[int(uid)] = {"role": role, "rank": int(rank), "world": int(world), "steps": int(steps),
                            "resizes": int(resizes), "hash": h, "momentum": m}
    return finals


def _commits(tmp: Path) -> list[dict]:
    """Every record the processes wrote with --log-samples (attempts, commits, world changes, finals)."""
    return load_records(tmp)


def _check_exactly_once(recs: list[dict], total_steps: int, epochs: int) -> None:
    """Every sample of every data epoch consumed exactly once by the world's committed steps: the
    checker of the fault campaign (dra_bench._faults.check.exactly_once). Every rank logs its share
    before the step's reduction, so the shares of the world that committed a step (the latest world
    epoch of its commit records) are complete even when a rank died after the reduction."""
    committed = sorted({r["step"] for r in recs if r["kind"] == "commit"})
    assert committed == list(range(total_steps)), "not every step was committed"
    lost, repeated, problems = exactly_once(recs, DATASET, epochs)
    assert (lost, repeated, problems) == (0, 0, []), problems
    for r in recs:
        if r["kind"] == "attempt":
            assert len(r["ids"]) in (BATCH // r["world"], -(-BATCH // r["world"])), r


def _check_event_keys(ev: dict) -> None:
    for key in ("event", "step", "epoch", "before", "after", "left", "joined", "reason", "cost_s"):
        assert key in ev, (key, ev)
    assert set(ev["cost_s"]) >= {"agree", "rebuild", "state_transfer", "reshard"}


@pytest.mark.timeout(200)
def test_grow_and_shrink_in_place_under_torchrun(procs, tmp_path):
    events = tmp_path / "events.jsonl"
    code, out = _torchrun(procs, "--epochs", "3", "--dataset", str(DATASET), "--global-batch", str(BATCH),
                          "--start-size", "2", "--decide-every", "100000", "--schedule", "20:3,40:2", "--verify",
                          "--events", str(events), "--log-samples", str(tmp_path), "--status-every", "10",
                          "--fault-timeout-ms", "20000")
    assert code == 0, out[-6000:]
    evs = _events(events)
    for ev in evs:
        _check_event_keys(ev)
    assert [e["event"] for e in evs] == ["start", "resize", "resize"], evs
    start, grow, shrink = evs
    assert (start["after"], start["params_identical"]) == (2, True)
    assert (grow["before"], grow["after"], grow["joined"], grow["left"]) == (2, 3, [2], [])
    assert (shrink["before"], shrink["after"], shrink["joined"], shrink["left"]) == (3, 2, [], [2])
    assert grow["params_identical"] is True and shrink["params_identical"] is True
    # The schedule asked after 20 and 40 committed steps; the change lands at the next boundary.
    assert (grow["decided_step"], grow["step"]) == (20, 21)
    assert (shrink["decided_step"], shrink["step"]) == (40, 41)
    assert grow["state_bytes"] > 0

    # The joiner continued at the world's step: it joined at the grow's step, and its first
    # committed step is that one.
    assert f"[dra-cpp] uid 2 joined at step {grow['step']} as rank 2 (world 3)" in out, out[-6000:]
    recs = _commits(tmp_path)
    assert min(r["step"] for r in recs if r["uid"] == 2 and r["kind"] == "attempt") == grow["step"]
    assert max(r["step"] for r in recs if r["uid"] == 2 and r["kind"] == "attempt") == shrink["step"] - 1
    _check_exactly_once(recs, total_steps=60, epochs=3)

    # The status line on rank 0 reports the world size as it changes.
    worlds = [int(w) for w in re.findall(r"\[dra\] step \d+ loss \S+ world (\d+)", out)]
    assert worlds == [2, 2, 3, 3, 2, 2], out[-6000:]

    finals = _finals(out)
    assert sorted(finals) == [0, 1, 2], out[-6000:]
    for uid in (0, 1):
        f = finals[uid]
        assert (f["role"], f["rank"], f["world"], f["steps"], f["resizes"]) == ("member", uid, 2, 60, 2), f
    assert finals[0]["hash"] == finals[1]["hash"]
    assert finals[0]["momentum"] == finals[1]["momentum"]  # the optimizer state is in step too
    # The released process stood by until the job finished.
    assert (finals[2]["role"], finals[2]["steps"]) == ("standby", shrink["step"]), finals[2]


@pytest.mark.timeout(200)
def test_release_exit_gives_the_process_back_while_the_others_continue(procs, tmp_path):
    events = tmp_path / "events.jsonl"
    code, out = _torchrun(procs, "--epochs", "2", "--dataset", str(DATASET), "--global-batch", str(BATCH),
                          "--start-size", "2", "--decide-every", "100000", "--schedule", "10:3,20:2", "--release",
                          "exit", "--verify", "--events", str(events), "--log-samples", str(tmp_path),
                          "--fault-timeout-ms", "20000")
    assert code == 0, out[-6000:]  # torchrun saw every process exit 0, the released one included
    evs = _events(events)
    assert [e["event"] for e in evs] == ["start", "resize", "resize"], evs
    assert evs[0]["release"] == "exit"
    shrink = evs[2]
    assert (shrink["before"], shrink["after"], shrink["left"]) == (3, 2, [2])
    assert f"[dra] process 2 released at step {shrink['step']}: exiting to give the device back" in out
    finals = _finals(out)
    assert finals[2]["role"] == "released" and finals[2]["steps"] == shrink["step"], finals
    for uid in (0, 1):
        assert (finals[uid]["role"], finals[uid]["world"], finals[uid]["steps"]) == ("member", 2, 40), finals[uid]
    assert finals[0]["hash"] == finals[1]["hash"] and finals[0]["momentum"] == finals[1]["momentum"]
    _check_exactly_once(_commits(tmp_path), total_steps=40, epochs=2)


@pytest.mark.timeout(200)
def test_survives_a_killed_process_mid_step(procs, tmp_path):
    """Three processes started by hand (rank 0 hosts the store); uid 1 kills itself with SIGKILL
    at step 25 after backward, before the gradient all-reduce. The survivors detect it, shrink to
    2, redo step 25 and finish with identical parameters, every sample consumed exactly once."""
    events = tmp_path / "events.jsonl"
    _start_by_hand(procs, 3, ["--epochs", "2", "--dataset", str(DATASET), "--global-batch", str(BATCH),
                              "--decide-every", "100000", "--verify", "--events", str(events), "--log-samples",
                              str(tmp_path), "--fault-timeout-ms", "3000", "--store-timeout-ms", "30000",
                              ], faults={1: "kill:step:25"})
    try:
        codes = procs.wait(150)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish: " + "\n".join(procs.output(f"r{u}")[-2000:] for u in range(3)))
    outs = {uid: procs.output(f"r{uid}") for uid in range(3)}
    assert codes["r1"] == -signal.SIGKILL, outs[1][-3000:]
    assert "test hook: kill in step at step 25" in outs[1]
    assert codes["r0"] == 0, outs[0][-3000:]
    assert codes["r2"] == 0, outs[2][-3000:]

    evs = _events(events)
    for ev in evs:
        _check_event_keys(ev)
    assert [e["event"] for e in evs] == ["start", "fault"], evs
    fault = evs[1]
    assert (fault["before"], fault["after"], fault["left"], fault["joined"]) == (3, 2, [1], [])
    assert fault["step"] == 25  # the interrupted step is redone in the new world
    assert fault["params_identical"] is True
    assert fault["reason"].startswith("peer failure")

    finals = _finals(outs[0] + outs[2])
    assert sorted(finals) == [0, 2]
    for uid, rank in ((0, 0), (2, 1)):
        assert (finals[uid]["role"], finals[uid]["rank"], finals[uid]["world"], finals[uid]["steps"]) == (
            "member", rank, 2, 40), finals[uid]
    assert finals[0]["hash"] == finals[2]["hash"] and finals[0]["momentum"] == finals[2]["momentum"]
    recs = _commits(tmp_path)
    assert max(r["step"] for r in recs if r["uid"] == 1 and r["kind"] == "attempt") == 24  # it died before committing 25
    _check_exactly_once(recs, total_steps=40, epochs=2)


@pytest.mark.timeout(200)
def test_a_process_killed_between_the_reduction_and_the_step_boundary_loses_no_sample(procs, tmp_path):
    """uid 1 dies after step 25's gradient reduction succeeded everywhere and before its step():
    the others commit step 25 with uid 1's share in it, then fail at step 26 and shrink. The
    record of step 25 must hold uid 1's share (it was written before the reduction), so the
    exactly-once checker counts every sample once and reports no loss."""
    _start_by_hand(procs, 3, ["--epochs", "2", "--dataset", str(DATASET), "--global-batch", str(BATCH),
                              "--decide-every", "100000", "--verify", "--events", str(tmp_path / "events.jsonl"),
                              "--log-samples", str(tmp_path), "--fault-timeout-ms", "3000"],
                   faults={1: "kill:after_reduce:25"})
    try:
        codes = procs.wait(150)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish: " + "\n".join(procs.output(f"r{u}")[-2000:] for u in range(3)))
    assert codes == {"r0": 0, "r1": -signal.SIGKILL, "r2": 0}, [procs.output(f"r{u}")[-2000:] for u in range(3)]
    assert "test hook: kill in after_reduce at step 25" in procs.output("r1")
    fault = [e for e in _events(tmp_path / "events.jsonl") if e["event"] == "fault"]
    # Step 26's reduction fails (25's, when uid 1's last bytes did not reach a peer: it is redone).
    assert [(e["left"], e["after"]) for e in fault] == [([1], 2)] and fault[0]["step"] in (25, 26), fault
    recs = _commits(tmp_path)
    committing = max(r["world_epoch"] for r in recs if r["kind"] == "commit" and r["step"] == 25)
    shares = [r for r in recs if r["kind"] == "attempt" and r["step"] == 25 and r["world_epoch"] == committing]
    assert sorted(r["uid"] for r in shares) == ([0, 1, 2] if fault[0]["step"] == 26 else [0, 2])
    _check_exactly_once(recs, total_steps=40, epochs=2)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("phase", ["rebuild", "state_transfer", "reshard"])
def test_survives_a_process_killed_during_a_resize(procs, tmp_path, phase):
    """Started by hand, 2 of 3 form the world; at the grow to 3 after 10 steps, uid 1 kills itself
    inside a phase of the world change. The leader and the joiner recover into a world of 2 (the
    joiner gets the whole state from the leader) and finish, every sample consumed exactly once."""
    events = tmp_path / "events.jsonl"
    _start_by_hand(procs, 3, ["--epochs", "2", "--dataset", str(DATASET), "--global-batch", str(BATCH),
                              "--start-size", "2", "--decide-every", "100000", "--schedule", "10:3", "--verify",
                              "--events", str(events), "--log-samples", str(tmp_path), "--fault-timeout-ms", "3000",
                              ], faults={1: f"kill:{phase}:1"})  # its second world change: the grow
    try:
        codes = procs.wait(150)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish: " + "\n".join(procs.output(f"r{u}")[-2000:] for u in range(3)))
    outs = {uid: procs.output(f"r{uid}") for uid in range(3)}
    assert codes["r1"] == -signal.SIGKILL, outs[1][-3000:]
    assert f"test hook: kill in {phase} at step 11" in outs[1]
    assert codes["r0"] == 0, outs[0][-3000:]
    assert codes["r2"] == 0, outs[2][-3000:]
    evs = _events(events)
    for ev in evs:
        _check_event_keys(ev)
    assert [e["event"] for e in evs] == ["start", "fault"], evs  # the grow never completed
    fault = evs[1]
    # Against the world that was running (0, 1): 1 is gone, the joiner 2 is kept in the recovered world.
    assert (fault["before"], fault["after"], fault["left"], fault["members"], fault["joined"]) == (
        2, 2, [1], [0, 2], [2]), fault
    assert fault["step"] == 11 and fault["params_identical"] is True
    finals = _finals(outs[0] + outs[2])
    for uid, rank in ((0, 0), (2, 1)):
        assert (finals[uid]["role"], finals[uid]["rank"], finals[uid]["world"], finals[uid]["steps"]) == (
            "member", rank, 2, 40), finals[uid]
    assert finals[0]["hash"] == finals[2]["hash"] and finals[0]["momentum"] == finals[2]["momentum"]
    recs = _commits(tmp_path)
    assert min(r["step"] for r in recs if r["uid"] == 2 and r["kind"] == "attempt") == 11  # the joiner continued at the world's step
    _check_exactly_once(recs, total_steps=40, epochs=2)


@pytest.mark.timeout(200)
def test_a_joiner_killed_in_the_grow_is_named_in_the_reason_not_among_those_who_left(procs, tmp_path):
    """The joiner (uid 2) kills itself while the grow from 2 to 3 rebuilds the world: the running
    world (0, 1) recovers at its size. The fault event's `left` is against the running world, so it
    is empty; the joiner that did not come is named in the reason (the faults campaign's trial
    171:store_fuzz:py listed a live joiner, whose admission another client wrote over, as left)."""
    events = tmp_path / "events.jsonl"
    _start_by_hand(procs, 3, ["--epochs", "1", "--dataset", str(DATASET), "--global-batch", str(BATCH),
                              "--start-size", "2", "--decide-every", "100000", "--schedule", "6:3",
                              "--events", str(events), "--fault-timeout-ms", "3000"],
                   faults={2: "kill:rebuild:0"})
    try:
        codes = procs.wait(150)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish: " + "\n".join(procs.output(f"r{u}")[-2000:] for u in range(3)))
    outs = {uid: procs.output(f"r{uid}") for uid in range(3)}
    assert codes["r2"] == -signal.SIGKILL, outs[2][-3000:]
    assert codes["r0"] == 0 and codes["r1"] == 0, (outs[0][-3000:], outs[1][-3000:])
    faults = [e for e in _events(events) if e["event"] == "fault"]
    assert len(faults) == 1, faults
    fault = faults[0]
    assert (fault["before"], fault["after"], fault["left"], fault["members"], fault["joined"]) == (
        2, 2, [], [0, 1], []), fault
    assert "joiner(s) 2 of the interrupted grow did not come" in fault["reason"], fault["reason"]


def _start_by_hand(procs: Processes, n: int, args: list[str], faults: dict[int, str] | None = None) -> None:
    """n processes without torchrun; rank 0 hosts the store (DRA_HOST_STORE=1); `faults` gives a
    process its --test-fault specs."""
    port = _free_port()
    for uid in range(n):
        env = procs.env(RANK=str(uid), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        DRA_JOB_ID=f"job-{procs.token[:8]}", DRA_HOST_STORE="1" if uid == 0 else "0")
        hooks = ["--test-fault", faults[uid]] if faults and uid in faults else []
        procs.start(f"r{uid}", [str(BINARY), *args, *hooks], env)


@pytest.mark.timeout(200)
def test_a_standby_ends_cleanly_when_rank0_hosts_the_store(procs, tmp_path):
    """Outside torchrun the store lives in rank 0's process: the job's end must reach the standby
    before rank 0 leaves and takes the store with it (the standby exits 0, not on a broken store)."""
    _start_by_hand(procs, 3, ["--epochs", "1", "--dataset", str(DATASET), "--global-batch", str(BATCH), "--start-size",
                              "2", "--decide-every", "100000", "--status-every", "0"])
    try:
        codes = procs.wait(150)
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish: " + "\n".join(procs.output(f"r{u}")[-2000:] for u in range(3)))
    outs = {uid: procs.output(f"r{uid}") for uid in range(3)}
    assert codes == {"r0": 0, "r1": 0, "r2": 0}, outs
    finals = _finals("".join(outs.values()))
    assert (finals[2]["role"], finals[2]["steps"]) == ("standby", 0), finals
    assert finals[0]["steps"] == finals[1]["steps"] == STEPS_PER_EPOCH
    assert finals[0]["hash"] == finals[1]["hash"]


@pytest.mark.timeout(120)
def test_the_library_keeps_sigpipe_from_killing_a_cpp_trainer(tmp_path):
    """The example no longer touches SIGPIPE: the controller ignores it when the program left it at
    its default. A one-process job whose stdout reader is gone before the process writes: its final
    lines fail with EPIPE (exit 0) instead of killing it with SIGPIPE (exit -13)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read what the trainer prints
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "DRA_"))}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               DRA_HOST_STORE="1", DRA_JOB_ID=f"sigpipe-{uuid.uuid4().hex[:8]}", OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([str(BINARY), "--epochs", "1", "--dataset", "64", "--global-batch", "32",
                               "--status-every", "0"], stdout=write_end, stderr=subprocess.DEVNULL, env=env,
                              timeout=100)
    finally:
        os.close(write_end)
    assert proc.returncode != -signal.SIGPIPE, "the trainer died of SIGPIPE"
    assert proc.returncode == 0


def test_rejects_bad_options():
    proc = subprocess.run([str(BINARY), "--release", "later"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    assert proc.returncode == 1
    assert "--release: expected 'standby' or 'exit', got 'later'" in proc.stdout
    proc = subprocess.run([str(BINARY), "--schedule", "0:2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    assert proc.returncode == 1
    assert "resize_schedule: steps must be >= 1" in proc.stdout  # the controller's own validation
    proc = subprocess.run([str(BINARY), "--test-fault", "kill:forward:3"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    assert proc.returncode == 1
    assert "--test-fault: expected ACTION:WHERE:INDEX[:SECONDS]" in proc.stdout and "'kill:forward:3'" in proc.stdout
