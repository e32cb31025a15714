"""A torchrun DDP script on dra, under `dra run` and under torchrun (issue 22), with real processes,
a real c10d store and real Gloo.

- `dra run` as torchrun's drop-in: its environment against torchrun's, the console prefixes, the
  one `dra` command and its subcommands;
- the ports of examples/ddp/ (six changed lines) run unchanged under both launchers, resize in
  place, and survive kill -9 of a worker and of the leader under `dra run`;
- the launcher's own death: SIGTERM ends the job cleanly (the leader writes the final checkpoint
  after the loop), SIGKILL leaves no worker running; a killed worker's DataLoader workers do not
  keep its connections open;
- the sampler against torch's DistributedSampler, a standby re-admitted in a later epoch;
- several nodes: two network namespaces on torch's c10d rendezvous, one killed; torchrun's crash
  recipe (rendezvous on the dedicated store), no 300 s exit barrier.

Every process a test starts carries an environment token; the test kills exactly those at the end.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from dra.testing import kill_tagged, tagged_processes

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "elastic_workers"
DRA = [sys.executable, "-m", "dra"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
pytestmark = pytest.mark.timeout(240)


class Procs:
    """Processes of one test, found by an environment token (torchrun and `dra run` start their
    workers in sessions of their own); ``close`` kills whatever still runs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = Path(tmp)
        self.token = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen] = {}
        self._files = []

    def env(self, **extra) -> dict[str, str]:
        env = dict(os.environ, DRA_TEST_TOKEN=self.token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                  "TORCHELASTIC_RUN_ID", "DRA_JOIN", "DRA_STOP_ON_SIGTERM", "DRA_LAUNCHER"):
            env.pop(k, None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, name: str, cmd: list[str], cwd: Path | None = None, **env) -> subprocess.Popen:
        out = open(self.tmp / f"{name}.txt", "w")
        self._files.append(out)
        p = subprocess.Popen(cmd, cwd=cwd or self.tmp, env=self.env(**env), stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.txt").read_text()

    def wait(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still runs after {timeout:g} s:\n{self.output(name)[-4000:]}")

    def wait_for(self, what: str, cond, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                outs = "\n".join(f"--- {n} (rc {p.poll()}):\n{self.output(n)[-2500:]}" for n, p in self.procs.items())
                pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n{outs}")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """Every live process carrying this test's token."""
        return tagged_processes("DRA_TEST_TOKEN", self.token)

    def close(self) -> None:
        kill_tagged("DRA_TEST_TOKEN", self.token)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in self._files:
            f.close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.close()


def _records(folder: Path, pattern: str = "log-*.jsonl") -> list[dict]:
    """Every record the workers wrote. Read while they run: a file's last line may be one a worker
    is still writing (read as '{"kind":' in a fresh-clone run), which is left for the next read;
    any other line that is not JSON fails the test."""
    out = []
    for f in sorted(folder.glob(pattern)):
        text = f.read_text()
        lines = text.split("\n")
        if not text.endswith("\n"):
            lines = lines[:-1]  # a line still being written
        out += [json.loads(line) for line in lines if line.strip()]
    return out


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---- the one command ------------------------------------------------------------------------------
def test_one_dra_command_with_every_subcommand_and_the_old_entry_points():
    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))

    top = run(*DRA, "--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("run", "pool", "store", "info", "sim", "bench"))
    assert "--nproc-per-node" in run(*DRA, "run", "--help").stdout
    info = run(*DRA, "info")
    assert info.returncode == 0 and json.loads(info.stdout)["version"]
    assert run(*DRA, "nope").returncode == 2
    # The older entry points: dra-sim, python -m dra.bench, python -m dra.pool.cli.
    bin_dir = Path(sys.executable).parent
    if (bin_dir / "dra-sim").exists():
        assert run(str(bin_dir / "dra-sim"), "--help").returncode == 0
    if (bin_dir / "dra").exists():
        assert "serve" in run(str(bin_dir / "dra"), "pool", "--help").stdout
    assert run(sys.executable, "-m", "dra.bench", "--help").returncode == 0


def test_every_numeric_option_of_dra_run_refuses_a_bad_value_by_name(tmp_path):
    """`dra run --shrink-grace-s -5` (a worker asked back stopped at once, or never: nan, inf) and
    NaN, infinite, zero or negative intervals, timeouts, ranks, ports and stream codes went through
    (or failed later with int()'s message, naming no option). Each is refused before anything
    starts: exit 2, the option and the value named; the values the docs use still run."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*DRA, "run", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))

    cases = [(["--shrink-grace-s", "-5"], "argument --shrink-grace-s: -5 is negative"),
             (["--shrink-grace-s", "nan"], "argument --shrink-grace-s: 'nan' is not finite"),
             (["--shrink-grace-s", "inf"], "argument --shrink-grace-s: 'inf' is not finite"),
             (["--shrink-grace-s", "soon"], "argument --shrink-grace-s: 'soon' is not a number"),
             (["--monitor-interval", "0"], "argument --monitor-interval/--monitor_interval: 0 is not > 0"),
             (["--monitor_interval", "nan"], "argument --monitor-interval/--monitor_interval: 'nan' is not finite"),
             (["--shutdown-timeout", "-1"], "argument --shutdown-timeout/--shutdown_timeout: -1 is negative"),
             (["--shutdown-timeout", "inf"], "argument --shutdown-timeout/--shutdown_timeout: 'inf' is not finite"),
             (["--fence-timeout-s", "0"], "argument --fence-timeout-s: 0 is not > 0"),
             (["--fence-timeout-s=-inf"], "argument --fence-timeout-s: '-inf' is not finite"),
             (["--max-restarts", "-1"], "argument --max-restarts/--max_restarts: -1 is negative"),
             (["--max-restarts", "1.5"], "argument --max-restarts/--max_restarts: '1.5' is not an integer"),
             (["--node-rank", "-1"], "argument --node-rank/--node_rank: -1 is negative"),
             (["--master-port", "70000"], "argument --master-port/--master_port: 70000 is not a port"),
             (["--master-port", "http"], "argument --master-port/--master_port: 'http' is not a port number"),
             (["--tee", "4"], "argument -t/--tee: 4 is not one of 0, 1, 2, 3"),
             (["--tee", "0:3,1:0"], "argument -t/--tee: '0:3,1:0' is not one of 0, 1, 2, 3 (a per-rank map"),
             (["--redirects", "all"], "argument -r/--redirects: 'all' is not one of 0, 1, 2, 3"),
             (["--nproc", "0"], "--nproc-per-node: must be >= 1, got 0; give a number of workers >= 1"),
             (["--nproc", "two"], "--nproc-per-node: expected a number, 'cpu', 'gpu' or 'auto', got 'two'"),
             (["--nnodes", "3:2"], "--nnodes: needs 1 <= MIN <= MAX, got '3:2'"),
             (["--nnodes", "2", "--node-rank", "2", "--master-port", "29500"],
              "--node-rank: 2 is not a node of --nnodes 2; give 0 to 1"),
             (["--nnodes", "2", "--node-rank", "0", "--master-port", "0"], "--master-port: 0 (a free port picked"),
             (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "host:port"],
              "--rdzv-endpoint: expected HOST:PORT with a port 1-65535, got 'host:port'"),
             # A pool job: refused before the pool is called (there is none at this address).
             (["--pool", f"unix:{tmp_path}/none.sock", "--job", "j", "--shrink-grace-s", "-1"],
              "argument --shrink-grace-s: -1 is negative")]
    for args, said in cases:
        r = run(*args, "--", "true")
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "dra-logs").exists()  # nothing started
    # The values the docs and tests use still run a job.
    ok = run("--nproc", "1", "--tee", "0", "--redirects", "3", "--monitor-interval", "0.05", "--shutdown-timeout", "0",
             "--max-restarts", "0", "--fence-timeout-s", "10", "--shrink-grace-s", "0", "--", "true")
    assert ok.returncode == 0, ok.stderr[-2000:]


# ---- torchrun's environment and console ---------------------------------------------------------
ENV_DUMP = """
import json, os, sys
print(json.dumps({k: v for k, v in os.environ.items() if k in json.loads(os.environ["KEYS"])}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
"""
TORCHRUN_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                 "OMP_NUM_THREADS", "DRA_STORE", "DRA_JOB_ID"]


def test_dra_run_gives_workers_torchruns_environment_and_prefixes_their_output(procs, tmp_path):
    script = tmp_path / "env_dump.py"
    script.write_text(ENV_DUMP)
    keys = json.dumps(TORCHRUN_KEYS)
    procs.start("dra", [*DRA, "run", "--nproc-per-node", "2", "--rdzv-id", "envjob", str(script)], KEYS=keys)
    procs.start("torchrun", [*TORCHRUN, "--nproc-per-node", "2", "--standalone", "--tee", "3", str(script)], KEYS=keys)
    assert procs.wait("dra", 120) == 0, procs.output("dra")
    assert procs.wait("torchrun", 120) == 0, procs.output("torchrun")

    def seen(name: str) -> dict[int, dict]:
        out = {}
        for line in procs.output(name).splitlines():
            m = re.match(r"^\[default(\d)\]:(\{.*\})$", line)
            if m:
                out[int(m.group(1))] = json.loads(m.group(2))
        return out

    ours, theirs = seen("dra"), seen("torchrun")
    assert set(ours) == set(theirs) == {0, 1}, procs.output("dra")[-3000:]
    for local_rank in (0, 1):
        mine, torchs = ours[local_rank], theirs[local_rank]
        assert set(torchs) - {"DRA_STORE", "DRA_JOB_ID"} <= set(mine), set(torchs) - set(mine)
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                  "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
            assert mine[k] == torchs[k], (k, mine[k], torchs[k])
        # The script's own init_process_group() and dra use one store: the launcher's.
        assert mine["DRA_STORE"] == f"{mine['MASTER_ADDR']}:{mine['MASTER_PORT']}"
        assert mine["TORCHELASTIC_RUN_ID"] == mine["DRA_JOB_ID"] == "envjob"
    # Console: each worker's lines, stdout and stderr, prefixed as torchrun's --tee does.
    assert "[default0]:to stderr" in procs.output("dra") and "[default1]:to stderr" in procs.output("dra")
    assert (tmp_path / "dra-logs" / "envjob.1.log").read_text().count("to stderr") == 1
    # --redirects 3 (files only): nothing of the workers on the console, everything in the files.
    quiet = procs.start("quiet", [*DRA, "run", "--nproc", "2", "--redirects", "3", "--log-dir", "q", "--",
                                  sys.executable, str(script)], KEYS=keys)
    assert quiet.wait(120) == 0
    assert "[default" not in procs.output("quiet")
    assert "to stderr" in (tmp_path / "q" / "job.0.log").read_text()


def test_the_program_after_the_dashes_is_the_one_that_runs(procs, tmp_path):
    """Another interpreter named after -- runs as given (no fork server of dra's own interpreter);
    a command that is not python runs too; the exit status is torchrun's (1 on a failure)."""
    probe = tmp_path / "which.py"
    probe.write_text("import sys; print('executable', sys.executable, flush=True)\n")
    other = tmp_path / "other-python"
    other.symlink_to(os.path.realpath(sys.executable))  # the same binary, another path: another environment
    p = procs.start("other", [*DRA, "run", "--nproc", "1", "--", str(other), "-I", str(probe)])
    assert p.wait(120) == 0, procs.output("other")
    assert f"executable {other}" in procs.output("other"), procs.output("other")
    fail = procs.start("fail", [*DRA, "run", "--nproc", "2", "--", "sh", "-c", 'exit $((RANK + 3))'])
    assert fail.wait(60) == 1
    assert re.search(r"exitcode\s+: [34] ", procs.output("fail")), procs.output("fail")
    # A job without dra is treated as torchrun treats it: a failure stops the group, which restarts.
    once = 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi; sleep 1; echo "attempt $TORCHELASTIC_RESTART_COUNT"'
    again = procs.start("again", [*DRA, "run", "--nproc", "2", "--max-restarts", "1", "--", "sh", "-c", once])
    assert again.wait(60) == 0, procs.output("again")
    assert "restarting the worker group (1 of 1)" in procs.output("again")
    assert procs.output("again").count("attempt 1") == 2


def test_an_uncaught_exception_on_every_rank_fails_the_job_and_on_one_rank_is_survived(procs, tmp_path):
    """Workers run from dra's fork server: an exception nobody catches must go through
    sys.excepthook there as in an interpreter (dra's hook makes the process leave the job). Printed
    by hand, every process went on to finish the job at exit, and a crash on every rank was
    reported as a finished job with exit status 0 (torchrun: 1)."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, torch\n"
        "import dra, dra.elastic as de\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "torch.manual_seed(0)\n"
        "ds = TensorDataset(torch.randn(128, 4), torch.randint(0, 2, (128,)))\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "sampler = de.DistributedSampler(ds, seed=0)\n"
        "loader = DataLoader(ds, batch_size=8, sampler=sampler)\n"
        "ctl = de.init(model, opt, sampler, policy='none')\n"
        "for ep in ctl.epochs(2):\n"
        "    for x, y in loader:\n"
        "        loss = torch.nn.functional.cross_entropy(ctl.model(x), y)\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n"
        "        st = dra.step(loss)\n"
        "        if st.step == 3 and os.environ['CRASH'] in ('all', str(ctl.uid)):\n"
        "            raise RuntimeError('user bug')\n"
        "        if st.step == 3 and os.environ['CRASH'] == 'exit':\n"
        "            raise SystemExit(1)\n")
    every = procs.start("every", [*DRA, "run", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "a"), str(script)],
                        CRASH="all")
    assert every.wait(120) == 1, procs.output("every")
    assert procs.output("every").count("leaves the job mid-training: uncaught RuntimeError") == 2, procs.output("every")
    assert "job finished at step" not in procs.output("every"), procs.output("every")
    one = procs.start("one", [*DRA, "run", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "b"), str(script)],
                      CRASH="1")
    assert one.wait(120) == 0, procs.output("one")
    assert "survived 1 worker failure(s) in place" in procs.output("one"), procs.output("one")
    # sys.exit(1) on every rank: under dra run the fork server sees the code, and each process leaves
    # the job as after an uncaught exception (dra._lifecycle); the job fails, as torchrun's would.
    gone = procs.start("gone", [*DRA, "run", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "c"), str(script)],
                       CRASH="exit")
    assert gone.wait(120) == 1, procs.output("gone")
    assert procs.output("gone").count("leaves the job mid-training: exit code 1") == 2, procs.output("gone")
    assert "FAILED" in procs.output("gone") and "job finished" not in procs.output("gone"), procs.output("gone")


# ---- the ports ------------------------------------------------------------------------------------
def _code_lines(path: Path) -> list[str]:
    """A script's lines without its module docstring (the example's prose differs, not its code)."""
    text = path.read_text()
    if text.startswith('"""'):
        text = text[text.index('"""', 3) + 3:]
    return text.splitlines()


@pytest.mark.parametrize("name", ["train", "tutorial"])
def test_a_ddp_script_is_ported_in_at_most_six_changed_lines(name):
    before = _code_lines(ROOT / f"examples/ddp/{name}_ddp.py")
    after = _code_lines(ROOT / f"examples/ddp/{name}_dra.py")
    diff = list(difflib.ndiff(before, after))
    added = [line for line in diff if line.startswith("+ ")]
    removed = [line for line in diff if line.startswith("- ")]
    assert len(added) <= 6 and len(removed) <= 6, (added, removed)


def test_the_tutorial_port_under_dra_run_resizes_and_survives_kill_9_of_a_worker_and_of_the_leader(procs, tmp_path):
    """examples/ddp/tutorial_dra.py, unchanged, under `dra run` with one DataLoader worker per
    process: the world grows 2 -> 3 in place, uid 1 is killed with SIGKILL, then the leader (uid 0);
    the job finishes on the survivors, the snapshot is written by the leader of the moment, the
    launcher exits 0."""
    options = {"policy": "none", "start_size": 2, "resize_schedule": {"4": 3}, "fault_timeout_s": 3.0,
               "events_path": str(tmp_path / "events.jsonl")}
    p = procs.start("dra", [*DRA, "run", "--nproc-per-node", "3", "--options", json.dumps(options),
                            str(ROOT / "examples/ddp/tutorial_dra.py"), "--epochs", "6", "--workers", "1",
                            "--batch-size", "16"])
    events = tmp_path / "events.jsonl"

    def started(epoch: int) -> bool:
        return f"epoch {epoch} |" in procs.output("dra") or p.poll() is not None

    procs.wait_for("epoch 1", lambda: started(1), 150)
    pid_of = _worker_pids(procs, "dra")
    assert p.poll() is None
    os.kill(pid_of[1], signal.SIGKILL)
    procs.wait_for("epoch 3", lambda: started(3), 150)
    os.kill(pid_of[0], signal.SIGKILL)  # the leader
    assert procs.wait("dra", 180) == 0, procs.output("dra")[-4000:]
    kinds = [(e["event"], e["after"]) for e in _events(events)]
    assert kinds[:2] == [("start", 2), ("resize", 3)], kinds
    faults = [e for e in _events(events) if e["event"] == "fault"]
    assert [f["left"] for f in faults] == [[1], [0]], faults
    assert faults[-1]["members"] == [2]
    snapshot = torch.load(tmp_path / "snapshot.pt")
    assert snapshot["EPOCHS_RUN"] == 6  # written after the last epoch by uid 2, the last leader
    assert "survived 2 worker failure(s) in place" in procs.output("dra")


def _worker_pids(procs: Procs, name: str) -> dict[int, int]:
    """rank -> pid of the job's training processes, as the launcher reports them."""
    return {int(r): int(pid) for r, pid in re.findall(r"\[dra run\] rank (\d+) \(local \d+\): pid (\d+)", procs.output(name))}


def test_the_ports_run_unchanged_under_torchrun_with_a_resize(procs, tmp_path):
    """Both ports under torchrun, unchanged, with a resize from DRA_OPTIONS; the simple one with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, where rank 0 hosts the store that dra and the script's own
    init_process_group() share (it was EADDRINUSE)."""
    options = {"policy": "none", "start_size": 1, "resize_schedule": {"3": 2}, "events_path": "events.jsonl"}
    a = procs.start("tutorial", [*TORCHRUN, "--nproc-per-node=2", "--standalone", "--max-restarts=0",
                                 str(ROOT / "examples/ddp/tutorial_dra.py"), "--epochs", "2", "--workers", "1"],
                    DRA_OPTIONS=json.dumps(options))
    assert a.wait(180) == 0, procs.output("tutorial")[-4000:]
    assert [(e["event"], e["after"]) for e in _events(tmp_path / "events.jsonl")] == [("start", 1), ("resize", 2)]
    assert torch.load(tmp_path / "snapshot.pt")["EPOCHS_RUN"] == 2
    (tmp_path / "events.jsonl").unlink()
    b = procs.start("simple", [*TORCHRUN, "--nproc-per-node=2", "--standalone", "--max-restarts=0",
                               str(ROOT / "examples/ddp/train_dra.py"), "--epochs", "1", "--workers", "1"],
                    DRA_OPTIONS=json.dumps(options), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    assert b.wait(180) == 0, procs.output("simple")[-4000:]
    assert "EADDRINUSE" not in procs.output("simple") and "address already in use" not in procs.output("simple")


# ---- the launcher's own death --------------------------------------------------------------------
def _checkpoint_job(procs: Procs, tmp_path: Path, name: str, nproc: int, *run_flags: str, **cfg) -> subprocess.Popen:
    cfg = {"out": str(tmp_path), **cfg}
    return procs.start(name, [*DRA, "run", "--nproc", str(nproc), *run_flags, "--",
                              sys.executable, str(WORKERS / "checkpoint_worker.py")], DRA_TEST_CFG=json.dumps(cfg))


def test_after_the_loop_the_last_leader_knows_it_and_writes_the_checkpoint(procs, tmp_path):
    p = _checkpoint_job(procs, tmp_path, "job", 3, dataset=96, epochs=2,
                        options={"policy": "none", "resize_schedule": {"5": 2}})
    assert p.wait(150) == 0, procs.output("job")[-4000:]
    finals = {r["uid"]: r for r in _records(tmp_path) if r["kind"] == "final"}
    assert set(finals) == {0, 1, 2}
    assert [u for u, r in finals.items() if r["saved"]] == [0]  # ctl.rank == 0 after the loop: one writer
    assert finals[0]["leader"] and finals[0]["rank"] == 0 and finals[1]["rank"] == 1
    assert finals[2]["rank"] == -1  # released by the shrink: not in the last world
    ckpt = torch.load(tmp_path / "ckpt.pt")
    assert ckpt["dra"]["step_index"] == finals[0]["step"] == 2 * 96 // 12


def test_sigterm_to_dra_run_ends_the_job_cleanly_with_the_final_checkpoint(procs, tmp_path):
    p = _checkpoint_job(procs, tmp_path, "job", 2, dataset=4000, epochs=5, step_sleep=0.02, workers=1,
                        options={"policy": "none"})
    procs.wait_for("steps", lambda: len([r for r in _records(tmp_path) if r["kind"] == "commit"]) >= 20, 120)
    p.send_signal(signal.SIGTERM)
    assert procs.wait("job", 60) == 1  # torchrun's status after a signal
    finals = {r["uid"]: r for r in _records(tmp_path) if r["kind"] == "final"}
    assert set(finals) == {0, 1}, procs.output("job")[-3000:]
    assert all(r["stopped"] and r["role"] == "finished" for r in finals.values())
    assert finals[0]["step"] == finals[1]["step"] < 5 * 4000 // 8  # the same step everywhere, before the end
    assert torch.load(tmp_path / "ckpt.pt")["dra"]["step_index"] == finals[0]["step"]
    commits = [r for r in _records(tmp_path) if r["kind"] == "commit"]
    assert max(r["step"] for r in commits) == finals[0]["step"] - 1
    assert "the job ended cleanly" in procs.output("job")
    assert not procs.pids(), "a process of the job outlived its launcher"


def test_sigterm_to_dra_run_ends_a_range_loop_script_cleanly_without_a_wrong_snapshot(procs, tmp_path):
    """The tutorial-style script (a `range` epoch loop, a snapshot per epoch): SIGTERM mid-epoch;
    every worker finishes its step and exits 0 at once, and the snapshot is the last complete
    epoch's (the interrupted epoch is not recorded as run)."""
    p = procs.start("dra", [*DRA, "run", "--nproc-per-node", "2", str(ROOT / "examples/ddp/tutorial_dra.py"),
                            "--epochs", "40", "--workers", "0", "--batch-size", "4"])
    procs.wait_for("epoch 2", lambda: "epoch 2 |" in procs.output("dra") or p.poll() is not None, 150)
    p.send_signal(signal.SIGTERM)
    assert procs.wait("dra", 60) == 1
    out = procs.output("dra")
    assert "the job was stopped at step" in out and out.count("ends here (a range epoch loop") == 2, out[-3000:]
    assert re.search(r"exited with", out) is None, out[-3000:]  # no worker failed: both exited 0
    snapshot = torch.load(tmp_path / "snapshot.pt")
    completed = max(int(m) for m in re.findall(r"Epoch (\d+) \| Training snapshot saved", out))
    assert snapshot["EPOCHS_RUN"] == completed + 1 and completed >= 1
    assert not procs.pids()


@pytest.mark.parametrize("zygote", [True, False], ids=["fork_server", "plain"])
def test_sigkill_of_dra_run_leaves_no_worker_running(procs, tmp_path, zygote):
    flags = [] if zygote else ["--no-zygote"]
    p = _checkpoint_job(procs, tmp_path, "job", 2, *flags, dataset=4000, epochs=5, step_sleep=0.02, workers=1,
                        options={"policy": "none"})
    procs.wait_for("steps", lambda: len([r for r in _records(tmp_path) if r["kind"] == "commit"]) >= 10, 120)
    before = procs.pids()
    assert len(before) >= 5, before  # the launcher, 2 workers and their DataLoader workers (and the fork server)
    p.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    p.wait()
    procs.wait_for("every worker to end", lambda: not procs.pids(), 5.0)
    gone_s = time.monotonic() - t0
    assert gone_s < 5.0
    (tmp_path / "orphans.json").write_text(json.dumps({"zygote": zygote, "gone_s": gone_s}))


def test_max_restarts_starts_a_replacement_that_joins_in_place(procs, tmp_path):
    p = _checkpoint_job(procs, tmp_path, "job", 2, "--max-restarts", "1", dataset=3000, epochs=2, step_sleep=0.02,
                        options={"policy": "none", "fault_timeout_s": 3.0, "events_path": str(tmp_path / "events.jsonl")})
    procs.wait_for("steps", lambda: len([r for r in _records(tmp_path) if r["kind"] == "commit"]) >= 20, 120)
    os.kill(_worker_pids(procs, "job")[1], signal.SIGKILL)
    assert p.wait(180) == 0, procs.output("job")[-4000:]
    kinds = [(e["event"], e["members"]) for e in _events(tmp_path / "events.jsonl")]
    assert kinds[:2] == [("start", [0, 1]), ("fault", [0])] and kinds[2] == ("resize", [0, 10000]), kinds
    finals = {r["uid"]: r for r in _records(tmp_path) if r["kind"] == "final"}
    assert set(finals) == {0, 10000} and finals[10000]["rank"] == 1 and finals[0]["saved"]
    assert "replaced by uid 10000" in procs.output("job")


def test_a_killed_workers_dataloader_workers_do_not_delay_its_peers(procs, tmp_path):
    """kill -9 of a worker that has DataLoader workers: its sockets close at once (the DataLoader's
    processes die with it), so the survivors recover in about half the fault timeout, not after a
    collective timeout."""
    fault_timeout = 6.0
    p = _checkpoint_job(procs, tmp_path, "job", 2, dataset=4000, epochs=5, step_sleep=0.02, workers=1,
                        options={"policy": "none", "fault_timeout_s": fault_timeout,
                                 "events_path": str(tmp_path / "events.jsonl")})
    procs.wait_for("steps", lambda: len([r for r in _records(tmp_path) if r["kind"] == "commit"]) >= 20, 120)
    victim = _worker_pids(procs, "job")[1]
    t_kill = time.time()
    os.kill(victim, signal.SIGKILL)
    procs.wait_for("the fault", lambda: any(e["event"] == "fault" for e in _events(tmp_path / "events.jsonl")), 60)
    fault = next(e for e in _events(tmp_path / "events.jsonl") if e["event"] == "fault")
    gap = fault["time"] - t_kill
    (tmp_path / "gap.json").write_text(json.dumps({"gap_s": gap}))
    assert gap < fault_timeout, f"the kill was noticed after {gap:.2f} s (fault timeout {fault_timeout} s)"
    p.send_signal(signal.SIGTERM)
    procs.wait("job", 60)


# ---- the sampler against torch's -----------------------------------------------------------------
def test_the_sampler_yields_torchs_batches_in_a_fixed_world_and_the_eval_loader_ends(procs, tmp_path):
    cfg = {"out": str(tmp_path), "dataset": 200, "batch_size": 8, "epochs": 3, "workers": 1,
           "options": {"policy": "none"}}
    p = procs.start("job", [*DRA, "run", "--nproc", "2", "--", sys.executable, str(WORKERS / "sampler_worker.py")],
                    DRA_TEST_CFG=json.dumps(cfg))
    assert p.wait(150) == 0, procs.output("job")[-4000:]
    recs = {r["uid"]: r for r in (json.loads(f.read_text()) for f in tmp_path.glob("sampler-*.json"))}
    assert set(recs) == {0, 1}
    for uid, rec in recs.items():
        assert rec["peeked"] == 8 and rec["is_sampler"]
        for e in rec["epochs"]:
            assert e["peek"] >= 1
            mine = [s["ids"] for s in e["steps"]]
            full = 200 // 16  # steps whose global batch is whole: torch pads only the last one
            assert mine[:full] == e["torch"][:full], (uid, e["epoch"])
            assert len(mine) == -(-200 // 16)
            assert e["eval"] == e["torch_eval"] and e["len_eval"] == len(e["torch_eval"])  # torch's split, ended
    # Every sample of every epoch exactly once over both ranks (torch's padding is not repeated).
    for epoch in range(3):
        ids = sorted(i for rec in recs.values() for s in rec["epochs"][epoch]["steps"] for i in s["ids"])
        assert ids == list(range(200))


def test_a_standby_readmitted_in_a_later_epoch_catches_up_in_a_range_loop(procs, tmp_path):
    cfg = {"out": str(tmp_path), "dataset": 96, "batch_size": 4, "epochs": 4, "workers": 1, "scheduler": True,
           "options": {"policy": "none", "resize_schedule": {"3": 2, "22": 3}, "fault_timeout_s": 10.0}}  # 8 steps per epoch
    p = procs.start("job", [*DRA, "run", "--nproc", "3", "--", sys.executable, str(WORKERS / "sampler_worker.py")],
                    DRA_TEST_CFG=json.dumps(cfg))
    assert p.wait(180) == 0, procs.output("job")[-4000:]
    recs = {r["uid"]: r for r in (json.loads(f.read_text()) for f in tmp_path.glob("sampler-*.json"))}
    assert set(recs) == {0, 1, 2}
    assert {r["final"]["step"] for r in recs.values()} == {4 * 8}
    standby = recs[2]
    trained = sorted({s["data_epoch"] for e in standby["epochs"] for s in e["steps"]})
    assert trained[0] == 0 and 1 not in trained and 3 in trained, trained  # left in epoch 0, back in epoch 2
    for epoch in range(4):
        ids = sorted(i for rec in recs.values() for e in rec["epochs"] for s in e["steps"] if s["data_epoch"] == epoch
                     for i in s["ids"])
        assert ids == list(range(96)), epoch
    _one_learning_rate_and_state(recs, 4)


def _one_learning_rate_and_state(recs: dict, epochs: int) -> None:
    """Every member ends with the world's learning rate (a per-epoch StepLR, halved at each epoch's
    end) and bit-identical parameters."""
    finals = [r["final"] for r in recs.values() if r["final"]["role"] == "member"]
    assert len(finals) == len(recs), [r["final"]["role"] for r in recs.values()]
    assert {f["lr"] for f in finals} == {0.01 * 0.5 ** epochs}, {u: r["final"]["lr"] for u, r in recs.items()}
    assert all(f["params"] == finals[0]["params"] for f in finals), "the members' parameters differ"


@pytest.mark.parametrize("after", [16, 19])
def test_a_joiner_in_a_range_loop_steps_the_epochs_scheduler_with_the_world(procs, tmp_path, after: int):
    """A joiner walks its `range` loop from epoch 0; each epoch the world has finished is a pass
    that trains nothing, and the code after it (``ctl.scheduler.step()``) used to run as well: its
    learning rate was halved once more per missed epoch and its parameters parted from the world's,
    silently. Admitted at an epoch's end (after 16 steps: the members end that epoch after the
    admission, and so does the joiner) and mid-epoch (after 19)."""
    cfg = {"out": str(tmp_path), "dataset": 96, "batch_size": 4, "epochs": 4, "workers": 0, "scheduler": True,
           "options": {"policy": "none", "start_size": 2, "resize_schedule": {str(after): 3},
                       "fault_timeout_s": 10.0}}  # 8 steps per epoch
    p = procs.start("job", [*DRA, "run", "--nproc", "3", "--", sys.executable, str(WORKERS / "sampler_worker.py")],
                    DRA_TEST_CFG=json.dumps(cfg))
    assert p.wait(180) == 0, procs.output("job")[-4000:]
    recs = {r["uid"]: r for r in (json.loads(f.read_text()) for f in tmp_path.glob("sampler-*.json"))}
    assert set(recs) == {0, 1, 2}
    joined = sorted({s["data_epoch"] for e in recs[2]["epochs"] for s in e["steps"]})
    assert joined == [2, 3], joined
    for epoch in range(4):
        ids = sorted(i for rec in recs.values() for e in rec["epochs"] for s in e["steps"] if s["data_epoch"] == epoch
                     for i in s["ids"])
        assert ids == list(range(96)), epoch
    _one_learning_rate_and_state(recs, 4)


def test_the_sampler_outside_an_elastic_job_is_torchs():
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    import dra.elastic as de

    data = TensorDataset(torch.arange(53))
    for kw in ({}, {"shuffle": False}, {"drop_last": True}, {"seed": 9}):
        for world, rank in ((1, 0), (3, 2), (4, 1)):
            ours = de.DistributedSampler(data, num_replicas=world, rank=rank, **kw)
            theirs = TorchSampler(data, num_replicas=world, rank=rank, **kw)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs) and len(ours) == len(theirs), (kw, world, rank, epoch)
            a = [b[0].tolist() for b in DataLoader(data, batch_size=5, sampler=ours)]
            b = [b[0].tolist() for b in DataLoader(data, batch_size=5, sampler=theirs)]
            assert a == b
    with pytest.raises(ValueError, match="rank"):
        de.DistributedSampler(data, num_replicas=2, rank=2)
    # The training sampler's split is the world's: refused before the controller joins anything.
    net = torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="num_replicas"):
        de.init(net, torch.optim.SGD(net.parameters(), lr=0.1), de.DistributedSampler(data, num_replicas=1).batches(4)
                .sampler)


# ---- several nodes ---------------------------------------------------------------------------------
def _store(procs: Procs, name: str, cmd_prefix: list[str] | None = None, host: str = "127.0.0.1") -> int:
    """A dedicated `dra store` (its port, once it listens)."""
    procs.start(name, [*(cmd_prefix or []), *DRA, "store", "--port", "0", "--host", host])
    procs.wait_for("the store", lambda: "listening" in procs.output(name), 60)
    return int(procs.output(name).split("listening on ")[1].split()[0].rsplit(":", 1)[1])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2")
def test_two_nodes_in_network_namespaces_one_killed_the_other_goes_on(procs, tmp_path):
    """Two `dra run` nodes in their own network namespaces (veth, a bridge) on torch's c10d
    rendezvous at a dedicated store in a third; the node of the leader is killed (SIGKILL of its
    launcher): its workers are gone at once, the other node's shrink in place, finish, and their
    launcher exits 0 without waiting for the dead one."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dra_bench._netns import RateLimitedLan

    with RateLimitedLan(3, "10gbit", subnet=214) as lan:
        port = _store(procs, "store", lan.command(0, []), host="0.0.0.0")
        endpoint = f"{lan.addresses[0]}:{port}"
        cfg = {"out": str(tmp_path), "dataset": 3000, "epochs": 3, "step_sleep": 0.02, "workers": 1,
               "options": {"policy": "none", "fault_timeout_s": 3.0, "events_path": str(tmp_path / "events.jsonl")}}
        nodes = []
        for node in (1, 2):
            nodes.append(procs.start(f"node{node}", lan.command(node, [
                *DRA, "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                endpoint, "--rdzv-id", "twonodes", "--local-addr", lan.addresses[node], "--log-dir", f"logs{node}",
                "--", sys.executable, str(WORKERS / "checkpoint_worker.py")]),
                DRA_TEST_CFG=json.dumps(cfg), GLOO_SOCKET_IFNAME="eth0"))
        procs.wait_for("steps", lambda: len([r for r in _records(tmp_path) if r["kind"] == "commit"]) >= 30, 150)
        starts = {r["uid"]: r["pid"] for r in _records(tmp_path) if r["kind"] == "start"}
        leader_node = next(i for i, n in enumerate(nodes) if "node 0 of 2" in procs.output(f"node{i + 1}"))
        dead, alive = nodes[leader_node], nodes[1 - leader_node]
        dead.send_signal(signal.SIGKILL)
        procs.wait_for("the dead node's worker to end", lambda: _zombie(starts[0]), 5.0)
        # The survivor's launcher is timed from the end of its training (its final record), not
        # from the kill: the rest of the training takes what the host gives it.
        procs.wait_for("the survivor's final record",
                       lambda: any(r["kind"] == "final" for r in _records(tmp_path)) or alive.poll() is not None, 150)
        t0 = time.monotonic()
        assert alive.wait(150) == 0, procs.output(f"node{2 - leader_node}")[-4000:]
        survivor_s = time.monotonic() - t0
        faults = [e for e in _events(tmp_path / "events.jsonl") if e["event"] == "fault"]
        assert faults and faults[-1]["members"] == [1], faults
        finals = {r["uid"]: r for r in _records(tmp_path) if r["kind"] == "final"}
        assert set(finals) == {1} and finals[1]["saved"]
        assert survivor_s < 120


def test_torchruns_crash_recipe_survives_the_loss_of_the_first_agent_without_the_exit_barrier(procs, tmp_path):
    """docs/guide/launch.md's torchrun recipe, as written: one agent per process, the rendezvous
    and the job on a dedicated `dra store`. The first agent (the one that would host the
    rendezvous) is killed with its worker: the others go on, finish, and their agents exit at once
    (the job's leader checks torchrun's exit barrier in for everyone; it would wait 300 s)."""
    port = _store(procs, "store")
    cfg = {"out": str(tmp_path), "dataset": 2000, "epochs": 2, "step_sleep": 0.02,
           "options": {"policy": "none", "fault_timeout_s": 3.0, "events_path": str(tmp_path / "events.jsonl")}}
    agents = []
    for i in range(3):
        agents.append(procs.start(f"agent{i}", [
            *TORCHRUN, "--nnodes=3", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=recipe", "--max-restarts=0",
            f"--local-addr=127.0.0.{i + 1}", str(WORKERS / "checkpoint_worker.py")],
            DRA_TEST_CFG=json.dumps(cfg), DRA_STORE=f"127.0.0.1:{port}", DRA_JOB_ID="recipe",
            OMP_NUM_THREADS="1"))
        time.sleep(0.3)  # agent 0 first: the one that would host the rendezvous without a dedicated store
    procs.wait_for("steps", lambda: len([r for r in _records(tmp_path) if r["kind"] == "commit"]) >= 20, 150)
    starts = {r["uid"]: r["pid"] for r in _records(tmp_path) if r["kind"] == "start"}
    # The node of rank 0 is lost: its agent (the group's first, the one hosting torchrun's own worker
    # store) and its worker (which dies with its agent; killed here too, as a lost node would be).
    victim = 0
    first = next(i for i, a in enumerate(agents) if a.pid == _parent_of(starts[victim]))
    agents[first].send_signal(signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(starts[victim], signal.SIGKILL)
    # Timed from the end of training (both survivors' final records), not from the kill: the rest
    # of the training and the recovery take what the host gives them; the barrier would add 300 s.
    procs.wait_for("the survivors' final records",
                   lambda: len([r for r in _records(tmp_path) if r["kind"] == "final"]) >= 2, 180)
    t0 = time.monotonic()
    for i, a in enumerate(agents):
        if i != first:
            assert a.wait(120) == 0, procs.output(f"agent{i}")[-4000:]
    assert time.monotonic() - t0 < 90, "the agents sat in torchrun's exit barrier"
    faults = [e for e in _events(tmp_path / "events.jsonl") if e["event"] == "fault"]
    assert faults and victim in faults[0]["left"], faults
    finals = {r["uid"]: r for r in _records(tmp_path) if r["kind"] == "final"}
    assert len(finals) == 2 and sum(r["saved"] for r in finals.values()) == 1


def _parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
