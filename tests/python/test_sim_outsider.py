"""dra-sim defects an outside reviewer found (notes/review-sim-outsider.md): a shared-cluster study
that lost runs at the horizon silently (utilisation above 1), replays of requests the profiles
cannot represent, outputs that overwrote inputs, a plugin's traceback, a repeated --policy, files
written unannounced and a wrong $DRA_SIM_DATA ignored."""

from __future__ import annotations

import json
import textwrap

import pytest
from _sim_harness import _csv, _refused

import dra.sim as sim
from dra.sim import cli
from dra.sim._replay import check_workload

pytestmark = pytest.mark.timeout(300)


# D1: the shared-cluster study and the 30-day horizon.


def test_the_shared_study_refuses_pool_rows_at_or_past_the_horizon(tmp_path, capsys):
    """A pool row 5,000,000 s after the first became a run that never started (rc 0, 'target
    reached 0.500', nothing said); replay refused the same file. Refused as replay refuses it."""
    late = _csv(tmp_path, ["a,0,cifar10,2,256", "b,5000000,cifar10,2,256"], "late.csv")
    out = tmp_path / "o.json"
    err = _refused(capsys, ["study", "--runs", "2", "--shared-cluster", "--jobs-per-cluster", "2", "--workloads",
                            str(late), "--quiet", "--json", str(out)], str(late), "line 3 job 'b'", "30 days",
                   "split the workload")
    assert not out.exists()
    replay_err = _refused(capsys, ["replay", "--workload", str(late), "--quiet"])
    assert err == replay_err  # one check, one message
    # Alone, each run starts at 0 whatever its row's time: nothing to refuse.
    alone = sim.study(1, workloads=[late], policies=["static"], resamples=10, jobs_detail=False)
    assert alone["policies"]["static_request"]["completed"] == 1


def test_unfinished_shared_runs_are_announced_and_utilisation_stays_at_most_one(tmp_path, capsys):
    """400 one-device imagenet runs on the 64-device cluster: 80 never finished in 30 days. Nothing
    was said, the table had no finished column, and utilisation was 1.033 (the busy time of the
    unfinished runs over a span ending at the last finished one)."""
    pool = _csv(tmp_path, ["im,0,imagenet,1,200", "im2,60,imagenet,1,200"], "pool.csv")
    out, md = tmp_path / "o.json", tmp_path / "o.md"
    capsys.readouterr()
    assert cli.main(["study", "--runs", "400", "--shared-cluster", "--jobs-per-cluster", "400", "--policy", "static",
                     "--workloads", str(pool), "--resamples", "10", "--no-jobs", "--quiet", "--json", str(out),
                     "--markdown", str(md)]) == 0
    err = capsys.readouterr().err
    doc = json.loads(out.read_text())
    for p, a in doc["policies"].items():
        assert 0 < a["utilization"] <= 1.0, (p, a["utilization"])
        assert all(u <= 1.0 for u in a["cluster_utilization_by_cluster"]), (p, a["cluster_utilization_by_cluster"])
    short = doc["policies"]["static_request"]
    assert 0 < short["unfinished"] == short["runs"] - short["completed"], short
    assert short["end_s"] == pytest.approx(30 * 86400.0)
    assert "runs unfinished at the horizon" in err and f"static_request {short['unfinished']} of 400" in err, err
    text = md.read_text()
    assert "runs unfinished at the horizon" in text and f"| static_request | {short['completed']}/400 |" in text, text


# D2: replay refuses what the study refuses.


