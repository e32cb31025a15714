"""The user docs' snippets, run as written, so that they cannot rot.

Each test takes a snippet from README.md or docs/guide/*.md (read from the file itself where it is
a whole program, copied where it needs a context the page leaves out) and checks what the text
says it gives: names, defaults, messages. Cheap: the whole file runs in well under a minute.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dra

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"


def code_block_after(path: Path, marker: str, lang: str = "python") -> str:
    """The first ```lang block after the line that contains ``marker``."""
    text = path.read_text()
    at = text.index(marker)
    m = re.compile(r"^```" + re.escape(lang) + r"\n(.*?)^```", re.S | re.M).search(text, at)
    assert m, f"no ```{lang} block after {marker!r} in {path}"
    return m.group(1)


def test_readme_using_it_loop_and_status():
    # README, "Using it": a plain process, no torch.distributed.
    dra.reset(dra.Controller(policy="convergence", decide_every=10))
    losses = [2.0 * 0.97**i for i in range(40)]
    for loss in losses:
        status = dra.step(loss)
        assert status.signals.phase in ("warmup", "fast", "steady", "plateau", "diverging")
        assert isinstance(status.decision.reason, str)
    d = status.to_dict()
    assert d["step"] == 39 and d["decision"]["policy"] == "convergence"
    import copy
    import pickle

    for f in (copy.copy, pickle.dumps):
        with pytest.raises(TypeError, match="to_dict"):
            f(status)
    with pytest.raises(ValueError, match="polcy"):
        dra.Controller(polcy="convergence")
    dra.reset(dra.Controller())


def test_readme_torchrun_script_runs_alone(tmp_path):
    # README, "Under torchrun": "it also runs alone, as a world of one".
    script = code_block_after(README, "### Under torchrun")
    (tmp_path / "train.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRA_", "RANK", "WORLD_SIZE", "MASTER_"))}
    r = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^step 9 phase \w+ decision ", r.stdout, re.M), r.stdout[-2000:]
    assert "job finished at step" in r.stdout + r.stderr


def test_elastic_guide_option_table_matches_the_option_names():
    # docs/guide/elastic.md, "Options": one table row per option of dra.Options.names().
    text = (GUIDE / "elastic.md").read_text()
    section = text[text.index("## Options"):text.index("## Faults")]
    documented = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            documented.update(re.findall(r"`([a-z_]+)`", row.split("|")[1]))
    assert documented == set(dra.Options.names())
    o = dra.Options()
    assert (o.engine.policy, o.engine.decide_every) == ("convergence", 10)
    assert (o.engine.costs.resize_cost_s, o.engine.costs.horizon_steps) == (0.0, 500.0)
    assert (o.fault_timeout_s, o.store_timeout_s, o.capacity_poll_s, o.chunk_mb) == (3.0, 30.0, 1.0, 16.0)
    assert (o.handoff, o.batch_mode, o.compress, o.backend, o.max_resize_retries) == ("full", "fixed", "", "gloo", 3)
    assert o.verify is False and o.status_every == 0
    with pytest.raises(ValueError, match=re.escape("max_size: must lie in [1, 2147483647], got 1000000000000")):
        dra.Controller(max_size=1000000000000)


def test_signals_guide_python_example():
    est = dra.ConvergenceEstimator(dra.EstimatorConfig(window=64, plateau_patience=32))
    for step in range(200):
        est.update_loss(step, 2.0 * math.exp(-0.01 * step))
    s = est.signals
    assert s.phase == "fast" and s.progress_rate < 0 and not s.plateau
    c = dra.EstimatorConfig()
    assert (c.loss_decay, c.window, c.warmup_steps, c.plateau_patience, c.gns_decay) == (0.9, 64, 32, 32, 0.95)
    with pytest.raises(ValueError, match="^window: needs at least 3 steps for a slope with an error, got 2"):
        dra.ConvergenceEstimator(dra.EstimatorConfig(window=2))
    dra.reset(dra.Controller())
    status = dra.step(1.0, small_sqr_norm=1.0, small_batch=8, big_sqr_norm=0.5, big_batch=16)
    assert math.isfinite(status.signals.gns)


