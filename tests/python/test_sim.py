"""dra.sim and the dra-sim command: JSON shape, CSV errors, determinism, conservation, plots."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dra.sim as sim
from dra.sim import cli

DATA = sim.default_data_dir()
W1 = DATA / "workloads" / "workload-1.csv"


def _small_workload(tmp_path: Path, n: int = 25) -> Path:
    lines = W1.read_text().splitlines()
    path = tmp_path / "small.csv"
    path.write_text("\n".join(lines[: n + 1]) + "\n")
    return path


def test_shipped_data_is_found_with_attribution():
    assert (DATA / "traces" / "cifar10" / "placements.csv").is_file()
    assert "Apache License" in (DATA / "NOTICE").read_text()
    profiles = sim.load_profiles()
    assert profiles.names() == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    # Interpolation through the binding: halfway between the rows at local batch 32 and 45.
    step, sync = profiles.throughput("cifar10", [1], 38.5)
    assert step == pytest.approx((0.0427886962890625 + 0.05048525333404541) / 2, rel=1e-12)
    assert sync == pytest.approx((0.0004995360016822816 + 0.000504022404551506) / 2, rel=1e-12)


def test_malformed_workload_names_file_line_column(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\nj0,1,cifar10,2,128\nj1,soon,cifar10,2,128\n")
    with pytest.raises(ValueError, match=r"bad\.csv:3: column 'time' \(2\): 'soon'"):
        sim.read_workload(bad, sim.load_profiles())
    rc = cli.main(["replay", "--workload", str(bad), "--quiet"])
    assert rc == 2


def test_unknown_policy_and_cost_are_rejected():
    with pytest.raises(ValueError, match="unknown 'fastest'"):
        sim.replay(W1, policies=["fastest"])
    with pytest.raises(ValueError, match="not a number of seconds"):
        sim.parse_cost("soon")
    assert sim.parse_cost("inplace") == sim.IN_PLACE_RESIZE_COST_S
    assert sim.parse_cost("pollux") == 30.0


def test_cost_from_a_resize_benchmark_report(tmp_path):
    # The shape `python -m dra.bench resize --json PATH` writes: the slower of shrink and grow at the
    # largest model state is the cost.
    report = {
        "suite": "resize",
        "machine": {},
        "results": [
            {"name": "shrink_4to2_10MB", "value": 0.2, "unit": "s", "baseline": None, "ratio": None},
            {"name": "grow_2to4_10MB", "value": 0.3, "unit": "s", "baseline": None, "ratio": None},
            {"name": "shrink_4to2_100MB", "value": 0.9, "unit": "s", "baseline": None, "ratio": None},
            {"name": "grow_2to4_100MB", "value": 1.4, "unit": "s", "baseline": None, "ratio": None},
            {"name": "grow_2to4_100MB_rebuild", "value": 0.1, "unit": "s", "baseline": None, "ratio": None},
        ],
    }
    path = tmp_path / "bench-resize.json"
    path.write_text(json.dumps(report))
    assert sim.parse_cost(str(path)) == 1.4
    empty = tmp_path / "other.json"
    empty.write_text(json.dumps({"suite": "overhead", "results": []}))
    with pytest.raises(ValueError, match="no shrink_4to2"):
        sim.parse_cost(str(empty))


def test_replay_json_interface(tmp_path):
    workload = _small_workload(tmp_path)
    out = tmp_path / "replay.json"
    rc = cli.main(["replay", "--workload", str(workload), "--json", str(out), "--quiet", "--plots", str(tmp_path / "plots")])
    assert rc == 0
    doc = json.loads(out.read_text())
    # Every policy but the oracle upper bounds, which run only when asked for.
    assert set(doc["policies"]) == {p for p in sim.POLICIES if not p.startswith("oracle_")}
    for name, agg in doc["policies"].items():
        for key in ("avg_jct_s", "p99_jct_s", "makespan_s", "gpu_hours", "utilization", "cluster_utilization", "final_metric", "wall_s"):
            assert key in agg, (name, key)
        assert agg["completed"] == 25
        assert 0.0 < agg["utilization"] <= 1.0
        assert 0.0 < agg["cluster_utilization"] <= agg["allocated_fraction"] <= 1.0
        assert agg["p99_jct_s"] >= agg["avg_jct_s"] > 0
        # Changes against the named baselines, with CIs (negative is less).
        for base in doc["baselines"]:
            if base == name:
                continue
            for key in ("jct_change", "p99_jct_change", "training_time_change", "gpu_hours_change", "utilization_change"):
                est, (lo, hi) = agg["vs"][base][key]["estimate"], agg["vs"][base][key]["ci95"]
                assert lo <= est <= hi, (name, base, key)
    assert doc["baselines"] == ["static", "pollux"]
    assert doc["published_avg_jct_s"] == {}  # a cut-down CSV matches no published workload
    jobs = [j for j in doc["jobs"] if j["policy"] == "static"]
    assert len(jobs) == 25
    # Static gives each job exactly what it asked for, for its whole life.
    assert all(j["max_devices"] == j["requested_replicas"] and j["reallocations"] == 0 for j in jobs)
    # Conservation at every decision, for every policy.
    for name, tl in doc["timelines"].items():
        assert max(tl["allocated"]) <= 64, name
        assert tl["allocated"][-1] == 0, name
    # The remaining-work estimator's calibration on the jobs of dra's policy (every job declared its
    # budget exactly here: the estimates are close).
    cal = doc["policies"]["convergence_aware"]["remaining_work_calibration"]
    assert set(cal) == {"0.1", "0.5", "0.9"}
    assert cal["0.5"]["jobs"] > 10 and cal["0.5"]["median_rel_error"] < 0.1 and cal["0.5"]["tail_coverage"] > 0.8
    assert doc["declarations"]["sigma"] == 0.0 and doc["upper_bounds"] == []
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == ["small-cost30-devices.png", "small-cost30-jct.png", "small-cost30-utilisation.png"]


def test_cheaper_reallocation_lowers_the_arbiters_jct(tmp_path):
    workload = _small_workload(tmp_path, 40)
    slow = sim.replay(workload, policies=["arbiter"], reallocation_cost=30)
    fast = sim.replay(workload, policies=["arbiter"], reallocation_cost="inplace")
    assert fast["reallocation_cost_s"] == sim.IN_PLACE_RESIZE_COST_S
    # Each reallocation is charged: cheaper ones show up as less held-but-idle device time per job.
    assert fast["policies"]["arbiter"]["avg_jct_s"] < slow["policies"]["arbiter"]["avg_jct_s"]


def test_published_figures_are_matched_by_content_not_file_name(tmp_path):
    half = DATA / "workloads-0.5" / "workload-1.csv"
    renamed = tmp_path / "workload-3.csv"
    renamed.write_bytes(half.read_bytes())
    found = sim.published_for(renamed)
    assert found["workload"] == "workload-1" and found["load"] == "0.5"
    assert found["avg_jct_s"]["pollux"] == pytest.approx(1059.51)
    assert sim.published_for(W1)["load"] == "1.0"
    edited = tmp_path / "workload-1.csv"
    edited.write_text(W1.read_text() + "x-1,99999,cifar10,1,128\n")
    assert sim.published_for(edited) == {}


def test_study_is_deterministic_and_reports_cis(tmp_path):
    a = sim.study(12, seed=7, resamples=200)
    b = sim.study(12, seed=7, resamples=200)
    assert a["specs"] == b["specs"]
    assert [j["completion_s"] for j in a["jobs"]] == [j["completion_s"] for j in b["jobs"]]
    c = sim.study(12, seed=8, resamples=200)
    assert a["specs"] != c["specs"]
    assert a["baselines"] == ["static_request", "static_best_size", "static_best_hindsight"]
    assert a["conditions"]["requests"].startswith("tuned") and a["quota_scale"] == 1.0
    for name, agg in a["policies"].items():
        for key in ("mean_training_time_s", "gpu_hours", "utilization", "final_metric_attainment"):
            assert key in agg
        assert 0.0 < agg["utilization"] <= 1.0
        for changes in agg["vs"].values():
            for key in ("training_time_change", "gpu_hours_change", "utilization_change"):
                est, (lo, hi) = changes[key]["estimate"], changes[key]["ci95"]
                assert lo <= est <= hi
                assert math.isfinite(lo) and math.isfinite(hi)
        if name != "static_request":
            assert agg["training_time_change"] == agg["vs"]["static_request"]["training_time_change"]
    # Per-run medians beside the pooled means; the earlier target rule apart.
    vs = a["policies"]["convergence_aware"]["vs"]["static_request"]
    assert "median_training_time_change_per_run" in vs
    assert "convergence_aware@geometric_batch" in a["policies"]
    assert a["conditions"]["target_rule"].startswith("work done")
    # Hindsight can only help: the best static configuration is never slower than the request.
    assert a["policies"]["static_best_hindsight"]["mean_training_time_s"] <= a["policies"]["static_request"]["mean_training_time_s"]


def test_replay_declarations_early_stopping_and_the_oracle(tmp_path):
    workload = _small_workload(tmp_path, 40)
    doc = sim.replay(workload, policies=["pollux", "convergence_aware", "oracle_convergence_aware"], declared_sigma=0.5,
                     declared_none_share=0.25, early_stop_share=0.5, declaration_seed=3, jobs_detail=True, resamples=50)
    assert doc["upper_bounds"] == ["oracle_convergence_aware"]
    assert doc["declarations"] == {**doc["declarations"], "sigma": 0.5, "none_share": 0.25, "early_stop_share": 0.5, "seed": 3}
    jobs = [j for j in doc["jobs"] if j["policy"] == "pollux"]
    assert any(j["declared_epochs"] is None for j in jobs) and any(j["declared_epochs"] for j in jobs)
    assert doc["policies"]["pollux"]["stopped_early"] > 0  # the truth is the same for every policy
    cal = doc["policies"]["convergence_aware"]["remaining_work_calibration"]["0.5"]
    assert cal["jobs"] > 0 and 0.0 <= cal["tail_coverage"] <= 1.0
    # A declared_epochs column is read and kept.
    lines = workload.read_text().splitlines()
    declared = tmp_path / "declared.csv"
    declared.write_text("\n".join([lines[0] + ",declared_epochs"] + [ln + ("," if i % 2 else ",7") for i, ln in enumerate(lines[1:])]) + "\n")
    rows = sim.read_workload(declared, sim.load_profiles())
    assert rows[0]["declared_epochs"] == 7 and rows[1]["declared_epochs"] is None
    with pytest.raises(ValueError, match="declared_sigma"):
        sim.replay(workload, declared_sigma=-1)
    md = sim.markdown_replay(doc)
    assert "oracle reference: reads the true remaining work" in md and "Declarations: budget x exp(0.5 z)" in md


def test_remaining_work_estimator_binding():
    import dra

    est = dra.RemainingWorkEstimator()
    first = est.estimate("resnet", 10.0, declared=100.0)
    assert first.sources == "declared" and first.median == pytest.approx(90.0, rel=0.05)
    for _ in range(5):
        est.record_completion("resnet", 60.0, declared=100.0)
    later = est.estimate("resnet", 10.0, declared=100.0)
    assert later.sources == "declared+history" and later.median == pytest.approx(50.0, rel=0.05)
    assert later.to_dict()["tail"] >= later.median
    assert dra.gittins_size(later, 10.0) == pytest.approx(later.median, rel=0.1)
    with pytest.raises(ValueError, match="tail_quantile"):
        dra.RemainingWorkEstimator(dra.RemainingWorkConfig(tail_quantile=2.0))


def test_shared_cluster_study_runs_contend():
    doc = sim.study(24, seed=3, shared_cluster=True, jobs_per_cluster=12, policies=["convergence_aware"], resamples=100)
    assert doc["baselines"] == ["static_request", "static_best_size", "static_best_hindsight"]
    assert doc["shared_cluster"] and len(doc["policies"]["static_request"]["cluster_utilization_by_cluster"]) == 2
    # Contention: some static runs wait for devices, so JCT exceeds training time.
    static = doc["policies"]["static_request"]
    assert static["mean_jct_s"] > static["mean_training_time_s"]
    vs = doc["policies"]["convergence_aware"]["vs"]["static_request"]
    assert len(vs["utilization_change_by_cluster"]) == 2
    # Utilisation is defined once: busy device time over the cluster x each policy's span.
    assert 0.0 < doc["policies"]["static_best_hindsight"]["utilization"] <= 1.0
    # And over the same horizon for every policy (the latest end of any): never above its own span's.
    pols = doc["policies"]
    for p, a in pols.items():
        assert 0.0 < a["utilization_common_horizon"] <= a["utilization"] + 1e-12, p
    assert vs["utilization_common_horizon_change"] == pytest.approx(
        pols["convergence_aware"]["utilization_common_horizon"] - static["utilization_common_horizon"])


def test_cli_study_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    proc = subprocess.run(
        [sys.executable, "-m", "dra.sim.cli", "study", "--runs", "10", "--seed", "3", "--json", str(out), "--markdown", str(md), "--resamples", "100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "study: 10/10 runs" in proc.stderr  # progress on stderr
    doc = json.loads(out.read_text())
    assert doc["runs"] == 10 and len(doc["specs"]) == 10
    assert "training_time_change" in doc["policies"]["goodput"]
    assert "| goodput |" in md.read_text()
    assert "vs static_best_hindsight" in md.read_text()


def test_foreign_inputs_unfinished_jobs_collisions_and_bad_outputs_are_named(tmp_path, capsys):
    """What an outside user's inputs met (each was a traceback or a silent wrong result): a header
    with no jobs; jobs still running at the horizon (30 days after the first arrival, the arrivals
    shifted by weeks changing nothing), whose policies' averages cover different jobs: said in the
    table, on stderr and in the JSON, with cluster utilisation at most 1; the same workload given
    twice keeps both results; output paths that cannot be written are refused before any run."""
    header = tmp_path / "header.csv"
    header.write_text("name,time,application,num_replicas,batch_size\n")
    with pytest.raises(ValueError, match="no jobs"):
        sim.replay(header)
    small = _small_workload(tmp_path, 4)
    late = tmp_path / "late.csv"
    rows = small.read_text().splitlines()
    cells = [r.split(",") for r in rows[1:]]
    t = rows[0].split(",").index("time")
    for c in cells:
        c[t] = str(int(c[t]) + 40 * 86400)
    late.write_text("\n".join([rows[0], *(",".join(c) for c in cells)]) + "\n")
    a = sim.replay(small, policies=["static"], jobs_detail=False)["policies"]["static"]
    b = sim.replay(late, policies=["static"], jobs_detail=False)["policies"]["static"]
    assert a["completed"] == b["completed"] == 4 and a["avg_jct_s"] == pytest.approx(b["avg_jct_s"])
    # A one-device cluster (every request cut to one device: larger ones are refused, see
    # test_a_job_requesting_more_devices_than_the_cluster_has_is_refused_by_name).
    one = tmp_path / "one-device.csv"
    rows1 = W1.read_text().splitlines()
    r = rows1[0].split(",").index("num_replicas")
    one.write_text("\n".join([rows1[0], *(",".join(c[:r] + ["1"] + c[r + 1:]) for c in (x.split(",") for x in rows1[1:]))]) + "\n")
    tiny = sim.replay(one, policies=["static"], nodes=1, devices_per_node=1, jobs_detail=False)
    s = tiny["policies"]["static"]
    assert 0 < s["unfinished"] < s["jobs"] and s["completed"] + s["unfinished"] == s["jobs"]
    assert s["cluster_utilization"] <= 1.0 + 1e-9
    assert "jobs unfinished at the horizon" in sim.markdown_replay(tiny) and f"{s['completed']}/{s['jobs']}" in sim.markdown_replay(tiny)
    out = tmp_path / "two.json"
    assert cli.main(["replay", "--workload", str(small), "--workload", str(small), "--policy", "static", "--no-jobs",
                     "--quiet", "--json", str(out)]) == 0
    assert len(json.loads(out.read_text())["workloads"]) == 2
    capsys.readouterr()
    assert cli.main(["replay", "--workload", str(small), "--policy", "static", "--quiet", "--json", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert cli.main(["replay", "--workload", str(small), "--policy", "static", "--quiet", "--plots", str(small)]) == 2
    assert "is a file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="resamples"):
        sim.replay(small, policies=["static"], resamples=0)


def _workload(tmp_path: Path, rows: list[str], header: str = "name,time,application,num_replicas,batch_size",
              name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_job_requesting_more_devices_than_the_cluster_has_is_refused_by_name(tmp_path, capsys):
    """Such a job was silently capped at the cluster (static and Tiresias ran it on fewer devices
    than it asked for: another workload than the one given). It is refused before anything runs,
    naming each job, its line, its request, the cluster and both fixes; a request of exactly the
    cluster's size runs."""
    w = _workload(tmp_path, ["fits,0,cifar10,4,512", "big,10,cifar10,6,512", "bigger,20,cifar10,9,512"])
    with pytest.raises(ValueError) as err:
        sim.replay(w, policies=["static"], nodes=1, devices_per_node=4, jobs_detail=False)
    msg = str(err.value)
    assert "2 job(s) request more devices than the simulated cluster has (4)" in msg
    assert "line 3 job 'big' requests 6" in msg and "line 4 job 'bigger' requests 9" in msg and "'fits'" not in msg
    assert "--nodes 1 x --devices-per-node 4" in msg and "num_replicas in those rows to at most 4" in msg
    out = tmp_path / "out.json"
    assert cli.main(["replay", "--workload", str(w), "--nodes", "1", "--policy", "static", "--quiet", "--json", str(out)]) == 2
    assert "job 'big' requests 6" in capsys.readouterr().err and not out.exists()
    # Checked for every workload before any is simulated (a good first one does not run first).
    good = _workload(tmp_path, ["fits,0,cifar10,4,512"], name="good.csv")
    assert cli.main(["replay", "--workload", str(good), "--workload", str(w), "--nodes", "1", "--policy", "static",
                     "--no-jobs", "--json", str(out)]) == 2
    assert "[dra-sim]" not in capsys.readouterr().err and not out.exists()
    fits = sim.replay(good, policies=["static"], nodes=1, devices_per_node=4, jobs_detail=True)
    assert fits["jobs"][0]["max_devices"] == 4 and fits["policies"]["static"]["completed"] == 1
    # The study's request pool: its cluster is 64 devices.
    pool = _workload(tmp_path, ["ok,0,cifar10,64,4096", "huge,0,cifar10,65,4096"], name="pool.csv")
    with pytest.raises(ValueError, match=r"line 3 job 'huge' requests 65.*study's cluster is fixed at 64"):
        sim.study(1, workloads=[pool], resamples=10)
    # ... nor more than its batch can split (cifar10's smallest per-device batch is 32: 128 / 32 = 4).
    pool = _workload(tmp_path, ["ok,0,cifar10,4,128", "thin,0,cifar10,5,128"], name="pool.csv")
    with pytest.raises(ValueError, match=r"line 3 job 'thin' requests 5 devices at batch 128, at most 4"):
        sim.study(1, workloads=[pool], resamples=10)
    ok = sim.study(1, workloads=[_workload(tmp_path, ["ok,0,cifar10,4,128"], name="ok.csv")], resamples=10,
                   policies=["static"])
    assert ok["specs"][0]["replicas"] == 4


