"""One policy registry (include/dra/policy/registry.hpp): every policy is selectable by name in the
live engine, the simulator and Python from that one table, and no section of a policy's settings
is dropped on the way (dra.Controller(EngineConfig) once lost convergence_aware and energy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dra
import dra.sim
from dra import _core, _sim

DATA = Path(__file__).resolve().parents[2] / "data" / "pollux"


def test_both_modules_read_the_same_registry() -> None:
    assert _core.policy_registry() == _sim.policy_registry()
    assert _core.policy_sections() == _sim.policy_sections()


def test_simulator_names_are_the_registrys() -> None:
    entries = _sim.policy_registry()
    assert list(dra.sim.POLICIES) == [e["name"] for e in entries if e["simulator"]]
    for e in entries:
        assert e["section"] is None or e["section"] in _sim.policy_sections()


@pytest.mark.parametrize("entry", [e for e in _core.policy_registry() if e["engine"]], ids=lambda e: e["name"])
def test_every_engine_policy_is_selectable_by_name(entry: dict) -> None:
    ctl = dra.Controller(policy=entry["name"], decide_every=5)
    for s in range(10):
        status = ctl.step(1.0 / (1 + s))
    assert status.step == 9
    assert _core.EngineConfig(policy=entry["name"]).policy == entry["name"]


def test_a_policy_the_engine_cannot_run_is_refused_by_name() -> None:
    sim_only = [e["name"] for e in _core.policy_registry() if not e["engine"]]
    assert "pollux" in sim_only
    with pytest.raises(ValueError, match="unknown policy 'pollux'"):
        dra.Controller(policy="pollux")


def test_engine_config_keeps_every_policy_section() -> None:
    config = _core.EngineConfig()
    config.policy = "convergence_aware"
    config.convergence_aware.price_floor = 0.37
    config.energy.objective = _core.EnergyObjective("zeus_cost", eta=0.25)
    ctl = dra.Controller(config)
    engine = ctl.options.engine
    assert engine.policy == "convergence_aware"
    assert engine.convergence_aware.price_floor == pytest.approx(0.37)
    assert engine.energy.objective.eta == pytest.approx(0.25)
    for section in _core.policy_sections():
        assert hasattr(engine, section)


@pytest.mark.parametrize("entry", [e for e in _sim.policy_registry() if e["simulator"]], ids=lambda e: e["name"])
def test_every_simulator_policy_replays_by_name(entry: dict, tmp_path: Path) -> None:
    rows = (DATA / "workloads" / "workload-6.csv").read_text().splitlines()[:5]
    csv = tmp_path / "w.csv"
    csv.write_text("\n".join(rows) + "\n")
    doc = dra.sim.replay(csv, policies=[entry["name"]], resamples=10)
    assert doc["policies"][entry["name"]]["completed"] == 4


def test_import_dra_sim_does_not_load_torch() -> None:
    code = "import sys, dra, dra.sim, dra.sim.cli; print('torch' in sys.modules, dra.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False", "import dra.sim loaded torch"
    assert out[1] == dra.__version__


def test_import_dra_for_training_works_as_before() -> None:
    code = (
        "import sys, dra; from dra import Controller, EngineConfig, _core; "
        "s = dra.step(0.5); print('torch' in sys.modules, type(s).__name__, dra.build_info()['version'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "StepStatus", dra.__version__]


def test_reallocation_cost_both_ways(tmp_path: Path) -> None:
    report = dra.sim.DEFAULT_RESIZE_REPORT
    same = dra.sim.costs_by_policy(["pollux", "convergence_aware"], "same", cost=30)
    assert same == {"pollux": 30.0, "convergence_aware": 30.0}
    system = dra.sim.costs_by_policy(["pollux", "tiresias", "convergence_aware"], "system", restart_cost=str(report))
    assert system["convergence_aware"] == pytest.approx(dra.sim.cost_from_resize_report(report))
    assert system["pollux"] == system["tiresias"] == pytest.approx(dra.sim.restart_cost_from_resize_report(report))
    assert system["convergence_aware"] < 1.0 < 10.0 < system["pollux"]
    with pytest.raises(ValueError, match="cost mode"):
        dra.sim.costs_by_policy(["pollux"], "cheapest")
    rows = (DATA / "workloads" / "workload-6.csv").read_text().splitlines()[:5]
    csv = tmp_path / "w.csv"
    csv.write_text("\n".join(rows) + "\n")
    doc = dra.sim.replay(csv, policies=["pollux", "arbiter"], cost_mode="system", resamples=10)
    assert doc["cost_mode"] == "system"
    assert doc["reallocation_cost_s_by_policy"]["pollux"] == 30.0
    assert doc["policies"]["arbiter"]["reallocation_cost_s"] < 1.0
    assert "system view" in dra.sim.markdown_replay(doc)
