"""Outside review of what training scripts pass to dra.step: the loss in the forms other libraries
hand it over, and the optional signals (gradient statistics, validation, timings) with the values a
real run produces, including the overflowed ones of a mixed-precision step. Each either works or
raises a ValueError naming the value and the fix, and a refused call changes nothing.

The real runs start 2 processes under `dra run` (real Gloo); every process a test starts carries an
environment token and is killed at the end."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from _elastic_harness import linear_job_script, run_logged_script

import dra

NAN, INF = float("nan"), float("inf")
GRADS = {"small_sqr_norm": 2.0, "small_batch": 8, "big_sqr_norm": 1.2, "big_batch": 16}


@pytest.fixture(autouse=True)
def _fresh_controller():
    dra.reset(dra.Controller(decide_every=10))
    yield
    dra.reset()


def _untouched() -> None:
    """A refused call took no step and fed nothing."""
    ctl = dra.default_controller()
    assert ctl.step_index == 0 and ctl.signals.accepted == 0 and ctl.signals.nonfinite_count == 0


@pytest.mark.parametrize("norm", [NAN, torch.tensor(NAN), torch.tensor(INF, dtype=torch.float16)])
def test_an_overflowed_gradient_norm_is_counted_not_raised(norm) -> None:
    # An AMP step whose gradients overflowed (the GradScaler skips it) has NaN/inf norms. A NaN one
    # raised "gradient statistics need all of small_sqr_norm, small_batch, big_sqr_norm, big_batch"
    # although all four were given, ending the training run at its first overflow; an inf was counted.
    for t in range(3):
        status = dra.step(1.0 / (t + 1), **GRADS)
    assert status.signals.gns_valid
    gns = status.signals.gns
    status = dra.step(0.2, **{**GRADS, "small_sqr_norm": norm, "big_sqr_norm": norm})
    assert status.step == 3 and status.signals.accepted == 4
    assert status.signals.nonfinite_count == 1 and status.signals.gns == gns  # counted, kept out of the state


def test_equal_batches_are_a_world_of_one_and_carry_no_statistics() -> None:
    # big_batch = world size x small_batch (docs/guide/signals.md) is small_batch in a world of one:
    # that raised "big_batch: needs 0 < small_batch < big_batch" at every step of a job shrunk to one.
    status = dra.step(1.0, small_sqr_norm=2.0, small_batch=8, big_sqr_norm=2.0, big_batch=8)
    assert status.step == 0 and not status.signals.gns_valid and status.signals.nonfinite_count == 0
    with pytest.raises(ValueError, match=r"big_batch: needs 0 < small_batch <= big_batch \(finite\), got 16\.0+ and 8\.0"):
        dra.step(1.0, small_sqr_norm=2.0, small_batch=16, big_sqr_norm=2.0, big_batch=8)  # swapped: still refused


@pytest.mark.parametrize(("given", "missing"), [
    ({"small_sqr_norm": 1.0}, "small_batch, big_sqr_norm, big_batch"),
    ({"small_batch": 8, "big_sqr_norm": 1.0, "big_batch": 16}, "small_sqr_norm"),
    ({**GRADS, "big_sqr_norm": None}, "big_sqr_norm"),
])
def test_incomplete_gradient_statistics_name_what_is_missing(given, missing) -> None:
    with pytest.raises(ValueError, match=rf"gradient statistics need all of .*; missing {missing}$"):
        dra.step(1.0, **given)
    _untouched()


@pytest.mark.parametrize("key", ["small_batch", "big_batch"])
@pytest.mark.parametrize("value", [NAN, INF, 0, -8])
def test_a_batch_size_that_is_no_count_of_samples_is_named_with_its_value(key, value) -> None:
    # A NaN batch size said "gradient statistics need all of ..." with all four given (NaN is the
    # binding's "not given"), and never named the value.
    with pytest.raises(ValueError, match=rf"^{key}: must be a finite number of samples > 0, got {value!r}"):
        dra.step(1.0, **{**GRADS, key: value})
    _untouched()


def test_a_nan_validation_metric_is_counted_as_an_inf_is() -> None:
    # A NaN validation was dropped without a trace while an inf was counted in nonfinite_count
    # (docs/guide/signals.md: non-finite metrics are counted).
    status = dra.step(1.0, validation=NAN)
    assert status.signals.nonfinite_count == 1 and not status.signals.has_validation
    status = dra.step(0.9, validation=torch.tensor(NAN))
    assert status.signals.nonfinite_count == 2
    status = dra.step(0.8, validation=0.7)
    assert status.signals.has_validation and status.signals.validation_metric == 0.7


@pytest.mark.parametrize(("signals", "message"), [
    ({"sync_time_s": 0.01}, r"^sync_time_s: is the part of step_time_s spent synchronising; pass step_time_s too$"),
    ({"step_time_s": INF}, r"^step_time_s: must be a finite number of seconds > 0, got inf$"),
    ({"step_time_s": 0.1, "sync_time_s": INF}, r"^sync_time_s: must be a finite number of seconds >= 0, got inf$"),
    ({"step_time_s": 0.1, "sync_time_s": 20.0}, r"^sync_time_s: 20\.0+ s exceeds step_time_s 0\.10+ s; it is the part"),
])
def test_timings_the_throughput_model_would_drop_are_refused(signals, message) -> None:
    # Each was accepted and then dropped by the throughput model without a word (observations
    # stayed 0): the policy kept predicting from its prior while the script believed it measured.
    with pytest.raises(ValueError, match=message):
        dra.step(1.0, **signals)
    _untouched()
    dra.step(1.0, step_time_s=0.1, sync_time_s=0.02)
    assert dra.default_controller().engine.throughput.observations == 1


class _ModelOutput(OrderedDict):
    """What a HuggingFace model returns: a dict whose items are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@pytest.mark.parametrize(("loss", "message"), [
    (_ModelOutput(loss=torch.tensor(2.0), logits=torch.zeros(2, 3)),
     r"got _ModelOutput .*; pass its \.loss \(e\.g\. dra\.step\(outputs\.loss\)\)$"),
    ((torch.tensor(2.0), torch.zeros(2, 3)), r"got tuple .*; pass the loss itself, not the tuple it came in"),
    (10**400, r"dra\.step: the loss is an int too large for a float \(10000000000000000000\.\.\., 401 digits\)"),
], ids=["model_output", "tuple", "huge_int"])
def test_a_loss_in_the_wrong_wrapper_names_the_fix(loss, message) -> None:
    # A model's output object and a (loss, logits) tuple were refused without saying what to pass;
    # an int beyond a double raised OverflowError "int too large to convert to float".
    with pytest.raises(ValueError, match=message):
        dra.step(loss)
    _untouched()