def test_options_that_would_be_ignored_are_refused(tmp_path, capsys):
    """An option another option's value makes useless was silently ignored (the same results as
    without it): --in-place-cost/--restart-cost under --cost-mode same, --reallocation-cost under
    system, a mechanism's cost when no policy run uses it, --declaration-seed with nothing to draw,
    --declared-sigma/--declared-none against a declared_epochs column, and in the study
    --jobs-per-cluster alone, --price-floor shared or without convergence_aware, the dynamic
    policies' options with only the static baselines. Each is refused, naming the option."""
    with pytest.raises(ValueError, match=r"in_place_cost \(--in-place-cost\): not used by cost mode 'same'"):
        sim.costs_by_policy(["pollux"], "same", in_place_cost=0.2)
    with pytest.raises(ValueError, match=r"restart_cost \(--restart-cost\): not used by cost mode 'same'"):
        sim.costs_by_policy(["pollux"], "same", restart_cost=20)
    with pytest.raises(ValueError, match=r"--reallocation-cost\) 5: not used by cost mode 'system'"):
        sim.costs_by_policy(["pollux"], "system", cost=5)
    with pytest.raises(ValueError, match=r"--in-place-cost\) 0.2: no policy run here resizes in place \(policies: pollux, static\)"):
        sim.costs_by_policy(["pollux", "static"], "system", in_place_cost=0.2)
    with pytest.raises(ValueError, match=r"--restart-cost\) 20: no policy run here restarts"):
        sim.costs_by_policy(["convergence_aware"], "system", restart_cost=20)
    # Where each is used, it is used.
    assert sim.costs_by_policy(["pollux", "convergence_aware"], "system", in_place_cost=0.2, restart_cost=20) == {
        "pollux": 20.0, "convergence_aware": 0.2}
    assert sim.costs_by_policy(["pollux"], "same", cost=5) == {"pollux": 5.0}
    small = _small_workload(tmp_path, 3)
    out = tmp_path / "o.json"
    for argv, said in (
        (["--in-place-cost", "999"], "--in-place-cost): not used by cost mode 'same'"),
        (["--cost-mode", "system", "--reallocation-cost", "5"], "--reallocation-cost) 5: not used by cost mode 'system'"),
        (["--declaration-seed", "3"], "--declaration-seed: not used here"),
    ):
        assert cli.main(["replay", "--workload", str(small), "--policy", "static", "--quiet", "--json", str(out), *argv]) == 2
        assert said in capsys.readouterr().err and not out.exists()
    lines = small.read_text().splitlines()
    declared = _workload(tmp_path, [ln + ",7" for ln in lines[1:]], header=lines[0] + ",declared_epochs", name="d.csv")
    with pytest.raises(ValueError, match="declared_sigma .*has a declared_epochs column"):
        sim.replay(declared, policies=["static"], declared_sigma=0.5)
    with pytest.raises(ValueError, match="declared_none_share .*has a declared_epochs column"):
        sim.replay(declared, policies=["static"], declared_none_share=0.5)
    with pytest.raises(ValueError, match="no job declares anything"):
        sim.replay(small, policies=["static"], declared_none_share=1.0, declared_sigma=0.5)
    for argv, said in (
        (["--jobs-per-cluster", "10"], "--jobs-per-cluster: not used here"),
        (["--shared-cluster", "--price-floor", "0.2"], "--price-floor: not used here, it is convergence_aware's per-job price"),
        (["--policy", "goodput", "--price-floor", "0.2"], "convergence_aware's, which is not run (policies: goodput)"),
        (["--policy", "static", "--gns-estimate-sigma", "0.1"], "--gns-estimate-sigma: not used here"),
        (["--policy", "static", "--declared-sigma", "0.1"], "--declared-sigma: not used here"),
        (["--policy", "static", "--old-target-rule"], "--old-target-rule: not used here"),
        (["--reference-limits", "--workloads", str(_workload(tmp_path, ["a,0,cifar10,2,128"], name="no-ncf.csv"))],
         "--reference-limits): no application of the request pool"),
    ):
        assert cli.main(["study", "--runs", "1", "--quiet", "--json", str(out), *argv]) == 2
        assert said in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("cell", ["0x10", "1_000", "inf", "nan", " 5 ", "1e3", "+5", "-5", "5s", "\u0665"])
