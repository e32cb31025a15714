"""A standby the outside actor names in `leave` (its device is being taken back) is dismissed at
each of the leader's looks while it is named, and registers again each time: it says so once, and
is admitted as soon as the outside actor stops naming it. Real store, real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "pool" / "train.py"
pytestmark = pytest.mark.timeout(180)


def _report(store) -> dict:
    return json.loads(store.get("dra/dis/0/report")) if store.check(["dra/dis/0/report"]) else {}


def test_a_standby_dismissed_again_and_again_says_it_once_and_is_admitted_when_no_longer_named(tmp_path):
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    store.set("dra/dis/0/capacity", json.dumps({"min_size": 1, "max_size": 2, "leave": [10000]}))
    env = {**os.environ, "DRA_STORE": f"127.0.0.1:{store.port}", "DRA_JOB_ID": "dis", "RANK": "0", "WORLD_SIZE": "1",
           "OMP_NUM_THREADS": "1", "DRA_OPTIONS": json.dumps({"release": "standby", "max_size": 2})}
    cmd = [sys.executable, str(TRAIN), "--model", "mlp", "--data", "digits", "--epochs", "1000",
           "--out", str(tmp_path / "out")]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    joiner_out = tmp_path / "joiner.txt"
    try:
        deadline = time.time() + 60
        while not _report(store):
            assert time.time() < deadline and procs[0].poll() is None, "the leader never reported"
            time.sleep(0.2)
        with open(joiner_out, "w") as out:
            procs.append(subprocess.Popen(cmd, env={**env, "DRA_JOIN": "1", "DRA_JOIN_UID": "10000"}, stdout=out,
                                          stderr=subprocess.STDOUT))
        # The leader looks every second: several dismissals while it stays named.
        deadline = time.time() + 60
        while "dismissed before admission" not in joiner_out.read_text():
            assert time.time() < deadline and procs[1].poll() is None, joiner_out.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(4.0)
        text = joiner_out.read_text()
        assert procs[1].poll() is None, text[-2000:]  # a standby waits on
        assert text.count("dismissed before admission") == 1, text[-2000:]  # before: once per look
        assert _report(store)["members"] == [0]
        store.set("dra/dis/0/capacity", json.dumps({"min_size": 2, "max_size": 2, "leave": []}))
        deadline = time.time() + 60
        while _report(store).get("members") != [0, 10000]:
            assert time.time() < deadline, (_report(store), joiner_out.read_text()[-2000:])
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
