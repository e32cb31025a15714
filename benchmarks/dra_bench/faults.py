"""``python -m dra.bench faults``: a seeded, bounded chaos campaign against real elastic jobs.

Each trial runs a small elastic job on loopback (Python workers, or the LibTorch example
``dra_elastic_train`` as C++ workers) against a dedicated store (``python -m dra store``) and
injects one fault drawn from the kinds of ``dra_bench._faults.kinds``, in six classes: process
faults (kill -9 of a member, of the leader, of two members within 100 ms, of a joiner or a
standby, inside a phase of a resize; SIGSTOP past the fault timeout then SIGCONT; the store
killed; a slow peer), the filesystem under the events and checkpoints (read-only, full, not a
folder), another client writing bad values into the job's store keys, the launcher's death
(``dra run`` SIGTERM/SIGKILL, the first torchrun agent of the crash recipe), exceptions in the
training loop (caught and uncaught), and joiners that do not match the world. Every trial checks
exactly-once data from the committed steps' sample records, identical state on the final members,
that every process ended (with the exit code its fault gives it), and the time from the fault to
resumed training (``dra_bench._faults.check``). Trial ``i`` has seed ``--seed + i``; trials go
round the (kind, language) pairs, the languages alternating; a failed trial reproduces alone with
the ``--trial SEED:KIND:LANG`` printed for it. A resize-churn run measures memory growth per
resize (a model with ``--churn-model-mb`` of state, ``--churn-resizes`` resizes).

Rows: ``faults_survived`` (fraction of the ``trials``; baseline: the goal, 1), ``samples_lost``,
``samples_repeated``, ``hung``, ``resume_s_p50`` and ``resume_s_p99`` (one process killed
mid-step: a member, the leader, a joiner after admission; baseline: the goal
``fault_timeout_s + 1.5 s``), ``resume_any_kill_s_p99`` (every kill, inside a resize and two at
once included), ``resume_stop_s_p50`` (SIGSTOP past the timeout),
``rss_growth_mb_per_resize``; one row per class (``class_<name>``: the jobs lost, with the trials,
samples lost and repeated, hung trials and resume p50/p99 of that class; orphans for launchers);
``store_fuzz_crashes`` (the protocol-level store fuzzer: ``--fuzz-cases`` values against every
reader of every key; baseline: the cases); the failures with their seeds and reproduction
commands.

    python -m dra.bench faults                      # a few minutes
    python -m dra.bench faults --trials 1000 --json docs/results/faults/faults.json
    python -m dra.bench faults --trial 1017:kill_leader:py --keep /tmp/trial   # one trial again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from dra._argtypes import count_arg, integer_arg, nonnegative_arg, nonnegative_int_arg, positive_arg
from dra_bench._faults.check import Verdict, judge, load_records
from dra_bench._faults.kinds import CLASSES, KINDS, make_trial, unavailable
from dra_bench._faults.trial import Fault, JobSpec, LocalLauncher, StoreProcess, TrialSpec, run_trial
from dra_bench._report import result, write_report

ROOT = Path(__file__).resolve().parents[2]  # the repository (benchmarks/dra_bench/faults.py)
CPP_BINARY = ROOT / "build" / "cpp" / "examples" / "cpp" / "dra_elastic_train"


MID_STEP_KINDS = ("kill_member", "kill_leader", "kill_joiner")  # one process killed mid-step


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN without values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[max(0, math.ceil(q / 100.0 * len(s)) - 1)]


def find_cpp_binary(given: str | None) -> Path | None:
    if given:
        path = Path(given)
        if not path.is_file():
            raise SystemExit(f"--cpp-binary: {given} is not a file")
        return path
    env = os.environ.get("DRA_CPP_EXAMPLE_DIR")
    for path in ([Path(env) / "dra_elastic_train"] if env else []) + [CPP_BINARY]:
        if path.is_file():
            return path
    return None


def plan(args: argparse.Namespace, languages: list[str]) -> list[TrialSpec]:
    if args.trial:
        seed, kind, lang = args.trial.split(":")
        args.trials = 1
        return [make_trial(int(seed), kind, lang, args.fault_timeout_s)]
    kinds = args.kinds.split(",") if args.kinds else sorted(KINDS)
    for kind in list(kinds):
        why = unavailable(kind)
        if why:
            print(f"[faults] {kind} not run: {why}", file=sys.stderr)
            args.not_run[kind] = why
            kinds.remove(kind)
    # Every (kind, language) pair once per round, the languages alternating from one kind to the
    # next and swapping each round: the first round already runs every kind, in both languages.
    pairs = []
    for r in range(len(languages)):
        for j, kind in enumerate(kinds):
            langs = [lang for lang in languages if lang in KINDS[kind].languages]
            if langs:
                pairs.append((kind, langs[(j + r) % len(langs)]))
    if not pairs:
        raise SystemExit(f"no fault kind among {kinds} runs on the languages {languages}")
    if args.trials is None:  # every kind once in each of its languages (a one-language kind once per round)
        args.trials = len(pairs)
    return [make_trial(args.seed + i, *pairs[i % len(pairs)], args.fault_timeout_s) for i in range(args.trials)]


def churn(args: argparse.Namespace, launcher: LocalLauncher, store: StoreProcess, tmp: Path) -> dict[str, Any]:
    """Memory growth per resize: 4 processes, a model with `--churn-model-mb` MB of state,
    `--churn-resizes` resizes between 2 and 4 processes, 4 steps apart; no fault."""
    n = args.churn_resizes
    sizes = [4, 2, 3, 2, 4, 3, 2, 4, 2, 3, 4, 2]
    job = JobSpec(
        language="py",
        nproc=4,
        start_size=2,
        max_size=4,
        epochs=1,
        global_batch=16,
        dataset=16 * (4 * n + 6),
        compute_ms=0.0,
        ballast_mb=args.churn_model_mb,
        fault_timeout_s=max(args.fault_timeout_s, 10.0),
        schedule={4 * (i + 1): sizes[i % len(sizes)] for i in range(n)},
    )
    spec = TrialSpec(args.seed, "churn", job, Fault("churn", f"{n} resizes, {args.churn_model_mb} MB of state"))
    run = run_trial(spec, tmp / "churn", launcher, store, args.trial_timeout_s * 3)
    v = judge(run)
    growth: dict[str, float] = {}
    for uid in sorted({r["uid"] for r in load_records(run.out)}):
        mine = [r for r in load_records(run.out) if r["uid"] == uid and r["kind"] in ("world", "final")]
        worlds = [r for r in mine if r["kind"] == "world"]
        final = next((r for r in mine if r["kind"] == "final"), None)
        if worlds and final and final["resizes"] > 0:
            growth[str(uid)] = (final["rss_mb"] - worlds[0]["rss_mb"]) / final["resizes"]
    return {
        "survived": v.survived,
        "problems": v.problems,
        "growth_mb_per_resize": growth,
        "resizes": n,
        "state_mb": args.churn_model_mb,
    }


def summarise(
    results: list[tuple[TrialSpec, Verdict, float]],
    args: argparse.Namespace,
    churned: dict[str, Any] | None,
    campaign_s: float = math.nan,
    fuzzed: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    n = len(results)
    survived = sum(v.survived for _, v, _ in results)
    label = f"measured, {n} trials, seeds {args.seed}..{args.seed + n - 1}" if not args.trial else "measured, one trial"
    if args.jobs > 1:
        label += f", {args.jobs} trials at once"
    if n < args.trials and not args.trial:
        label += f" (interrupted: {n} of {args.trials} planned)"
    by_kind: dict[str, dict[str, Any]] = {}
    for spec, v, _ in results:
        k = by_kind.setdefault(
            f"{spec.kind}/{spec.job.language}", {"trials": 0, "survived": 0, "not_fired": 0, "resume_s": []}
        )
        k["trials"] += 1
        k["survived"] += v.survived
        k["not_fired"] += not v.fired
        if v.resume_s is not None:
            k["resume_s"].append(round(v.resume_s, 3))
    failures = [
        {
            "seed": s.seed,
            "kind": s.kind,
            "language": s.job.language,
            "fault": s.fault.description,
            "problems": v.problems[:6],
            "repro": s.repro(),
        }
        for s, v, _ in results
        if not v.survived
    ]
    # The goal holds for one process killed mid-step; a kill inside a resize (a rebuild waits for
    # its connection timeout) and two kills (a second recovery) are reported apart.
    mid = [v.resume_s for s, v, _ in results if v.resume_s is not None and s.kind in MID_STEP_KINDS]
    kills = [v.resume_s for s, v, _ in results if v.resume_s is not None and s.kind != "stop_past_timeout"]
    stop = [v.resume_s for s, v, _ in results if v.resume_s is not None and s.kind == "stop_past_timeout"]
    goal = args.fault_timeout_s + 1.5
    rows = [
        result(
            "faults_survived",
            survived / n if n else math.nan,
            "fraction",
            ("goal: every trial survives", 1.0),
            label=label,
            trials=n,
            survived=survived,
            not_fired=sum(not v.fired for _, v, _ in results),
            by_kind=by_kind,
            failures=failures,
            fault_timeout_s=args.fault_timeout_s,
            wall_s=round(sum(w for _, _, w in results), 1),
            campaign_s=round(campaign_s, 1),
            jobs=args.jobs,
        ),
        result("samples_lost", sum(v.samples_lost for _, v, _ in results), "samples", None, label=label),
        result("samples_repeated", sum(v.samples_repeated for _, v, _ in results), "samples", None, label=label),
        result(
            "hung",
            sum(bool(v.hung) for _, v, _ in results),
            "trials",
            None,
            label=label,
            processes=sum(len(v.hung) for _, v, _ in results),
        ),
        result(
            "resume_s_p50",
            percentile(mid, 50),
            "s",
            ("goal: fault_timeout_s + 1.5 s", goal),
            label=label,
            samples=len(mid),
        ),
        result(
            "resume_s_p99",
            percentile(mid, 99),
            "s",
            ("goal: fault_timeout_s + 1.5 s", goal),
            label=label,
            samples=len(mid),
            max=max(mid, default=math.nan),
        ),
        result(
            "resume_any_kill_s_p99",
            percentile(kills, 99),
            "s",
            None,
            label=label,
            samples=len(kills),
            p50=percentile(kills, 50),
            kinds="every kill: mid-step, inside a resize, two at once",
        ),
        result(
            "resume_stop_s_p50",
            percentile(stop, 50),
            "s",
            None,
            label=label,
            samples=len(stop),
            p99=percentile(stop, 99),
        ),
    ]
    for klass in CLASSES:
        mine = [(spec, v) for spec, v, _ in results if KINDS[spec.kind].klass == klass]
        if not mine:
            continue
        resumes = [v.resume_s for _, v in mine if v.resume_s is not None]
        extra: dict[str, Any] = {}
        if klass == "launcher":
            extra["orphans"] = sum(v.orphans for _, v in mine)
        if klass == "store_writers":
            extra["values_written"] = sum(v.fuzz_writes for _, v in mine)
        rows.append(
            result(
                f"class_{klass}",
                sum(v.job_lost for _, v in mine),
                "jobs lost",
                ("trials", len(mine)),
                label=label,
                kinds=sorted({spec.kind for spec, _ in mine}),
                survived=sum(v.survived for _, v in mine),
                samples_lost=sum(v.samples_lost for _, v in mine),
                samples_repeated=sum(v.samples_repeated for _, v in mine),
                hung=sum(bool(v.hung) for _, v in mine),
                resume_s_p50=percentile(resumes, 50),
                resume_s_p99=percentile(resumes, 99),
                resume_samples=len(resumes),
                **extra,
            )
        )
    if args.not_run:
        rows.append(result("kinds_not_run", len(args.not_run), "kinds", None, label=label, why=args.not_run))
    if fuzzed is not None:
        rows.append(
            result(
                "store_fuzz_crashes",
                len(fuzzed["crashes"]),
                "crashes",
                ("cases", fuzzed["cases"]),
                label=f"measured, {fuzzed['cases']} values against every reader of {fuzzed['families']} key families",
                **fuzzed,
            )
        )
    if churned is not None:
        growth = list(churned["growth_mb_per_resize"].values())
        rows.append(
            result(
                "rss_growth_mb_per_resize",
                max(growth, default=math.nan),
                "MB",
                None,
                label="measured, one run, the largest over its processes",
                **churned,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dra.bench faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="PATH")
    p.add_argument(
        "--trials",
        type=count_arg,
        default=None,
        help="number of trials (default: every kind in each of its languages once, a few minutes here)",
    )
    p.add_argument(
        "--fuzz-cases",
        type=nonnegative_int_arg,
        default=10200,
        help="values the protocol-level store fuzzer writes (over every key family; 0: none)",
    )
    p.add_argument("--seed", type=integer_arg, default=1, help="seed of the first trial (trial i has seed + i)")
    p.add_argument("--kinds", default="", help=f"comma-separated fault kinds (default all: {', '.join(sorted(KINDS))})")
    p.add_argument("--langs", default="py,cpp", help="worker languages, taken in turn (cpp needs the example built)")
    p.add_argument("--trial", metavar="SEED:KIND:LANG", help="run this one trial again (as printed for a failure)")
    p.add_argument("--fault-timeout-s", type=positive_arg, default=2.0)
    p.add_argument("--trial-timeout-s", type=positive_arg, default=120.0, help="a process running longer has hung")
    p.add_argument("--cpp-binary", help="the dra_elastic_train example (default: build/cpp/examples/cpp)")
    p.add_argument("--churn-model-mb", type=nonnegative_arg, default=100.0)
    p.add_argument("--churn-resizes", type=count_arg, default=11)
    p.add_argument("--no-churn", action="store_true", help="skip the memory-growth run")
    p.add_argument(
        "--jobs", type=count_arg, default=1, help="trials run at once (default 1; more shortens a long run, adds contention)"
    )
    p.add_argument("--keep", metavar="DIR", help="keep every trial's records and outputs under DIR")
    p.add_argument("--keep-failed", metavar="DIR",
                   help="copy the records and outputs of each trial that failed under DIR (a long campaign's evidence)")
    args = p.parse_args(argv)
    args.not_run = {}
    if args.jobs > 16:
        p.error(f"--jobs: expected 1..16 trials at once, got {args.jobs}")
    for k in filter(None, args.kinds.split(",")):
        if k not in KINDS:
            p.error(f"--kinds: unknown kind '{k}'; known: {', '.join(sorted(KINDS))}")
    binary = find_cpp_binary(args.cpp_binary)
    languages = [lang for lang in args.langs.split(",") if lang]
    if not languages or any(lang not in ("py", "cpp") for lang in languages):
        p.error(f"--langs: expected py and/or cpp, got '{args.langs}'")
    if "cpp" in languages and binary is None:
        build = ("configure build/cpp as the README's C++ section says, then cmake --build build/cpp --target "
                 "dra_elastic_train")
        if languages == ["cpp"]:
            p.error(f"--langs cpp: the C++ example is not built; {build}")
        print(f"[faults] C++ example not built ({build}): Python workers only", file=sys.stderr)
        languages = [lang for lang in languages if lang != "cpp"]
    specs = plan(args, languages)
    launcher = LocalLauncher(binary)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dra-faults-"))
    store = StoreProcess()
    results: list[tuple[TrialSpec, Verdict, float]] = []
    churned = None
    fuzzed = None
    campaign_s = math.nan
    interrupted = False
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM ends the campaign like Ctrl-C
    lock = threading.Lock()
    done = 0

    def one(spec: TrialSpec) -> tuple[TrialSpec, Verdict, float]:
        nonlocal store, done
        with lock:
            if not store.alive():  # a trial's defect must not spill into the next ones
                store.close()
                store = StoreProcess()
            shared = store
        run = run_trial(
            spec, tmp / f"trial-{spec.seed}-{spec.kind}-{spec.job.language}", launcher, shared, args.trial_timeout_s
        )
        v = judge(run)
        state = "survived" if v.survived else "FAILED"
        extra = f" resume {v.resume_s:.2f} s" if v.resume_s is not None else ""
        extra += "" if v.fired else f" (fault did not fire{': ' + '; '.join(v.notes) if v.notes else ''})"
        lines = [
            f"{spec.job.language} {spec.kind}: {spec.fault.description}: {state}{extra} ({run.wall_s:.1f} s)",
            *(f"           {problem[:300]}" for problem in v.problems[:4]),
            *([f"           reproduce: {spec.repro()}"] if not v.survived else []),
        ]
        if args.keep or (args.keep_failed and not v.survived):
            (run.out / "verdict.json").write_text(json.dumps({"spec": spec.fault.description, **v.to_dict()}))
        if args.keep_failed and not v.survived:
            shutil.copytree(run.out, Path(args.keep_failed) / run.out.name, dirs_exist_ok=True)
        with lock:
            done += 1
            print(f"[faults] {done}/{len(specs)} seed {spec.seed} " + "\n".join(lines), flush=True)
        return spec, v, run.wall_s

    t0 = time.monotonic()
    try:
        # Trials in parallel (--jobs) share the store and the CPUs: each has its own job id and
        # processes; the times they report include the contention, which the label says.
        # Ctrl-C (or SIGTERM) stops the campaign: trials not started are dropped, running ones end
        # (bounded by --trial-timeout-s), and the report covers the trials that finished.
        finished: dict[int, tuple[TrialSpec, Verdict, float]] = {}
        pool = ThreadPoolExecutor(max_workers=args.jobs)
        futures = {pool.submit(one, spec): i for i, spec in enumerate(specs)}
        try:
            for f in as_completed(futures):
                finished[futures[f]] = f.result()
        except KeyboardInterrupt:
            print(f"[faults] interrupted: finishing the running trials, reporting {len(finished)}+", flush=True)
            pool.shutdown(wait=True, cancel_futures=True)
            for f, i in futures.items():
                if f.done() and not f.cancelled() and f.exception() is None:
                    finished[i] = f.result()
        pool.shutdown(wait=True)
        results = [finished[i] for i in sorted(finished)]
        interrupted = len(results) < len(specs)
        campaign_s = time.monotonic() - t0
        if not args.no_churn and not args.trial and not interrupted:
            churned = churn(args, launcher, store, tmp)
            print(f"[faults] churn: {churned['growth_mb_per_resize']} MB per resize", flush=True)
        if args.fuzz_cases and not args.trial and not interrupted:
            from dra_bench._faults import fuzz

            if not store.alive():
                store.close()
                store = StoreProcess()
            fuzzed = fuzz.run(store.address, args.fuzz_cases, args.seed)
            print(
                f"[faults] store fuzzer: {fuzzed['cases']} values, {len(fuzzed['crashes'])} crashes "
                f"({fuzzed['read']} read, {fuzzed['ignored']} ignored, {fuzzed['handled']} handled) in {fuzzed['wall_s']} s",
                flush=True,
            )
    finally:
        store.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    write_report("faults", summarise(results, args, churned, campaign_s, fuzzed), args.json)
    if interrupted:
        print(f"[faults] interrupted: the report covers {len(results)} of {len(specs)} trials", flush=True)
    ok = (
        not interrupted
        and all(v.survived for _, v, _ in results)
        and (churned is None or churned["survived"])
        and (fuzzed is None or not fuzzed["crashes"])
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
