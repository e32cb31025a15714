"""The RL stage-balance policy and pipeline simulator from Python (dra.rl, dra-sim rl, dra.bench rl)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

import dra.rl as rl
from dra import _core


def test_shipped_trace_is_the_azure_generated_tokens() -> None:
    conv = rl.trace_lengths("conv")
    code = rl.trace_lengths("code")
    assert len(conv) == 19366 and len(code) == 8819
    assert max(conv) == 1000 and max(code) == 1899
    assert sorted(conv)[len(conv) // 2] == 129
    assert (rl.data_dir() / "LICENSE").is_file() and (rl.data_dir() / "NOTICE").is_file()


def test_simulate_sweeps_every_split_on_the_same_lengths() -> None:
    doc = rl.simulate(trace="conv", drift=3.0, steps=15)
    statics = doc["statics"]
    assert [r["rollout"] for r in statics] == list(range(1, 8))
    best = statics[doc["best_static"]]
    assert best["total_s"] == min(r["total_s"] for r in statics)
    assert doc["oracle"]["total_s"] <= best["total_s"] + 1e-9
    # Common random numbers: every schedule generated the same batches.
    for r in [*statics, doc["dynamic"], doc["oracle"]]:
        assert r["phases"]["mean_length"][:15] == statics[0]["phases"]["mean_length"][:15]
        assert sum(r["phases"]["trained_sequences"]) == 15 * 512
    s = doc["summary"]
    assert s["label"] == "simulated"
    assert s["dynamic_vs_best_static"] == pytest.approx(doc["dynamic"]["samples_per_s"] / best["samples_per_s"] - 1)
    assert s["dynamic_time_vs_best_static"] == pytest.approx(doc["dynamic"]["total_s"] / best["total_s"] - 1)
    assert doc["colocated"]["phases"]["rollout"][0] == 8
    text = rl.markdown(doc)
    assert "| static (best) |" in text and "colocated time sharing" in text


def test_training_bound_without_tail_gains_nothing() -> None:
    doc = rl.simulate("training_bound", steps=40)
    best = doc["statics"][doc["best_static"]]
    # Nothing to rebalance: the dynamic run ends on the best static split and cannot beat it.
    assert doc["dynamic"]["phases"]["rollout"][-1] == best["rollout"]
    assert doc["dynamic"]["samples_per_s"] <= best["samples_per_s"] * (1 + 1e-9)
    # Even free per-phase switching gains only on the pipeline's fill and drain phases (rollout
    # only, training only); in between the oracle keeps the best static split.
    assert doc["oracle"]["phases"]["rollout"][1:-1] == [best["rollout"]] * 39
    assert 0.0 <= doc["summary"]["oracle_vs_best_static"] < 0.02


def test_options_are_checked_with_named_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="scenario: unknown scenario 'nope'"):
        rl.simulate("nope")
    with pytest.raises(ValueError, match="give one source"):
        rl.simulate(trace="conv", constant_length=10.0)
    with pytest.raises(ValueError, match="unknown option 'stepz'"):
        rl.simulate(workload={"stepz": 3})
    with pytest.raises(ValueError, match="switch_weights_s"):
        rl.simulate(costs={"switch_weights_s": -1.0}, steps=2)
    with pytest.raises(ValueError, match="pipeline: unknown pipeline"):
        rl.simulate(pipeline="fast", steps=2)
    with pytest.raises(ValueError, match="initial_rollout"):
        rl.simulate(initial_rollout=9, steps=2)
    other = tmp_path / "other.csv"
    other.write_text("TIMESTAMP,Tokens\nx,5\n")
    with pytest.raises(ValueError, match="missing column 'GeneratedTokens'"):
        rl.trace_lengths(other)
    other.write_text("GeneratedTokens\n5\n0\n")
    with pytest.raises(ValueError, match=":3: column 'GeneratedTokens'.*>= 1 token"):
        _core.rl_read_lengths(str(other))


def test_policy_binding_decides_and_names_bad_input() -> None:
    policy = rl.StageBalancePolicy(rl.StageBalanceConfig(devices=4, cooldown_steps=0, hysteresis_decisions=1, prior_switch_cost_s=0.0))
    assert policy.decide(2, 2, 0, 100, -1, 64)["reason"].startswith("hold: no generation observed")
    for _ in range(5):
        for _ in range(64):
            policy.observe_generation(50.0, 3000.0)
        for c in (64, 32, 8, 1):
            policy.observe_decode(c, c * 1500.0, 10.0, 10.0 * (0.01 + 1e-4 * c))
        policy.observe_train(2, 64 * 3050 / 2, 0.2 + 1e-5 * 64 * 3050 / 2 + 0.05, 0.05)
    d = policy.decide(1, 3, 5, 100, -1, 64)
    assert d["action"] == "to_rollout" and d["rollout"] > 1 and d["rollout"] + d["train"] == 4
    assert d["target"]["step_s"] < d["current"]["step_s"]
    assert len(policy.predict_all(64)) == 3
    assert policy.lengths.quantile(0.5) == pytest.approx(3000.0, rel=0.011)
    with pytest.raises(ValueError, match="direction: unknown direction 'sideways'"):
        policy.observe_switch("sideways", 1.0)
    with pytest.raises(ValueError, match="stage_state"):
        policy.decide(3, 3, 0, 0)
    with pytest.raises(ValueError, match="min_rollout"):
        rl.StageBalanceConfig(devices=2, min_rollout=2)
    sketch = rl.QuantileSketch(rl.QuantileSketchConfig(half_life=10.0))
    for v in (1.0, 2.0, 3.0):
        sketch.add(v)
    assert sketch.observations == 3 and sketch.quantile(1.0) == pytest.approx(3.0, rel=0.011)


def _last_step_snapshot(trainers: int) -> dict:
    """4 slots, 3 steps of 4 prompts x 2 samples; the last step's batch is generated and nothing is
    left to generate: `trainers` slots train, the others sit idle with the newest weights."""
    n = 8
    members = list(range(4 - trainers, 4))
    return {"now_s": 100.0, "seed": 1, "steps": 3, "prompts_per_step": 4, "group_size": 2, "updates_per_step": 2,
            "prompt_tokens": 16.0, "max_generation_tokens": 4096.0, "max_concurrency": 32, "step": 2, "published": 2,
            "members": members,
            "slots": [{"role": "train" if s in members else "rollout", "version": 2, "clock_s": 100.0} for s in range(4)],
            "batches": [{"open": True, "opened_s": 60.0, "complete_s": 99.0, "rollout_at_open": 4 - trainers, "remaining": 0,
                         "queued": [[] for _ in range(4)]}],
            "lengths": [[1000.0 + 100.0 * (i % 3) for i in range(n)] for _ in range(3)]}


def test_lookahead_planner_plans_on_a_leaders_snapshot_and_names_bad_input() -> None:
    """StageBalancePolicy.plan: the planner the live leader runs (and the simulator, on its own state)."""
    policy = rl.StageBalancePolicy(rl.StageBalanceConfig(devices=4, group_size=2, prior_switch_cost_s=0.5))
    for _ in range(8):  # training: 20 s of compute per step on one device, shared by the trainers
        for t in (1, 2):
            policy.observe_train(t, 8 * 1016.0 / t, 0.1 + 20.0 / 2 / t + (0.2 if t > 1 else 0.0), 0.2 if t > 1 else 0.0)
        for c in (8, 4, 1):
            policy.observe_decode(c, c * 1500.0, 10.0, 10.0 * (0.01 + 1e-4 * c))
    # Only the last step is left and it is all compute: the idle slots join (two at most per move).
    mv = policy.plan(_last_step_snapshot(1))
    assert mv["join"] == [0, 1] and mv["leave"] == [] and mv["trainers"] == 3, mv
    assert mv["reason"].startswith("lookahead: 3 trainers")
    # The same step with a switch measured at 60 s to agree: no join pays, the planner holds.
    held = policy.plan({**_last_step_snapshot(1), "last_switch": {"agree_s": 60.0, "rebuild_s": 0.5}})
    assert held["join"] == [] and held["leave"] == [] and held["trainers"] == 1, held
    bad = [({"steps": "3"}, "snapshot.steps: wrong type"),
           ({"stepz": 3}, "snapshot.stepz: unknown key"),
           ({"members": [0]}, "members"),
           ({"lengths": [[0.0] * 8] * 3}, "lengths: batch 0"),
           ({"step": 3}, "step: must lie in"),
           ({"slots": [{"role": "trainer"}] * 4}, "role must be 'rollout', 'train' or 'starting'")]
    for change, message in bad:
        with pytest.raises(ValueError, match=message):
            policy.plan({**_last_step_snapshot(1), **change})
    snap = _last_step_snapshot(1)
    del snap["published"]
    with pytest.raises(ValueError, match="snapshot.published: missing"):
        policy.plan(snap)
    with pytest.raises(ValueError, match="configured for 4 devices but the snapshot has 5 slots"):
        policy.plan({**_last_step_snapshot(1), "slots": _last_step_snapshot(1)["slots"] + [{"role": "rollout"}]})


def test_cli_writes_json_markdown_and_plot(tmp_path) -> None:
    out = tmp_path / "rl.json"
    md = tmp_path / "rl.md"
    proc = subprocess.run(
        [sys.executable, "-m", "dra.sim.cli", "rl", "--scenario", "long_tail", "--steps", "12", "--json", str(out),
         "--markdown", str(md), "--plots", str(tmp_path / "plots"), "--policy", "cooldown_steps=2"],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["scenario"] == "long_tail" and doc["settings"]["policy"] == {"cooldown_steps": 2}
    assert "AzureLLMInferenceTrace_code.csv" in doc["settings"]["length_source"]
    assert md.read_text().startswith("### RL pipeline, simulated: long_tail")
    assert (tmp_path / "plots" / "rl-long_tail-roles.png").stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "-m", "dra.sim.cli", "rl", "--cost", "nonsense"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--cost: expected NAME=VALUE" in bad.stderr


def test_bench_rl_rows(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dra.bench", "rl", "--steps", "10", "--scenarios", "long_tail", "training_bound", "--pipeline-scenarios",
         "--tail-weights", "--json", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    for name in ("rl_sim_throughput", "rl_sim_time", "rl_sim_throughput_vs_colocated", "rl_sim_oracle",
                 "rl_sim_throughput.training_bound"):
        assert name in rows, name
    assert rows["rl_sim_throughput"]["baseline"]["name"] == "best_static_split"
    assert rows["rl_sim_throughput_vs_colocated"]["baseline"]["name"] == "colocated_time_sharing"
    assert rows["rl_sim_throughput"]["label"] == "simulated"
    best = max(rows["rl_sim_throughput"]["static_samples_per_s"].values())
    assert rows["rl_sim_throughput"]["baseline"]["value"] == pytest.approx(best)


# ---- the event simulator (rollout-bound regime) -------------------------------------------------


def test_reasoning_lengths_are_long_grouped_and_growing() -> None:
    steps = rl.reasoning_lengths(steps=30)
    first, last = steps[0], steps[-1]
    assert len(first) == 512
    assert sum(first) / len(first) > 1000  # reasoning lengths: mean >= 1k tokens
    assert max(max(b) for b in steps) == 20480  # a tail to the limit
    assert sum(last) / len(last) > 1.5 * sum(first) / len(first)  # growth over training
    spread_in = sum(max(first[i : i + 8]) / min(first[i : i + 8]) for i in range(0, 512, 8)) / 64
    means = sorted(sum(first[i : i + 8]) / 8 for i in range(0, 512, 8))
    assert spread_in < means[-1] / means[0]  # a GRPO group's samples vary less than prompts do
    with pytest.raises(ValueError, match="tail_weight"):
        rl.reasoning_lengths(reasoning={"tail_weight": 1.5})


def test_pipeline_report_in_three_parts() -> None:
    doc = rl.simulate_pipeline("longgen", steps=4, devices=4, workload={"prompts_per_step": 16, "group_size": 4})
    s = doc["summary"]
    assert s["label"] == "simulated" and s["exactly_once"]
    bf, br = doc["barrier_free"], doc["barrier"]
    assert [r["rollout"] for r in bf] == [1, 2, 3]
    best = bf[doc["best_barrier_free"]]
    assert best["total_s"] == min(r["total_s"] for r in bf)
    # 1. the barrier's part, at the best barrier split and best against best
    assert s["barrier"]["fixed_split_time_ratio"] == pytest.approx(bf[doc["best_barrier"]]["total_s"] / br[doc["best_barrier"]]["total_s"])
    assert s["barrier"]["fixed_split_time_ratio"] <= 1.0 + 1e-9
    # 2. dra's part against the best static split of the same pipeline; 3. the oracle's share
    assert s["resizing"]["dynamic_time_vs_best_static"] == pytest.approx(doc["dynamic"]["total_s"] / best["total_s"])
    gain = best["total_s"] - doc["oracle_within_step"]["total_s"]
    share = s["oracle"]["oracle_share"]
    assert share is None if gain <= 0 else share == pytest.approx((best["total_s"] - doc["dynamic"]["total_s"]) / gain)
    assert 0.0 < s["checks"]["colocated_rollout_share"] < 1.0 and 0.0 < s["checks"]["colocated_tail_share"] < 1.0
    roles = doc["dynamic"]["roles"]
    assert all(r + t + m == 4 for r, t, m in zip(roles["rollout"], roles["train"], roles["moving"]))
    # 4. the look-ahead planner, on the same lengths, beside the window planner
    la, run = s["lookahead_planner"], doc["dynamic_lookahead"]
    assert run["name"] == "dynamic_lookahead" and run["exactly_once"] and la["live"] is True
    assert la["dynamic_time_vs_best_static"] == pytest.approx(run["total_s"] / best["total_s"])
    assert la["oracle_share"] is None if gain <= 0 else la["oracle_share"] == pytest.approx((best["total_s"] - run["total_s"]) / gain)
    text = rl.pipeline_markdown(doc)
    assert "Removing the barrier (not dra's)" in text and "Resizing (dra's)" in text
    assert "4. The look-ahead planner (planner='lookahead'; the live leader runs it" in text
    # planner='lookahead' makes it the headline too: the same run, seeded alike
    head = rl.simulate_pipeline("longgen", steps=4, devices=4, workload={"prompts_per_step": 16, "group_size": 4},
                                policy={"planner": "lookahead"})
    assert head["dynamic"]["total_s"] == head["dynamic_lookahead"]["total_s"] == run["total_s"]
    with pytest.raises(ValueError, match="planner: must be 'window' or 'lookahead', got 'greedy'"):
        rl.simulate_pipeline("longgen", steps=2, policy={"planner": "greedy"})
    with pytest.raises(ValueError, match="scenario: unknown scenario"):
        rl.simulate_pipeline("nope")
    with pytest.raises(ValueError, match="trace/workload"):
        rl.simulate_pipeline("longgen", trace="conv", steps=2)
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        rl.simulate_pipeline("longgen", steps=2, costs={"kv_capacity_tokens": 1000.0})


def test_the_lookahead_references_come_when_asked_for() -> None:
    # The oracle at the measured switch costs and its search on drawn lengths (by group, and alone):
    # whole runs (every sequence generated and trained once), in the JSON only when asked for.
    small = {"steps": 6, "devices": 4, "workload": {"prompts_per_step": 16, "group_size": 4}}
    seen: list[tuple[int, int]] = []
    doc = rl.simulate_pipeline("longgen", lookahead_samples=2, progress=lambda d, t: seen.append((d, t)), **small)
    refs = doc["references"]
    assert sorted(refs) == ["lookahead_sampled", "lookahead_sampled_independent", "oracle_within_step_paid"]
    for name, run in refs.items():
        assert run["name"] == name and run["exactly_once"]
    assert sum(w["total_s"] for w in refs["oracle_within_step_paid"]["switch_log"]) > 0.0  # it pays
    assert seen[-1][0] == seen[-1][1]  # the progress counts the references too
    assert doc["settings"]["lookahead_samples"] == 2
    assert "references" not in rl.simulate_pipeline("longgen", **small)
    with pytest.raises(ValueError, match="lookahead_samples: must be an integer >= 0"):
        rl.simulate_pipeline("longgen", lookahead_samples=-1, **small)
    text = rl.pipeline_markdown(doc)
    assert "References (not dra's result; 2 draws per decision):" in text and "- lookahead_sampled: x" in text
    cli = subprocess.run([sys.executable, "-m", "dra.sim.cli", "rl", "--scenario", "long_tail", "--lookahead-samples", "2"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "--lookahead-samples" in cli.stderr and "--pipeline-scenario" in cli.stderr


@pytest.mark.parametrize("seed", [1, 4])
def test_the_policy_follows_lengths_that_drift_to_the_best_split(seed: int) -> None:
    # Azure conversation lengths growing x4 over 200 steps: the best static split is 3 rollout / 5
    # train. A batch-time fit with a term collinear to the bulk at any one split put the growth
    # on the term that more rollout devices do not shrink, and held 2 / 6 for the whole run
    # (x1.21-1.22 of the best split on seeds 1-6). The fresh-batch model (each split's bulk at the
    # concurrency it leaves a device, plus the tail, one measured scale) moves with the lengths.
    doc = rl.simulate_pipeline("azure_conv_drift", steps=200, seed=seed)
    best = min(r["total_s"] for r in doc["barrier_free"])
    dynamic = doc["dynamic"]
    assert dynamic["exactly_once"]
    assert dynamic["total_s"] <= 1.0 * best, (dynamic["total_s"] / best, dynamic["switch_log"])
    assert dynamic["mean_rollout_devices"] > 2.5


def test_a_split_that_pays_over_the_run_is_taken_back_despite_its_one_off_cost() -> None:
    # azure_code, seed 4: the best split is 1 rollout / 7 train. A trainer lent to rollout in step 1
    # was never taken back: going back costs a measured 7.25 s optimizer handover once and saves
    # about 1.5 s on every later step, but the cost was charged inside the 6-step horizon (2.1 %
    # predicted gain, under min_relative_gain), so the policy stayed at x1.098 of the best split.
    doc = rl.simulate_pipeline("azure_code", steps=200, seed=4)
    best = min(r["total_s"] for r in doc["barrier_free"])
    dynamic = doc["dynamic"]
    assert dynamic["exactly_once"]
    assert dynamic["total_s"] <= 1.05 * best, (dynamic["total_s"] / best, dynamic["switch_log"])
    assert dynamic["mean_rollout_devices"] < 1.5


def test_pipeline_plots(tmp_path) -> None:
    from dra.rl.plots import plot_pipeline

    doc = rl.simulate_pipeline("azure_code", steps=4, devices=4)
    paths = plot_pipeline(doc, tmp_path)
    assert [p.name for p in paths] == ["rl-azure_code-roles.png", "rl-azure_code-static-vs-dynamic.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_bench_rl_pipeline_rows(tmp_path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dra.bench", "rl", "--scenarios", "--sweep-traces", "--pipeline-scenarios", "longgen",
         "--pipeline-steps", "3", "--tail-weights", "0.2", "--tail-steps", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["rl_sim_time_longgen"]["baseline"]["name"] == "best_static_split"
    assert rows["rl_sim_time_longgen"]["baseline"]["value"] == pytest.approx(min(rows["rl_sim_time_longgen"]["static_barrier_free_s"].values()))
    b = rows["rl_sim_time_longgen_barrier_free"]
    assert b["baseline"]["name"] == "best_static_split" and b["baseline"]["value"] == pytest.approx(min(b["static_barrier_s"].values()))
    assert b["value"] == pytest.approx(b["static_barrier_free_s"][str(b["split_rollout"])])
    assert rows["rl_sim_oracle_share_longgen"]["unit"] == "fraction"
    la = rows["rl_sim_time_longgen_lookahead"]
    assert la["baseline"]["name"] == "best_static_split" and la["baseline"]["value"] == rows["rl_sim_time_longgen"]["baseline"]["value"]
    assert rows["rl_sim_oracle_share_longgen_lookahead"]["unit"] == "fraction"
    assert rows["rl_sim_tail_sweep.w0.2"]["tail_weight"] == 0.2
    assert all(r["label"] == "simulated" for r in rows.values())


def test_cli_refuses_phase_model_flags_with_a_pipeline_scenario(capsys):
    """--trace, --drift, --constant-length, --scenario and --pipeline shape the phase model only: with
    --pipeline-scenario they were silently ignored (the same JSON as without them)."""
    from dra.sim import cli

    assert cli.main(["rl", "--pipeline-scenario", "longgen", "--steps", "2", "--quiet", "--drift", "8"]) == 2
    assert "--drift: not used by --pipeline-scenario" in capsys.readouterr().err


def test_cli_names_values_of_the_wrong_type_instead_of_a_traceback(capsys):
    """--seed -1, --cost NAME=abc and --policy cooldown_steps=1.5 reached the bindings unchecked
    (TypeError: incompatible function arguments); each is now a named error, exit 2."""
    from dra.sim import cli

    for argv, said in ((["--seed", "-1"], "--seed: -1 is out of range"),
                       (["--cost", "switch_optimizer_s=abc"], "switch_optimizer_s: 'abc' (str) is not of type float"),
                       (["--cost", "decode_fixed_s=nan"], "decode_fixed_s: 'nan' is not a finite number"),
                       (["--policy", "cooldown_steps=1.5"], "cooldown_steps: 1.5 (float) is not of type int")):
        with pytest.raises(SystemExit) if argv[0] == "--seed" else contextlib.nullcontext():
            assert cli.main(["rl", "--scenario", "long_tail", "--steps", "2", "--quiet", *argv]) == 2
        assert said in capsys.readouterr().err


def _rl_args(*argv: str):
    import argparse

    from dra.rl import cli as rl_cli

    parser = argparse.ArgumentParser(prog="dra-sim")
    rl_cli.add_parser(parser.add_subparsers(dest="command"))
    return rl_cli, parser.parse_args(["rl", *argv])


def test_cli_refuses_runs_above_the_documented_bounds():
    """`--steps 100000000` or `--devices 100000` ran for hours (the phase model costs about
    2.5e-6 s x steps x devices x (devices + 48) here; 1024 devices at 200 steps did not end in 5
    minutes). Refused at once, naming the bound; a run just inside the bounds is accepted. Each case
    in its own process with a timeout: without the bounds it would run on."""
    for argv, said in (
        (["--steps", "100001"], "argument --steps: 100001 is above the bound 100000"),
        (["--devices", "1025"], "argument --devices: 1025 is above the bound 1024"),
        (["--devices", "512", "--steps", "2000"], "above the bound steps x devices x (devices + 48) <= 240,000,000"),
        (["--workload", "steps=200000"], "--workload steps=200000: above the bound 100,000"),
        # The event model (a 200-step longgen run takes 3-4 minutes here; its planner grows faster).
        (["--pipeline-scenario", "longgen", "--steps", "1000"], "above the bound steps x (devices + 16) x (1 + lookahead"),
        (["--pipeline-scenario", "longgen", "--lookahead-samples", "64"], "give at most --steps 87 at this size"),
        (["--pipeline-scenario", "azure_code", "--devices", "65"], "above the event model's bound 64"),
    ):
        scenario = [] if "--pipeline-scenario" in argv else ["--scenario", "long_tail"]
        proc = subprocess.run([sys.executable, "-m", "dra.sim.cli", "rl", *scenario, "--quiet", *argv],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr, (argv, proc.stderr)
    for argv in (["--scenario", "long_tail", "--steps", "100000"], ["--scenario", "long_tail", "--devices", "512", "--steps", "800"],
                 ["--scenario", "long_tail", "--devices", "1024", "--steps", "200"],
                 ["--pipeline-scenario", "longgen"], ["--pipeline-scenario", "longgen", "--lookahead-samples", "12"],
                 ["--pipeline-scenario", "azure_code", "--devices", "64", "--steps", "200"]):
        rl_cli, args = _rl_args(*argv)
        assert rl_cli._check(args) is None, argv


def test_cli_refuses_options_that_would_be_ignored_and_non_decimal_numbers(tmp_path, capsys):
    """Silently ignored before: --scenario under --all-scenarios, --steps/--seed/--drift beside the
    --workload field that overrides them, --seed where every length is the same (nothing is drawn:
    the same JSON for every seed). Numbers such as '1_000' or ' 5 ' (Python's int()/float()) were
    taken; a --trace CSV that repeats a column was read from the first."""
    from dra.sim import cli

    for argv, said in (
        (["--steps", "2", "--scenario", "long_tail", "--all-scenarios"], "--scenario long_tail: not used with --all-scenarios"),
        (["--scenario", "long_tail", "--steps", "5", "--workload", "steps=7"], "--steps 5 and --workload steps=7 set the same thing"),
        (["--scenario", "long_tail", "--seed", "5", "--workload", "seed=7"], "--seed 5 and --workload seed=7"),
        (["--steps", "2", "--drift", "2", "--workload", "drift_final_scale=3"], "--drift 2.0 and --workload drift_final_scale=3"),
        (["--steps", "2", "--constant-length", "100", "--seed", "3"],
         "--seed: not used here, every generation has the same length (--constant-length)"),
        (["--steps", "2", "--scenario", "training_bound", "--seed", "3"], "(scenario training_bound)"),
        (["--steps", "2", "--pipeline-scenario", "longgen", "--pipeline", "one_step_off"], "--pipeline: not used by --pipeline-scenario"),
    ):
        assert cli.main(["rl", "--quiet", *argv]) == 2, argv
        assert said in capsys.readouterr().err, argv
    for flag, value in (("--steps", "1_000"), ("--steps", " 5 "), ("--devices", "0x10"), ("--constant-length", "1e3"),
                        ("--drift", "inf"), ("--seed", "+5"), ("--initial-rollout", "-1")):
        with pytest.raises(SystemExit):
            cli.main(["rl", "--scenario", "long_tail", "--quiet", flag, value])
        err = capsys.readouterr().err
        assert f"argument {flag}: " in err and ("plain" in err or "out of range" in err), (flag, value, err)
    trace = tmp_path / "trace.csv"
    trace.write_text("GeneratedTokens,GeneratedTokens\n5,7\n")
    assert cli.main(["rl", "--trace", str(trace), "--steps", "2", "--quiet"]) == 2
    assert "column 'GeneratedTokens' appears twice" in capsys.readouterr().err
    trace.write_text("GeneratedTokens\n5\n0x10\n")
    assert cli.main(["rl", "--trace", str(trace), "--steps", "2", "--quiet"]) == 2
    assert "trace.csv:3: column 'GeneratedTokens' (1): '0x10' is not a plain decimal" in capsys.readouterr().err
