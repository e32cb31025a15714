"""dra.sim and the dra-sim command: JSON shape, CSV errors, determinism, conservation, plots."""

from __future__ import annotations

import json
import math
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
    assert "oracle: upper bound" in md and "Declarations: budget x exp(0.5 z)" in md


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
    tiny = sim.replay(W1, policies=["static"], nodes=1, devices_per_node=1, jobs_detail=False)
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