def test_policy_guide_python_example():
    policy = dra.ConstrainedPolicy(
        dra.ConvergencePhasePolicy(dra.ConvergencePhaseConfig(grow_step=2)),
        dra.Constraints(min_size=1, max_size=8, cooldown_steps=100, hysteresis_decisions=2),
    )
    estimator = dra.ConvergenceEstimator()
    world = dra.WorldState()
    world.size, world.active, world.candidates = 2, [0, 1], [2, 3, 4, 5]
    world.global_batch = world.base_batch = 256.0
    model = dra.ThroughputModel()
    model.observe(2, 128.0, 0.150, 0.020)
    d = policy.decide(estimator.signals, world, dra.Capacity(6),
                      dra.CostModel(resize_cost_s=5.0, horizon_steps=500), model)
    assert (d.action, d.target_size, list(d.join), list(d.leave)) == ("hold", 2, [], [])
    assert d.reason
    dra.reset(dra.Controller(policy="goodput", min_size=1, max_size=8, decide_every=10, resize_cost_s=5.0))
    dra.reset(dra.Controller())


def test_sage_guide_energy_meter_and_energy_policy():
    import dra.energy

    meter = dra.energy.EnergyMeter()
    for _ in range(2):
        sum(i * i for i in range(20000))
        step = meter.mark()
        assert step.source in ("measured", "estimated") and step.joules >= 0 and step.seconds >= 0
    assert meter.job.joules >= 0 and meter.source in ("measured", "estimated")
    assert isinstance(meter.notes, list)
    cfg = dra.EngineConfig(policy="zeus_cost")
    cfg.energy = dra._core.EnergyPolicyConfig(watts_per_device=250.0, max_watts_per_device=300.0)
    for name in ("min_energy_deadline", "energy_delay", "zeus_cost", "energy_budget"):
        dra.Controller(policy=name)


def test_sage_guide_codec_specs_and_sparsity():
    import dra.compress as dc

    for spec in ("fp32", "fp16", "bf16", "powersgd:4", "topk:0.1", "random:0.1", "masked", "masked:0.5"):
        dc.make_codec(spec)
    for bad in ("fp32:1", "powersgd:2.5", "topk:", "random:0"):
        with pytest.raises(ValueError, match=re.escape(bad)):
            dc.make_codec(bad)
    c = dc.make_codec("powersgd:4")
    c.load_state(c.save_state())
    c.save_state(with_error_feedback=False)
    with pytest.raises(ValueError, match="sparsity"):
        dra.Controller(compress="powersgd:4", sparsity={"max_sparsity": 0.5})
    # A sparsity equal to RigL's defaults changes nothing and is accepted (sage.md says so).
    dra.Controller(compress="powersgd:4", sparsity={"max_sparsity": 0.9})
    with pytest.raises(ValueError, match="sparsity"):
        dc.make_codec("powersgd:4", sparsity={"max_sparsity": 0.9})


def test_pool_request_errors_read_as_the_guide_shows():
    # docs/guide/pool.md, "Requests": the memory error shows the numbers as written (it showed
    # "100.000000 GB ... (largest: 80.000000 GB)").
    from dra._core import pool as p

    inv = p.Inventory([p.Device(id="g0", type="gpu-80gb", memory_gb=80)])
    with pytest.raises(ValueError) as e:
        p.Request(job="j", device_type="gpu-80gb", memory_gb=100).validate(inv)
    assert str(e.value) == ("memory_gb: 100 GB is more than any 'gpu-80gb' device has (largest: 80 GB); "
                            "ask for at most that")
    with pytest.raises(ValueError, match=r"^memory_gb: 80\.5 GB is more than any device has \(largest: 80 GB\)"):
        p.Request(job="j", memory_gb=80.5).validate(inv)


