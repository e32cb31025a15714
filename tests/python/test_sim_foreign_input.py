"""dra-sim fed inputs the project never shipped (an outside review): each case was a hang, a
traceback, a silent wrong result or a message that named neither the value nor the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _sim_harness import HEADER, _csv, _refused

import dra.sim as sim
from dra import _sim
from dra.sim import cli


def test_arrivals_far_from_zero_skip_the_idle_ticks():
    """Unix timestamps as times: the simulator ticked every interval from 0 (28 million ticks for
    1.7e9 s; 1e12 s ended in std::bad_alloc after minutes). Idle ticks are skipped on the grid, so a
    shift by a multiple of the interval gives the same JCT, a few ticks in."""
    profiles = sim.load_profiles()
    job = {"name": "a", "submit_s": 107.0, "application": "cifar10", "replicas": 2, "batch": 2048.0}
    ticks: list[float] = []

    def progress(now: float, done: int, total: int) -> bool:
        ticks.append(now)
        return len(ticks) < 500

    base = _sim.sim_run(profiles, [job], "static", 30.0, 60.0, 16, 4, record_timeline=False)
    far = _sim.sim_run(profiles, [dict(job, submit_s=107.0 + 1_000_000_000_020)], "static", 30.0, 60.0, 16, 4,
                       record_timeline=False, progress=progress)
    assert far["all_completed"] and far["jobs"][0]["jct_s"] == pytest.approx(base["jobs"][0]["jct_s"], abs=1e-3)
    assert len(ticks) < 500


def test_a_job_arriving_after_the_horizon_is_refused_by_line(tmp_path, capsys):
    """A job 31 days after the first was reported 'unfinished' with advice to add devices: it can
    never run, since a simulation stops 30 days after the first arrival."""
    w = _csv(tmp_path, ["a,0,cifar10,2,2048", "b,2678400,cifar10,2,2048"])
    out = tmp_path / "o.json"
    _refused(capsys, ["replay", "--workload", str(w), "--quiet", "--json", str(out)], "line 3 job 'b'", "30 days")
    assert not out.exists()


def test_a_workload_that_is_not_utf8_names_file_and_line(tmp_path, capsys):
    """A Latin-1 job name failed with Python's bare "'utf-8' codec can't decode byte 0xe9"."""
    w = tmp_path / "latin1.csv"
    w.write_bytes(HEADER.encode() + b"\na,0,cifar10,2,2048\ncaf\xe9,0,cifar10,2,2048\n")
    _refused(capsys, ["replay", "--workload", str(w), "--quiet"], f"{w}:3:", "0xe9", "UTF-8")
    _refused(capsys, ["study", "--runs", "1", "--quiet", "--workloads", str(w)], f"{w}:3:", "UTF-8")


def test_a_line_of_spaces_is_blank(tmp_path):
    """A trailing line of spaces was 'expected 5 comma-separated fields like the header, got 1'."""
    plain = _csv(tmp_path, ["a,0,cifar10,2,2048"], "plain.csv")
    spaced = _csv(tmp_path, ["a,0,cifar10,2,2048", "   \t", ""], "spaced.csv", end="\r\n  \n")
    a = sim.replay(plain, policies=["static"], jobs_detail=False)["policies"]["static"]
    b = sim.replay(spaced, policies=["static"], jobs_detail=False)["policies"]["static"]
    assert a["avg_jct_s"] == b["avg_jct_s"] and b["jobs"] == 1


def test_numbers_too_large_are_named_so(tmp_path, capsys):
    """A 400-digit number was 'not a plain decimal number; write digits...' (it is digits), printed
    whole; num_replicas 2000000 was told 'num_replicas must be >= 1'."""
    huge = "9" * 400
    w = _csv(tmp_path, [f"a,{huge},cifar10,2,2048"])
    err = _refused(capsys, ["replay", "--workload", str(w), "--quiet"], "column 'time'", "too large")
    assert huge not in err
    w = _csv(tmp_path, ["a,0,cifar10,2000000,2048"], "reps.csv")
    _refused(capsys, ["replay", "--workload", str(w), "--quiet"], "num_replicas 2000000 is outside [1, 1048576]")
    w = _csv(tmp_path, ["a,0,cifar10,99999999999999999999,2048"], "reps2.csv")
    _refused(capsys, ["replay", "--workload", str(w), "--quiet"], "too large an integer")
    with pytest.raises(SystemExit):
        cli.main(["replay", "--workload", str(w), "--interval", huge])
    assert "too large" in capsys.readouterr().err
    with pytest.raises(ValueError, match="too large"):
        sim.parse_cost(huge)