def test_replay_refuses_requests_the_profiles_cannot_represent(tmp_path, capsys):
    """64 devices at batch 128 (2 samples a device, cifar10 measures 32 at least) ran with a clamped
    step time and a changed batch; 128 devices ran as 64 (the profiles stop there) at twice the
    GPU-hours. Both are refused as the study refuses them, by file, line, job, value and fix."""
    thin = _csv(tmp_path, ["ok,0,cifar10,4,128", "smallb,0,cifar10,64,128"], "thin.csv")
    out = tmp_path / "o.json"
    _refused(capsys, ["replay", "--workload", str(thin), "--quiet", "--json", str(out)], str(thin),
             "line 3 job 'smallb' requests 64 devices at batch 128, at most 4", "lower num_replicas or raise batch_size")
    assert not out.exists()
    with pytest.raises(ValueError, match="line 3 job 'smallb' requests 64 devices at batch 128, at most 4"):
        sim.study(1, workloads=[thin], resamples=10)  # the same check
    wide = _csv(tmp_path, ["c128,0,cifar10,128,4096"], "wide.csv")
    _refused(capsys, ["replay", "--workload", str(wide), "--nodes", "64", "--quiet", "--json", str(out)], str(wide),
             "line 2 job 'c128' requests 128 devices", "measures at most 64", "lower num_replicas to at most 64")
    assert not out.exists()
    ok = _csv(tmp_path, ["c64,0,cifar10,64,4096"], "ok.csv")
    assert len(check_workload(ok, sim.load_profiles(), nodes=64)) == 1


def test_every_shipped_workload_passes_the_replay_checks():
    """The 32 shipped workloads (every one --all-loads and the benchmarks replay) hold no such row."""
    profiles = sim.load_profiles()
    root = sim.default_data_dir()
    files = [root / f / f"workload-{i}.csv" for f in ("workloads-0.5", "workloads", "workloads-1.5", "workloads-2.0")
             for i in range(1, 9)]
    assert all(f.is_file() for f in files)
    for f in files:
        assert check_workload(f, profiles)


# D4: outputs that are inputs or each other.


def test_an_output_path_that_is_an_input_or_another_output_is_refused(tmp_path, capsys, monkeypatch):
    """--json over the workload CSV replaced it with JSON (rc 0); --json and --markdown on one path
    kept only the markdown. Compared resolved: ./w.csv and w.csv are one file."""
    monkeypatch.chdir(tmp_path)
    w = _csv(tmp_path, ["a,0,cifar10,2,256"], "w.csv")
    before = w.read_text()
    _refused(capsys, ["replay", "--workload", "w.csv", "--policy", "static", "--quiet", "--json", "./w.csv"],
             "--json", "--workload", "overwrite")
    _refused(capsys, ["study", "--runs", "1", "--workloads", "w.csv", "--quiet", "--markdown", str(w)],
             "--markdown", "--workloads")
    plugin = tmp_path / "p.py"
    plugin.write_text("import dra.sim\ndra.sim.add_cluster_policy('outsider_p_out', lambda i: [0 for _ in i.jobs])\n")
    try:
        _refused(capsys, ["replay", "--plugin", str(plugin), "--workload", "w.csv", "--policy", "static", "--quiet",
                          "--json", "p.py"], "--json", "--plugin")
    finally:
        sim.remove_cluster_policy("outsider_p_out")
    assert w.read_text() == before and "outsider" in plugin.read_text()
    _refused(capsys, ["replay", "--workload", "w.csv", "--policy", "static", "--quiet", "--json", "same.out",
                      "--markdown", str(tmp_path / "same.out")], "--markdown", "--json", "different paths")
    assert not (tmp_path / "same.out").exists()


# D5: a --plugin policy that raises while it runs.


def test_a_plugin_policy_raising_at_run_time_is_one_line_and_exit_2(tmp_path, capsys):
    plugin = tmp_path / "late_raise.py"
    plugin.write_text(textwrap.dedent("""
        import dra.sim

        def f(i):
            if i.now > 600:
                raise KeyError("boom")
            return [min(1, j["max_devices"]) for j in i.jobs]

        dra.sim.add_cluster_policy("outsider_late_raise", f)
    """))
    w = _csv(tmp_path, ["a,0,cifar10,2,256", "b,100,cifar10,2,256"])
    out = tmp_path / "o.json"
    try:
        err = _refused(capsys, ["replay", "--plugin", str(plugin), "--policy", "static", "--policy", "outsider_late_raise",
                                "--workload", str(w), "--quiet", "--json", str(out)],
                       "--policy outsider_late_raise", str(plugin), "KeyError", "boom", "fix its decide function")
    finally:
        sim.remove_cluster_policy("outsider_late_raise")
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists()


