"""Zeus's measured traces replayed by dra's energy chooser and, side by side, by Zeus's own
trace-driven simulator (``zeus._legacy.simulate`` from the ``zeus`` package).

Everything here is ``replayed``: epochs to target come from Zeus's ``summary_train.csv`` (several
seeds per batch size), epoch time and average power from ``summary_power_<gpu>.csv``, both measured
by the Zeus authors (Apache-2.0, shipped in ``data/zeus/`` with attribution).

Approaches, each over the same recurrences of a job, at the same eta, on the same traces:

- ``default``: the user's batch size b0 at the maximum power limit (Zeus's baseline).
- ``zeus``: Zeus's simulator (pruning Gaussian-Thompson-sampling batch size optimizer, JIT power
  limit profiling, early stopping at beta x the best cost seen).
- ``dra``: dra's learner over the same knobs under the same rules: a batch size's first run
  profiles the power limits during its first epoch (the cost Zeus's simulator charges), runs are
  stopped at beta x the best cost seen, and a stopped run is retried; it sweeps the batch sizes
  from b0 outwards, pruning where a run is stopped, then Thompson-samples epochs to target and
  lets dra's chooser (``choose_setting`` with the Zeus cost) pick on the draws (DraLearner).
- ``dra_hindsight``: dra's chooser given the trace means for every setting (the best static choice
  in hindsight: a bound no learner beats on average).
- ``dra_knobs``: dra's learner's batch size, then world size and sparsity added as knobs through
  the stated models below (they are models, not measurements, and say so).

Extra-knob models (stated assumptions; see docs/guide/sage.md):
- World size N at global batch B: each GPU runs batch B/N (its epoch time and power from the trace
  at B/N), an epoch takes tpe(B/N)/N plus a ring all-reduce per step of 2(N-1)/N x 4 x params bytes
  over a 100 Gbit/s link, the N GPUs draw their traced power throughout (sync included), Zeus's
  time price is N x MAXPOWER, and epochs to target are those of global batch B.
- Sparsity s: the traced GPUs (V100, A40, P100, RTX6000) run unstructured-sparse weights with
  the same dense kernels, so epoch time and power are unchanged; no trace says how sparsity moves
  epochs to target, so it is taken as unchanged. The knob can then never win: it is listed so the
  result says so.
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dra._core import EnergyObjective, KnobSetting, choose_setting

GPUS = ("v100", "a40", "p100", "rtx6000")


@dataclass(frozen=True)
class ZeusJob:
    """A recurring job as in Zeus's paper (Table 3): target metric, epoch cap, default batch b0."""

    dataset: str
    network: str
    optimizer: str
    target_metric: float
    max_epochs: int
    default_bs: int
    params_millions: float  # model size: only the world-size model uses it (stated, approximate)
    train_samples: int  # samples per epoch: only the world-size model uses it (stated, approximate)

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.network}"


JOBS = (
    ZeusJob("cifar100", "shufflenetv2", "adadelta", 0.6, 100, 1024, 1.4, 50_000),
    ZeusJob("imagenet", "resnet50", "adadelta", 0.65, 100, 256, 25.6, 1_281_167),
    ZeusJob("librispeech", "deepspeech2", "adamw", 40.0, 16, 192, 26.0, 28_539),
    ZeusJob("movielens-1m", "ncf", "adam", 0.41, 100, 1024, 1.0, 994_169),
    ZeusJob("squad", "bert_base_uncased", "adamw", 84.0, 6, 32, 110.0, 88_641),
    ZeusJob("sentiment140", "bert_base_uncased", "adamw", 0.84, 10, 128, 110.0, 1_600_000),
)
LEARNER_STREAM = 0x6472  # dra's learner draws from default_rng([seed, LEARNER_STREAM]); paths from default_rng(seed)
LINK_BYTES_PER_S = 100e9 / 8  # world-size model: a 100 Gbit/s link between GPUs (stated)