def test_an_interval_longer_than_a_day_is_refused(tmp_path, capsys):
    """--interval 100000000 ran, no job ever started, and the warning advised more devices."""
    w = _csv(tmp_path, ["a,0,cifar10,2,2048"])
    with pytest.raises(SystemExit):
        cli.main(["replay", "--workload", str(w), "--quiet", "--interval", "100000000"])
    assert "above the bound 86400" in capsys.readouterr().err


def test_a_study_pool_with_declarations_is_refused(tmp_path, capsys):
    """The study silently ignored a --workloads file's declared_epochs column."""
    w = _csv(tmp_path, ["a,0,cifar10,2,2048,3"], header=HEADER + ",declared_epochs")
    _refused(capsys, ["study", "--runs", "1", "--quiet", "--workloads", str(w)], "declared_epochs", "drop the column")


def test_a_declaration_other_than_declared_epochs_is_refused_by_name(tmp_path, capsys):
    """A foreign CSV's declared_steps column was silently ignored, and its jobs then declared their
    exact budget (the default): the one declaration the simulator reads is declared_epochs."""
    for column in ("declared_steps", "Declared_Epochs", "declaredEpochs", "declared epochs"):
        w = _csv(tmp_path, ["a,0,cifar10,2,2048,500"], f"{column}.csv", header=f"{HEADER},{column}")
        out = tmp_path / "o.json"
        _refused(capsys, ["replay", "--workload", str(w), "--quiet", "--json", str(out)], f"{w}:1: column '{column}'",
                 "accepts only declared_epochs", "drop the column")
        assert not out.exists()
        with pytest.raises(ValueError, match=f"column '{column}'"):
            sim.read_workload(w)
    ok = _csv(tmp_path, ["a,0,cifar10,2,2048,7"], "ok.csv", header=f"{HEADER},declared_epochs")
    assert sim.read_workload(ok)[0]["declared_epochs"] == 7.0


def test_unwritable_outputs_are_refused_before_simulating(tmp_path, capsys):
    """--json '' was silently ignored; --json under /proc failed after the simulation with a bare
    '[Errno 2]'; dra-sim rl --plots on a file ended in a FileExistsError traceback."""
    w = _csv(tmp_path, ["a,0,cifar10,2,2048"])
    a_file = tmp_path / "file"
    a_file.write_text("x")
    base = ["replay", "--workload", str(w), "--quiet", "--policy", "static"]
    _refused(capsys, [*base, "--json", ""], "--json", "empty")
    _refused(capsys, [*base, "--markdown", str(a_file / "x.md")], "--markdown", "is a file")
    if Path("/proc/self").is_dir():
        _refused(capsys, [*base, "--json", "/proc/x.json"], "--json", "cannot create files in /proc")
    _refused(capsys, ["rl", "--steps", "5", "--quiet", "--json", str(tmp_path / "r.json"), "--plots", str(a_file)],
             "--plots", "is a file")
    assert not (tmp_path / "r.json").exists()


def test_duplicate_names_reordered_and_extra_columns_change_nothing(tmp_path):
    """Foreign layouts that already worked, kept working: columns in another order with extra ones,
    repeated job names, rows out of arrival order, a BOM and CRLF line ends."""
    rows = ["a,107,cifar10,6,2048", "b,110,deepspeech2,6,320", "c,135,ncf,1,32768"]
    base = _csv(tmp_path, rows, "base.csv")
    other = tmp_path / "other.csv"
    cells = [r.split(",") for r in rows]
    lines = ["user,batch_size,application,time,num_replicas,name"]
    lines += [f"u,{c[4]},{c[2]},{c[1]},{c[3]},job" for c in reversed(cells)]
    other.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    a = sim.replay(base, policies=["static", "pollux"])
    b = sim.replay(other, policies=["static", "pollux"])
    for p in ("static", "pollux"):
        assert a["policies"][p]["avg_jct_s"] == b["policies"][p]["avg_jct_s"]
    assert sorted(j["jct_s"] for j in a["jobs"]) == sorted(j["jct_s"] for j in b["jobs"])
    json.dumps(b)


