"""Binding results become dicts by one mechanism (python/to_dict.hpp): every bound property, nothing listed.

The golden file holds what the hand-written ``*_to_dict`` functions produced on these small runs
before the mechanism replaced them (captured from that build); the dicts must stay equal, keys,
order and values. After a deliberate change of a simulator's behaviour, rewrite it with
``python tests/python/test_to_dict.py --write`` and say so in the commit.
"""

from __future__ import annotations

import enum
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import dra
import dra.rl as rl
import dra.sim as sim
from dra import _core, _sim

GOLDEN = Path(__file__).with_name("data") / "to_dict_golden.json"


def _power_law(t: int) -> float:
    return 4.0 * (1.0 + t / 20.0) ** -0.7


def _sim_samples() -> dict[str, Any]:
    profiles = sim.load_profiles()
    jobs = _sim.sim_read_workload(str(sim.default_data_dir() / "workloads" / "workload-1.csv"), profiles)[:3]
    out: dict[str, Any] = {"sim_read_workload": jobs, "sim_profile_info": {a: profiles.info(a) for a in profiles.names()}}
    for policy in ("static", "convergence_aware"):
        out[f"sim_run.{policy}"] = _sim.sim_run(profiles, jobs, policy, 30.0, 600.0, 2, 4)
    # Stopped early: jobs that never started or finished (None where the functions wrote None); one
    # node of 6, as many as the largest request (a request above the cluster is refused).
    out["sim_run.stopped"] = _sim.sim_run(profiles, jobs, "static", 30.0, 600.0, 1, 6, progress=lambda now, *_: now < 1800.0)
    out["sim_study"] = _sim.sim_study(profiles, jobs, 2, 5, ["convergence_aware"], 30.0, 1.0, 600.0)
    return out


def _rl_samples() -> dict[str, Any]:
    lengths = rl.trace_lengths("conv")[:2000]
    sweep = _core.rl_sim_sweep(lengths, "conv", 4, "one_step_off", _core.RlWorkload(steps=6, prompts_per_step=16))
    policy = rl.StageBalancePolicy(rl.StageBalanceConfig(devices=4, cooldown_steps=0, hysteresis_decisions=1, prior_switch_cost_s=0.0))
    unobserved = policy.decide(2, 2, 0, 100, -1, 64)
    for _ in range(5):
        for _ in range(64):
            policy.observe_generation(50.0, 3000.0)
        for c in (64, 32, 8, 1):
            policy.observe_decode(c, c * 1500.0, 10.0, 10.0 * (0.01 + 1e-4 * c))
        policy.observe_train(2, 64 * 3050 / 2, 0.2 + 1e-5 * 64 * 3050 / 2 + 0.05, 0.05)
    events = _core.rl_sim_events(lengths, "conv", 4, _core.RlWorkload(steps=4, prompts_per_step=16))
    return {
        "rl_sim_sweep": sweep,
        "rl_sim_events_dynamic": events["dynamic"],
        "stage_window": policy.decide_window(rollout=2, train=2, idle_rollout=0, step=6),
        "stage_predict": policy.predict(2, 64),
        "stage_predict_all": policy.predict_all(64),
        "stage_decide": policy.decide(1, 3, 5, 100, -1, 64),
        "stage_decide_hold": policy.decide(2, 2, 6, 100, 40, 64),
        "stage_decide_unobserved": unobserved,
    }


def _policy_samples() -> dict[str, Any]:
    est = dra.ConvergenceEstimator()
    for t in range(200):
        est.update_loss(t, 4.0 * math.exp(-0.005 * t))
    world = dra.WorldState()
    world.size, world.active, world.candidates = 2, [0, 1], [5, 6, 7]
    world.steps_since_resize, world.global_batch, world.base_batch = 1000, 256.0, 256.0
    model = dra.ThroughputModel(dra.ThroughputModelConfig(prior_sync_fixed_s=0.0, prior_sync_per_rank_s=0.0))
    for k in (1, 2, 4):
        model.observe(k, 256.0 / k, 0.001 * 256.0 / k, 0.0)
    policy = dra.ConstrainedPolicy(dra.ConvergencePhasePolicy(dra.ConvergencePhaseConfig(grow_step=2)), dra.Constraints(max_size=8))
    decision = policy.decide(est.signals, world, dra.Capacity(5), dra.CostModel(0.0), model)
    remaining = dra.RemainingWorkEstimator()
    work = remaining.estimate("cifar", 100.0, 400.0, [(float(t), 4.0 * math.exp(-0.005 * t)) for t in range(0, 100, 10)])
    return {"signals": est.signals.to_dict(), "decision": decision.to_dict(), "work_estimate": work.to_dict()}


