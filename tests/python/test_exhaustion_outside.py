"""Fault classes an outside review ran against real ``dra run`` jobs (real processes, real Gloo, 2-3
ranks) and a real pool, none of which the fault campaign or the other fault tests cover:

- a rank stuck in its own code (a long sleep, a deadlocked DataLoader worker), not in a collective:
  the others leave it out and finish, and the launcher stops it once the job is done (before: the
  launcher waited for it for as long as its code ran, for ever for a deadlock);
- a straggler, 5x slower per step, or one step past ``fault_timeout_s``: never declared dead.

Every process a test starts carries an environment token and is killed at the end (run_logged_script);
mounts and cgroups are removed in ``finally``. No test asserts on speed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _elastic_harness import linear_job_script, run_logged_script

pytestmark = pytest.mark.timeout(120)

FAULT_TIMEOUT_S = 2.0
# Each step's record: who, which step, the world it ran in, whether it was committed.
RECORD = """
        st = dra.step(loss)
        log.write(json.dumps({"kind": "step", "uid": ctl.uid, "step": step, "size": ctl.world_size,
                              "epoch": ctl.epoch, "members": list(ctl.members), "committed": bool(st.committed),
                              "t": __import__("time").time()}) + "\\n")
        log.flush()
"""


def _events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _committed(records: list[dict], uid: int) -> list[int]:
    return sorted({r["step"] for r in records if r.get("kind") == "step" and r["uid"] == uid and r["committed"]})


def _options(tmp_path: Path, **extra) -> dict:
    return {"fault_timeout_s": FAULT_TIMEOUT_S, "events_path": str(tmp_path / "events.jsonl"), "policy": "none",
            **extra}


# -- 1. a rank stuck in its own code ----------------------------------------------------------

# A rank whose DataLoader worker deadlocks: a worker process of rank 1 blocks for good in
# __getitem__ after it has served a few batches (the main process then waits on the loader's queue).
LOADER_SCRIPT = """
import json, os, time, torch
import dra, dra.elastic as de

cfg = json.loads(os.environ["CFG"])
torch.manual_seed(0)
n = cfg["n"]

class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y, self.served = torch.randn(n, 4), torch.randn(n, 1), 0
    def __len__(self):
        return n
    def __getitem__(self, i):
        self.served += 1  # in the worker process: its own count
        if os.environ["RANK"] == "1" and self.served > 16:
            time.sleep(3600)  # deadlocked
        return self.x[i], self.y[i]

ds = Data()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sampler = de.DistributedSampler(ds, seed=1)
loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1)
ctl = de.init(model, opt, sampler)
log = open(os.path.join(cfg["out"], f"log-{ctl.uid}.jsonl"), "a")
for epoch in ctl.epochs(1):
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(ctl.model(xb), yb)
        ctl.optimizer.zero_grad(); loss.backward(); ctl.optimizer.step()
        step = ctl.step_index
""" + RECORD + """
log.close()
"""
SLEEP_SCRIPT = linear_job_script(RECORD + """
        if ctl.uid == 1 and step == 3:
            time.sleep(3600)  # stuck in its own code, not in a collective
""")


@pytest.mark.parametrize("stuck", ["sleep", "dataloader"])
def test_a_rank_stuck_in_its_own_code_is_left_out_and_stopped_once_the_job_is_done(tmp_path: Path, stuck: str) -> None:
    """Before: the two others left the stuck rank out after 3 x fault_timeout_s + 1 s (it still
    beat) and finished, but ``dra run`` waited for it as long as its code ran: an hour for the
    sleep, for ever for the deadlock. The job records the world that finished it (``final``); a
    worker outside it still running after the end is stopped by its launcher, saying so."""
    script = SLEEP_SCRIPT.replace("import json, math", "import time, json, math") if stuck == "sleep" else LOADER_SCRIPT
    code, out, records = run_logged_script(tmp_path, script, 3, _options(tmp_path), {"n": 96}, timeout=80,
                                           launcher_args=("--shutdown-timeout", "3"))
    assert code == 0, out[-3000:]  # -1: the launcher still waited after 80 s
    assert re.search(r"rank 1 \(uid 1, pid \d+\) still runs \d+ s after the job finished without it \(its last "
                     r"world was \[0, 2\]", out), out[-3000:]
    faults = [e for e in _events(tmp_path) if e["event"] == "fault"]
    assert [e["left"] for e in faults] == [[1]], faults
    # The two others trained every step (8 of 12 samples): the stuck rank's steps were redone without it.
    assert _committed(records, 0) == _committed(records, 2) == list(range(8)), records
    assert "survived" not in out.splitlines()[-1]  # the stopped rank is not counted as a failure


# -- 2. a straggler ------------------------------------------------------------------------------

def test_a_straggler_five_times_slower_is_never_declared_dead(tmp_path: Path) -> None:
    """Rank 1 takes 0.5 s a step, the others 0.1 s (within fault_timeout_s): the world waits for it
    in each step's reduction; no fault, nobody left out."""
    script = linear_job_script(RECORD + """
        __import__("time").sleep(0.5 if ctl.uid == 1 else 0.1)
""")
    code, out, records = run_logged_script(tmp_path, script, 3, _options(tmp_path), {"n": 96}, timeout=80)
    assert code == 0, out[-3000:]
    assert [e["event"] for e in _events(tmp_path)] == ["start"], _events(tmp_path)
    for uid in (0, 1, 2):
        assert _committed(records, uid) == list(range(8))
    assert {r["size"] for r in records if r.get("kind") == "step"} == {3}


def test_one_step_past_the_fault_timeout_costs_a_recovery_that_keeps_the_straggler(tmp_path: Path) -> None:
    """Rank 1 stalls 1.5 x fault_timeout_s after step 3: the others' reduction times out and they
    recover, but it still beats, so it is waited for (up to 3 x fault_timeout_s + 1 s) and stays a
    member: the fault event names nobody in ``left`` and the world keeps its 3 ranks."""
    script = linear_job_script(RECORD + f"""
        if ctl.uid == 1 and step == 3 and st.committed:
            __import__("time").sleep({1.5 * FAULT_TIMEOUT_S})
""")
    code, out, records = run_logged_script(tmp_path, script, 3, _options(tmp_path), {"n": 96}, timeout=80)
    assert code == 0, out[-3000:]
    faults = [e for e in _events(tmp_path) if e["event"] == "fault"]
    assert all(e["left"] == [] and e["members"] == [0, 1, 2] for e in faults), faults
    for uid in (0, 1, 2):
        assert _committed(records, uid) == list(range(8))
