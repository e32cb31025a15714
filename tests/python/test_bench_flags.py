"""The benchmark suites' number flags (``python -m dra.bench <suite> --flag VALUE``): a bad value
(a negative count, a zero timeout, nan, inf, a seed out of range) is refused at once, exit 2, with
the flag and what to give instead, before any measurement starts (not minutes later, mid-run).

The suites run in this process through ``dra_bench.__main__.main`` (the dispatch of
``python -m dra.bench``): a refused value ends in argparse's SystemExit(2) before any work; one
test runs the real command line once. "At once" is checked by what ends the run, not by a clock:
argparse's error naming the flag (its SystemExit(2) is raised while parsing, before a suite's first
line of work). A value that slipped through runs a benchmark instead, which says no such error
(or runs into the 120 s timeout). No wall-time bound: the first test imports torch and the suites
(9 s on a loaded 2-core host, more under CI's load), and the command line starts an interpreter
that imports them again.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import pytest

from dra_bench import __main__ as bench

pytestmark = pytest.mark.timeout(120)

# (suite, arguments, what the error must say); every converter kind appears: count, nonnegative
# integer, integer, seed in [0, 2^32), positive, nonnegative and [0, 1] numbers, nan and inf, and
# the range checks made right after parsing (>= 2, <= 16, a known workload, a list of sizes).
BAD = [
    ("dropin", ["--trials", "-3"], "argument --trials: -3 is not >= 1"),
    ("dropin", ["--fault-timeout-s", "0"], "argument --fault-timeout-s: 0 is not > 0"),
    ("dropin", ["--fault-timeout-s", "nan"], "argument --fault-timeout-s: 'nan' is not finite"),
    ("faults", ["--trials", "0"], "argument --trials: 0 is not >= 1"),
    ("faults", ["--fuzz-cases", "-1"], "argument --fuzz-cases: -1 is negative"),
    ("faults", ["--seed", "1.5"], "argument --seed: '1.5' is not an integer"),
    ("faults", ["--fault-timeout-s", "-1"], "argument --fault-timeout-s: -1 is not > 0"),
    ("faults", ["--trial-timeout-s", "inf"], "argument --trial-timeout-s: 'inf' is not finite"),
    ("faults", ["--churn-model-mb", "-1"], "argument --churn-model-mb: -1 is negative"),
    ("faults", ["--churn-resizes", "0"], "argument --churn-resizes: 0 is not >= 1"),
    ("faults", ["--jobs", "0"], "argument --jobs: 0 is not >= 1"),
    ("faults", ["--jobs", "17"], "--jobs: expected 1..16 trials at once, got 17"),
    ("nccl", ["--nproc", "-1"], "argument --nproc: -1 is negative"),
    ("nccl", ["--min-bytes", "0"], "argument --min-bytes: 0 is not >= 1"),
    ("nccl", ["--max-bytes", "x"], "argument --max-bytes: 'x' is not an integer"),
    ("nccl", ["--p2p-mb", "-4"], "argument --p2p-mb: -4 is not > 0"),
    ("nccl", ["--chunk-mb", "inf"], "argument --chunk-mb: 'inf' is not finite"),
    ("nccl", ["--budget-s", "nan"], "argument --budget-s: 'nan' is not finite"),
    ("nccl", ["--repeats", "0"], "argument --repeats: 0 is not >= 1"),
    ("nccl", ["--resize-mb", "0"], "argument --resize-mb: 0 is not > 0"),
    ("nccl", ["--resize-nproc", "1"], "--resize-nproc: 1 is not >= 2"),
    ("nccl", ["--resize-repeats", "-2"], "argument --resize-repeats: -2 is not >= 1"),
    ("nccl", ["--watchdog-timeout-s", "0"], "argument --watchdog-timeout-s: 0 is not > 0"),
    ("nccl", ["--steps", "0"], "argument --steps: 0 is not >= 1"),
    ("nccl", ["--rounds", "-1"], "argument --rounds: -1 is not >= 1"),
    ("overhead", ["--repeats", "0"], "argument --repeats: 0 is not >= 1"),
    ("pool", ["--handover-repeats", "0"], "argument --handover-repeats: 0 is not >= 1"),
    ("resize", ["--chunk-mb", "0"], "argument --chunk-mb: 0 is not > 0"),
    ("resize", ["--timeout", "-1"], "argument --timeout: -1 is not > 0"),
    ("resize", ["--dra-repeats", "0"], "argument --dra-repeats: 0 is not >= 1"),
    ("resize", ["--torchft-repeats", "-1"], "argument --torchft-repeats: -1 is not >= 1"),
    ("resize", ["--sizes-mb", "10,-5"], "--sizes-mb: -5 is not > 0"),
    ("resize", ["--t0", "nan"], "argument --t0: 'nan' is not finite"),
    ("rl", ["--steps", "0"], "argument --steps: 0 is not >= 1"),
    ("rl", ["--sweep-drifts", "1", "0"], "argument --sweep-drifts: 0 is not > 0"),
    ("rl", ["--pipeline-steps", "-1"], "argument --pipeline-steps: -1 is not >= 1"),
    ("rl", ["--tail-weights", "0.1", "1.5"], "argument --tail-weights: 1.5 is not in [0, 1]"),
    ("rl", ["--live-reward-steps", "-1"], "argument --live-reward-steps: -1 is negative"),
    ("rl", ["--live-cpus-per-slot", "inf"], "argument --live-cpus-per-slot: 'inf' is not finite"),
    ("rl", ["--live-slots", "1"], "--live-slots: 1 is not >= 2"),
    ("sage", ["--world", "0"], "argument --world: 0 is not >= 1"),
    ("sage", ["--ramp-start", "-1"], "argument --ramp-start: -1 is negative"),
    ("sage", ["--seeds", "0"], "argument --seeds: 0 is not >= 1"),
    ("sage", ["--first-seed", "-1"], "argument --first-seed: -1 is out of range"),
    ("sage", ["--first-seed", str(2**32)], f"argument --first-seed: {2**32} is out of range"),
    ("sage", ["--first-seed", str(2**32 - 1), "--seeds", "2"], "the last seed passes 2^32 - 1"),
    ("sage", ["--target", "1.5"], "argument --target: 1.5 is not in [0, 1]"),
    ("sage", ["--latency-ms", "-1"], "argument --latency-ms: -1 is negative"),
    ("sage", ["--burst-bytes", "100"], "--burst-bytes: 100 is below two full frames"),
    ("sage", ["--run-timeout", "0"], "argument --run-timeout: 0 is not > 0"),
    ("sage", ["--eta", "nan"], "argument --eta: 'nan' is not finite"),
    ("sim", ["--workloads", "1", "0"], "argument --workloads: 0 is not >= 1"),
    ("sim", ["--workloads", "9"], "--workloads: there is no workload 9"),
    ("sim", ["--runs", "-1"], "argument --runs: -1 is negative"),
    ("sim", ["--reference-jobs", "0"], "argument --reference-jobs: 0 is not >= 1"),
    ("step", ["--repeats", "0"], "argument --repeats: 0 is not >= 1"),
    ("step", ["--steps", "0"], "argument --steps: 0 is not >= 1"),
    ("step", ["--warmup", "-1"], "argument --warmup: -1 is negative"),
    ("step", ["--seed", "-1"], "argument --seed: -1 is out of range"),
    ("step", ["--lr", "0"], "argument --lr: 0 is not > 0"),
    ("step", ["--timeout", "nan"], "argument --timeout: 'nan' is not finite"),
    ("step", ["--depth", "-1"], "argument --depth: -1 is negative"),
    ("torchft_baseline", ["--repeats", "0"], "argument --repeats: 0 is not >= 1"),
    ("torchft_baseline", ["--timeout", "inf"], "argument --timeout: 'inf' is not finite"),
    ("torchft_baseline", ["--heartbeat-timeout-ms", "0"], "argument --heartbeat-timeout-ms: 0 is not >= 1"),
]

# Values at the edge of each range that the suites take (0 where it means none/all/default).
GOOD = [
    ("dropin", ["--trials", "1", "--fault-timeout-s", "0.5"], {"trials": 1, "fault_timeout_s": 0.5}),
    ("faults", ["--seed", "-3", "--fuzz-cases", "0", "--churn-model-mb", "0", "--jobs", "16"],
     {"seed": -3, "fuzz_cases": 0, "churn_model_mb": 0.0, "jobs": 16, "trials": None}),
    ("nccl", ["--nproc", "0"], {"nproc": 0, "chunk_mb": 16.0, "budget_s": 150.0, "repeats": 5}),
    ("overhead", [], {"repeats": None}),
    ("pool", [], {"handover_repeats": 3}),
    ("resize", ["--t0", "-1.5"], {"t0": -1.5, "chunk_mb": 16.0, "timeout": 600.0, "dra_repeats": 3}),
    ("rl", ["--tail-weights", "0", "1", "--live-reward-steps", "0", "--live-switch-runs", "0",
            "--live-pretrain-steps", "0", "--live-cpus-per-slot", "2"],
     {"tail_weights": [0.0, 1.0], "live_reward_steps": 0, "live_cpus_per_slot": 2.0, "live_slots": 8}),
    ("sage", ["--latency-ms", "0", "--ramp-steps", "0", "--target", "1", "--eta", "0", "--first-seed", str(2**32 - 5)],
     {"latency_ms": 0.0, "ramp_steps": 0, "target": 1.0, "eta": 0.0, "burst_bytes": 16 * 1024}),
    ("sim", ["--runs", "0", "--workloads", "1", "8"], {"runs": 0, "workloads": [1, 8], "reference_jobs": 8}),
    ("step", ["--warmup", "0", "--discard", "0", "--seed", "0"], {"warmup": 0, "discard": 0, "seed": 0, "lr": 0.05}),
    ("torchft_baseline", [], {"repeats": 3, "timeout": 300.0, "heartbeat_timeout_ms": 1000}),
]


@pytest.fixture(autouse=True)
def _keep_signal_handlers():
    """A suite that got past its checks may set a SIGTERM handler: this process keeps its own."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _suite(suite: str) -> str:
    return bench.SHORT.get(suite, suite)