def _status_samples() -> dict[str, Any]:
    dra.reset()
    try:
        status = None
        for t in range(100):
            status = dra.step(_power_law(t))
        assert status is not None
        ctl = dra.default_controller()
        return {"step_status": status.to_dict(), "handoff": ctl.handoff, "device_reads": ctl.device_reads}
    finally:
        dra.reset()


def samples() -> dict[str, Any]:
    return {**_sim_samples(), **_rl_samples(), **_policy_samples(), **_status_samples()}


def _same(got: Any, want: Any, path: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: a dict expected, got {type(got).__name__}"
        assert list(got) == list(want), f"{path}: keys differ: {list(got)} != {list(want)}"
        for k in want:
            _same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, (list, tuple)), f"{path}: a list expected, got {type(got).__name__}"
        assert len(got) == len(want), f"{path}: {len(got)} items, want {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert isinstance(got, float), f"{path}: a float expected, got {got!r}"
        assert got == want or (math.isnan(got) and math.isnan(want)), f"{path}: {got!r} != {want!r}"
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def _jsonable(doc: dict[str, Any]) -> dict[str, Any]:
    """The samples as JSON reads them back (tuples become lists), less the simulator's own run time."""
    out = json.loads(json.dumps(doc))
    for name, sample in out.items():
        if name.startswith("sim_run."):
            assert isinstance(sample.pop("wall_s"), float)
            end = sample.pop("end_s")  # added after the golden was taken: when the simulation stopped
            assert isinstance(end, float) and end >= sample["makespan_s"], (name, end)
    return out


@pytest.mark.parametrize("name", sorted(json.loads(GOLDEN.read_text())) if GOLDEN.exists() else [])
def test_dicts_equal_what_the_hand_written_functions_produced(name: str) -> None:
    want = json.loads(GOLDEN.read_text())[name]
    got = _jsonable(_SAMPLES())[name]
    _same(got, want, name)


def _SAMPLES(cache: dict[str, Any] = {}) -> dict[str, Any]:  # noqa: B006 - computed once per session
    if not cache:
        cache.update(samples())
    return cache


def _properties(cls: type) -> set[str]:
    """What the class binds as public properties, less what it keeps out of its dict."""
    names = {n for klass in cls.__mro__ for n, v in vars(klass).items() if isinstance(v, property) and not n.startswith("_")}
    return names - set(getattr(cls, "_dict_skip", ()))


def _result_classes() -> dict[str, type]:
    modules = [_core, _core.comm, _core.elastic, _core.pool, _core._testing, _sim]
    return {c.__name__: c for m in modules for c in vars(m).values() if isinstance(c, type) and hasattr(c, "to_dict")}