@pytest.mark.parametrize(("loss", "value"), [
    (torch.tensor(1.5, requires_grad=True) * 2, 3.0), (torch.tensor(1.5, dtype=torch.bfloat16), 1.5),
    (torch.tensor(1.5, dtype=torch.float16), 1.5), (__import__("numpy").float32(1.5), 1.5), (3, 3.0),
    (1e-8, 1e-8), (1e6, 1e6), (-2.5, -2.5),
])
def test_the_usual_loss_forms_are_taken(loss, value) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either (torch's about .item() on a grad tensor included)
        status = dra.step(loss)
    assert status.signals.accepted == 1 and status.loss == value


# A real job: 2 processes, gradient statistics as docs/guide/signals.md says to pass them in data
# parallelism (big_batch = world size x per-rank batch), an AMP-like overflowed step (NaN norms) and
# a NaN validation metric, and a schedule that shrinks the world to one at step 4.
SCRIPT = linear_job_script(r'''
        norm = float("nan") if step == 2 else 1.0 + 1.0 / (step + 1)
        if "fall" in cfg:  # a loss that crosses zero at step 10 (as the world's mean)
            loss = loss.detach() * 0 + (1.0 - cfg["fall"] * step)
        st = dra.step(loss, small_sqr_norm=norm, small_batch=4, big_sqr_norm=norm / 2, big_batch=4 * ctl.world_size,
                      validation=float("nan") if step == 3 else 0.5)
        log.write(json.dumps({"kind": "step", "uid": ctl.uid, "step": step, "world": ctl.world_size,
                              "committed": bool(st.committed), "nonfinite": st.signals.nonfinite_count}) + "\n")
        log.flush()
''', after=r'''log.write(json.dumps({"kind": "final", "uid": ctl.uid, "step": ctl.step_index, "role": ctl.role}) + "\n")
''')


@pytest.mark.timeout(120)
def test_a_real_job_with_overflowed_norms_shrunk_to_one_trains_to_the_end(tmp_path: Path) -> None:
    # Before: every rank raised at step 2 (the NaN norms), and a job without that step raised at
    # its first step in a world of one (big_batch == small_batch); both left the job mid-training.
    code, out, records = run_logged_script(tmp_path, SCRIPT, 2, {"policy": "none", "resize_schedule": {"4": 1},
                                                                 "fault_timeout_s": 10}, {}, timeout=90)
    assert code == 0, out[-4000:]
    assert "ValueError" not in out and "leaves the job" not in out, out[-4000:]
    steps = [r for r in records if r["kind"] == "step" and r["committed"]]
    leader = {r["step"]: r for r in steps if r["uid"] == 0}
    last = max(leader)
    assert sorted(leader) == list(range(last + 1)) and last >= 6  # every step of the epoch, none refused
    assert {r["world"] for r in steps if r["step"] <= 3} == {2} and {r["world"] for r in steps if r["step"] >= 5} == {1}
    assert leader[last]["nonfinite"] == 2  # the overflowed norms and the NaN validation, counted
    assert {r["role"] for r in records if r["kind"] == "final" and r["uid"] == 0} == {"finished"}


@pytest.mark.parametrize(("losses", "said"), [
    # a negative log-likelihood that crosses zero at step 40 and goes on falling
    ([2.0 / (1 + 0.025 * i) - 1.0 for i in range(100)], True),
    ([1.0 / (1 + i) if i % 5 else 0.0 for i in range(100)], False),  # a zero now and then: the trend is fed
    ([-1.0 - 0.01 * i for i in range(100)], False),  # never positive: the other message says it
])
def test_a_loss_that_turns_negative_mid_run_is_said_once(capfd, losses, said) -> None:
    # The trend fits log(loss): after the crossing the regression got no point, the phase stayed
    # what it was at the last positive loss (here "fast": the convergence policy would keep growing)
    # and nothing was said (only a loss <= 0 from the first step on was reported).
    dra.reset(dra.Controller(decide_every=10, estimator={"warmup_steps": 16, "window": 16}))
    for loss in losses:
        status = dra.step(loss)
    err = capfd.readouterr().err
    assert err.count("are <= 0 after positive ones") == (1 if said else 0), err
    if said:
        assert status.signals.nonpositive_count == 60
        assert "step 55: the latest 16 losses (the latest -0.157" in err and "the phase (" in err
        assert "loss minus a known lower bound" in err


@pytest.mark.timeout(120)
def test_a_real_job_whose_loss_turns_negative_is_told_once(tmp_path: Path) -> None:
    # Before: the leader's phase froze at the last positive window and nothing was said.
    options = {"policy": "none", "fault_timeout_s": 10, "estimator": {"window": 8, "warmup_steps": 8}}
    code, out, records = run_logged_script(tmp_path, SCRIPT, 2, options, {"n": 256, "fall": 0.1}, timeout=90)
    assert code == 0, out[-4000:]
    assert out.count("are <= 0 after positive ones") == 1, out[-4000:]
    assert "the latest 8 losses (the latest -0.7) are <= 0" in out and "the phase (fast)" in out, out[-4000:]


# Every rank passes a signal dra.step refuses at step 3, catches the ValueError and goes on with its
# next batch (as after any exception caught between backward and dra.step).
CAUGHT = linear_job_script(r'''
        try:
            st = dra.step(loss, **({"sync_time_s": 0.1} if step == 3 else {}))
        except ValueError as e:
            log.write(json.dumps({"kind": "refused", "uid": ctl.uid, "step": step, "error": str(e)}) + "\n"); log.flush()
            continue
        log.write(json.dumps({"kind": "step", "uid": ctl.uid, "step": step, "committed": bool(st.committed)}) + "\n"); log.flush()
''', after=r'''log.write(json.dumps({"kind": "final", "uid": ctl.uid, "step": ctl.step_index, "digest": ctl.state_digest()}) + "\n")
''')


@pytest.mark.timeout(120)
def test_a_refused_signal_caught_by_the_script_leaves_the_step_untaken(tmp_path: Path) -> None:
    # Before: the controller had marked the backward's step as taken before the C++ check refused
    # it, so the next backward did not catch the missed step up: the world refused step 4 twice
    # ("computed this step on the batch of the step they did not call step() for") and redid it.
    code, out, records = run_logged_script(tmp_path, CAUGHT, 2, {"policy": "none", "fault_timeout_s": 10}, {},
                                           timeout=90)
    assert code == 0, out[-4000:]
    refused = [r for r in records if r["kind"] == "refused"]
    assert [(r["uid"], r["step"]) for r in refused] == [(0, 3), (1, 3)]
    assert all(r["error"].startswith("sync_time_s: is the part of step_time_s") for r in refused)
    assert '"event":"refused"' not in out, out[-4000:]
    for uid in (0, 1):
        assert [r["step"] for r in records if r["kind"] == "step" and r["uid"] == uid] == [0, 1, 2, 4, 5, 6, 7]
    finals = [r for r in records if r["kind"] == "final"]
    assert len(finals) == 2 and len({r["digest"] for r in finals}) == 1