def test_the_unfinished_warning_names_a_reallocation_cost_that_keeps_jobs_from_finishing(tmp_path):
    """--reallocation-cost 100000000000: no job finished, and the warning advised only more devices.
    A cost past the simulation's 30 days is refused now; one of 30 days still keeps jobs from ending."""
    w = _csv(tmp_path, ["a,0,cifar10,2,2048"])
    with pytest.raises(ValueError, match=r"reallocation_cost_s: must lie in \[0, max_time_s"):
        sim.replay(w, policies=["static"], reallocation_cost="100000000000", jobs_detail=False)
    doc = sim.replay(w, policies=["static"], reallocation_cost="2592000", jobs_detail=False)
    note = sim.unfinished_note(doc)
    assert "static 1 of 1" in note and "smaller --reallocation-cost (2.592e+06 s per change" in note
    assert "reallocation-cost" not in sim.unfinished_note(sim.replay(w, policies=["static"], jobs_detail=False))


def test_a_report_that_cannot_be_written_whole_leaves_the_earlier_one_and_no_debris(tmp_path):
    # write_json (every dra-sim / dra-sim rl / bench report) writes beside the target and renames:
    # a failure part way (here a value JSON cannot hold) leaves the earlier report as it was.
    from dra._jsonio import write_json

    path = tmp_path / "report.json"
    write_json({"avg_jct_s": 1.5, "p99": float("inf")}, path)
    before = path.read_text()
    assert json.loads(before) == {"avg_jct_s": 1.5, "p99": None}
    with pytest.raises(TypeError):
        write_json({"avg_jct_s": 2.0, "bad": object()}, path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_control_characters_are_refused_and_shown_visibly(tmp_path, capsys):
    """A NUL inside a job name was accepted (and reached the reports); a tab before a number was
    refused with the tab printed invisibly ('	107'). Both are now named with escapes."""
    w = _csv(tmp_path, ["job\x001,0,cifar10,2,2048"], "nul.csv")
    _refused(capsys, ["replay", "--workload", str(w), "--quiet"], "column 'name' (1): 'job\\x001' holds a control "
             "character (\\x00)")
    w = _csv(tmp_path, ["a,\t107x,cifar10,2,2048"], "tab.csv")
    _refused(capsys, ["replay", "--workload", str(w), "--quiet"], "'\\t107x' is not a plain decimal number")


# -- A second outside review of foreign workloads and traces --------------------------------------


@pytest.mark.parametrize("time", ["1700000000000000000", "99999999999999999999999999999"])
def test_an_arrival_in_nanoseconds_is_refused_naming_the_unit(tmp_path, capsys, time):
    """A Unix timestamp in ns: at 1.7e18 s adding the 60 s interval left the time unchanged, so
    pollux never ended and the others reported a 0 s JCT and a utilisation of 1.4e11; at 1e29 the
    first arrival was refused as arriving 30 days after itself."""
    w = _csv(tmp_path, [f"a,{time},cifar10,2,2048", f"b,{time},cifar10,2,2048"])
    _refused(capsys, ["replay", "--workload", str(w), "--policy", "pollux", "--quiet"], "w.csv:2:", "past 1e13 s",
             "nanoseconds", "subtract the first arrival")
    job = {"name": "a", "submit_s": 1.7e18, "application": "cifar10", "replicas": 2, "batch": 2048.0}
    with pytest.raises(ValueError, match="submit_s"):  # an embedder's jobs, past the CSV's checks
        _sim.sim_run(sim.load_profiles(), [job], "static", 30.0, 60.0, 16, 4, record_timeline=False)


def test_a_repeated_job_name_is_made_unique_by_its_line_and_said(tmp_path, capsys):
    """Two jobs named j1 gave records, plots and messages that could not tell them apart."""
    w = _csv(tmp_path, ["j1,0,cifar10,2,2048", "j2,10,cifar10,2,2048", "j1,20,ncf,1,32768"])
    capsys.readouterr()
    doc = sim.replay(str(w), policies=["static"], quiet=True)
    assert sorted(j["name"] for j in doc["jobs"]) == ["j1", "j1@4", "j2"]
    assert "1 job name(s) repeat an earlier one; each is named by its line: j1@4" in capsys.readouterr().err


def _trace(tmp_path: Path, file: str, column: str, change) -> Path:
    """A copy of the shipped cifar10 profile as application 'toy', one column of one file changed."""
    import csv
    import shutil

    root = tmp_path / "traces"
    shutil.copytree(sim.default_data_dir() / "traces" / "cifar10", root / "toy")
    path = root / "toy" / file
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        row[column] = str(change(i, row))
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    return root


@pytest.mark.parametrize(("file", "column", "change", "needle"), [
    ("placements.csv", "sync_time", lambda i, r: 3 * float(r["step_time"]), "the sync is part of the step"),
    ("scalability.csv", "step_time", lambda i, r: -1, "must be > 0 seconds"),
    ("validation-128.csv", "progress", lambda i, r: 0, "grow every epoch"),
    ("validation-128.csv", "progress", lambda i, r: 1000 - i, "grow every epoch"),
    ("validation-128.csv", "grad_var", lambda i, r: -1, "each >= 0"),
])
def test_a_profile_that_cannot_be_is_refused_naming_file_line_and_column(tmp_path, capsys, file, column, change,
                                                                          needle):
    """Foreign profiles were read unchecked: progress 0 made 100 epochs free (JCT 90 s), a sync
    longer than its step gave a utilisation of -1.96, a negative step time left every job
    unfinished with advice to add devices."""
    traces = _trace(tmp_path, file, column, change)
    w = _csv(tmp_path, ["a,0,toy,2,256"])
    _refused(capsys, ["replay", "--workload", str(w), "--traces", str(traces), "--quiet"], file, column, needle)


def test_the_system_view_charges_every_jobs_first_start_alike(tmp_path):
    """--cost-mode system charged each job's launch at its system's resize cost: 30 s for static
    and Pollux jobs, 0.23 s for dra's, although a launch is no cheaper under in-place resizing."""
    w = _csv(tmp_path, ["a,0,cifar10,4,512"])
    same = sim.replay(str(w), policies=["static"], quiet=True)
    system = sim.replay(str(w), policies=["static", "convergence_aware"], cost_mode="system", quiet=True)
    assert system["launch_cost_s"] == same["launch_cost_s"] == 30.0
    assert system["policies"]["static"]["avg_jct_s"] == pytest.approx(same["policies"]["static"]["avg_jct_s"])
    job = {"name": "a", "submit_s": 0.0, "application": "cifar10", "replicas": 4, "batch": 512.0}
    profiles = sim.load_profiles()
    cheap = _sim.sim_run(profiles, [job], "static", 0.23, 60.0, 16, 4, record_timeline=False)
    launched = _sim.sim_run(profiles, [job], "static", 0.23, 60.0, 16, 4, record_timeline=False, launch_cost_s=30.0)
    assert launched["jobs"][0]["jct_s"] == pytest.approx(cheap["jobs"][0]["jct_s"] + 30.0 - 0.23, abs=1.0)


def test_a_job_whose_patience_ends_at_its_last_epoch_did_not_stop_early():
    """stopped_early was set whenever patience ran out, at the last epoch too (ncf, 10 of 10)."""
    profiles = sim.load_profiles()
    jobs = _sim.sim_read_workload(str(sim.default_data_dir() / "workloads" / "workload-1.csv"), profiles)
    result = _sim.sim_run(profiles, jobs, "static", 30.0, 60.0, 16, 4, record_timeline=False, early_stop_share=1.0)
    ended = [j for j in result["jobs"] if j["completion_s"] is not None]
    assert any(j["stopped_early"] for j in ended)
    for j in ended:
        if j["stopped_early"]:
            assert j["epochs"] < profiles.info(j["application"])["max_epochs"], j


def test_a_replay_at_exact_declarations_says_so(tmp_path):
    w = _csv(tmp_path, ["a,0,cifar10,4,512"])
    exact = sim.markdown_replay(sim.replay(str(w), policies=["static"], quiet=True))
    drawn = sim.markdown_replay(sim.replay(str(w), policies=["static"], declared_sigma=0.5, quiet=True))
    assert "Every job declares its exact budget" in exact and "Every job declares" not in drawn
