"""``python -m dra.bench overhead --json PATH``: what dra costs a training loop per step.

Figures (medians over repeats, each measured in this run):

- ns per C++ estimator update (``ConvergenceEstimator.update_loss``; and with the gradient
  statistics as well), timed by a loop in C++;
- ns per policy decision (``ConstrainedPolicy.decide``, convergence and goodput policies) and per
  ``ResizeEngine.step`` (an update plus a decision every ``decide_every`` steps), timed in C++;
- µs per Python ``dra.step(float)`` and ``dra.step(0-d tensor)`` call, against the same loop over
  a bare no-op pybind11 call (``dra.testing.noop()``) as the baseline (interleaved repeats); on a
  machine with CUDA, ``dra.step(0-d CUDA tensor)`` as well (never read at a step without a decision).

Two clocks: the thread's CPU time (the cost of the code itself, robust on a shared machine where
other processes take turns on the cores) is the headline value; wall-clock time is given beside it
(``wall``). Goals (DESIGN/issue 2, issue 10): estimator update < 200 ns; ``dra.step`` with a float
and with a 0-d tensor < 3x the no-op call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from dra._argtypes import count_arg
from dra_bench._report import result, write_report

ESTIMATOR_GOAL_NS = 200.0
STEP_GOAL_RATIO = 3.0


def _median_pair(measure: Callable[[], tuple[float, float]], repeats: int) -> tuple[float, float]:
    """Median CPU and wall figures of `repeats` measurements."""
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = measure()
        cpu.append(c)
        wall.append(w)
    return statistics.median(cpu), statistics.median(wall)


def _cpp_figure(fn: Callable[..., float], count: int, *args: Any) -> Callable[[], tuple[float, float]]:
    """The C++ loops time themselves (wall, steady_clock); CPU time is taken around the call."""

    def measure() -> tuple[float, float]:
        c0 = time.thread_time_ns()
        wall_ns = fn(*args)
        return (time.thread_time_ns() - c0) / count, wall_ns

    return measure


def _timed(loop: Callable[[int], None], number: int) -> Callable[[], tuple[float, float]]:
    def measure() -> tuple[float, float]:
        c0 = time.thread_time_ns()
        w0 = time.perf_counter_ns()
        loop(number)
        w1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        return (c1 - c0) / number, (w1 - w0) / number

    return measure


# The baseline and the subject run in loops of the same shape: a local name called once per
# iteration. The baseline is the bare binding itself, not a Python wrapper around it.
def _noop_loop(noop: Callable[[], None]) -> Callable[[int], None]:
    def loop(number: int) -> None:
        for _ in range(number):
            noop()

    return loop


def _step_loop(step: Callable[[Any], Any], value: Any) -> Callable[[int], None]:
    def loop(number: int) -> None:
        for _ in range(number):
            step(value)

    return loop


def run(*, quick: bool = False, repeats: int | None = None) -> list[dict[str, Any]]:
    import torch

    import dra
    from dra import _core

    repeats = repeats or (3 if quick else 7)
    updates = 200_000 if quick else 2_000_000
    decisions = 20_000 if quick else 200_000
    steps = 50_000 if quick else 300_000
    rows: list[dict[str, Any]] = []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    # ---- C++ hot paths ----------------------------------------------------------------------
    cpu, wall = _median_pair(_cpp_figure(_core._testing.bench_estimator_update_ns, updates, updates, False), repeats)
    rows.append(
        result(
            "estimator update (C++)",
            cpu,
            "ns",
            goal=f"< {ESTIMATOR_GOAL_NS:g} ns",
            goal_met=cpu < ESTIMATOR_GOAL_NS,
            wall=wall,
            clock="thread cpu time",
        )
    )
    cpu, wall = _median_pair(_cpp_figure(_core._testing.bench_estimator_update_ns, updates, updates, True), repeats)
    rows.append(result("estimator update + gradient stats (C++)", cpu, "ns", wall=wall, clock="thread cpu time"))
    for policy in ("convergence", "goodput"):
        cpu, wall = _median_pair(_cpp_figure(_core._testing.bench_policy_decision_ns, decisions, policy, decisions), repeats)
        rows.append(result(f"policy decision, {policy} (C++)", cpu, "ns", wall=wall, clock="thread cpu time"))
    cpu, wall = _median_pair(_cpp_figure(_core._testing.bench_engine_step_ns, updates // 2, updates // 2, 10), repeats)
    rows.append(
        result("engine step, decide every 10 (C++)", cpu, "ns", wall=wall, clock="thread cpu time")
    )

    # ---- Python dra.step against a bare binding call ----------------------------------------
    dra.reset()
    for t in range(500):  # past warm-up, so the loop measures the steady state
        dra.step(4.0 * (1.0 + t / 50.0) ** -0.5)
    # Interleave baseline and subject so drifts in machine load hit both alike.
    # A 0-d tensor (what `loss` is) is read straight from its storage, never through item().
    tensor = torch.tensor(1.0)
    base_cpu, base_wall, step_cpu, step_wall, tensor_cpu, tensor_wall = [], [], [], [], [], []
    for _ in range(repeats):
        c, w = _timed(_noop_loop(_core._testing.noop), steps)()
        base_cpu.append(c)
        base_wall.append(w)
        c, w = _timed(_step_loop(dra.step, 1.0), steps)()
        step_cpu.append(c)
        step_wall.append(w)
        c, w = _timed(_step_loop(dra.step, tensor), steps)()
        tensor_cpu.append(c)
        tensor_wall.append(w)
    bc, bw = statistics.median(base_cpu), statistics.median(base_wall)
    sc, sw = statistics.median(step_cpu), statistics.median(step_wall)
    baseline_name = "no-op pybind11 call, same loop"
    rows.append(result("python no-op binding call (baseline)", bc / 1000.0, "us", wall=bw / 1000.0, clock="thread cpu time"))
    rows.append(
        result(
            "python dra.step(float)",
            sc / 1000.0,
            "us",
            baseline=(baseline_name, bc / 1000.0),
            goal=f"ratio < {STEP_GOAL_RATIO:g}",
            goal_met=sc / bc < STEP_GOAL_RATIO,
            wall=sw / 1000.0,
            wall_ratio=sw / bw,
            clock="thread cpu time",
        )
    )
    tc, tw = statistics.median(tensor_cpu), statistics.median(tensor_wall)
    rows.append(
        result(
            "python dra.step(0-d tensor)",
            tc / 1000.0,
            "us",
            baseline=(baseline_name, bc / 1000.0),
            goal=f"ratio < {STEP_GOAL_RATIO:g}",
            goal_met=tc / bc < STEP_GOAL_RATIO,
            wall=tw / 1000.0,
            wall_ratio=tw / bw,
            clock="thread cpu time",
        )
    )
    if torch.cuda.is_available():
        # A CUDA loss is never read at a step without a decision: no device synchronisation here.
        cuda_loss = torch.tensor(1.0, device="cuda")
        torch.cuda.synchronize()
        cc, cw = _median_pair(_timed(_step_loop(dra.step, cuda_loss), steps // 4), repeats)
        torch.cuda.synchronize()
        rows.append(
            result("python dra.step(0-d CUDA tensor)", cc / 1000.0, "us", baseline=(baseline_name, bc / 1000.0),
                   wall=cw / 1000.0, clock="thread cpu time")
        )
    dra.reset()
    for row in rows:
        row["load_average_1min"] = load
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the JSON report here")
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, noisier figures)")
    parser.add_argument("--repeats", type=count_arg, default=None, help="measurements per figure (median reported)")
    args = parser.parse_args(argv)
    rows = run(quick=args.quick, repeats=args.repeats)
    write_report("overhead", rows, args.json)
    return 0
