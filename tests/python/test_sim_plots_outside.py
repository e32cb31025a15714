"""dra-sim's plots and outputs as an outside reviewer read them (review-sim-sweeps-1): an oracle_*
row is a reference, not a bound, and is drawn apart; every condition a plot's title names is in its
file name (a perturbed study overwrote the tuned one's plot); a plot that cannot be written leaves
nothing of the command behind; the utilisation plot is the tables' busy utilisation with ends that
are not pulled towards 0; and the study says when declarations cannot matter."""

from __future__ import annotations

import json

import numpy as np
from _sim_harness import _csv, _refused

import dra.sim as sim
from dra.sim import cli
from dra.sim.plots import _moving_mean


def test_an_unwritable_plot_leaves_no_json_markdown_or_plot(tmp_path, capsys):
    w = _csv(tmp_path, ["a,0,cifar10,4,512", "b,60,cifar10,2,256"])
    plots = tmp_path / "plots"
    (plots / "w-cost30-devices.png").mkdir(parents=True)  # the second plot's name is a folder
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    _refused(capsys, ["replay", "--workload", str(w), "--policy", "static", "--quiet", "--plots", str(plots), "--json",
                      str(out), "--markdown", str(md)], "cannot write", "w-cost30-devices.png")
    assert not out.exists() and not md.exists()
    assert sorted(p.name for p in plots.iterdir()) == ["w-cost30-devices.png"]  # the folder only: no debris


def test_study_plots_of_other_conditions_do_not_overwrite_each_other(tmp_path, capsys):
    folder = tmp_path / "plots"
    for extra in ([], ["--perturb"], ["--declared-sigma", "0.5"], ["--no-noise"], ["--gns-estimate-sigma", "0.5"]):
        assert cli.main(["study", "--runs", "4", "--resamples", "20", "--quiet", "--plots", str(folder), *extra]) == 0
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["study-4-seed1-perturbed-quota1-cost1.png", "study-4-seed1-quota1-cost1-gns0.5.png",
                     "study-4-seed1-quota1-cost1-nonoise.png", "study-4-seed1-quota1-cost1-sigma0.5.png",
                     "study-4-seed1-quota1-cost1.png"], names
    # The same conditions again (another policy set, say): replaced, and said so even with --quiet.
    capsys.readouterr()
    assert cli.main(["study", "--runs", "4", "--resamples", "20", "--quiet", "--plots", str(folder)]) == 0
    assert "replaced" in capsys.readouterr().err


def test_an_oracle_row_is_called_a_reference_and_the_study_says_what_declarations_can_change(tmp_path):
    doc = sim.study(4, 1, policies=["convergence_aware", "oracle_convergence_aware"], resamples=20, quiet=True)
    text = sim.markdown_study(doc)
    assert "| oracle_convergence_aware (oracle reference: reads the true remaining work; not guaranteed better) |" in text
    assert "Every run declares its exact budget" in text and "declarations hardly enter decisions here" in text
    w = _csv(tmp_path, ["a,0,cifar10,4,512"])
    replay = sim.markdown_replay(sim.replay(str(w), policies=["static", "oracle_convergence_aware"], quiet=True))
    assert "upper bound" not in replay and "oracle reference" in replay
    assert "upper bound" not in json.dumps(doc["conditions"])


def test_the_moving_mean_keeps_a_constant_constant_at_its_ends():
    # Zero padding drew a last value of 0.338 as 0.262 and a first 0 as 0.042.
    y = np.full(30, 0.5)
    assert np.allclose(_moving_mean(y, 10), 0.5)
    ramp = np.arange(20, dtype=float)
    assert _moving_mean(ramp, 10)[-1] > 15 and _moving_mean(ramp, 10)[0] < 5


def test_a_sigma_past_5_is_refused(tmp_path, capsys):
    # --declared-sigma 1000 was accepted: every budget declared as 1 epoch or as billions.
    w = _csv(tmp_path, ["a,0,cifar10,4,512"])
    _refused(capsys, ["replay", "--workload", str(w), "--policy", "static", "--quiet", "--declared-sigma", "1000"],
             "sigma", "[0, 5]")
    _refused(capsys, ["study", "--runs", "2", "--quiet", "--declared-sigma", "6"], "declared_sigma", "[0, 5]")
    _refused(capsys, ["study", "--runs", "2", "--quiet", "--gns-estimate-sigma", "7"], "gns_estimate_sigma", "[0, 5]")


def test_a_data_folder_without_workloads_is_named_with_the_variable(tmp_path, capsys, monkeypatch):
    # It said only "<path>/workloads-0.5/workload-1.csv: cannot open file; check the path".
    data = tmp_path / "data"
    data.mkdir()
    (data / "traces").symlink_to(sim.default_data_dir() / "traces")
    monkeypatch.setenv("DRA_SIM_DATA", str(data))
    _refused(capsys, ["replay", "--all-loads", "--policy", "static", "--quiet"],
             f"DRA_SIM_DATA: {data} holds no workloads-0.5/ folder, which --all-loads reads", "unset DRA_SIM_DATA")
    _refused(capsys, ["study", "--runs", "2", "--quiet"], "holds no workloads/ folder", "--workloads DIR")
