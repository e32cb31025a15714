"""The Python API of the single-process controller, the estimator and the policies."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import dra


@pytest.fixture(autouse=True)
def fresh_controller():
    """Every test starts from a fresh process-wide controller and leaves one behind."""
    dra.reset()
    yield
    dra.reset()


def power_law(t: int) -> float:
    return 4.0 * (1.0 + t / 20.0) ** -0.7


# ---- dra.step -------------------------------------------------------------------------------------


def test_step_with_float_returns_status() -> None:
    status = None
    for t in range(100):
        status = dra.step(power_law(t))
    assert status is not None
    assert status.step == 99
    assert status.world_size == 1
    sig = status.signals
    assert isinstance(sig, dra.ConvergenceSignals)
    assert sig.accepted == 100
    assert sig.loss == pytest.approx(power_law(99))
    assert sig.best_loss == pytest.approx(power_law(99))
    assert sig.progress_rate < 0.0
    assert sig.phase == "fast"
    assert status.decided  # decide_every defaults to 10: step 99 is the 100th step
    assert isinstance(status.decision, dra.Decision)
    assert status.decision.action == "hold"  # one process: nothing to grow into
    assert status.decision.target_size == 1
    assert status.decision.reason
    d = status.to_dict()
    assert set(d) == {"step", "committed", "loss", "world_size", "rank", "epoch", "decided", "signals", "decision", "event",
                      "energy_step_j", "energy_job_j", "energy_source"}
    assert math.isnan(d["energy_job_j"]) and d["energy_source"] == ""  # alone: no meter on dra.step's hot path
    assert d["committed"] and d["rank"] == 0 and d["event"] is None
    assert d["signals"]["phase"] == "fast"
    assert d["decision"]["action"] == "hold"
    assert "phase=fast" in repr(status)
    # The same status object every step (no allocation on the hot path), reading live values.
    assert dra.step(1.0) is status
    assert status.step == 100


def test_step_with_0d_tensor_matches_float() -> None:
    losses = [power_law(t) for t in range(80)]
    for loss in losses:
        dra.step(torch.tensor(loss, dtype=torch.float64, requires_grad=True) * 1.0)
    tensor_signals = dra.default_controller().signals.to_dict()
    dra.reset()
    for loss in losses:
        dra.step(loss)
    float_signals = dra.default_controller().signals.to_dict()
    assert tensor_signals == float_signals


def test_step_reads_a_tensor_once() -> None:
    """One host read per call: the only device synchronisation dra.step may force."""
    reads = []

    class Counting(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.numpy):
                reads.append(func.__name__)
            return super().__torch_function__(func, types, args, kwargs or {})

    loss = torch.tensor(0.75).as_subclass(Counting)
    dra.step(loss)
    dra.step(loss, validation=loss, step_time_s=0.01)
    assert reads == ["item"] * 3  # one per tensor passed: loss; then loss and validation
    assert dra.default_controller().signals.loss == 0.75


def test_step_accepts_ints_and_float_subclasses() -> None:
    import numpy as np

    dra.step(3)
    dra.step(np.float64(2.5))
    dra.step(np.array(2.0))  # type: ignore[arg-type]  # 0-d array: accepted at run time
    assert dra.default_controller().signals.accepted == 3
    assert dra.default_controller().signals.loss == 2.0


@pytest.mark.parametrize(
    "bad",
    [torch.ones(2), torch.ones(1), torch.ones(1, 1), "1.0", None, [1.0]],
    ids=["vector", "one-element-1d", "matrix", "str", "none", "list"],
)
def test_step_rejects_non_scalar_loss(bad) -> None:
    with pytest.raises(ValueError, match="0-d tensor"):
        dra.step(bad)
    # Nothing was counted.
    assert dra.default_controller().signals.accepted == 0


def test_after_a_long_nonfinite_streak_the_signals_decide_again() -> None:
    # Issue 23, decided: a streak of non-finite losses (50 here) is "diverging" while it lasts, so
    # the policy holds; none of it entered the state, so the first finite loss after it gives the
    # phase back (the policy grows again). A job whose parameters took the NaN (a rank's NaN
    # gradient summed into everyone's) has only NaN losses after it and holds, as it should.
    for t in range(200):
        dra.step(power_law(t))
    before = dra.default_controller().signals.phase
    with pytest.warns(RuntimeWarning, match="non-finite loss"):
        for _ in range(50):
            dra.step(float("nan"))
    assert dra.default_controller().signals.diverging
    dra.step(power_law(200))
    sig = dra.default_controller().signals
    assert not sig.diverging and sig.nonfinite_streak == 0
    assert sig.phase == before != "diverging"


def test_an_integer_loss_tensor_is_taken_as_its_value_and_bool_is_refused() -> None:
    # Issue 23, decided: one rule on every device (CPU here; CUDA converts on the device).
    dra.step(torch.tensor(3, dtype=torch.int64))
    assert dra.default_controller().signals.loss == 3.0
    with pytest.raises(ValueError, match="real number"):
        dra.step(torch.tensor(True))


def test_nonfinite_loss_warns_once_per_streak_and_never_raises() -> None:
    for t in range(50):
        dra.step(power_law(t))
    before = dra.default_controller().signals.smoothed_loss
    with pytest.warns(RuntimeWarning, match="non-finite loss nan") as record:
        dra.step(float("nan"))
        dra.step(float("inf"))
        dra.step(torch.tensor(float("nan")))
    assert len(record) == 1  # one streak, one warning
    sig = dra.default_controller().signals
    assert sig.nonfinite_count == 3
    assert sig.nonfinite_streak == 3
    assert sig.smoothed_loss == before  # never entered the state
    assert math.isfinite(sig.progress_rate)
    assert sig.diverging  # three in a row (divergence_nonfinite_streak) means diverging
    # A finite loss ends the streak; the next non-finite one warns again.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dra.step(1.0)
    with pytest.warns(RuntimeWarning) as record:
        dra.step(float("-inf"))
    assert len(record) == 1
    assert dra.default_controller().signals.nonfinite_count == 4


def test_optional_signals() -> None:
    for t in range(40):
        status = dra.step(
            power_law(t),
            small_sqr_norm=1.0 + 64.0 / 8.0,
            small_batch=8,
            big_sqr_norm=1.0 + 64.0 / 64.0,
            big_batch=64,
            validation=0.5,
            step_time_s=0.02,
            sync_time_s=0.0,
        )
    sig = status.signals
    assert sig.gns_valid
    assert sig.gns == pytest.approx(64.0)  # tr(Sigma) = 64, |G|^2 = 1
    assert sig.has_validation and sig.validation_metric == 0.5
    assert dra.default_controller().engine.throughput.observations == 40


def test_step_errors() -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        dra.step(1.0, learning_rate=0.1)
    with pytest.raises(ValueError, match="gradient statistics need all"):
        dra.step(1.0, small_sqr_norm=1.0)
    with pytest.raises(ValueError, match="0-d tensor"):
        dra.step(1.0, validation=torch.ones(3))
    # A rejected call changes nothing: no step was taken.
    assert dra.default_controller().step_index == 0
    assert dra.default_controller().signals.accepted == 0


def test_reset_installs_a_controller() -> None:
    dra.step(1.0)
    dra.step(0.9)
    mine = dra.Controller(policy="goodput", decide_every=1, min_size=1, max_size=4)
    assert dra.reset(mine) is mine
    assert dra.default_controller() is mine
    status = dra.step(2.0)
    assert status.step == 0
    assert status.decided
    assert status.decision.policy == "goodput"
    fresh = dra.reset()
    assert fresh is not mine
    assert dra.default_controller().signals.accepted == 0


def test_step_follows_reset_even_when_imported_by_name() -> None:
    from dra import step as imported_step

    first = dra.default_controller()
    imported_step(1.0)
    second = dra.reset(dra.Controller())
    imported_step(2.0)
    imported_step(3.0)
    assert first.signals.accepted == 1
    assert second.signals.accepted == 2
    assert second.step_index == 2


def test_reset_takes_only_a_controller() -> None:
    """One controller type behind dra.step: anything else is refused, and the old one stays."""
    before = dra.default_controller()
    with pytest.raises(ValueError, match="dra.Controller"):
        dra.reset(object())  # type: ignore[arg-type]
    assert dra.default_controller() is before


def test_fast_and_python_paths_agree() -> None:
    """A Controller subclass that overrides step() takes the Python path; results are identical."""

    class Traced(dra.Controller):
        calls = 0

        def step(self, loss, **signals):
            Traced.calls += 1
            return super().step(loss, **signals)

    losses = [power_law(t) for t in range(120)] + [float("nan")] + [power_law(t) for t in range(120, 200)]
    with pytest.warns(RuntimeWarning):
        for loss in losses:
            dra.step(loss)
    fast = dra.default_controller().signals.to_dict()
    fast_decision = dra.default_controller().engine.status.last_decision.to_dict()
    dra.reset(Traced())
    with pytest.warns(RuntimeWarning):
        for loss in losses:
            dra.step(loss)
    assert Traced.calls == len(losses)
    assert dra.default_controller().signals.to_dict() == fast
    assert dra.default_controller().engine.status.last_decision.to_dict() == fast_decision


def test_nonfinite_warning_points_at_the_caller() -> None:
    with pytest.warns(RuntimeWarning) as fast:
        dra.step(float("nan"))  # C fast path
    dra.step(1.0)
    with pytest.warns(RuntimeWarning) as slow:
        dra.step(torch.tensor(float("nan")))  # Python path
    assert fast[0].filename == __file__
    assert slow[0].filename == __file__


def test_warnings_as_errors_propagate_from_the_fast_path() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            dra.step(float("inf"))
    # The step was still counted before the warning was raised.
    assert dra.default_controller().signals.nonfinite_count == 1


# ---- configuration errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"min_size": 3, "max_size": 2}, "min_size"),
        ({"min_size": 0}, "min_size"),
        ({"policy": "fastest"}, "policy"),
        ({"decide_every": 0}, "decide_every"),
        ({"horizon_steps": 0.0}, "horizon_steps"),
        ({"resize_cost_s": -1.0}, "resize_cost_s"),
        ({"estimator": {"window": 2}}, "window"),
        ({"estimator": {"loss_decay": 1.5}}, "loss_decay"),
        ({"limits": {"cooldown_steps": -1}}, "cooldown_steps"),
        ({"limits": {"allowed_sizes": [8], "max_size": 4}}, "allowed_sizes"),
        ({"convergence": {"grow_step": 0}}, "grow_step"),
        ({"goodput": {"min_marginal_efficiency": 2.0}}, "min_marginal_efficiency"),
        ({"throughput": {"gamma": 0.5}}, "gamma"),
        ({"bogus": 1}, "bogus"),
        ({"estimator": {"windows": 10}}, "windows"),
    ],
)
def test_bad_configuration_raises_value_error_naming_field(options, field) -> None:
    with pytest.raises(ValueError, match=field):
        dra.Controller(**options)


def test_config_objects_validate_on_construction() -> None:
    with pytest.raises(ValueError, match="min_size"):
        dra.Constraints(min_size=5, max_size=2)
    with pytest.raises(ValueError, match="unknown option 'cooldown'"):
        dra.Constraints(cooldown=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="plateau_exit_t_threshold"):
        dra.EstimatorConfig(plateau_t_threshold=3.0, plateau_exit_t_threshold=2.0)
    cfg = dra.EstimatorConfig(window=16, plateau_patience=8)
    assert cfg.window == 16 and cfg.plateau_patience == 8
    with pytest.raises(ValueError, match="window"):
        dra.ConvergenceEstimator(dra.EstimatorConfig(window=2))
    with pytest.raises(ValueError, match="either an EngineConfig or keyword options"):
        dra.Controller(dra.EngineConfig(), policy="goodput")


# ---- estimator ------------------------------------------------------------------------------------


def test_convergence_estimator_from_python() -> None:
    est = dra.ConvergenceEstimator(dra.EstimatorConfig(window=16, warmup_steps=16, plateau_patience=8))
    assert est.update_loss(0, 2.0)
    assert not est.update_loss(0, 1.0)  # step did not advance
    assert est.rejected_steps == 1
    assert not est.update_loss(1, float("nan"))
    assert est.signals.nonfinite_count == 1
    for t in range(2, 200):
        est.update_loss(t, 1.0)
    s = est.signals
    assert s.plateau and s.phase == "plateau"
    assert s.progress_rate == pytest.approx(0.0, abs=1e-12)
    assert est.update_gradients(9.0, 8.0, 2.0, 64.0)
    assert est.signals.gns_valid and not est.signals.gns_biased
    assert est.signals.gns == pytest.approx((9.0 - 2.0) / (1 / 8 - 1 / 64) / ((64 * 2.0 - 8 * 9.0) / 56))
    assert est.update_gradients(9.0, 8.0, 2.0, 16.0, biased=True)
    assert est.signals.gns_biased
    assert not est.update_gradients(1.0, 8.0, 1.0, 8.0)  # big batch must exceed small
    assert est.config.window == 16
    assert "plateau" in repr(est.signals)


# ---- policies and decisions -----------------------------------------------------------------------


def _fast_signals() -> dra.ConvergenceSignals:
    est = dra.ConvergenceEstimator()
    for t in range(200):
        est.update_loss(t, 4.0 * math.exp(-0.005 * t))
    assert est.signals.phase == "fast"
    return est.signals


def _plateau_signals() -> dra.ConvergenceSignals:
    est = dra.ConvergenceEstimator()
    for t in range(200):
        est.update_loss(t, 1.0)
    assert est.signals.phase == "plateau"
    return est.signals


def _world(size: int, candidates: list[int]) -> dra.WorldState:
    w = dra.WorldState()
    w.size = size
    w.active = list(range(size))
    w.candidates = candidates
    w.steps_since_resize = 1000
    w.global_batch = 256.0
    w.base_batch = 256.0
    return w


def _scaling_model() -> dra.ThroughputModel:
    model = dra.ThroughputModel(dra.ThroughputModelConfig(prior_sync_fixed_s=0.0, prior_sync_per_rank_s=0.0))
    for k in (1, 2, 4):
        assert model.observe(k, 256.0 / k, 0.001 * 256.0 / k, 0.0)
    return model


def test_constrained_policy_grows_on_fast_progress() -> None:
    policy = dra.ConstrainedPolicy(dra.ConvergencePhasePolicy(dra.ConvergencePhaseConfig(grow_step=2)), dra.Constraints(max_size=8))
    d = policy.decide(_fast_signals(), _world(2, [5, 6, 7]), dra.Capacity(5), dra.CostModel(0.0), _scaling_model())
    assert isinstance(d, dra.Decision)
    assert d.action == "grow"
    assert d.target_size == 4
    assert d.join == [5, 6]
    assert d.leave == []
    assert d.batch_scale == 1.0 and d.lr_scale == 1.0
    assert d.policy == "convergence"
    assert "grow" in d.reason
    assert d.to_dict()["join"] == [5, 6]


def test_constrained_policy_plateau_shrinks_to_min_and_amortisation_blocks() -> None:
    policy = dra.ConstrainedPolicy(dra.ConvergencePhasePolicy(), dra.Constraints(min_size=2))
    d = policy.decide(_plateau_signals(), _world(6, []), dra.Capacity(6), dra.CostModel(0.0), _scaling_model())
    assert d.action == "shrink"
    assert d.target_size == 2
    assert d.leave == [2, 3, 4, 5]
    assert "plateau" in d.reason
    # A resize that costs more than it can save over the horizon is held.
    blocked = policy.decide(_plateau_signals(), _world(6, []), dra.Capacity(6), dra.CostModel(1e6, 10.0), _scaling_model())
    assert blocked.action == "hold"
    assert blocked.target_size == 6
    assert "would not pay back" in blocked.reason


def test_goodput_policy_and_cooldown_from_python() -> None:
    limits = dra.Constraints(cooldown_steps=100, amortise=False)
    policy = dra.ConstrainedPolicy(dra.GoodputPolicy(dra.GoodputConfig(min_marginal_efficiency=0.5)), limits)
    world = _world(1, [1, 2, 3])
    world.steps_since_resize = 10
    d = policy.decide(_fast_signals(), world, dra.Capacity(4), dra.CostModel(), _scaling_model())
    assert d.action == "hold" and "cooldown" in d.reason
    world.steps_since_resize = 100
    d = policy.decide(_fast_signals(), world, dra.Capacity(4), dra.CostModel(), _scaling_model())
    assert d.action == "grow" and d.target_size == 4 and d.policy == "goodput"
    assert d.predicted_speedup > 1.0


def test_decisions_are_deterministic() -> None:
    def run() -> list[tuple]:
        policy = dra.ConstrainedPolicy(dra.GoodputPolicy(dra.GoodputConfig(adapt_batch=True)), dra.Constraints(hysteresis_decisions=2))
        out = []
        for size in (1, 2, 3, 4, 2, 1):
            d = policy.decide(_fast_signals(), _world(size, list(range(size, 8))), dra.Capacity(8), dra.CostModel(0.1), _scaling_model())
            out.append((d.action, d.target_size, d.join, d.leave, d.batch_scale.hex(), d.lr_scale.hex(), d.reason))
        return out

    assert run() == run()


def test_policy_configuration_errors() -> None:
    with pytest.raises(ValueError, match="grow_step"):
        dra.ConvergencePhaseConfig(grow_step=0)
    with pytest.raises(ValueError, match="max_per_rank_batch"):
        dra.GoodputConfig(min_per_rank_batch=8.0, max_per_rank_batch=4.0)
    with pytest.raises(ValueError, match="unknown option"):
        dra.GoodputConfig(adapt=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="policy"):
        dra.ConstrainedPolicy(None)  # type: ignore[arg-type]


def test_efficiency_helpers() -> None:
    assert dra.statistical_efficiency(100.0, True, 300.0, 100.0) == pytest.approx(0.5)
    assert dra.statistical_efficiency(100.0, False, 300.0, 100.0) == 1.0
    assert dra.adascale_gain(0.0, True, 400.0, 100.0) == pytest.approx(1.0)


# ---- package --------------------------------------------------------------------------------------


def test_step_signature_and_doc() -> None:
    import inspect

    params = inspect.signature(dra.step).parameters
    assert list(params) == ["loss", "signals"]
    assert params["signals"].kind is inspect.Parameter.VAR_KEYWORD
    assert "0-d tensor" in (dra.step.__doc__ or "")


def test_build_info_keys() -> None:
    info = dra.build_info()
    assert set(info) >= {"version", "torch_version", "torch_version_compiled", "compiler", "backends"}
    assert info["version"] == dra.__version__
    assert info["torch_version"] == torch.__version__
    assert set(info["backends"]) >= {"gloo", "nccl"}
    assert isinstance(info["backends"]["gloo"], bool)


def test_public_names_have_docstrings() -> None:
    for name in dra.__all__:
        if name == "__version__":
            continue
        obj = getattr(dra, name)
        assert obj.__doc__, name
    assert "B_simple" in (dra.ConvergenceSignals.gns.__doc__ or "")
