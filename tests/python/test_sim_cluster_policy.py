"""A cluster policy written in Python and run by dra's simulator (dra.sim.add_cluster_policy):
it divides the cluster among jobs from what a real scheduler knows, is run under the same rules
as pollux and tiresias on a shipped workload, and its mistakes are refused naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dra.sim

WORKLOAD = "data/pollux/workloads/workload-6.csv"
pytestmark = pytest.mark.timeout(300)


def _example_policy():
    """The shipped plugin's policy function (examples/sim/equal_share.py; loading it registers it
    as 'equal_share', which is taken back here so each test registers its own names)."""
    import runpy

    dra.sim.remove_cluster_policy("equal_share")  # a name left registered would make the file's call raise
    module = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "sim" / "equal_share.py"))
    dra.sim.remove_cluster_policy("equal_share")
    return module["equal_share"]


equal_share = _example_policy()


@pytest.fixture
def registered():
    names = []

    def add(name, decide, **kw):
        dra.sim.add_cluster_policy(name, decide, **kw)
        names.append(name)

    yield add
    for n in names:
        dra.sim.remove_cluster_policy(n)


def test_a_python_cluster_policy_runs_beside_pollux_and_tiresias_and_sees_only_observables(registered):
    seen = []

    def spy(inputs):
        seen.append((inputs.now, inputs.capacity, [dict(j) for j in inputs.jobs],
                     [inputs.goodput(i, 2) for i in range(len(inputs.jobs))]))
        return equal_share(inputs)

    registered("py_equal_share", spy, summary="equal shares", in_place=True)
    assert "py_equal_share" in dra.sim.sim_policy_names()
    out = dra.sim.replay(WORKLOAD, policies=["py_equal_share", "pollux", "tiresias"], resamples=50)
    mine, pollux, tiresias = (out["policies"][p] for p in ("py_equal_share", "pollux", "tiresias"))
    assert mine["completed"] == mine["jobs"] == pollux["jobs"] and mine["unfinished"] == 0, mine
    # Its own numbers, not another policy's under its name.
    assert mine["avg_jct_s"] not in (pollux["avg_jct_s"], tiresias["avg_jct_s"])
    assert 0.5 * pollux["avg_jct_s"] < mine["avg_jct_s"] < 3.0 * pollux["avg_jct_s"], (mine, pollux)
    allocated = out["timelines"]["py_equal_share"]["allocated"]
    assert allocated and max(allocated) <= 64 and max(allocated) > 32, max(allocated)
    assert seen and all(cap == 64 for _, cap, _, _ in seen)
    keys = set(seen[-1][2][0])
    assert keys == {"name", "job_class", "submit_s", "requested_replicas", "requested_batch", "declared_epochs",
                    "max_devices", "devices", "restarts", "attained_device_s", "epochs_done", "work_done",
                    "last_batch"}, keys
    assert any(g > 0 for *_, gs in seen for g in gs)  # goodput predictions once jobs measured
    # cost_mode="system" reads its mechanism from the registration (in place).
    assert dra.sim.costs_by_policy(["py_equal_share"], "system", in_place_cost=2.0) == {"py_equal_share": 2.0}


@pytest.mark.parametrize(
    ("decide", "message"),
    [
        (lambda inputs: [inputs.capacity] * len(inputs.jobs) if len(inputs.jobs) > 1 else [1], "devices in all"),
        (lambda inputs: [-1] * len(inputs.jobs), "counts"),
        (lambda inputs: [1.5] * len(inputs.jobs), "1.5 among its counts; give each job an integer"),
        (lambda inputs: [True] * len(inputs.jobs), "True among its counts"),
        (lambda inputs: "all", "'all'; return a list of one device count"),
        (lambda inputs: [10**12] * len(inputs.jobs), "1000000000000 devices for a job"),
        (lambda inputs: [], "counts"),
        (lambda inputs: 1 / 0, "ZeroDivisionError"),
    ],
    ids=["over_capacity", "negative", "float", "bool", "string", "huge", "too_few", "raises"],
)
def test_a_first_draft_is_refused_naming_the_policy(registered, decide, message):
    registered("py_draft", decide)
    with pytest.raises((ValueError, RuntimeError)) as err:
        dra.sim.replay(WORKLOAD, policies=["py_draft"], resamples=10, jobs_detail=False)
    assert "'py_draft'" in str(err.value) and message in str(err.value), str(err.value)


def test_bad_registrations_are_refused_and_an_unknown_name_lists_the_added_ones(registered):
    with pytest.raises(TypeError, match="not callable"):
        dra.sim.add_cluster_policy("py_x", 3)
    with pytest.raises(ValueError):
        dra.sim.add_cluster_policy("pollux", equal_share)  # a built-in name is taken
    registered("py_listed", equal_share)
    with pytest.raises(ValueError, match="py_listed"):
        dra.sim.replay(WORKLOAD, policies=["nope"])
    dra.sim.remove_cluster_policy("py_listed")
    assert "py_listed" not in dra.sim.sim_policy_names()
    with pytest.raises(ValueError, match="unknown 'py_listed'"):
        dra.sim.replay(WORKLOAD, policies=["py_listed"])


def test_the_study_calls_a_python_policy_without_holding_the_gil_itself(registered):
    # The study releases the GIL while it simulates; the policy is called with it taken back.
    registered("py_equal_share", equal_share)
    out = dra.sim.study(runs=2, seed=5, policies=["py_equal_share", "pollux"], shared_cluster=True,
                        jobs_per_cluster=20)
    assert {"py_equal_share", "pollux", "static_request"} <= set(out["policies"]), list(out["policies"])


def _dra_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra.sim.cli", *args], capture_output=True, text=True, timeout=120)


def test_the_command_line_runs_a_plugins_policy_and_refuses_a_bad_plugin_at_once(tmp_path):
    plugin = tmp_path / "equal.py"
    plugin.write_text(textwrap.dedent("""
        import dra.sim

        def equal_share(inputs):
            share = inputs.capacity // max(1, len(inputs.jobs))
            return [min(share, j["max_devices"]) for j in inputs.jobs]

        dra.sim.add_cluster_policy("cli_equal_share", equal_share, "equal shares")
    """))
    out = tmp_path / "out.json"
    proc = _dra_sim("replay", "--plugin", str(plugin), "--policy", "cli_equal_share", "--policy", "pollux",
                    "--workload", WORKLOAD, "--quiet", "--no-jobs", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    runs = doc[0] if isinstance(doc, list) else doc
    assert runs["policies"]["cli_equal_share"]["completed"] == 160, runs["policies"]["cli_equal_share"]
    assert "| cli_equal_share | 160/160 |" in proc.stdout
    # Without the plugin the name is no choice; a missing, failing or empty plugin is refused at once.
    proc = _dra_sim("replay", "--policy", "cli_equal_share", "--workload", WORKLOAD)
    assert proc.returncode == 2 and "invalid choice: 'cli_equal_share'" in proc.stderr, proc.stderr
    (tmp_path / "bad.py").write_text("x = 1 / 0\n")
    (tmp_path / "empty.py").write_text("x = 1\n")
    for arg, says in ((str(tmp_path / "none.py"), "is not a file"),
                      (str(tmp_path / "bad.py"), "failed: ZeroDivisionError: division by zero"),
                      (str(tmp_path / "empty.py"), "registered no policy; call dra.sim.add_cluster_policy")):
        proc = _dra_sim("study", f"--plugin={arg}", "--runs", "2")
        assert proc.returncode == 2 and f"argument --plugin: {arg}" in proc.stderr.replace(repr(arg), arg), proc.stderr
        assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_plugin_that_fails_mid_run_is_said_on_a_line_of_its_own_after_the_progress(tmp_path):
    # The error used to follow the open progress line on the same line ("... 0/160 jobs done
    # dra-sim: error: ..."), and so did a traceback.
    plugin = tmp_path / "late.py"
    plugin.write_text(textwrap.dedent("""
        import dra.sim

        def late(inputs):
            if inputs.now > 3600:
                raise ValueError("boom")
            return [min(1, j["max_devices"]) for j in inputs.jobs]

        dra.sim.add_cluster_policy("cli_late", late, "fails after an hour")
    """))
    proc = _dra_sim("replay", "--plugin", str(plugin), "--policy", "cli_late", "--workload", WORKLOAD, "--no-jobs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "[dra-sim] " in proc.stderr, proc.stderr  # its progress was shown
    lines = proc.stderr.split("\n")
    said = [line for line in lines if "dra-sim: error:" in line]
    assert len(said) == 1 and said[0].startswith("dra-sim: error: --policy cli_late"), proc.stderr[-2000:]
    assert "at t = " in said[0] and "boom" in said[0]


def test_inputs_kept_past_the_call_raise_instead_of_reading_freed_memory(registered):
    # A policy that kept its inputs (self.prev = inputs) read a later call's data during the run
    # and garbage after it (a capacity of -1778091392, then MemoryError).
    kept = []

    def keeps(inputs):
        kept.append(inputs)
        return equal_share(inputs)

    registered("py_keeps", keeps)
    dra.sim.replay(WORKLOAD, policies=["py_keeps"], resamples=10, jobs_detail=False)
    assert len(kept) > 2
    for attr in ("jobs", "capacity", "nodes", "devices_per_node", "now"):
        with pytest.raises(RuntimeError, match=r"^inputs: used after the decision it was given to returned"):
            getattr(kept[0], attr)
    with pytest.raises(RuntimeError, match="used after"):
        kept[-1].goodput(0, 1)

    def reads_the_last(inputs):  # during the run: refused at the first such read, naming the policy
        if kept:
            _ = kept[0].capacity
        kept[:] = [inputs]
        return equal_share(inputs)

    kept.clear()
    registered("py_reads_the_last", reads_the_last)
    with pytest.raises(RuntimeError, match=r"'py_reads_the_last' at t = \d+ s: .*inputs: used after the decision"):
        dra.sim.replay(WORKLOAD, policies=["py_reads_the_last"], resamples=10, jobs_detail=False)


def test_numpy_integers_are_device_counts_and_a_negative_index_is_named(registered):
    import numpy as np

    registered("py_ints", equal_share)
    registered("py_numpy", lambda inputs: np.asarray(equal_share(inputs), dtype=np.int64))
    registered("py_numpy_items", lambda inputs: [np.int32(c) for c in equal_share(inputs)])
    out = dra.sim.replay(WORKLOAD, policies=["py_ints", "py_numpy", "py_numpy_items"], resamples=10, jobs_detail=False)
    jct = {p: out["policies"][p]["avg_jct_s"] for p in ("py_ints", "py_numpy", "py_numpy_items")}
    assert jct["py_numpy"] == jct["py_ints"] == jct["py_numpy_items"], jct
    registered("py_float_numpy", lambda inputs: np.asarray(equal_share(inputs), dtype=np.float64))
    with pytest.raises(ValueError, match=r"np.float64\(\d+.0\) among its counts; give each job an integer"):
        dra.sim.replay(WORKLOAD, policies=["py_float_numpy"], resamples=10, jobs_detail=False)
    registered("py_negative_index", lambda inputs: [inputs.goodput(-1, 1)] and equal_share(inputs))
    with pytest.raises(RuntimeError, match=r"i: goodput asked about job -1 of \d+; use an index of inputs.jobs"):
        dra.sim.replay(WORKLOAD, policies=["py_negative_index"], resamples=10, jobs_detail=False)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_inside_a_policy_stops_the_run_as_itself(registered, raised):
    # Ctrl-C in a slow Python policy came out as RuntimeError ("... KeyboardInterrupt: ...; fix its
    # decide function"), and dra-sim exited 2 telling the user to fix their function.
    def interrupted(inputs):
        if inputs.now > 600:
            raise raised()
        return equal_share(inputs)

    registered("py_interrupted", interrupted)
    with pytest.raises(raised):
        dra.sim.replay(WORKLOAD, policies=["py_interrupted"], resamples=10, jobs_detail=False)
    # ... and the next run is untouched by it.
    registered("py_after", equal_share)
    assert dra.sim.replay(WORKLOAD, policies=["py_after"], resamples=10, jobs_detail=False)["policies"]["py_after"][
        "completed"] == 160


def test_the_shipped_plugin_runs_as_the_guide_shows(tmp_path):
    out = tmp_path / "out.json"
    plugin = Path(__file__).resolve().parents[2] / "examples" / "sim" / "equal_share.py"
    proc = _dra_sim("replay", "--plugin", str(plugin), "--policy", "equal_share", "--policy",
                    "pollux", "--workload", WORKLOAD, "--quiet", "--no-jobs", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    runs = doc[0] if isinstance(doc, list) else doc
    assert runs["policies"]["equal_share"]["completed"] == 160
    assert round(runs["policies"]["equal_share"]["avg_jct_s"]) == 3240  # the figure simulator.md gives
