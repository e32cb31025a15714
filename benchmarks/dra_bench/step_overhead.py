"""``python -m dra.bench step --json PATH``: dra's per-step overhead in the digits job.

The question (issue 3): how much longer is one optimizer step of the digits job under dra (the
elastic controller over a static world) than the same step under plain torch DDP over Gloo, at the
same world size, on the same samples, with the same model? Goal: < 1 %.

How it is measured:

* One torchrun job of N processes (N = 2 and 4 by default) holds all the variants, in the same
  processes, on the same data (scikit-learn's digits, the examples' 75/25 split), with the same
  initial weights and SGD with momentum:

  - ``plain``: ``torch.nn.parallel.DistributedDataParallel`` (defaults) over a Gloo process
    group; each rank's share of every global batch is precomputed before the timed loop (the
    cheapest plain loop), from the very samples dra's sampler hands that rank;
  - ``dra``: ``dra.elastic.init`` (policy ``convergence`` with min = max = start = N, so the
    world never changes; default ``decide_every``), ``ElasticSampler``, ``ctl.model``,
    ``dra.step(loss)`` after ``optimizer.step()``; the sampler runs inside the loop (its cost is
    dra's cost);
  - ``bare``: the least a data-parallel step must do, written by hand: after ``backward``, one
    flat Gloo all-reduce of all gradients (``torch.cat``, ``all_reduce``, divide, copy back),
    the same single collective dra issues; dra vs bare is dra's own cost;
  - ``local``: the same model and per-rank batch with no communication at all (the compute floor);
  - ``plain2``: the plain DDP job once more (its own model, the same group): the A/A control.
    Its "overhead" against ``plain`` is what the measurement scatters by on this machine; a dra
    figure inside that band is not distinguishable from zero.

  The variants are interleaved step by step: every iteration of a round runs one step of each,
  back to back, so load from elsewhere on the machine falls on all of them alike; the order
  rotates from round to round and from launch to launch. A barrier (on the plain group, untimed)
  precedes every step, so no step inherits the skew between the ranks that the previous one left.
  Each round drops its first ``--discard`` iterations; an untimed warm-up of each variant comes
  first.
* Per-step time = rank 0's perf_counter from asking for the step's batch (the sampler's yield) to
  the end of the step: indexing the batch, forward, zero_grad + backward with the gradient
  reduction, optimizer step, ``dra.step``. Per variant and launch: the median over the timed
  steps; beside it the 10th percentile (the steps that other processes on the machine did not
  slow down), the mean (which also carries periodic costs such as the leader's decision every
  ``decide_every`` steps), and the process CPU time per step (all threads, Gloo's too).
* Each launch (``--repeats``) gives a ratio dra/plain of the medians; the headline is the median
  of those ratios with their min/max, and a bootstrap 95 % interval over the per-round ratios.
* Models: ``digits`` (the job's own model: 64-128-10 MLP, global batch 32; its step is a few
  milliseconds of fixed per-step latencies, the all-reduce's among them) and ``wide``
  (64-1024-1024-10, global batch 256, 1.1 M parameters; compute dominates, as in most users'
  models).
* Breakdown (rank 0, medians): the phases of each variant; the time inside ``dra.step``; the
  gradient reduction of each variant (its backward minus the local backward) against one flat
  all-reduce of the gradients' size on the same Gloo world; ``--profile`` runs cProfile over
  rank 0's dra steps in one extra launch (written beside the JSON as ``.profile.txt``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra._argtypes import count_arg, nonnegative_int_arg, positive_arg, seed32_arg
from dra_bench._report import write_report
from dra_bench._step_analysis import _analyse, _pooled, _print_breakdown, _rows
from dra_bench._step_config import COMPARISONS, GOAL_PCT, MODELS, PHASES, VARIANTS
from dra_bench._step_worker import _worker

__all__ = ["COMPARISONS", "GOAL_PCT", "MODELS", "PHASES", "VARIANTS", "main", "measure"]


# ---------------------------------------------------------------------------------------------
# the suite: launches, measure() and the command line
# ---------------------------------------------------------------------------------------------
def _launch(nproc: int, model: str, repeat: int, out: str, args: argparse.Namespace, profile: bool = False) -> list[dict]:
    spec = MODELS[model]
    steps = args.steps or spec["steps"]
    warmup = args.warmup if args.warmup is not None else spec["warmup"]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
        "-m", "dra_bench.step_overhead", "--worker", "--out", out, "--repeat", str(repeat),
        "--hidden", str(spec["hidden"]), "--depth", str(spec["depth"]), "--global-batch", str(spec["global_batch"]),
        "--rounds", str(args.rounds), "--steps", str(steps), "--warmup", str(warmup),
        "--discard", str(args.discard), "--seed", str(args.seed), "--lr", str(args.lr),
    ]
    if profile:
        cmd.append("--profile")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"step overhead job ({model}, {nproc} processes) failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]


def measure(
    sizes: tuple[int, ...] | list[int] = (2, 4),
    models: tuple[str, ...] | list[str] = ("digits", "wide"),
    *,
    repeats: int = 5,
    rounds: int = 4,
    steps: int | None = None,
    warmup: int | None = None,
    discard: int = 2,
    seed: int = 0,
    lr: float = 0.05,
    timeout: float = 900.0,
    profile: bool = False,
) -> tuple[list[dict[str, Any]], str | None]:
    """Runs the launches; returns the report rows (``_report.result`` dicts) and, with `profile`,
    the cProfile text of rank 0's dra steps (first size, first model). Other suites may call this
    (e.g. ``measure([4], ["digits"], repeats=3)``) and append the rows to their own report."""
    args = argparse.Namespace(rounds=rounds, steps=steps, warmup=warmup, discard=discard, seed=seed, lr=lr, timeout=timeout)
    results: list[dict[str, Any]] = []
    profile_text = None
    with tempfile.TemporaryDirectory(prefix="dra-bench-step-") as tmp:
        for model in models:
            for nproc in sizes:
                launches = []
                for rep in range(repeats):
                    out = os.path.join(tmp, f"{model}-n{nproc}-r{rep}")
                    t0 = time.perf_counter()
                    launches.append(_launch(nproc, model, rep, out, args))
                    r0 = launches[-1][0]
                    p = statistics.median(_pooled(r0, "plain", "step_s"))
                    d = statistics.median(_pooled(r0, "dra", "step_s"))
                    print(f"[step] {model} n={nproc} launch {rep + 1}/{repeats}: plain {1e3 * p:.3f} ms, dra {1e3 * d:.3f} ms, "
                          f"ratio {d / p:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
                a = _analyse(launches)
                _print_breakdown(model, nproc, a)
                results += _rows(model, nproc, a, MODELS[model])
        if profile:
            out = os.path.join(tmp, "profile")
            _launch(sizes[0], models[0], 0, out, args, profile=True)
            profile_text = Path(out, "profile.txt").read_text()
    return results, profile_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra.bench step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, help="where to write the JSON report")
    parser.add_argument("--sizes", default="2,4", help="world sizes (processes), comma-separated")
    parser.add_argument("--models", default="digits,wide", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--repeats", type=count_arg, default=5, help="torchrun launches per size and model")
    parser.add_argument("--rounds", type=count_arg, default=4, help="rounds per launch (the variants' order rotates every round)")
    parser.add_argument("--steps", type=count_arg, default=None, help="steps of each variant per round (default: per model)")
    parser.add_argument("--warmup", type=nonnegative_int_arg, default=None, help="untimed steps of each variant first (default: per model)")
    parser.add_argument("--discard", type=nonnegative_int_arg, default=2, help="first iterations of every round not counted")
    parser.add_argument("--seed", type=seed32_arg, default=0)
    parser.add_argument("--lr", type=positive_arg, default=0.05)
    parser.add_argument("--profile", action="store_true", help="one extra launch with cProfile over rank 0's dra steps")
    parser.add_argument("--timeout", type=positive_arg, default=900.0, help="seconds per torchrun launch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=nonnegative_int_arg, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=count_arg, default=128, help=argparse.SUPPRESS)
    parser.add_argument("--depth", type=nonnegative_int_arg, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--global-batch", type=count_arg, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: unknown model '{m}'; choose from {', '.join(MODELS)}")
    if not sizes or any(n < 2 for n in sizes):
        parser.error("--sizes: world sizes must be >= 2 (a world of one has no gradient reduction to compare)")
    for m in models:
        if (args.steps or MODELS[m]["steps"]) <= args.discard:
            parser.error(f"--steps ({args.steps or MODELS[m]['steps']}) must exceed --discard ({args.discard})")

    results, profile_text = measure(
        sizes, models, repeats=args.repeats, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
        discard=args.discard, seed=args.seed, lr=args.lr, timeout=args.timeout, profile=args.profile,
    )
    write_report("step", results, args.json)
    if profile_text is not None:
        print(profile_text)
        if args.json:
            path = os.path.splitext(args.json)[0] + ".profile.txt"
            Path(path).write_text(profile_text)
            print(f"  profile: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