def test_numbers_in_a_workload_must_be_plain_decimals(tmp_path, cell):
    """The C++ reader's strtod took '0x10' as 16 s, '1e3' as 1000, '+5' and ' 5 ' as 5: a time in a
    workload is now only digits with an optional fraction, named by file, line, column and value.
    The same for num_replicas and batch_size."""
    profiles = sim.load_profiles()
    w = _workload(tmp_path, ["a,0,cifar10,2,128", f"b,{cell},cifar10,2,128"])
    with pytest.raises(ValueError, match=rf"w\.csv:3: column 'time' \(2\): '{re.escape(cell)}'"):
        sim.read_workload(w, profiles)
    w = _workload(tmp_path, [f"a,0,cifar10,{cell},128"])
    with pytest.raises(ValueError, match=rf"w\.csv:2: column 'num_replicas' \(4\): '{re.escape(cell)}'"):
        sim.read_workload(w, profiles)
    w = _workload(tmp_path, [f"a,0,cifar10,2,{cell}"])
    with pytest.raises(ValueError, match=rf"w\.csv:2: column 'batch_size' \(5\): '{re.escape(cell)}'"):
        sim.read_workload(w, profiles)


def test_plain_decimal_times_are_read_as_written(tmp_path):
    w = _workload(tmp_path, ["a,0,cifar10,2,128", "b,16,cifar10,2,128", "c,16.5,cifar10,2,128", "d,.5,cifar10,2,128"])
    assert [j["submit_s"] for j in sim.read_workload(w, sim.load_profiles())] == [0.0, 16.0, 16.5, 0.5]


