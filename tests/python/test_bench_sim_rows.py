"""``python -m dra.bench sim``'s rows that issue 21 names (simulated): the plain
``sim_fidelity_pollux`` (Pollux in dra's simulator against its published figures, geometric mean
over the cases), and the realistic declarations against Pollux, ``sim_mixed_vs_pollux`` and
``sim_no_declaration_vs_pollux``, which ``--only declarations`` runs alone. Each on one workload at
one load, a few seconds of replays."""

from __future__ import annotations

import json
import math

import pytest

from dra_bench import sim as bench_sim

pytestmark = pytest.mark.timeout(300)


def _rows(results: list[dict], name: str) -> list[dict]:
    return [r for r in results if r["name"] == name]


def test_the_plain_fidelity_row_is_the_geometric_mean_of_the_cases_against_published():
    rows = bench_sim.fidelity_rows(workloads=[1, 2], loads=["1.0"])
    cases = [r for r in rows if r["name"].startswith("sim_fidelity_pollux.workload-")]
    assert [r["name"] for r in cases] == ["sim_fidelity_pollux.workload-1@1.0x", "sim_fidelity_pollux.workload-2@1.0x"]
    (plain,) = _rows(rows, "sim_fidelity_pollux")
    assert plain["baseline"]["name"] == "published" and plain["cases"] == 2
    assert plain["ratio"] == pytest.approx(math.sqrt(cases[0]["ratio"] * cases[1]["ratio"]), rel=1e-12)
    assert plain["worst_ratio"] in (cases[0]["ratio"], cases[1]["ratio"])
    # The rows that were there before stay.
    assert {"sim_fidelity_pollux@1.0x", "sim_fidelity_pollux_worst", "sim_fidelity_pollux_geomean"} <= {r["name"] for r in rows}


def test_only_declarations_emits_the_mix_and_nothing_declared_against_pollux(tmp_path, capsys):
    path = tmp_path / "bench-sim.json"
    assert bench_sim.main(["--only", "declarations", "--workloads", "1", "--loads", "1.0", "--json", str(path)]) == 0
    results = json.loads(path.read_text())["results"]
    names = {r["name"] for r in results}
    assert not any(n.startswith(("sim_fidelity", "study", "sim_process_wall", "sim_budget")) for n in names), names
    (exact,) = _rows(results, "sim_jct_vs_pollux")
    (mixed,) = _rows(results, "sim_mixed_vs_pollux")
    (none,) = _rows(results, "sim_no_declaration_vs_pollux")
    for row in (exact, mixed, none):
        assert row["baseline"]["name"] == "pollux" and row["load"] == 1.0 and row["cases"] == 1
        assert row["ratios"] == {"workload-1": pytest.approx(row["ratio"])}
    # Nothing declared, nothing stopped early: Pollux's runs are the exact ones, dra's are not.
    assert none["baseline"]["value"] == exact["baseline"]["value"] and none["value"] != exact["value"]
    # Early stoppers change the truth, so Pollux reran on the mixed jobs.
    assert mixed["baseline"]["value"] != exact["baseline"]["value"]
    (est,) = _rows(results, "estimator_error_p50")
    assert set(est["calibration"]) == {"0.1", "0.5", "0.9"}
    assert "sim_no_declaration_vs_pollux" in capsys.readouterr().out
