"""Scripts without dra in the pool: a plain command (a shell loop, a script of one's own, a
torchrun-style program) is run at the size it started at. It is never grown (a second process
would run the whole script again on its own) and a worker that ended by itself is not replaced
(its part is done). An outside review found both: one such job rerun its script over and over
for more than 90 s. A job that formed a dra world is still resized (test_pool_scaling.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool.server import PoolClient, PoolServer
from dra.pool.service import PoolService


def declared(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def _events(state: Path) -> list[dict]:
    return [json.loads(x) for x in (state / "events.jsonl").read_text().splitlines()]


def _run(tmp_path: Path, devices: int, specs: list[dict], before: Callable[[Path], None] | None = None) -> tuple[dict, dict, list[dict]]:
    """Runs the jobs of ``specs`` (submitted in order; ``before(client)`` runs after the first)
    on a real pool of ``devices`` CPU slots with real launchers: (their end states, their
    reasons, the pool's events)."""
    state = tmp_path / "state"
    server = PoolServer(PoolService(declared(devices), state, heartbeat_timeout_s=5.0)).start()
    client = PoolClient(server.url)
    try:
        for i, spec in enumerate(specs):
            if i == 1 and before is not None:
                before(state)
            client.submit({"cwd": str(tmp_path), "log": str(tmp_path / "logs"), **spec})
        states = client.wait([s["name"] for s in specs], timeout_s=75)
        reasons = {j["name"]: j.get("reason") for j in client.status()["jobs"]}
    finally:
        server.close()
    return states, reasons, _events(state)


def _results(tmp_path: Path, job: str) -> list[str]:
    """The RESULT lines the job's workers printed, sorted."""
    return sorted(line for log in (tmp_path / "logs").glob(f"{job}.*.log") for line in log.read_text().splitlines()
                  if line.startswith("RESULT"))


def _script(marker: Path, rank0_s: float, rank1_s: float) -> list[str]:
    """Appends one line per start (its RANK, WORLD_SIZE and DRA_JOIN) to ``marker``, then sleeps:
    rank 0 for ``rank0_s``, every other rank for ``rank1_s``."""
    code = (f"import os, time\n"
            f"with open({str(marker)!r}, 'a') as f:\n"
            f"    f.write(' '.join(os.environ.get(k, '-') for k in ('RANK', 'WORLD_SIZE', 'DRA_JOIN')) + '\\n')\n"
            f"time.sleep({rank0_s} if os.environ['RANK'] == '0' and not os.environ.get('DRA_JOIN') else {rank1_s})\n")
    return [sys.executable, "-c", code]


@pytest.mark.timeout(90)
def test_a_plain_script_whose_worker_ends_first_is_not_run_again(tmp_path: Path) -> None:
    """Rank 1 of a 2-worker plain script exits 0 at once, rank 0 runs for 12 s. The lease rank 1
    gave back was granted again and a new worker ran the script from its start (as a world of
    one), then again when that one ended: the job looped. Now the job ends when rank 0 does, after
    exactly the two starts of its first world, and its devices are not granted again."""
    marker = tmp_path / "starts.txt"
    t0 = time.time()
    states, _, events = _run(tmp_path, 2, [{"name": "plain", "min_size": 1, "max_size": 2,
                                            "command": _script(marker, 12.0, 0.0)}])
    took = time.time() - t0
    assert states == {"plain": "finished"}, states
    starts = marker.read_text().splitlines()
    assert sorted(starts) == ["0 2 -", "1 2 -"], starts
    grants = [e for e in events if e["event"] == "grant" and e["job"] == "plain"]
    assert len(grants) == 2, grants
    assert took < 40, took


@pytest.mark.timeout(90)
def test_a_plain_script_is_not_grown_when_devices_free_up(tmp_path: Path) -> None:
    """A plain script admitted at 1 worker (the other device busy) was grown when the device came
    free: its launcher started a second process that ran the whole script again as a world of its
    own, beside the first. Now the job keeps its one worker; the device stays free."""
    marker = tmp_path / "starts.txt"

    def held(state: Path) -> None:  # the other device is busy when the plain script starts
        deadline = time.time() + 30
        while time.time() < deadline and not any(e["event"] == "grant" for e in _events(state)):
            time.sleep(0.05)

    # The other job holds its device until the plain script has started, and 3 s more (a fixed
    # `sleep 6` could end before the plain job was admitted on a loaded host: it then got both
    # devices at once, and the test saw a world of 2 it had not meant to make); bounded at 60 s.
    hold = f"for i in $(seq 600); do [ -s {marker} ] && break; sleep 0.1; done; sleep 3"
    states, _, events = _run(tmp_path, 2, [{"name": "hold", "command": ["sh", "-c", hold]},
                                           {"name": "plain", "min_size": 1, "max_size": 2,
                                            "command": _script(marker, 12.0, 12.0)}], before=held)
    assert states == {"hold": "finished", "plain": "finished"}, states
    grants = [e for e in events if e["event"] == "grant" and e["job"] == "plain"]
    starts = marker.read_text().splitlines()
    assert starts == ["0 1 -"], (starts, grants)
    assert len(grants) == 1, grants


_TORCHRUN_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")  # from the environment, as under torchrun
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
weights = [torch.zeros(5) for _ in range(world)]
dist.all_gather(weights, torch.cat([p.detach().flatten() for p in model.parameters()]))
same = all(torch.equal(weights[0], w) for w in weights)
print("RESULT", rank, world, os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"], same, flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(90)
def test_a_script_written_for_torchrun_runs_on_the_pool_unchanged(tmp_path: Path) -> None:
    """A DDP script that calls init_process_group() from the environment failed on the pool at
    once ("environment variable MASTER_ADDR expected, but not set"): the launcher set RANK and
    WORLD_SIZE only. It now sets what torchrun's agent sets (MASTER_ADDR and MASTER_PORT of the
    job's store, used as the agent's store, LOCAL_RANK, LOCAL_WORLD_SIZE, ...): the script trains
    on 2 devices and its replicas agree."""
    states, reasons, _ = _run(tmp_path, 2, [{"name": "ddp", "min_size": 2, "max_size": 2,
                                             "command": [sys.executable, "-c", _TORCHRUN_SCRIPT]}])
    assert states == {"ddp": "finished"}, reasons
    lines = _results(tmp_path, "ddp")
    assert lines == ["RESULT 0 2 0 1 True", "RESULT 1 2 0 1 True"], lines


_SPAWN_SCRIPT = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, world):
    os.environ["MASTER_ADDR"] = "localhost"  # the PyTorch DDP tutorial's setup()
    os.environ["MASTER_PORT"] = sys.argv[1]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    sys.stdout.write(f"RESULT {rank} {t.item()}\\n")  # one write: print's pieces of two processes interleave
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
"""


@pytest.mark.timeout(90)
def test_a_script_that_spawns_its_own_world_on_one_lease_still_meets(tmp_path: Path) -> None:
    """The DDP tutorial's way: one process sets MASTER_ADDR and MASTER_PORT itself and starts its
    own workers with torch.multiprocessing.spawn. The agent store announced for torchrun-style
    scripts (TORCHELASTIC_USE_AGENT_STORE) must not reach a world of one, or that script's rank 0
    would not host the store its workers meet at, and they would wait for it until the timeout."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "spawn_ddp.py"  # a file: spawned processes import their function from it
    script.write_text(_SPAWN_SCRIPT)
    states, reasons, _ = _run(tmp_path, 1, [{"name": "spawn", "command": [sys.executable, str(script), str(port)]}])
    assert states == {"spawn": "finished"}, reasons
    lines = _results(tmp_path, "spawn")
    assert lines == ["RESULT 0 3.0", "RESULT 1 3.0"], lines
