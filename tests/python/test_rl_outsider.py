"""The RL part fed inputs nobody on the project wrote (an outside review, 2026-12-06), each case a
defect found and fixed:

- sequences per step had no bound: one `dra-sim rl` ran the host out of memory (22.5 GB), and
  prompts x group past 2^31 wrapped to 2 sequences, run without a word;
- a generation the stage-balance policy rejected still fed its prompt to the model, and one length
  of 1e300 moved every prediction to 1e9 s; an infinite token count fed the training model;
- a split outside [min_rollout, devices - min_train] was held for the whole run, called "balanced";
- JSON `true` passed for a number.
"""

from __future__ import annotations

import math

import pytest

import dra.rl as rl
from dra.rl import cli

pytestmark = pytest.mark.timeout(300)


def _policy(**config) -> rl.StageBalancePolicy:
    c = rl.StageBalanceConfig()
    c.devices = 8
    for k, v in config.items():
        setattr(c, k, v)
    p = rl.StageBalancePolicy(c)
    for length in (100, 200, 300, 50, 80):
        p.observe_generation(256, length)
    p.observe_decode(32, 3000.0, 100.0, 1.2)
    p.observe_decode(64, 9000.0, 100.0, 2.5)
    p.observe_decode(16, 1000.0, 100.0, 1.0)
    p.observe_train(4, 30000.0, 20.0, 1.0)
    p.observe_train(6, 20000.0, 14.0, 1.2)
    p.observe_train(2, 60000.0, 40.0, 0.6)
    p.observe_weight_sync(0.5)
    return p


def _predictions(p: rl.StageBalancePolicy) -> list[float]:
    return [x["step_s"] for x in p.predict_all(64)]


def test_a_rejected_or_absurd_generation_changes_no_prediction():
    p = _policy()
    before, rejected = _predictions(p), p.lengths.rejected
    for _ in range(50):
        p.observe_generation(1e9, float("nan"))  # its prompt was taken in: 10 s -> 190,000 s
    p.observe_generation(256, 1e300)
    p.observe_generation(float("inf"), 100)
    assert _predictions(p) == before
    assert p.lengths.rejected == rejected + 52
    assert all(math.isfinite(s) and s < 1000 for s in _predictions(p))


def test_an_infinite_token_count_does_not_feed_the_training_model():
    p = _policy()
    before = _predictions(p)
    assert p.observe_train(4, float("inf"), 1.0, 0.1) is False
    assert _predictions(p) == before


def test_a_split_outside_the_minimums_is_restored_at_once():
    p = _policy(min_rollout=7, max_move=8, cooldown_steps=100, hysteresis_decisions=3)
    d = p.decide(4, 4, 0, 20)  # (rollout, train, steps since a switch, steps left)
    assert d["rollout"] == 7 and d["train"] == 1, d
    assert "restore" in d["reason"], d
    q = _policy(min_train=6, max_move=1)
    d = q.decide(4, 4, 0, 20)
    assert d["rollout"] == 3 and "restore" in d["reason"], d  # one move closer (max_move 1)


def _rl(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(argv)
    return code, capsys.readouterr().err


def test_sequences_per_step_are_bounded_before_anything_is_drawn(tmp_path, capsys):
    out = tmp_path / "rl.json"
    for workload in ("prompts_per_step=100000000", "prompts_per_step=1431655766"):  # 2^31 wrapped with group 3
        code, err = _rl(["--steps", "20", "--workload", workload, "--workload", "group_size=3", "--json", str(out)],
                        capsys)
        assert code == 2, err
        assert "sequences per step" in err and "Traceback" not in err, err
        assert not out.exists()
    # Within a step's bound, but too many sequences over the run for about 10 minutes.
    code, err = _rl(["--steps", "400", "--workload", "prompts_per_step=1000", "--workload", "group_size=1000",
                     "--json", str(out)], capsys)
    assert code == 2 and "prompts_per_step x group_size" in err, err
    assert not out.exists()


def test_json_true_is_not_a_number(capsys):
    code, err = _rl(["--workload", "steps=true"], capsys)
    assert code == 2 and "steps" in err and "true" in err.lower(), err
    with pytest.raises(ValueError, match="group_size: expected a number"):
        rl.simulate("code_balanced" if "code_balanced" in rl.SCENARIOS else next(iter(rl.SCENARIOS)), steps=2,
                    workload={"group_size": True})


def test_policy_options_the_run_sets_are_refused_not_recorded():
    scenario = next(iter(rl.SCENARIOS))
    for option in ({"devices": 99}, {"pipeline": "synchronous"}):
        with pytest.raises(ValueError, match="set by the run itself"):
            rl.simulate(scenario, steps=2, policy=option)


def test_a_length_source_given_overrides_the_scenarios():
    with_trace = [n for n, s in rl.SCENARIOS.items() if s.get("trace") is not None]
    with_constant = [n for n, s in rl.SCENARIOS.items() if s.get("constant_length") is not None]
    if with_constant:
        doc = rl.simulate(with_constant[0], trace="code", steps=2)
        assert "GeneratedTokens" in doc["settings"]["length_source"], doc["settings"]
    if with_trace:
        doc = rl.simulate(with_trace[0], constant_length=100, steps=2)
        assert doc["settings"]["length_source"].startswith("constant"), doc["settings"]
    assert with_trace or with_constant


def test_live_settings_are_checked_before_anything_starts():
    from dra.rl.live.config import LiveConfig

    with pytest.raises(ValueError, match="cooldown_steps"):
        LiveConfig(policy={"cooldown_steps": -1}).validate()
    with pytest.raises(ValueError, match="policy.devices: set by the run itself"):
        LiveConfig(policy={"devices": 99}).validate()
    LiveConfig(policy={"min_relative_gain": 0.1}).validate()


# -- A second outside review (2026-12-07) ----------------------------------------------------------


def test_the_reasoning_length_model_is_refused_in_the_phase_model(capsys):
    """--workload lengths=reasoning replaced the trace (or constant) while the output still named
    it: 'constant 100 tokens' over lengths of mean 3,300 with a tail to 32,768."""
    for source in (["--constant-length", "100"], ["--trace", "code"]):
        code, err = _rl([*source, "--steps", "3", "--workload", "lengths=reasoning"], capsys)
        assert code == 2 and "lengths=reasoning" in err and "event model" in err, err


def test_generation_lengths_past_what_the_policy_observes_are_refused(capsys):
    """Lengths above 1e7 tokens were simulated but never observed by the policy, which held its
    first split blind (+73 % time), with nothing said; infinity was accepted."""
    for cap in ("2e7", "1e400"):
        code, err = _rl(["--constant-length", "100", "--steps", "2", "--workload", f"max_generation_tokens={cap}"],
                        capsys)
        assert code == 2 and "max_generation_tokens" in err and "1e7" in err, err


def test_no_bubble_fraction_is_negative():
    doc = rl.simulate(constant_length=10_000_000, steps=3, workload={"max_generation_tokens": 1e7})
    runs = [*doc["statics"], doc["dynamic"], doc["oracle"], doc["colocated"]]
    assert all(r["bubble_fraction"] >= 0.0 for r in runs), [r["bubble_fraction"] for r in runs]