# D6: a repeated --policy.


def test_a_repeated_policy_is_refused(tmp_path, capsys):
    """--policy static twice ran static twice and doubled its per-job records."""
    w = _csv(tmp_path, ["a,0,cifar10,2,256"])
    out = tmp_path / "o.json"
    _refused(capsys, ["replay", "--policy", "static", "--policy", "static", "--policy", "pollux", "--workload", str(w),
                      "--quiet", "--json", str(out)], "'static' is given more than once", "give each policy once")
    _refused(capsys, ["study", "--runs", "1", "--policy", "goodput", "--policy", "goodput", "--quiet"],
             "'goodput' is given more than once")
    assert not out.exists()
    with pytest.raises(ValueError, match="'static' is given more than once"):
        sim.replay(w, policies=["static", "static"])
    with pytest.raises(ValueError, match="'goodput' is given more than once"):
        sim.study(1, policies=["goodput", "goodput"])


# D7: the files written are named.


def test_json_and_markdown_writes_are_announced(tmp_path, capsys):
    w = _csv(tmp_path, ["a,0,cifar10,2,256"])
    out, md = tmp_path / "o.json", tmp_path / "o.md"
    capsys.readouterr()
    assert cli.main(["replay", "--workload", str(w), "--policy", "static", "--json", str(out), "--markdown", str(md)]) == 0
    err = capsys.readouterr().err
    assert f"[dra-sim] wrote {out}" in err and f"[dra-sim] wrote {md}" in err, err
    assert cli.main(["study", "--runs", "1", "--policy", "static", "--workloads", str(w), "--resamples", "10",
                     "--json", str(out), "--markdown", str(md)]) == 0
    err = capsys.readouterr().err
    assert f"[dra-sim] wrote {out}" in err and f"[dra-sim] wrote {md}" in err, err
    assert cli.main(["replay", "--workload", str(w), "--policy", "static", "--quiet", "--json", str(out)]) == 0
    assert "wrote" not in capsys.readouterr().err


# D9: a wrong $DRA_SIM_DATA.


def test_a_wrong_dra_sim_data_is_an_error(tmp_path, capsys, monkeypatch):
    """It was silently ignored: the shipped profiles were used instead of the user's."""
    monkeypatch.setenv("DRA_SIM_DATA", str(tmp_path / "nonexistent"))
    _refused(capsys, ["profiles"], "DRA_SIM_DATA", "does not exist", "unset it")
    monkeypatch.setenv("DRA_SIM_DATA", str(tmp_path))
    _refused(capsys, ["profiles"], "DRA_SIM_DATA", "holds no traces/", "point it at a folder")
    with pytest.raises(FileNotFoundError, match="DRA_SIM_DATA"):
        sim.default_data_dir()
    monkeypatch.delenv("DRA_SIM_DATA")
    assert (sim.default_data_dir() / "traces").is_dir()


# D8: reached_target in a replay.


def test_a_replay_reports_no_target_reached_it_never_set(tmp_path, capsys):
    """A replay sets no target metric: every job's reached_target read false, even a cifar10 job
    past the study's target. It is null, and final_metric says how far each got."""
    work = _csv(tmp_path, ["one,0,cifar10,2,256", "two,60,ncf,1,256"])
    out = tmp_path / "r.json"
    assert cli.main(["replay", "--workload", str(work), "--policy", "static", "--quiet", "--json", str(out)]) == 0
    jobs = json.loads(out.read_text())["jobs"]
    assert len(jobs) == 2
    assert all(j["reached_target"] is None for j in jobs), jobs
    assert all(j["final_metric"] is not None for j in jobs), jobs