def test_every_suite_has_cases() -> None:
    assert {_suite(s) for s, _, _ in BAD} == set(bench.suites())
    assert {_suite(s) for s, _, _ in GOOD} == set(bench.suites())


@pytest.mark.parametrize(("suite", "args", "message"), BAD, ids=[f"{s}{''.join(a[:1])}={a[-1]}" for s, a, _ in BAD])
def test_bad_value_exits_2_naming_the_flag(suite: str, args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main([suite, *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert message in err, err
    assert f"dra.bench {suite}: error:" in err, err


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


@pytest.mark.parametrize(("suite", "args", "expected"), GOOD, ids=[s for s, _, _ in GOOD])
def test_good_values_and_defaults_unchanged(suite: str, args: list[str], expected: dict, monkeypatch) -> None:
    """Parsing only: the parse ends the suite (what follows the suite's own checks is not run)."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        raise _Parsed(parse(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed) as got:
        bench.main([suite, *args])
    values = vars(got.value.namespace)
    assert {k: values[k] for k in expected} == expected
    assert all(type(values[k]) is type(v) for k, v in expected.items() if v is not None)


@pytest.mark.parametrize("suite", bench.suites())
def test_help_still_works(suite: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main([suite, "--help"])
    assert exc.value.code == 0
    assert "usage: python -m dra.bench" in capsys.readouterr().out


def test_the_private_sage_worker_refuses_a_bad_seed(monkeypatch, capsys) -> None:
    from dra_bench import _sage_worker

    monkeypatch.setattr(sys, "argv", ["_sage_worker", "--method", "fp32_allreduce", "--out", "x", "--seed", "-1"])
    with pytest.raises(SystemExit) as exc:
        _sage_worker.main()
    assert exc.value.code == 2
    assert "argument --seed: -1 is out of range; give a seed in [0, 2^32)" in capsys.readouterr().err


def test_the_command_line_refuses_at_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "dra.bench", "nccl", "--budget-s", "nan"],
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stderr
    assert "python -m dra.bench nccl: error: argument --budget-s: 'nan' is not finite; give a finite number" in proc.stderr
    assert proc.stdout == "", proc.stdout  # no suite started: nothing measured, nothing printed