@pytest.mark.parametrize("value", ["0x10", "1_000", "inf", "nan", " 5 ", "1e3", "-5"])
def test_numbers_on_the_command_line_must_be_plain_decimals(tmp_path, capsys, value):
    """--interval took '1_000', ' 5 ' and '1e3' (Python's float()), the costs the same, the counts
    '1_000' and ' 5 ' (int()): each is refused, naming the option and the value."""
    small = _small_workload(tmp_path, 2)
    for argv, flag in ((["replay", "--workload", str(small), "--interval", value], "--interval"),
                       (["study", "--runs", value], "--runs"),
                       (["replay", "--workload", str(small), "--nodes", value], "--nodes"),
                       (["study", "--seed", value], "--seed")):
        with pytest.raises(SystemExit):
            cli.main([*argv, "--quiet"])
        err = capsys.readouterr().err
        assert f"argument {flag}: " in err and value.strip() in err, err
    with pytest.raises(ValueError, match=f"reallocation cost: '{re.escape(value)}' is not a number of seconds"):
        sim.parse_cost(value)
    assert cli.main(["replay", "--workload", str(small), "--policy", "static", "--quiet", "--reallocation-cost", value]) == 2
    assert f"'{value}' is not a number of seconds" in capsys.readouterr().err


def test_a_column_the_header_repeats_is_refused(tmp_path):
    """The reader took the first of two columns of one name and silently ignored the other."""
    w = _workload(tmp_path, ["a,5,cifar10,2,128,99999"], header="name,time,application,num_replicas,batch_size,time")
    with pytest.raises(ValueError, match=r"w\.csv:1: column 'time' appears twice in the header \(columns 2 and 6\)"):
        sim.read_workload(w, sim.load_profiles())
    with pytest.raises(ValueError, match="appears twice"):
        sim.replay(w, policies=["static"])
    # The same in a profile folder (--traces).
    import shutil

    traces = tmp_path / "traces"
    shutil.copytree(DATA / "traces", traces)
    placements = traces / "cifar10" / "placements.csv"
    head, *rest = placements.read_text().splitlines()
    placements.write_text("\n".join([head + ",step_time", *(r + ",0.1" for r in rest)]) + "\n")
    with pytest.raises(ValueError, match=r"placements\.csv:1: column 'step_time' appears twice in the header"):
        sim.load_profiles(traces)


