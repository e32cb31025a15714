"""Crash survival under torchrun: several agents ("nodes") sharing one c10d rendezvous.

torchrun's agent watches only its own node's workers: when one of them fails it stops that
node's other workers and exits (``LocalElasticAgent._invoke_run``, state FAILED with
``--max-restarts=0``), but the other nodes' agents only react to nodes *joining* the rendezvous
(``rdzv_handler.num_nodes_waiting()``), not to one leaving. So a worker killed on node B takes
node B's workers down, and dra's fault path lets node A's workers shrink and go on, provided
node A hosts both stores: the c10d rendezvous store (``--rdzv-conf=is_host=1`` on A) and the
workers' TCPStore at MASTER_ADDR:MASTER_PORT, which the agent of group rank 0 hosts (group
ranks follow the sorted ``--local-addr``: 127.0.0.1 for A, 127.0.0.2, ... for the others).

Each test runs real torchrun agents, each with real worker processes
(tests/python/elastic_workers/torchrun_fault_worker.py), kills one worker with SIGKILL at a
deterministic point (inside the step the file ``at-<uid>-<step>`` names; the peers wait in that
step's gradient all-reduce), and asserts on what the workers logged and on what the agents did.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _elastic_harness import check_exactly_once, free_port

HERE = Path(__file__).resolve().parent
WORKER = HERE / "elastic_workers" / "torchrun_fault_worker.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # what the `torchrun` entry point runs
N, EPOCHS, GLOBAL_BATCH = 192, 2, 16
STEPS = EPOCHS * N // GLOBAL_BATCH
pytestmark = pytest.mark.timeout(180)


class TorchrunNodes:
    """One torchrun agent per emulated node on loopback; node 0 hosts both stores.

    Every process started here (agents and, through them, their workers) carries a unique
    environment token, so ``close`` finds and kills exactly these processes, whatever state
    they are in (torchrun starts each worker in its own session)."""

    def __init__(self, tmp: Path, nproc_per_node: list[int], **cfg) -> None:
        self.tmp = Path(tmp)
        self.layout = list(nproc_per_node)
        self.cfg = {"out": str(self.tmp), "dataset_size": N, "global_batch": GLOBAL_BATCH, "epochs": EPOCHS, **cfg}
        self.token = uuid.uuid4().hex
        self.port = free_port()
        self.agents: list[subprocess.Popen] = []
        self._outs = []

    def start(self) -> None:
        for node, nproc in enumerate(self.layout):
            cmd = [
                *TORCHRUN, f"--nnodes={len(self.layout)}", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id=job-{self.token[:8]}",
                f"--rdzv-conf=is_host={1 if node == 0 else 0}", f"--local-addr=127.0.0.{node + 1}",
                "--max-restarts=0", str(WORKER),
            ]
            env = dict(os.environ)
            env.update({"DRA_TEST_CFG": json.dumps(self.cfg), "DRA_TORCHRUN_TEST_TOKEN": self.token,
                        "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1"})
            env.pop("DRA_JOB_ID", None)  # the run id is torchrun's --rdzv-id
            out = open(self.tmp / f"agent-{node}.txt", "w")
            self._outs.append(out)
            self.agents.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))

    def first_rank(self, node: int) -> int:
        return sum(self.layout[:node])

    def ranks(self, node: int) -> list[int]:
        return list(range(self.first_rank(node), self.first_rank(node) + self.layout[node]))

    def output(self, node: int) -> str:
        return (self.tmp / f"agent-{node}.txt").read_text()

    def records(self, kind: str | None = None) -> list[dict]:
        out = []
        for f in sorted(self.tmp.glob("log-*.jsonl")):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                if kind is None or rec["kind"] == kind:
                    out.append(rec)
        return out

    def events(self) -> list[dict]:
        path = self.tmp / "events.jsonl"
        return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []

    def wait_for(self, what: str, cond, timeout: float) -> None:
        """Polls `cond` until true; fails naming `what` (with the agents' output) at the deadline."""
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() >= deadline:
                tails = "\n".join(f"--- agent {i} (rc {a.poll()}):\n{self.output(i)[-3000:]}" for i, a in enumerate(self.agents))
                pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{tails}")
            time.sleep(0.02)

    def _our_pids(self) -> list[int]:
        needle = f"DRA_TORCHRUN_TEST_TOKEN={self.token}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                pass
        return pids

    def close(self) -> None:
        for pid in self._our_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for a in self.agents:
            if a.poll() is None:
                a.kill()
            a.wait()
        for out in self._outs:
            out.close()


def _gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize(
    "layout, victim",
    [
        # 2 nodes x 2 workers: rank 3 (node 1's second worker) dies; node 1's agent stops rank 2.
        # Known hole (reported to the lead): if rank 2 reaches the recovery first and claims
        # fault/<epoch>/decider before its agent's SIGTERM lands, nobody publishes the result
        # and the survivors fail with TimeoutError after 2 * fault_timeout_s + 5 s. Not seen in
        # 9 runs here; forced by delaying ranks 0 and 1, it reproduces.
        ([2, 2], 3),
        # one agent per process (the finest grain): rank 2 dies alone; nodes 0, 1 and 3 go on.
        ([1, 1, 1, 1], 2),
    ],
    ids=["2nodes_x2", "4nodes_x1"],
)
def test_worker_killed_on_one_node_others_shrink_and_finish(tmp_path, layout, victim):
    kill_step = 5
    job = TorchrunNodes(tmp_path, layout, victim=victim, kill_step=kill_step, fault_timeout_s=2.0)
    dead_node = next(n for n in range(len(layout)) if victim in job.ranks(n))
    dead_ranks = set(job.ranks(dead_node))
    survivors = set(range(sum(layout))) - dead_ranks
    survivor_nodes = [n for n in range(len(layout)) if n != dead_node]
    try:
        job.start()
        marker = tmp_path / f"at-{victim}-{kill_step}"
        job.wait_for(f"rank {victim} to reach step {kill_step}", lambda: marker.exists() or any(a.poll() is not None for a in job.agents), 120)
        assert all(a.poll() is None for a in job.agents), "an agent ended before the fault was injected"
        os.kill(int(marker.read_text()), signal.SIGKILL)

        # The dead node's agent stops its other workers and exits non-zero (max-restarts=0).
        dead_agent = job.agents[dead_node]
        job.wait_for(f"node {dead_node}'s agent to exit", lambda: dead_agent.poll() is not None, 60)
        assert dead_agent.returncode != 0
        text = job.output(dead_node)
        # torchrun's failure summary: the victim is the root cause, killed by SIGKILL.
        assert re.search(rf"Root Cause.*?rank\s+: {victim} \(local_rank: \d+\)\s+exitcode\s+: -9 ", text, re.S), text[-3000:]
        hellos = {r["uid"]: r for r in job.records("hello")}
        assert set(hellos) == set(range(sum(layout)))
        assert all(_gone(hellos[u]["pid"]) for u in dead_ranks), "a worker of the failed node still runs"

        # The other nodes' workers finish training: every local worker exited 0 (the agent's
        # SUCCEEDED state needs all of them), then the agent waits in its exit barrier for the
        # dead node's agent (LocalElasticAgent's exit_barrier_timeout, 300 s, no torchrun flag).
        for n in survivor_nodes:
            job.wait_for(f"node {n}'s workers to finish", lambda n=n: "worker group successfully finished" in job.output(n), 90)
        assert all(job.agents[n].poll() is None for n in survivor_nodes), "expected the survivors' agents in their exit barrier"

        # Both stores lived on node 0 (the workers' TCPStore is the group-rank-0 agent's).
        assert {h["env"]["MASTER_ADDR"] for h in hellos.values()} == {"127.0.0.1"}
        assert {h["env"]["TORCHELASTIC_USE_AGENT_STORE"] for h in hellos.values()} == {"True"}
        assert all(int(h["env"]["GROUP_RANK"]) == n for n in range(len(layout)) for u, h in hellos.items() if u in job.ranks(n))

        faults = [e for e in job.events() if e["event"] == "fault"]
        assert faults, job.events()
        assert all(f["reason"].startswith("peer failure") for f in faults)
        left = {u for f in faults for u in f["left"]}
        if dead_ranks == {victim}:
            # Nobody else on the victim's node: one fault, naming the victim.
            assert [f["left"] for f in faults] == [[victim]]
        else:
            # The agent SIGTERMs the victim's node-mate about 0.1 s (its monitor interval)
            # after the SIGKILL, racing with the recovery: the node-mate may die before checking
            # in (one fault event, both ranks in `left`), after the survivors' next world was
            # built (two events), or in between, while that world is being built. In the last
            # case the controller retries from the failed intermediate world and its event
            # names only the node-mate (before = 3, left = [node-mate]): the victim appears in
            # no event (reported to the lead; then this becomes `left == dead_ranks`).
            assert left and left <= dead_ranks, faults
        assert faults[-1]["after"] == len(survivors) and set(faults[-1]["members"]) == survivors
        assert faults[0]["step"] == kill_step, "the interrupted step is redone, not skipped"
        assert all(e["params_identical"] is True for e in job.events() if e["event"] in ("start", "fault"))
        check_exactly_once(job, N, EPOCHS)
        finals = {r["uid"]: r for r in job.records("final")}
        assert set(finals) == survivors
        assert {r["step"] for r in finals.values()} == {STEPS}
        assert {r["role"] for r in finals.values()} == {"finished"}
        assert len({r["digest"] for r in finals.values()}) == 1, "survivors ended with different parameters"
    finally:
        job.close()


def test_worker_killed_on_the_store_node_ends_the_job_with_a_clear_error(tmp_path):
    # Node 0's agent hosts the workers' store (and here the rendezvous store): when one of its
    # workers dies it stops the others and exits, and the store goes with it. The other node's
    # workers cannot agree on survivors without a store: they fail with an error naming it
    # (bounded by the store and fault timeouts), and their agent exits non-zero too.
    job = TorchrunNodes(tmp_path, [2, 2], victim=1, kill_step=5, fault_timeout_s=2.0)
    try:
        job.start()
        marker = tmp_path / "at-1-5"
        job.wait_for("rank 1 to reach step 5", lambda: marker.exists() or any(a.poll() is not None for a in job.agents), 120)
        assert all(a.poll() is None for a in job.agents), "an agent ended before the fault was injected"
        os.kill(int(marker.read_text()), signal.SIGKILL)
        job.wait_for("both agents to exit", lambda: all(a.poll() is not None for a in job.agents), 60)
        assert job.agents[0].returncode != 0 and job.agents[1].returncode != 0
        ports = {h["env"]["MASTER_PORT"] for h in job.records("hello")}
        assert len(ports) == 1
        address = f"127.0.0.1:{ports.pop()}"
        store_errors = [l for l in job.output(1).splitlines() if f"store at {address}" in l]
        assert store_errors, job.output(1)[-3000:]
        assert not job.records("final"), "nobody can finish without the store"
    finally:
        job.close()