def test_pool_guide_inventory_file_fields(tmp_path):
    # docs/guide/pool.md, "Devices": the JSON inventory's fields, their types and defaults.
    from dra.pool import _inventory

    f = tmp_path / "inv.json"
    f.write_text(json.dumps({"devices": [
        {"id": "g0", "type": "gpu-80gb", "node": "n0", "group": 1, "memory_gb": 80, "compute": 1.0,
         "enforcement": "soft"},
        {"id": "d1", "type": "t"},
    ]}))
    full, bare = _inventory.from_file(f)
    assert (full.node, full.group, full.memory_gb) == ("n0", 1, 80.0)
    assert (bare.node, bare.group, bare.memory_gb, bare.compute, bare.enforcement) == ("local", 0, 0.0, 1.0, "soft")
    f.write_text(json.dumps({"devices": [{"id": "g0", "type": "t", "group": "nvl0"}]}))
    with pytest.raises(ValueError, match="group"):
        _inventory.from_file(f)


def test_a_decision_costs_what_signals_md_says():
    # README / signals.md: dra.step(float) stays within 3x a no-op binding call, and an engine step
    # deciding every 10 steps about 0.1 us. A remaining-work curve fit at every decision (tens of
    # microseconds, read by nothing without a declared budget) made it 30x; it is now computed when
    # ResizeEngine.remaining is read. Relative, in one process: deciding at every step costs a few
    # times a step that never decides, not tens of times.
    import time

    def per_step(decide_every: int, n: int = 20000) -> float:
        e = dra.ResizeEngine(dra.EngineConfig(decide_every=decide_every))
        t = time.perf_counter()
        for i in range(n):
            e.step(i, 1.0 + 1.0 / (i + 1))
        return (time.perf_counter() - t) / n

    ratio = min(per_step(1) / per_step(10**9) for _ in range(3))
    assert ratio < 10, f"a decision costs {ratio:.1f}x a step"


def test_engine_remaining_is_the_latest_decisions_estimate():
    # docs/guide/policy.md, "Remaining work": ResizeEngine.remaining, the estimate at the latest
    # decision; with a declared budget it sets world.remaining_steps, without one it does not.
    e = dra.ResizeEngine(dra.EngineConfig(policy="none", declared_steps=1000, decide_every=10))
    for s in range(400):
        e.step(s, 1.0 / (1.0 + 0.01 * s))
    assert "declared" in e.remaining.sources
    assert e.world.remaining_steps == round(e.remaining.median)
    f = dra.ResizeEngine(dra.EngineConfig(policy="none", decide_every=10))
    for s in range(400):
        f.step(s, 1.0 / (1.0 + 0.01 * s))
    assert f.world.remaining_steps == -1
    median = f.remaining.median
    assert median > 0
    for s in range(400, 405):  # steps without a decision leave the decision's estimate as it was
        f.step(s, 0.2)
    assert f.remaining.median == median


def test_bench_help_lists_the_suites_and_nothing_else() -> None:
    # `python -m dra.bench --help` listed pollux_reference and pool_security (helper modules: one
    # needs Python 3.8) as suites, and not the short name `step` the README uses.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "dra.bench", "--help"], capture_output=True, text=True, timeout=120)
    listed = out.stdout.split("suites: ", 1)[1].strip()
    assert "pollux_reference" not in listed and "pool_security" not in listed, listed
    assert "step_overhead (step)" in listed and "sim" in listed.split(", "), listed


def test_a_pool_cli_output_cut_short_by_its_reader_says_nothing() -> None:
    # `dra pool schema | head` ended with "dra pool schema: [Errno 32] Broken pipe".
    import subprocess
    import sys

    out = subprocess.run(f"{sys.executable} -m dra pool schema | true", shell=True, capture_output=True, text=True,
                         timeout=120)
    assert "Broken pipe" not in out.stderr, out.stderr


@pytest.mark.parametrize(("extra", "listens", "warned"), [([], "127.0.0.1", False), (["--host", "0.0.0.0"], "0.0.0.0", True)])
def test_dra_store_listens_on_the_loopback_unless_told_and_warns_beyond_it(extra, listens, warned) -> None:
    # A c10d store has no authentication; `dra store` bound every interface by default, silently.
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "dra", "store", "--port", "0", *extra], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith(f"[dra] store listening on {listens}:"), line
    finally:
        p.terminate()
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
    assert ("has no authentication" in err) == warned, err
