"""Energy, gradient codecs and sparsity used the way their authors did not try: Zeus-format traces
with bad or missing rows, energy knobs out of range, RigL masks fed arrays of other types or sizes,
and sparse-training options given to another codec. Each case was a crash, a hang, a silent wrong
result or a half-applied change before its fix; the error must now name the value and the fix."""

from __future__ import annotations

import csv
import math
import shutil

import numpy as np
import pytest

import dra
from dra.compress import LocalCollective, RiglMasks, make_codec, rigl_update
from dra.energy import EnergyObjective, KnobSetting, choose_setting
from dra.energy import zeus_replay as z

CIFAR = z.JOBS[0]  # cifar100/shufflenetv2: b0 1024, seven power limits on V100


def _traces(tmp_path, edit_power=None, edit_train=None, gpu="v100"):
    """A copy of the shipped traces with the CIFAR-100 rows of one file edited."""
    root = tmp_path / "zeus"
    shutil.copytree(z.data_dir(), root)
    for name, edit in ((f"summary_power_{gpu}.csv", edit_power), ("summary_train.csv", edit_train)):
        if edit is None:
            continue
        with open(root / name, newline="") as f:
            rows = list(csv.DictReader(f))
        fields = list(rows[0])
        rows = edit(rows)
        with open(root / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields if not rows else list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return root


def _set(column, value, where=lambda r: True):
    def edit(rows):
        for r in rows:
            if r["dataset"] == "cifar100" and where(r):
                r[column] = value
        return rows
    return edit


ONE = lambda r: r["batch_size"] == "128" and r["power_limit"] == "100"  # noqa: E731


@pytest.mark.parametrize("column", ["average_power", "time_per_epoch"])
@pytest.mark.parametrize("value", ["nan", "inf", "-50", "0", ""])
def test_a_power_trace_value_that_cannot_be_is_refused_naming_file_line_and_value(tmp_path, column, value):
    # Before: NaN crashed deep in the learner ("cannot convert float NaN to integer"), a zero time
    # divided by zero, and a zero or negative power was replayed as a free or energy-making setting.
    root = _traces(tmp_path, edit_power=_set(column, value, ONE))
    with pytest.raises(ValueError, match=rf"summary_power_v100.csv, line \d+: {column} '{value}' .*fix or drop"):
        z.load_trace(CIFAR, "v100", root)


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_a_target_epoch_below_one_is_refused(tmp_path, value):
    # Before: epoch 0 was "reached" in 0 epochs (a negative run time) and no run ever counted.
    root = _traces(tmp_path, edit_train=_set("target_epoch", value, lambda r: r["batch_size"] == "1024"))
    with pytest.raises(ValueError, match=rf"summary_train.csv, line \d+: target_epoch '{value}'.*never reached"):
        z.load_trace(CIFAR, "v100", root)


def test_other_trace_shapes_are_refused_or_read(tmp_path):
    # Columns in another order read the same trace.
    def reverse(rows):
        return [dict(reversed(list(r.items()))) for r in rows]
    ref = z.load_trace(CIFAR, "v100")
    same = z.load_trace(CIFAR, "v100", _traces(tmp_path / "a", reverse, reverse))
    assert same.power == ref.power and same.epochs == ref.epochs
    # A missing column is named (it was a bare KeyError).
    with pytest.raises(ValueError, match=r"missing column\(s\) average_power"):
        z.load_trace(CIFAR, "v100", _traces(tmp_path / "b", lambda rows: [
            {k: v for k, v in r.items() if k != "average_power"} for r in rows]))
    # A power limit of 0 W or below, and a batch size of 0 (both were replayed, 0 W chosen as best).
    with pytest.raises(ValueError, match=r"power_limit '-100' must be a whole number > 0"):
        z.load_trace(CIFAR, "v100", _traces(tmp_path / "c", _set("power_limit", "-100", lambda r: r["power_limit"] == "100")))
    with pytest.raises(ValueError, match=r"batch_size '0' must be a whole number > 0"):
        z.load_trace(CIFAR, "v100", _traces(tmp_path / "d", _set("batch_size", "0", lambda r: r["batch_size"] == "128")))
    # A (batch, power limit) twice: the later row silently replaced the earlier one.
    def twice(rows):
        return rows + [dict(next(r for r in rows if r["dataset"] == "cifar100" and ONE(r)), average_power="10")]
    with pytest.raises(ValueError, match=r"batch 128 at 100 W is on line \d+ too"):
        z.load_trace(CIFAR, "v100", _traces(tmp_path / "e", twice))
    # The baseline's row (b0 at the maximum limit) missing: a bare KeyError (1024, 250) later.
    with pytest.raises(ValueError, match=r"no row for the default batch 1024 at the maximum power limit 250 W"):
        z.load_trace(CIFAR, "v100", _traces(tmp_path / "f", lambda rows: [
            r for r in rows if not (r["dataset"] == "cifar100" and r["batch_size"] == "1024" and r["power_limit"] == "250")]))
    # No batch size ever reaching the target: "no candidate setting ... widen the knob space" before.
    with pytest.raises(ValueError, match=r"no batch size reaches the target 0.6 within 100 epochs"):
        z.load_trace(CIFAR, "v100", _traces(tmp_path / "g", edit_train=_set("target_epoch", "")))
    # A GPU without a trace names the shipped sets; with root= holding its file it is read.
    with pytest.raises(ValueError, match=r"gpu 'h100': no trace .*use one of v100, a40, p100, rtx6000"):
        z.load_trace(CIFAR, "h100")
    root = _traces(tmp_path / "h")
    shutil.copy(root / "summary_power_v100.csv", root / "summary_power_h100.csv")
    assert z.load_trace(CIFAR, "h100", root).power == ref.power


def test_a_batch_size_traced_at_some_power_limits_only_is_replayed(tmp_path):
    # Zeus's RTX6000 trace holds NCF's batch 4 at 250 and 260 W only; a trace may lack rows. The
    # learner profiled and priced every limit at every batch size: KeyError (128, 100) here.
    root = _traces(tmp_path, edit_power=lambda rows: [
        r for r in rows if not (r["dataset"] == "cifar100" and r["batch_size"] in ("128", "256", "512")
                                and r["power_limit"] not in ("200", "250"))])
    trace = z.load_trace(CIFAR, "v100", root)
    assert trace.limits_for(128) == [200, 250] and trace.limits_for(1024) == trace.power_limits
    recs = z.run_dra(trace, 0.5, 2.0, 20, 0)
    used = {(r.bs, r.pl) for rs in recs for r in rs}
    assert {b for b, _ in used} & {128, 256, 512}, used  # it did go there
    assert all(pl in trace.limits_for(bs) for bs, pl in used), used
    ncf = next(j for j in z.JOBS if j.network == "ncf")
    rtx = z.load_trace(ncf, "rtx6000")
    learner = z.DraLearner(rtx, 0.5, 2.0, np.random.default_rng(0))
    assert learner._best_pl(4) in (250, 260)


def test_zeus_replays_the_traces_the_dra_side_read(tmp_path):
    pytest.importorskip("zeus._legacy.simulate")
    # run_zeus read the shipped traces whatever root the trace came from: the "side by side" then
    # compared dra on the user's traces with Zeus on others. Doubled power and power limits: every
    # cost doubles, so the same decisions, and the energy doubles.
    def double(rows):
        for r in rows:
            r["average_power"] = str(2 * float(r["average_power"]))
            r["power_limit"] = str(2 * int(r["power_limit"]))
        return rows
    ref = z.load_trace(CIFAR, "v100")
    mine = z.load_trace(CIFAR, "v100", _traces(tmp_path, edit_power=double))
    a = z.run_zeus(ref, 0.5, 2.0, 3, 0)
    b = z.run_zeus(mine, 0.5, 2.0, 3, 0)
    ea = sum(r.energy_j for rs in a for r in rs)
    eb = sum(r.energy_j for rs in b for r in rs)
    assert eb == pytest.approx(2 * ea, rel=1e-6)


def test_choose_setting_skips_a_nan_or_negative_max_power():
    # Before: the NaN candidate won (a NaN cost compares below nothing, and it came first).
    obj = EnergyObjective("zeus_cost", eta=0.5)
    cands = [KnobSetting(world_size=1), KnobSetting(world_size=2)]
    for bad in (math.nan, -1000.0):
        c = choose_setting(obj, cands, [1.0, 1.0], [1.0, 1.0], [bad, 1.0])
        assert c.index == 1, (bad, c.reason)


def test_an_infinite_max_batch_is_refused_not_a_hang():
    # adapt_batch doubles the per-rank batch from min to max: an infinite max never ended (the
    # first decision hung the process).
    with pytest.raises(ValueError, match=r"max_per_rank_batch: must be a finite number .*got inf"):
        dra._core.EnergyPolicyConfig(adapt_batch=True, max_per_rank_batch=math.inf)
    energy = dra._core.EnergyPolicyConfig(adapt_batch=True)
    energy.max_per_rank_batch = math.inf  # set after construction: refused when the engine is built
    cfg = dra.EngineConfig(policy="zeus_cost")
    cfg.energy = energy
    with pytest.raises(ValueError, match=r"max_per_rank_batch"):
        dra.Controller(cfg)
    energy.max_per_rank_batch = 1024.0
    energy.watts_per_device = energy.max_watts_per_device = math.inf
    with pytest.raises(ValueError, match=r"watts_per_device: must be a finite number > 0 \(W\), got inf"):
        energy.validate()


@pytest.mark.parametrize("mask", [np.ones(10, dtype=bool), np.ones(20, dtype=np.uint8)[::2], np.ones(10, np.int64)])
def test_rigl_update_refuses_a_mask_it_could_not_update_in_place(mask):
    # A bool or strided mask was converted to a copy, updated, and thrown away: the counts said 5
    # dropped while the caller's mask was unchanged.
    w = np.arange(10, dtype=np.float32)
    with pytest.raises(ValueError, match=r"mask: must be a writable C-contiguous uint8 array.*np.ascontiguousarray"):
        rigl_update(mask, w, w, 0.5, 0.0)
    assert mask.all()
    ok = np.ones(10, np.uint8)
    assert rigl_update(ok, w, w, 0.5, 0.0) == (5, 0, 5) and ok.sum() == 5


def test_rigl_masks_refuse_arrays_of_another_size_and_change_nothing():
    # Before: 3-element arrays for a 10000-entry tensor were read past their end (5000 "dropped").
    r = RiglMasks(0, max_sparsity=0.9, every=1)
    r.fit([(100, 100), (100,)])
    short = np.zeros(3, np.float32)
    full = np.random.default_rng(0).random(10_000).astype(np.float32)
    with pytest.raises(ValueError, match=r"weights: array 0 has 3 entries for a tensor of 10000"):
        r.update(1, 0.5, [short, None], [full, None])
    with pytest.raises(ValueError, match=r"grads: array 0 has 3 entries for a tensor of 10000"):
        r.update(1, 0.5, [full, None], [short, None])
    assert r.sparse_fraction() == 0.0
    # A dense tensor's arrays are not read: any (its own) size is fine.
    assert r.update(1, 0.5, [full, np.zeros(100, np.float32)], [full, np.zeros(100, np.float32)])[2] == 5000


def test_rigl_masks_refusing_one_tensor_leave_the_others_unchanged():
    # Before: tensor 0's mask was updated, then tensor 1 was refused: half the model pruned.
    r = RiglMasks(0, max_sparsity=0.9, every=1)
    r.fit([(10, 10), (10, 10)])
    w = np.random.default_rng(1).random(100).astype(np.float32)
    with pytest.raises(ValueError, match=r"tensor 1 is sparsified"):
        r.update(1, 0.5, [w, None], [w, None])
    assert r.sparse_fraction() == 0.0 and r.mask(0).all()


def test_masked_codec_refuses_weights_of_another_size():
    # On a mask-update step the weights are read through a bare pointer, for the gradient's size.
    c = make_codec("masked", 0, {"every": 1})
    g = [np.ones((8, 8), np.float32)]
    c.reduce(g, LocalCollective())  # step 0: no update
    assert c.update_next
    with pytest.raises(ValueError, match=r"weights: array 0 has 4 entries for a tensor of 64"):
        c.reduce([np.ones((8, 8), np.float32)], LocalCollective(), [np.ones(4, np.float32)])
    assert c.steps == 1


def test_sparsity_options_without_the_masked_codec_are_refused():
    # They configure the 'masked' codec only: with another one they were silently dropped.
    for compress in ("powersgd:4", None):
        with pytest.raises(ValueError, match=r"sparsity: configures sparse training.*compress='masked'"):
            dra.Options(compress=compress, sparsity={"max_sparsity": 0.5})
    assert dra.Options(compress="masked:0.5", sparsity={"every": 5}).sparsity["every"] == 5
    assert dra.Options(compress="fp16", sparsity={}).compress == "fp16"  # the defaults: nothing set


def test_a_nan_inside_an_option_dict_is_named():
    # Before: "expected a dict such as {...}, got {'max_sparsity': nan} (dict)": it was a dict.
    with pytest.raises(ValueError, match=r"sparsity.max_sparsity: must be a finite number, got nan"):
        dra.Options(compress="masked", sparsity={"max_sparsity": math.nan})


def test_make_codec_refuses_sparsity_options_for_another_codec():
    # GradientReducer(model, "powersgd:4", sparsity={...}) dropped them silently.
    with pytest.raises(ValueError, match=r"sparsity: configures the 'masked' codec only, the spec is 'powersgd:4'"):
        make_codec("powersgd:4", 0, {"max_sparsity": 0.5})
    assert make_codec("masked:0.5", 0, {"every": 3}).name == "masked"
