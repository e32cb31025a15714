"""The single-process API and dra.rl driven as an outside user does, with the inputs users give it:
every bad one is a one-line error naming the value and the fix (no pybind11 signature dump, no
internal name), and nothing is silently dropped."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch

import dra
import dra.rl as rl
from dra import _core


@pytest.fixture(autouse=True)
def _fresh_controller():
    dra.reset(dra.Controller(decide_every=10))
    yield
    dra.reset()


def test_a_meta_tensor_loss_is_refused_by_name() -> None:
    # It raised torch's "Tensor.item() cannot be called on meta tensors" from inside dra.step.
    with pytest.raises(ValueError, match=r"dra\.step: the loss is a tensor on the meta device.*cpu or cuda"):
        dra.step(torch.tensor(1.0, device="meta"))
    assert dra.step(1.0).step == 0  # nothing was counted


def test_a_second_positional_argument_names_dra_step() -> None:
    # It raised "_step_slow() takes 1 positional argument but 2 were given".
    with pytest.raises(TypeError, match=r"dra\.step: takes the loss as its one positional argument, got 2; pass"):
        dra.step(1.0, 2.0)


def test_a_numpy_nan_is_warned_about_as_a_float() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = dra.step(np.float64("nan"))
    assert status.signals.nonfinite_count == 1
    assert [str(w.message).split(" at ")[0] for w in caught] == ["dra.step: non-finite loss nan"]


@pytest.mark.parametrize("make", [lambda s: s, lambda s: s.signals, lambda s: s.decision])
@pytest.mark.parametrize("how", [pickle.dumps, copy.copy, copy.deepcopy])
def test_live_status_objects_refuse_pickling_and_copying_with_the_fix(make, how) -> None:
    status = dra.step(1.0)
    with pytest.raises(TypeError, match=r"cannot be pickled or copied; keep .*to_dict\(\), a plain dict"):
        how(make(status))
    assert make(status).to_dict()  # the fix works


@pytest.mark.parametrize("how", [pickle.dumps, copy.copy, copy.deepcopy])
def test_a_controller_refuses_pickling_and_copying_with_the_fix(how) -> None:
    with pytest.raises(TypeError, match=r"Controller: a controller holds a live engine.*dra\.Controller\(\*\*options\)"):
        how(dra.Controller())


def test_an_engine_config_budget_is_not_dropped_silently() -> None:
    # dra.Controller(config) used to ignore EngineConfig.declared_steps without a word.
    config = dra.EngineConfig(policy="goodput", declared_steps=1000)
    with pytest.raises(ValueError, match=r"declared_steps: 1000: dra\.Controller takes no declared budget.*ResizeEngine"):
        dra.Controller(config)
    assert dra.ResizeEngine(config).config.declared_steps == 1000


@pytest.mark.parametrize(("build", "message"), [
    (lambda: dra.EngineConfig(decide_every="10"), r"^decide_every: '10' \(str\) is not of type int; give a value"),
    (lambda: dra.EngineConfig(policy=3), r"^policy: 3 \(int\) is not of type str"),
    (lambda: dra.Controller(policy="zeus_cost", energy={"objective": "zeus_cost"}),
     r"^energy: objective: 'zeus_cost' \(str\) is not of type EnergyObjective"),
    (lambda: dra.EstimatorConfig(window=2**70), r"^window: 1180591620717411303424 is out of range for this field"),
])
def test_a_config_value_of_the_wrong_type_is_named(build, message) -> None:
    # Each raised pybind11's TypeError "(): incompatible function arguments" with the setter's signature.
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"devices": 2.5}, r"devices: expected an integer, got 2\.5 \(float\)"),
    ({"devices": "8"}, r"devices: expected an integer, got '8' \(str\)"),
    ({"initial_rollout": None}, r"initial_rollout: expected an integer, got None"),
    ({"seed": -1}, r"seed: -1 is out of range for this field; give a smaller or non-negative integer"),
])
def test_rl_simulate_names_a_bad_argument(kwargs, message) -> None:
    # devices=2.5 raised "rl_sim_sweep(): incompatible function arguments"; seed=-1 said "-1 is not of type int".
    with pytest.raises(ValueError, match=message):
        rl.simulate(steps=2, **kwargs)


def test_rl_simulate_pipeline_names_a_bad_device_count() -> None:
    with pytest.raises(ValueError, match=r"devices: expected an integer, got 4\.0 \(float\)"):
        rl.simulate_pipeline(devices=4.0, steps=2)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: rl.simulate(devices=10**6, steps=2), r"devices: 1000000 is above the phase model's bound 1024"),
    (lambda: rl.simulate(steps=10**9), r"steps: 1000000000 is above the bound 100,000"),
    (lambda: rl.simulate(workload={"steps": 10**9}), r"steps: 1000000000 is above the bound"),
    (lambda: rl.simulate_pipeline(devices=4096, steps=2), r"devices: 4096 is above the event model's bound 64"),
    (lambda: rl.simulate_pipeline(steps=2, lookahead_samples=10**6), r"lookahead_samples: 1000000 is above the bound 64"),
])
def test_rl_simulations_refuse_sizes_that_would_not_end(call, message) -> None:
    # dra-sim rl bounded them; the Python API ran on silently (devices=10**6 for hours: every static
    # split is simulated; 256 devices in the event model took 74 s for 20 steps).
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"slots": 2.5}, r"slots: expected an integer, got 2\.5"),
    ({"slots": "4"}, r"slots: expected an integer, got '4'"),
    ({"timeout_s": 0}, r"timeout_s: must be a finite number > 0, got 0"),
    ({"timeout_s": float("nan")}, r"timeout_s: must be a finite number > 0, got nan"),
    ({"cpus_per_slot": -1.0}, r"cpus_per_slot: must be a finite number > 0"),
    ({"rollout_slots": 0}, r"rollout_slots: must be >= 1, got 0"),
    ({"lr": float("inf")}, r"lr: must be a finite number > 0"),
    ({"policy": "lookahead"}, r"policy: expected a dict of StageBalanceConfig options"),
    ({"policy": {"cooldown": 3}}, r"policy: unknown option 'cooldown'; valid options: .*cooldown_steps"),
    ({"model": {"d_model": 64}}, r"model: expected a dra\.rl\.live\.model\.ModelConfig.*ModelConfig\(\*\*"),
    ({"trace": "nope"}, r"trace: 'nope' is neither a shipped trace"),
    ({"use_cgroups": "no"}, r"use_cgroups: expected True or False"),
])
def test_live_config_names_a_bad_setting_before_anything_starts(kwargs, message) -> None:
    # Each was accepted by validate() and failed later (after the warm-up), deep inside, or never.
    from dra.rl.live.config import LiveConfig

    with pytest.raises(ValueError, match=message):
        LiveConfig(**kwargs).validate()
    LiveConfig(policy={"planner": "lookahead", "cooldown_steps": 2}).validate()


@pytest.mark.parametrize("losses,said", [
    ([-1.0 - 0.01 * i for i in range(40)], True),  # a negative log-likelihood bound, a reward passed negated
    ([0.0] * 40, True),
    ([-1.0] * 5 + [0.5] + [-1.0] * 34, False),  # one positive loss: the fit has something
    ([2.0 / (1 + i) for i in range(40)], False),
])
def test_a_loss_that_is_never_positive_is_said_once(capfd, losses, said) -> None:
    # The loss-trend signals fit log(loss): a loss never positive left them empty and the phase in
    # warmup for the whole run, and nothing said so.
    dra.reset(dra.Controller(decide_every=10, estimator={"warmup_steps": 16}))
    for loss in losses:
        status = dra.step(torch.tensor(loss))
    dra.step(-5.0)
    err = capfd.readouterr().err
    assert err.count("is <= 0: the convergence signals fit log(loss)") == (1 if said else 0), err
    if said:
        assert status.signals.phase == "warmup" and "step 15: every loss so far (16 steps" in err


@pytest.mark.parametrize("kwargs", [
    {"warmup_steps": 16},  # an unknown option: no world
    {"model": torch.nn.Linear(2, 1), "optimizer": None, "sampler": None},  # an elastic job's objects refused
])
def test_a_controller_whose_construction_failed_is_safe_to_look_at(kwargs) -> None:
    # The half-made object stays reachable from the traceback's frames, where pytest (on a failing
    # test), a debugger or a crash reporter calls its repr: that read a C++ object that was never
    # made and killed the process with SIGSEGV.
    with pytest.raises((ValueError, TypeError)) as info:
        dra.Controller(**kwargs)
    made = [e.frame.f_locals["self"] for e in info.traceback
            if isinstance(e.frame.f_locals.get("self"), dra.Controller)]
    assert made
    for ctl in made:
        assert repr(ctl) == "<dra.Controller whose construction failed (an inert local controller)>"
        assert ctl.status.world_size == 1 and ctl.world_size == 1


@pytest.mark.parametrize(("stmt", "message"), [
    ("cfg.estimator.window = '8'", r"^window: '8' \(str\) is not of type int; give a value of that type$"),
    ("cfg.estimator.warmup_steps = -1", r"^warmup_steps: -1 is out of range for this field"),
    ("cfg.policy = 5", r"^policy: 5 \(int\) is not of type str"),
    ("cfg.min_size = 2", r"^unknown option 'min_size'; valid options: convergence, .*decide_every"),
    ("cfg.throughput.prior_sync_fixed_s = 'nan'", r"^prior_sync_fixed_s: 'nan' is not a finite number"),
    ("core.RlWorkload().steps = 2.5", r"^steps: 2\.5 \(float\) is not of type int"),
])
def test_assigning_a_config_field_names_it(stmt, message) -> None:
    # A value of the wrong type assigned after construction raised pybind11's TypeError listing
    # the setter's signature ("(): incompatible function arguments ... Invoked with: <...>, -1"),
    # and a misspelt field an AttributeError that named no valid one.
    cfg = dra.EngineConfig()
    with pytest.raises(ValueError, match=message):
        exec(stmt, {"cfg": cfg, "core": _core})
    cfg.estimator.window = 16  # a right value still goes through
    assert cfg.estimator.window == 16


def test_the_live_reward_figure_of_a_one_step_run_shows_its_point(tmp_path, monkeypatch) -> None:
    # A 1-step run's curve was one point drawn as a line (nothing shown) and the axis claimed a
    # 10-step mean. Points get markers, and the label names the mean the runs can have.
    import matplotlib.pyplot as plt

    from dra.rl.plots import plot_rewards

    monkeypatch.setattr(plt, "close", lambda fig=None: None)  # keep the figure to look at it
    runs = {"static-2": {"rewards": [0.25]}, "dynamic": {"rewards": [0.5]}}
    assert plot_rewards(runs, [], tmp_path / "r.png", window=10).stat().st_size > 5000
    ax = plt.gcf().axes[0]
    assert [line.get_marker() for line in ax.lines] == ["o", "o"]
    assert ax.get_ylabel() == "mean reward of the batch"
    plot_rewards({"dynamic": {"rewards": [0.1 * i for i in range(30)]}}, [], tmp_path / "s.png", window=10)
    ax = plt.gcf().axes[0]
    assert ax.get_ylabel() == "mean reward of the batch (mean of the last 10 steps)"
    assert ax.lines[0].get_marker() in ("None", None, "")
    plt.close("all")