def test_runs_above_the_documented_bounds_are_refused(tmp_path, capsys):
    """How much one command simulates is bounded (docs/guide/simulator.md, "Inputs and bounds"):
    beyond, a study ran for hours (a run costs about 0.09 s of CPU, a bootstrap resample about 24 us
    per run) or a cluster of a billion nodes was accepted. Each is refused naming the bound; the
    documented sizes are accepted. The study cases run in a process with a timeout: without the
    bounds they would run on."""
    for argv, said in (
        (["--runs", "10001"], "argument --runs: 10001 is above the bound 10000"),
        (["--resamples", "100001"], "argument --resamples: 100001 is above the bound 100000"),
        (["--runs", "10000", "--resamples", "2001"], "above the bound runs x resamples <= 20,000,000"),
        (["--shared-cluster", "--jobs-per-cluster", "641"], "argument --jobs-per-cluster: 641 is above the bound 640"),
    ):
        proc = subprocess.run([sys.executable, "-m", "dra.sim.cli", "study", "--quiet", "--no-jobs", *argv],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr, (argv, proc.stderr)
    small = _small_workload(tmp_path, 2)
    out = tmp_path / "o.json"
    for argv, said in ((["--nodes", "4097"], "argument --nodes: 4097 is above the bound 4096"),
                       (["--interval", "0.5"], "argument --interval: 0.5 is out of range; give a number >= 1")):
        with pytest.raises(SystemExit):
            cli.main(["replay", "--workload", str(small), "--policy", "static", "--quiet", "--json", str(out), *argv])
        assert said in capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match=r"nodes \(--nodes\): must be a whole number in \[1, 4096\], got 5000"):
        sim.replay(small, policies=["static"], nodes=5000)
    assert cli.main(["replay", "--workload", str(small), "--policy", "static", "--quiet", "--json", str(out),
                     "--nodes", "4096", "--devices-per-node", "9", "--interval", "1"]) == 0
    assert json.loads(out.read_text())["cluster"] == {"nodes": 4096, "devices_per_node": 9}
