"""Binding results become dicts by one mechanism (python/to_dict.hpp): every bound property, nothing listed.

The golden file holds what the hand-written ``*_to_dict`` functions produced on these small runs
before the mechanism replaced them (captured from that build); the dicts must stay equal, keys,
order and values. After a deliberate change of a simulator's behaviour, rewrite it with
``python tests/python/test_to_dict.py --write`` and say so in the commit.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import dra
import dra.rl as rl
import dra.sim as sim
from dra import _core

GOLDEN = Path(__file__).with_name("data") / "to_dict_golden.json"


def _power_law(t: int) -> float:
    return 4.0 * (1.0 + t / 20.0) ** -0.7


def _sim_samples() -> dict[str, Any]:
    profiles = sim.load_profiles()
    jobs = _core.sim_read_workload(str(sim.default_data_dir() / "workloads" / "workload-1.csv"), profiles)[:3]
    out: dict[str, Any] = {"sim_read_workload": jobs, "sim_profile_info": {a: profiles.info(a) for a in profiles.names()}}
    for policy in ("static", "convergence_aware"):
        result = _core.sim_run(profiles, jobs, policy, 30.0, 600.0, 2, 4)
        result.pop("wall_s")  # the simulator's own run time: not reproducible
        out[f"sim_run.{policy}"] = result
    # Stopped early: jobs that never started or finished (None where the functions wrote None).
    out["sim_run.stopped"] = _core.sim_run(profiles, jobs, "static", 30.0, 600.0, 1, 1, progress=lambda now, *_: now < 1800.0)
    out["sim_run.stopped"].pop("wall_s")
    out["sim_study"] = _core.sim_study(profiles, jobs, 2, 5, ["convergence_aware"], 30.0, 1.0, 600.0)
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
    return {
        "rl_sim_sweep": sweep,
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
    return {"signals": est.signals.to_dict(), "decision": decision.to_dict()}


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


def _jsonable(doc: Any) -> Any:
    """The samples as JSON reads them back (tuples become lists)."""
    return json.loads(json.dumps(doc))


@pytest.mark.parametrize("name", sorted(json.loads(GOLDEN.read_text())) if GOLDEN.exists() else [])
def test_dicts_equal_what_the_hand_written_functions_produced(name: str) -> None:
    want = json.loads(GOLDEN.read_text())[name]
    got = _jsonable(_SAMPLES()[name])
    _same(got, want, name)


def _SAMPLES(cache: dict[str, Any] = {}) -> dict[str, Any]:  # noqa: B006 - computed once per session
    if not cache:
        cache.update(samples())
    return cache


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/python/test_to_dict.py --write  (rewrites the golden file)")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(_jsonable(samples()), indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
