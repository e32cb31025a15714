"""`dra run` as a torchrun user runs it (a second outside review of the launcher), each case a
defect found and fixed:

- two one-node launches in one folder with the default run id: the second is refused, naming the
  first and the fix (both ran, and each console printed the other job's lines as its own);
- an error file left by an earlier run was reported as this run's failure;
- ``--master-port`` on one node was ignored (a random port), as torchrun does not;
- an endpoint that takes connections but is no store held the launcher past ``join_timeout``,
  silent;
- the script's ``__file__`` under the fork server was the path as typed (Python makes it absolute).

Real ``dra run`` processes on loopback; every process a test starts carries an environment token
and is killed at the end.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from _launch_harness import _env

DRA = [sys.executable, "-m", "dra", "run"]
pytestmark = pytest.mark.timeout(150)


def test_a_second_launch_with_the_same_run_id_and_folder_is_refused_while_the_first_runs(tmp_path, token):
    (tmp_path / "slow.py").write_text("import sys, time\nfor i in range(40):\n    print('A', i, flush=True)\n"
                                      "    time.sleep(0.25)\n")
    (tmp_path / "quick.py").write_text("print('B done')\n")
    first = subprocess.Popen([*DRA, "--nproc", "1", "slow.py"], cwd=tmp_path, env=_env(token), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "dra-logs" / "job.0.log").exists():
            assert time.monotonic() < deadline and first.poll() is None, "the first launch never started its worker"
            time.sleep(0.1)
        second = subprocess.run([*DRA, "--nproc", "1", "quick.py"], cwd=tmp_path, env=_env(token), text=True,
                                capture_output=True, timeout=60)
        assert second.returncode == 1, second.stderr  # refused, as a port in use is
        assert f"another dra run (pid {first.pid})" in second.stderr and "--rdzv-id" in second.stderr, second.stderr
        assert "B done" not in (tmp_path / "dra-logs" / "job.0.log").read_text()
        # Its own run id (or log folder) runs beside the first.
        apart = subprocess.run([*DRA, "--nproc", "1", "--rdzv-id", "b", "quick.py"], cwd=tmp_path, env=_env(token),
                               text=True, capture_output=True, timeout=90)
        assert apart.returncode == 0 and "B done" in apart.stdout, apart.stderr
        assert "A " not in apart.stdout
    finally:
        out, _ = first.communicate(timeout=90)
    assert first.returncode == 0, out
    assert "B done" not in out
    # The lock goes with its launcher: the next launch in the folder runs.
    again = subprocess.run([*DRA, "--nproc", "1", "quick.py"], cwd=tmp_path, env=_env(token), text=True,
                           capture_output=True, timeout=90)
    assert again.returncode == 0, again.stderr


def test_an_earlier_runs_error_file_is_not_this_runs_error(tmp_path, token):
    (tmp_path / "rec.py").write_text(
        "import os\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    if os.environ.get('MODE') == 'raise':\n"
        "        raise RuntimeError('boom from the earlier run')\n"
        "    os.kill(os.getpid(), 9)\n"
        "main()\n")
    env = _env(token)
    earlier = subprocess.run([*DRA, "--nproc", "1", "rec.py"], cwd=tmp_path, env=dict(env, MODE="raise"), text=True,
                             capture_output=True, timeout=90)
    assert earlier.returncode == 1 and "boom from the earlier run" in earlier.stderr + earlier.stdout
    killed = subprocess.run([*DRA, "--nproc", "1", "rec.py"], cwd=tmp_path, env=env, text=True, capture_output=True,
                            timeout=90)
    assert killed.returncode == 1
    assert "SIGKILL" in killed.stderr, killed.stderr
    assert "boom from the earlier run" not in killed.stderr + killed.stdout, killed.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_master_port_on_one_node_is_the_stores_port_and_a_held_one_is_refused(tmp_path, token):
    (tmp_path / "port.py").write_text("import os\nprint('MASTER_PORT', os.environ['MASTER_PORT'], flush=True)\n")
    port = _free_port()
    run = subprocess.run([*DRA, "--nproc", "1", "--master-port", str(port), "port.py"], cwd=tmp_path, env=_env(token),
                         text=True, capture_output=True, timeout=90)
    assert run.returncode == 0, run.stderr
    assert f"MASTER_PORT {port}" in run.stdout, run.stdout
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        refused = subprocess.run([*DRA, "--nproc", "1", "--rdzv-id", "held", "--master-port", str(taken), "port.py"],
                                 cwd=tmp_path, env=_env(token), text=True, capture_output=True, timeout=90)
    assert refused.returncode == 1, refused.stderr
    assert f"--master-port {taken}" in refused.stderr and "is in use" in refused.stderr, refused.stderr


def test_an_endpoint_that_is_no_store_ends_the_launch_after_join_timeout(tmp_path, token):
    (tmp_path / "port.py").write_text("print('never')\n")
    with socket.socket() as mute:  # takes connections, never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        endpoint = f"127.0.0.1:{mute.getsockname()[1]}"
        start = time.monotonic()
        run = subprocess.run([*DRA, "--nproc", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                              "--rdzv-conf", "join_timeout=3", "port.py"], cwd=tmp_path, env=_env(token), text=True,
                             capture_output=True, timeout=120)
        took = time.monotonic() - start
    assert run.returncode == 1, run.stderr
    assert "never" not in run.stdout
    assert took < 90, took  # join_timeout 3 s + 30 s of slack, and the launcher's start
    assert endpoint in run.stderr, run.stderr


def test_the_scripts_file_is_absolute_as_pythons_own(tmp_path, token):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "info.py").write_text("import os, sys\nprint('FILE', __file__, flush=True)\n"
                                              "print('ARGV0', sys.argv[0], flush=True)\n")
    run = subprocess.run([*DRA, "--nproc", "1", "sub/info.py"], cwd=tmp_path, env=_env(token), text=True,
                         capture_output=True, timeout=90)
    assert run.returncode == 0, run.stderr
    assert f"FILE {tmp_path / 'sub' / 'info.py'}" in run.stdout, run.stdout
    # sys.argv[0] names the same file (absolute: runpy sets it to the path it runs; Python keeps it as typed)
    assert f"ARGV0 {tmp_path / 'sub' / 'info.py'}" in run.stdout, run.stdout