# Each result class with a to_dict, and where the API hands out its dict on the runs above.
_DICTS = {
    "BuildInfo": lambda s: _core._build_info(),
    "ConvergenceSignals": lambda s: s["signals"],
    "Decision": lambda s: s["decision"],
    "DeviceReadStats": lambda s: s["device_reads"],
    "GenerationModel": lambda s: s["generation_fit"],
    "HandoffStats": lambda s: s["handoff"],
    "ProcessEnergy": None,  # needs an elastic world: tests/python/elastic_worker.py reads ctl.energy
    "RlPhase": lambda s: s["rl_sim_sweep"]["dynamic"]["phases"],
    "RlRoleSample": lambda s: s["rl_sim_events_dynamic"]["roles"],
    "RlRun": lambda s: s["rl_sim_sweep"]["dynamic"],
    "RlSweep": lambda s: s["rl_sim_sweep"],
    "RlSwitch": lambda s: s["rl_sim_sweep"]["dynamic"]["switch_log"][0],
    "RlSwitchCostSplit": lambda s: s["rl_sim_sweep"]["dynamic"]["switch_log"][0]["cost_split"],
    "SimApplication": lambda s: s["sim_profile_info"]["cifar10"],
    "SimJobResult": lambda s: s["sim_run.static"]["jobs"][0],
    "SimJobSpec": lambda s: s["sim_read_workload"][0],
    "SimResult": lambda s: s["sim_run.static"],
    "SimStudyRun": lambda s: s["sim_study"][0],
    "SimTimelinePoint": lambda s: s["sim_run.static"]["timeline"],
    "StageDecision": lambda s: s["stage_decide"],
    "StagePrediction": lambda s: s["stage_predict"],
    "StepStatus": lambda s: s["step_status"],
    "WindowDecision": lambda s: s["stage_window"],
    "WorkEstimate": lambda s: s["work_estimate"],
}


def test_every_result_class_is_checked() -> None:
    assert sorted(_result_classes()) == sorted(_DICTS), "a result class with to_dict: add where its dict comes from to _DICTS"


@pytest.mark.parametrize("name", sorted(k for k, v in _DICTS.items() if v is not None))
def test_a_dict_holds_every_bound_property(name: str) -> None:
    """The mechanism, not a list, decides what a dict holds: a property bound later shows up too."""
    cls = _result_classes()[name]
    d = _DICTS[name]({**_SAMPLES(), "generation_fit": _generation_fit()})
    assert set(d) == _properties(cls)
    assert set(d) >= {"step", "decision", "signals", "event", "energy_source"} if name == "StepStatus" else True


def _generation_fit() -> dict[str, Any]:
    policy = rl.StageBalancePolicy(rl.StageBalanceConfig(devices=4))
    policy.observe_decode(8, 8 * 1500.0, 10.0, 0.2)
    return policy.generation_fit


class _Colour(enum.Enum):
    RED = 1


@pytest.fixture
def extra_property():
    """A property added to Decision at run time, as a new binding would add one."""
    added: list[str] = []

    def add(name: str, getter: Any) -> None:
        setattr(_core.Decision, name, property(getter))
        added.append(name)

    yield add
    for name in added:
        delattr(_core.Decision, name)


def test_a_property_added_later_is_in_the_dict(extra_property) -> None:
    extra_property("zz_extra", lambda self: 7)
    extra_property("zz_nested", lambda self: [dra.Capacity(5), {"k": (dra.CostModel(2.0),)}])
    extra_property("zz_enum", lambda self: _Colour.RED)
    extra_property("zz_nan", lambda self: math.nan)
    extra_property("_zz_private", lambda self: 1)
    d = dra.Decision().to_dict()
    assert list(d)[-4:] == ["zz_extra", "zz_nested", "zz_enum", "zz_nan"] and "_zz_private" not in d
    assert d["zz_extra"] == 7
    capacity = dra.Capacity(5)
    assert d["zz_nested"][0] == {"available": 5, "device_price": capacity.device_price}  # bound objects nest as dicts
    assert d["zz_nested"][1] == {"k": ({"resize_cost_s": 2.0, "horizon_steps": 500.0},)}  # tuples stay tuples
    assert d["zz_enum"] == "RED"
    assert math.isnan(d["zz_nan"])  # NaN stays NaN unless the property says None (finite_or_none)


def test_a_cycle_raises_a_clear_error(extra_property) -> None:
    extra_property("zz_self", lambda self: self)
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        dra.Decision().to_dict()


def test_step_status_keeps_its_control_flags_out_of_the_dict() -> None:
    assert set(_core.StepStatus._dict_skip) == {"exit_requested", "released"}
    assert {"exit_requested", "released"} <= {n for n, v in vars(_core.StepStatus).items() if isinstance(v, property)}
    assert not {"exit_requested", "released"} & set(_SAMPLES()["step_status"])


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/python/test_to_dict.py --write  (rewrites the golden file)")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(_jsonable(samples()), indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