def data_dir() -> Path:
    """The shipped traces: ``data/zeus`` next to the package (wheel) or in the source tree."""
    here = Path(__file__).resolve()
    for candidate in (here.parent / "data" / "zeus", here.parents[3] / "data" / "zeus"):
        if (candidate / "summary_train.csv").exists():
            return candidate
    raise FileNotFoundError("Zeus traces not found: expected data/zeus/summary_train.csv in the source tree or package")


@dataclass
class Trace:
    """One job's slice of the traces on one GPU."""

    job: ZeusJob
    gpu: str
    epochs: dict[int, list[float]]  # batch size -> target_epoch per seed (nan: never reached)
    power: dict[tuple[int, int], tuple[float, float]]  # (batch, power limit) -> (time_per_epoch, avg power)
    batch_sizes: list[int] = field(default_factory=list)
    power_limits: list[int] = field(default_factory=list)
    root: Path | None = None  # the directory the traces were read from (None: the shipped ones)

    @property
    def max_power(self) -> float:
        return float(max(self.power_limits))

    def limits_for(self, bs: int) -> list[int]:
        """The power limits traced at batch size `bs` (a trace need not hold every limit at every batch)."""
        return [pl for pl in self.power_limits if (bs, pl) in self.power]

    def epoch_cost(self, eta: float, bs: int, pl: int, n: int = 1) -> float:
        tpe, watts = self.power[(bs, pl)]
        return eta * tpe * watts * n + (1 - eta) * n * self.max_power * tpe


TRAIN_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "target_metric", "target_epoch")
POWER_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "power_limit", "time_per_epoch", "average_power")


def _rows(path: Path, columns: tuple[str, ...]):
    """(line number, row) of a Zeus-format CSV, its columns in any order; a missing file or column is
    refused naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trace file; a Zeus-format directory holds summary_train.csv and "
                                "summary_power_<gpu>.csv")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        have = reader.fieldnames or []
        missing = [c for c in columns if c not in have]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (the header has "
                             f"{', '.join(have) if have else 'nothing'}); a Zeus-format trace needs {', '.join(columns)}")
        for row in reader:
            yield reader.line_num, row


def _number(path: Path, line: int, row: dict, column: str, kind: str) -> float:
    """A value of one row, checked: ``whole`` a whole number > 0, ``positive`` a finite number > 0,
    ``epoch`` the epoch the target was reached (>= 1; empty, nan or inf: never reached, as nan),
    ``finite`` any finite number. Anything else is refused naming the file, line, column and value."""
    text = (row.get(column) or "").strip()
    if kind == "epoch" and text.lower() in ("", "nan", "inf", "+inf"):
        return math.nan
    try:
        v = float(text)
        problem = ""
    except ValueError:
        v, problem = math.nan, "is not a number"
    if not problem:
        if kind == "whole" and not (math.isfinite(v) and v > 0 and v == int(v)):
            problem = "must be a whole number > 0"
        elif kind == "positive" and not (math.isfinite(v) and v > 0):
            problem = "must be a finite number > 0"
        elif kind == "epoch" and not (math.isfinite(v) and v >= 1):
            problem = "must be an epoch >= 1 (leave it empty or write nan where the target was never reached)"
        elif kind == "finite" and not math.isfinite(v):
            problem = "must be a finite number"
    if problem == "is not a number" and kind == "epoch":
        problem += " (leave it empty or write nan where the target was never reached)"
    if problem:
        raise ValueError(f"{path}, line {line}: {column} {text!r} {problem}; fix or drop that row")
    return v


def _job_row(row: dict, job: ZeusJob) -> bool:
    return (row["dataset"], row["network"], row["optimizer"]) == (job.dataset, job.network, job.optimizer)


def default_batch(job: ZeusJob, gpu: str, root: Path | None = None) -> int:
    """The user's batch size b0 on `gpu`, as Zeus's own trace-driven runs set it
    (``get_job_with_defaults`` in ``run_alibaba.py``, the NSDI '23 reproduction script of Zeus's repository):
    the paper's b0, capped at the largest batch size the GPU's power trace holds for the dataset
    (a smaller GPU's memory fits less: P100's traces stop below some of the paper's b0)."""
    root = Path(root) if root is not None else data_dir()
    path = _power_path(root, gpu)
    sizes = [int(_number(path, line, row, "batch_size", "whole"))
             for line, row in _rows(path, POWER_COLUMNS) if row["dataset"] == job.dataset]
    if not sizes:
        raise ValueError(f"{job.name}: no {gpu} power trace for dataset {job.dataset} in {path}")
    return min(job.default_bs, max(sizes))


def _power_path(root: Path, gpu: str) -> Path:
    path = root / f"summary_power_{gpu}.csv"
    if gpu not in GPUS and not path.is_file():
        raise ValueError(f"gpu '{gpu}': no trace {path}; use one of {', '.join(GPUS)} (the shipped sets), or give "
                         "root= a directory with that GPU's summary_power_<gpu>.csv")
    return path


def load_trace(job: ZeusJob, gpu: str = "v100", root: Path | None = None) -> Trace:
    """One job's traces on `gpu`; `job.default_bs` becomes that GPU's b0 (default_batch).

    `root`: a directory of Zeus-format traces (``summary_train.csv``, ``summary_power_<gpu>.csv``,
    columns in any order); the shipped ones when None. The job's rows are checked (batch sizes and
    power limits whole and > 0, epoch times and powers finite and > 0, target epochs >= 1, or empty
    or nan where never reached; one row per batch size and power limit), and so are b0's row at the
    maximum power limit (the baseline's) and one batch size at least reaching the target within the
    job's epoch cap: a bad trace is refused naming the file, line and value. A batch size need not
    be traced at every power limit (``Trace.limits_for``)."""
    root = Path(root) if root is not None else data_dir()
    power_path = _power_path(root, gpu)
    job = replace(job, default_bs=default_batch(job, gpu, root))
    epochs: dict[int, list[float]] = {}
    train_path = root / "summary_train.csv"
    for line, row in _rows(train_path, TRAIN_COLUMNS):
        if not _job_row(row, job):
            continue
        if not math.isclose(_number(train_path, line, row, "target_metric", "finite"), job.target_metric):
            continue
        e = _number(train_path, line, row, "target_epoch", "epoch")
        epochs.setdefault(int(_number(train_path, line, row, "batch_size", "whole")), []).append(e)
    power: dict[tuple[int, int], tuple[float, float]] = {}
    seen_at: dict[tuple[int, int], int] = {}
    for line, row in _rows(power_path, POWER_COLUMNS):
        if not _job_row(row, job):
            continue
        key = (int(_number(power_path, line, row, "batch_size", "whole")),
               int(_number(power_path, line, row, "power_limit", "whole")))
        if key in seen_at:
            raise ValueError(f"{power_path}, line {line}: batch {key[0]} at {key[1]} W is on line {seen_at[key]} too; "
                             "keep one row per (batch size, power limit)")
        seen_at[key] = line
        power[key] = (_number(power_path, line, row, "time_per_epoch", "positive"),
                      _number(power_path, line, row, "average_power", "positive"))
    traced = {b for b, _ in power}
    batches = sorted(b for b in epochs if b in traced)
    limits = sorted({p for _, p in power})
    if job.default_bs not in batches:
        raise ValueError(f"{job.name} on {gpu}: default batch {job.default_bs} missing from the traces")
    if (job.default_bs, limits[-1]) not in power:
        raise ValueError(f"{job.name} on {gpu}: {power_path} has no row for the default batch {job.default_bs} at "
                         f"the maximum power limit {limits[-1]} W, where the baseline runs; add that row")
    trace = Trace(job, gpu, epochs, power, batches, limits, root)
    if all(math.isinf(_mean_epochs(trace, b)) for b in batches):
        raise ValueError(f"{job.name} on {gpu}: no batch size reaches the target {job.target_metric} within "
                         f"{job.max_epochs} epochs in every seed of {train_path}; nothing to replay")
    return trace


@dataclass
class Run:
    bs: int
    pl: int
    energy_j: float
    time_s: float
    reached: bool
    n: int = 1
    sparsity: float = 0.0


def _mean_epochs(trace: Trace, bs: int) -> float:
    vals = trace.epochs.get(bs, [])
    if not vals or any(math.isnan(v) or v > trace.job.max_epochs for v in vals):
        return math.inf  # some seed never reaches the target within the cap
    return statistics.fmean(vals)


def _world_epoch(trace: Trace, bs: int, pl: int, n: int) -> tuple[float, float] | None:
    """(time per epoch, total average power) at global batch bs over n GPUs (the world-size model)."""
    if n == 1:
        return trace.power.get((bs, pl))
    if bs % n or (bs // n, pl) not in trace.power:
        return None
    tpe, watts = trace.power[(bs // n, pl)]
    steps = math.ceil(trace.job.train_samples / bs)
    sync = steps * 2 * (n - 1) / n * 4 * trace.job.params_millions * 1e6 / LINK_BYTES_PER_S
    return tpe / n + sync, n * watts


def hindsight(trace: Trace, eta: float, worlds=(1,), sparsities=(0.0,)):
    """dra's chooser over every setting, given the trace's mean epochs to target (a bound)."""
    cands, times, energies, maxp = [], [], [], []
    for n in worlds:
        for bs in trace.batch_sizes:
            ep = _mean_epochs(trace, bs)
            for s in sparsities:
                for pl in trace.power_limits:
                    w = _world_epoch(trace, bs, pl, n)
                    if w is None or math.isinf(ep):
                        continue
                    tpe, watts = w
                    cands.append(KnobSetting(world_size=n, global_batch=bs, sparsity=s, power_limit_w=pl))
                    times.append(ep * tpe)
                    energies.append(ep * tpe * watts)
                    maxp.append(n * trace.max_power)
    return choose_setting(EnergyObjective("zeus_cost", eta=eta), cands, times, energies, maxp)


def default_expected(trace: Trace, eta: float) -> Run:
    """b0 at the maximum power limit, expected over the seeds."""
    pl = max(trace.power_limits)
    tpe, watts = trace.power[(trace.job.default_bs, pl)]
    ep = _mean_epochs(trace, trace.job.default_bs)
    return Run(trace.job.default_bs, pl, ep * tpe * watts, ep * tpe, True)


class DraLearner:
    """dra over recurrences: a pruning sweep from b0, then Thompson sampling through dra's chooser.

    1. Sweep: b0, then smaller batch sizes in turn until one is stopped before the target (its run
       cost more than beta x the best recurrence so far, or it never converges), then larger ones
       likewise. A batch size stopped in the sweep is pruned.
    2. Then every recurrence draws, for each surviving batch size, its epochs to target from a
       Gaussian around the mean observed (spread: the batch's own sample deviation once it has two
       runs, else the mean coefficient of variation seen over batches with two or more, else
       ``PRIOR_CV``; divided by sqrt(runs)), and dra's chooser (``choose_setting`` with the Zeus
       cost) picks the setting (batch, power limit, world size, sparsity) on the drawn epochs. The
       draws shrink as runs accumulate, so exploration fades on its own. A batch size stopped more
       often than it reached the target is pruned.
    """

    PRIOR_CV = 0.2  # a stated prior spread of epochs to target (20 %), used until two runs of one batch exist

    def __init__(self, trace: Trace, eta: float, beta: float, rng: np.random.Generator, worlds=(1,), sparsities=(0.0,),
                 paths: np.random.Generator | None = None):
        self.t, self.eta, self.beta, self.rng = trace, eta, beta, rng
        # The traces' randomness (which seed's training path a run follows) has its own stream,
        # apart from the learner's own draws: see draw_path.
        self.paths = paths if paths is not None else rng
        self.worlds, self.sparsities = worlds, sparsities
        self.seen: dict[int, list[float]] = {}  # batch -> epochs observed (inf when stopped early)
        self.profiled: set[int] = set()
        self.pruned: set[int] = set()
        self.min_cost = math.inf
        self.objective = EnergyObjective("zeus_cost", eta=eta)
        order = self.t.batch_sizes
        i0 = order.index(self.t.job.default_bs)
        self._down = list(reversed(order[:i0]))  # the sweep: b0, smaller ones, then larger ones
        self._up = list(order[i0 + 1:])
        self._sweeping = True

    def _best_pl(self, bs: int) -> int:
        return min(self.t.limits_for(bs), key=lambda pl: (self.t.epoch_cost(self.eta, bs, pl), -pl))

    def _sweep_next(self) -> int | None:
        if self.t.job.default_bs not in self.seen:
            return self.t.job.default_bs
        for side in (self._down, self._up):
            while side:
                b = side[0]
                if b not in self.seen:
                    return b
                side.pop(0)
                if not any(math.isfinite(e) for e in self.seen[b]):
                    self.pruned.add(b)
                    side.clear()  # stopped: the batch sizes beyond it on this side are not tried
        return None

    def _drawn_epochs(self) -> dict[int, float]:
        finite = {b: [e for e in v if math.isfinite(e)] for b, v in self.seen.items() if b not in self.pruned}
        finite = {b: v for b, v in finite.items() if v}
        cvs = [statistics.stdev(v) / statistics.fmean(v) for v in finite.values() if len(v) >= 2]
        cv = statistics.fmean(cvs) if cvs else self.PRIOR_CV
        out = {}
        for b, v in finite.items():
            m = statistics.fmean(v)
            sd = statistics.stdev(v) if len(v) >= 2 else cv * m
            out[b] = max(1.0, float(self.rng.normal(m, sd / math.sqrt(len(v)))))
        return out

    def _choose(self) -> KnobSetting:
        if self._sweeping:
            b = self._sweep_next()
            if b is not None:
                return KnobSetting(global_batch=b, power_limit_w=self._best_pl(b))
            self._sweeping = False
        for b, v in self.seen.items():
            stopped = sum(1 for e in v if not math.isfinite(e))
            if stopped > len(v) - stopped:
                self.pruned.add(b)
        drawn = self._drawn_epochs()
        if not drawn:
            b = self.t.job.default_bs
            return KnobSetting(global_batch=b, power_limit_w=self._best_pl(b))
        cands, times, energies, maxp = [], [], [], []
        for bs, ep in sorted(drawn.items()):
            for n in self.worlds:
                for s in self.sparsities:
                    for pl in self.t.power_limits:
                        w = _world_epoch(self.t, bs, pl, n)
                        if w is None:
                            continue
                        cands.append(KnobSetting(world_size=n, global_batch=bs, sparsity=s, power_limit_w=pl))
                        times.append(ep * w[0])
                        energies.append(ep * w[0] * w[1])
                        maxp.append(n * self.t.max_power)
        return choose_setting(self.objective, cands, times, energies, maxp).setting

    def recur(self) -> list[Run]:
        """One recurrence: runs (a stopped run is retried) until the target is reached."""
        runs: list[Run] = []
        acc = 0.0
        for _ in range(20):
            k = self._choose()
            bs, pl, n = int(k.global_batch), int(k.power_limit_w), k.world_size
            target = draw_path(self.t, bs, self.paths)
            tpe, watts = _world_epoch(self.t, bs, pl, n)
            profile = bs not in self.profiled
            # The first epoch of a new batch size profiles every power limit (Zeus's JIT rule).
            limits = self.t.limits_for(bs)  # the limits traced at this batch size
            first_t = statistics.fmean(self.t.power[(bs, p)][0] for p in limits) if profile else tpe
            first_e = statistics.fmean(self.t.power[(bs, p)][0] * self.t.power[(bs, p)][1] for p in limits) if profile else tpe * watts
            self.profiled.add(bs)
            cap = self.t.job.max_epochs
            if math.isfinite(self.min_cost):
                per_epoch = self.eta * tpe * watts + (1 - self.eta) * n * self.t.max_power * tpe
                cap = min(cap, int(self.beta * self.min_cost // per_epoch))
            if cap <= 0:
                self.seen.setdefault(bs, []).append(math.inf)
                continue
            reached = not math.isnan(target) and target <= cap
            epochs = int(target) if reached else cap
            time_s = first_t + (epochs - 1) * tpe
            energy = first_e + (epochs - 1) * tpe * watts
            runs.append(Run(bs, pl, energy, time_s, reached, n, k.sparsity))
            acc += self.eta * energy + (1 - self.eta) * n * self.t.max_power * time_s
            self.seen.setdefault(bs, []).append(float(epochs) if reached else math.inf)
            if reached:
                self.min_cost = min(self.min_cost, acc)
                return runs
        raise RuntimeError(f"{self.t.job.name}: no run reached the target in 20 tries")


def draw_path(trace: Trace, bs: int, paths: np.random.Generator) -> float:
    """Which of the traced seeds' training paths a run at batch size `bs` follows: its epochs to
    target (nan: never reached). Drawn as Zeus's simulator draws it (one row of the batch size's
    rows, in the traces' order, by ``Generator.choice(k, 1, replace=False)``), so that a stream
    seeded alike gives both learners the same paths whenever they run the same batch size: common
    random numbers, the comparison then measures the decisions and not the luck of the draws."""
    seeds = trace.epochs[bs]
    return seeds[int(paths.choice(len(seeds), size=1, replace=False)[0])]


def run_dra(trace: Trace, eta: float, beta: float, recurrences: int, seed: int, worlds=(1,), sparsities=(0.0,)) -> list[list[Run]]:
    """dra's learner over `recurrences`. The training paths come from ``default_rng(seed)``, the
    stream Zeus's simulator draws its paths from at the same seed (common random numbers); the
    learner's own draws (Thompson sampling) come from a stream of their own."""
    learner = DraLearner(trace, eta, beta, np.random.default_rng([seed, LEARNER_STREAM]), worlds, sparsities,
                         paths=np.random.default_rng(seed))
    return [learner.recur() for _ in range(recurrences)]


def zeus_available() -> tuple[bool, str]:
    try:
        import zeus._legacy.simulate  # noqa: F401
    except Exception as e:  # noqa: BLE001 - report precisely why the side-by-side run is missing
        return False, f"{type(e).__name__}: {e}"
    import zeus

    return True, getattr(zeus, "__version__", "unknown")


def run_zeus(trace: Trace, eta: float, beta: float, recurrences: int, seed: int) -> list[list[Run]]:
    """Zeus's own simulator on the same traces (its pruning GTS batch size optimizer, JIT power)."""
    import pandas as pd
    from zeus._legacy.job import Job
    from zeus._legacy.policy.optimizer import JITPowerLimitOptimizer, PruningGTSBatchSizeOptimizer
    from zeus._legacy.simulate import Simulator

    root = trace.root or data_dir()  # the traces the dra side replays, not always the shipped ones
    train = pd.read_csv(root / "summary_train.csv")
    power = pd.read_csv(root / f"summary_power_{trace.gpu}.csv")
    j = trace.job
    job = Job(j.dataset, j.network, j.optimizer, j.target_metric, j.max_epochs, j.default_bs)
    with contextlib.redirect_stdout(io.StringIO()):
        sim = Simulator(train, power, PruningGTSBatchSizeOptimizer(seed=seed, verbose=False),
                        JITPowerLimitOptimizer(verbose=False), seed=seed, verbose=False)
        history = sim.simulate_one_job(job, recurrences, beta, eta)
    out: list[list[Run]] = [[]]
    for h in history:
        out[-1].append(Run(int(h.bs), int(h.pl), float(h.energy), float(h.time), bool(h.reached)))
        if h.reached:
            out.append([])
    return [r for r in out if r]


def recurrence_totals(recs: list[list[Run]], eta: float, max_power: float) -> list[tuple[float, float, float]]:
    """(energy, time, Zeus cost) of each recurrence, retries included."""
    out = []
    for runs in recs:
        e = sum(r.energy_j for r in runs)
        t = sum(r.time_s for r in runs)
        c = sum(eta * r.energy_j + (1 - eta) * r.n * max_power * r.time_s for r in runs)
        out.append((e, t, c))
    return out


def summarise(recs, eta, max_power, last: int) -> dict:
    tot = recurrence_totals(recs, eta, max_power)
    tail = tot[-last:]
    return {
        "energy_j_all": statistics.fmean(x[0] for x in tot),
        "time_s_all": statistics.fmean(x[1] for x in tot),
        "cost_all": statistics.fmean(x[2] for x in tot),
        "energy_j_last": statistics.fmean(x[0] for x in tail),
        "time_s_last": statistics.fmean(x[1] for x in tail),
        "cost_last": statistics.fmean(x[2] for x in tail),
        "final_bs": recs[-1][-1].bs,
        "final_pl": recs[-1][-1].pl,
        "final_world": recs[-1][-1].n,
    }


def replay_job(job: ZeusJob, gpu: str, eta: float, beta: float, seeds: list[int], with_zeus: bool, progress=None) -> dict:
    """All approaches on one job; energies averaged over seeds. Every figure is `replayed`."""
    trace = load_trace(job, gpu)
    recurrences = 2 * len(trace.batch_sizes) * len(trace.power_limits)  # as in Zeus's paper
    last = max(1, recurrences // 10)
    d = default_expected(trace, eta)
    default_cost = eta * d.energy_j + (1 - eta) * trace.max_power * d.time_s
    hs = hindsight(trace, eta)
    hk = hindsight(trace, eta, worlds=(1, 2, 4, 8), sparsities=(0.0, 0.5, 0.9))
    rows: dict[str, list[dict]] = {"dra": [], "dra_knobs": []}
    if with_zeus:
        rows["zeus"] = []
    for seed in seeds:
        rows["dra"].append(summarise(run_dra(trace, eta, beta, recurrences, seed), eta, trace.max_power, last))
        rows["dra_knobs"].append(summarise(run_dra(trace, eta, beta, recurrences, seed, (1, 2, 4, 8), (0.0, 0.5, 0.9)),
                                           eta, trace.max_power, last))
        if with_zeus:
            rows["zeus"].append(summarise(run_zeus(trace, eta, beta, recurrences, seed), eta, trace.max_power, last))
        if progress:
            progress(f"{job.name} {gpu} eta={eta} seed {seed} done")
    out = {
        "job": job.name, "gpu": gpu, "eta": eta, "beta": beta, "recurrences": recurrences, "last": last,
        "seeds": seeds, "source": "replayed",
        "default": {"bs": d.bs, "pl": d.pl, "energy_j": d.energy_j, "time_s": d.time_s, "cost": default_cost},
        "dra_hindsight": {"bs": hs.setting.global_batch, "pl": hs.setting.power_limit_w, "energy_j": hs.energy_j,
                          "time_s": hs.time_s},
        "dra_hindsight_knobs": {"bs": hk.setting.global_batch, "pl": hk.setting.power_limit_w,
                                "world": hk.setting.world_size, "sparsity": hk.setting.sparsity,
                                "energy_j": hk.energy_j, "time_s": hk.time_s},
    }
    for name, per_seed in rows.items():
        agg = {k: statistics.fmean(r[k] for r in per_seed) for k in per_seed[0] if not k.startswith("final")}
        agg["final"] = [(r["final_bs"], r["final_pl"], r["final_world"]) for r in per_seed]
        agg["per_seed_last"] = [r["energy_j_last"] for r in per_seed]
        agg["energy_saving_last"] = 1 - agg["energy_j_last"] / d.energy_j
        agg["energy_saving_all"] = 1 - agg["energy_j_all"] / d.energy_j
        agg["cost_saving_last"] = 1 - agg["cost_last"] / default_cost
        out[name] = agg
    out["dra_hindsight"]["energy_saving"] = 1 - hs.energy_j / d.energy_j
    out["dra_hindsight_knobs"]["energy_saving"] = 1 - hk.energy_j / d.energy_j
    return out
