"""Facts the user docs state about the code (flags, defaults, fields), checked against the code.

test_docs_snippets.py runs the docs' snippets; this file checks what the text claims around them,
so that a renamed flag, a changed default or a new job field fails here instead of misleading a
user who follows the page. Each check reads the code's own definitions (the CLIs' argparse
parsers, the option and config objects, the spec schema); nothing is run for long.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import dra

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"


class _Parsed(Exception):
    pass


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option string of a parser and of its subcommands, with its action."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            out[flag] = action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update(_options(sub))
    return out


def _parsers_of(main: Callable[..., Any], argv: list[str]) -> list[argparse.ArgumentParser]:
    """The parsers a CLI's main builds, caught at parse_args (nothing after it runs)."""
    seen: list[argparse.ArgumentParser] = []

    def grab(self: argparse.ArgumentParser, *_a: Any, **_k: Any) -> Any:
        seen.append(self)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab):
        with pytest.raises(_Parsed):
            main(argv)
    return seen


def _flags_of(*parsers: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for p in parsers:
        out.update(_options(p))
    return out


def _bench_main(suite: str) -> Callable[..., Any]:
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(f"dra_bench.{suite}").main


def _pool_parser() -> argparse.ArgumentParser:
    from dra.pool import cli

    return _parsers_of(cli.main, ["pool", "serve"])[0]


def _run_parser() -> argparse.ArgumentParser:
    from dra.launch.cli import parser

    return parser()


def _store_parser() -> argparse.ArgumentParser:
    from dra import cli

    return _parsers_of(cli._store, [])[0]


def _sim_parser() -> argparse.ArgumentParser:
    from dra.sim.cli import _parser

    return _parser()


def _doc_flags(path: Path) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", path.read_text()))


# Flags the pages name that belong to other programs: `ray start`, pip, cmake, scripts/sanitize.sh,
# the C++ example's test hook.
OTHER_PROGRAMS = {"--head", "--address", "--resources", "--num-gpus", "--no-build-isolation", "--no-deps",
                  "--install", "--build", "--prefix", "--torch", "--test-fault"}


@pytest.mark.parametrize("page", ["pool.md", "pool-ray.md", "elastic.md", "launch.md", "faults.md", "simulator.md",
                                  "simulator-results.md", "rl.md", "sage.md"])
def test_every_flag_a_guide_names_is_a_flag_of_its_commands(page: str) -> None:
    # A page's `--flag` must be one of the commands that page documents (not a flag of any CLI).
    clis: dict[str, Callable[[], list[argparse.ArgumentParser]]] = {
        "pool.md": lambda: [_pool_parser(), _run_parser(),
                            *_parsers_of(_example_main("examples/pool/pool_at_work.py"), []),
                            *_script_parsers("examples/pool/train.py")],
        "pool-ray.md": lambda: [_pool_parser(), _run_parser()],
        "launch.md": lambda: [_run_parser(), _store_parser(), *_script_parsers("examples/ddp/tutorial_dra.py")],
        "elastic.md": lambda: [_run_parser(), _store_parser(), *_parsers_of(_bench_main("nccl"), []),
                               *_script_parsers("examples/ddp/tutorial_dra.py")],
        "faults.md": lambda: [*_parsers_of(_bench_main("faults"), []), _run_parser()],
        "simulator.md": lambda: [_sim_parser(), *_parsers_of(_bench_main("sim"), [])],
        "simulator-results.md": lambda: [_sim_parser(), *_parsers_of(_bench_main("sim"), []),
                                         *_parsers_of(_bench_main("resize"), [])],
        "rl.md": lambda: [_sim_parser(), *_parsers_of(_bench_main("rl"), []),
                          *_parsers_of(importlib.import_module("dra.rl.live.cli").main, [])],
        "sage.md": lambda: _parsers_of(_bench_main("sage"), []),
    }
    known = _flags_of(*clis[page]())
    unknown = sorted(_doc_flags(GUIDE / page) - set(known) - OTHER_PROGRAMS)
    # simulator-results.md names one retired option on purpose ("today's `dra-sim` has no such option").
    if page == "simulator-results.md":
        flat = " ".join((GUIDE / page).read_text().split())
        assert "`--remaining-work loss-curve`" in flat and "today's `dra-sim` has no such option" in flat
        unknown.remove("--remaining-work")
    assert not unknown, f"{page} names flags its commands do not have: {unknown}"


def _script_parsers(rel: str) -> list[argparse.ArgumentParser]:
    """The parser a script builds under ``if __name__ == "__main__"`` (run as __main__ up to parse_args)."""
    import runpy

    seen: list[argparse.ArgumentParser] = []

    def grab(self: argparse.ArgumentParser, *_a: Any, **_k: Any) -> Any:
        seen.append(self)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab), pytest.raises(_Parsed):
        runpy.run_path(str(ROOT / rel), run_name="__main__")
    return seen


def _example_main(rel: str) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location("_doc_example", ROOT / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_readme_commands_name_real_flags() -> None:
    known = _flags_of(_pool_parser(), _run_parser(), _store_parser(), _sim_parser(),
                      *_parsers_of(_bench_main("rl"), []),
                      *_parsers_of(_example_main("examples/pool/pool_at_work.py"), []),  # the main job's
                      *_script_parsers("examples/pool/train.py"))  # the pool's example job
    unknown = sorted(_doc_flags(README) - set(known) - OTHER_PROGRAMS)
    assert not unknown, f"README.md names flags no dra command has: {unknown}"


def _default(parser: argparse.ArgumentParser, flag: str) -> Any:
    return _options(parser)[flag].default


def test_pool_serve_defaults_are_the_guides() -> None:
    text = (GUIDE / "pool.md").read_text()
    p = _pool_parser()
    assert _default(p, "--heartbeat-timeout-s") == 3.0 and "`--heartbeat-timeout-s` (3 s)" in text
    assert _default(p, "--warm-launchers") == 4 and "`--warm-launchers` (4)" in text
    assert _default(p, "--slot-memory-gb") == 2.0 and "(`--slot-memory-gb`, 2 GB, at least 0.25)" in text
    assert _default(p, "--state") == "dra-pool" and "--state dra-pool     # the daemon" in text
    assert _default(p, "--host") == "127.0.0.1"
    assert "(default: the\nlarger of 30 s and ten heartbeat timeouts)" in text
    assert "max(30, 10 x the timeout)" in _options(p)["--silence-limit-s"].help
    from dra.pool.server import default_url

    assert "`$DRA_POOL` or `unix:dra-pool/pool.sock`" in text
    with mock.patch.dict("os.environ", {}, clear=False) as env:
        env.pop("DRA_POOL", None)
        assert default_url() == "unix:dra-pool/pool.sock"


def test_pool_spec_table_lists_every_field_the_schema_takes() -> None:
    from dra.pool._spec import SPEC_FIELDS

    text = (GUIDE / "pool.md").read_text()
    table = text[text.index("| field | meaning | checked |"):text.index("Anywhere in a spec")]
    documented: set[str] = set()
    for row in table.splitlines()[2:]:
        if not row.startswith("|"):
            break
        documented.update(re.findall(r"`([a-z_]+)`", row.split("|")[1]))
    assert documented == set(SPEC_FIELDS), (sorted(set(SPEC_FIELDS) - documented), sorted(documented - set(SPEC_FIELDS)))


def test_pool_spec_defaults_are_the_guides() -> None:
    # The defaults live where they are read (the loop, the launcher); the table gives them in the
    # order of its names: resize_cooldown_s (10 s), resize_cost_s (3 s), shrink_grace_s (30 s).
    from dra.pool.launcher import LOG_LIMIT_MB

    text = (GUIDE / "pool.md").read_text()
    row = next(r for r in text.splitlines() if r.startswith("| `resize_cooldown_s`"))
    names = re.findall(r"`([a-z_]+)`", row.split("|")[1])
    seconds = [float(s) for s in re.findall(r"\((\d+) s\)", row.split("|")[2])]
    assert names == ["resize_cooldown_s", "resize_cost_s", "shrink_grace_s"] and seconds == [3.0, 30.0], row
    assert "in the last 10 s after a resize" in row
    loop = (ROOT / "python" / "dra" / "pool" / "_loop.py").read_text()
    launcher = (ROOT / "python" / "dra" / "pool" / "launcher.py").read_text()
    assert 'spec.get("resize_cooldown_s", 10.0)' in loop
    assert 'spec.get("resize_cost_s", 3.0)' in loop
    assert 'spec.get("shrink_grace_s", 30.0)' in launcher
    assert LOG_LIMIT_MB == 1024 and "holds (1024)" in text


def test_dra_run_defaults_are_the_guides() -> None:
    from dra.launch.cli import _join_timeout

    text = (GUIDE / "launch.md").read_text()
    p = _run_parser()
    assert _default(p, "--shutdown-timeout") == 30.0 and "`--shutdown-timeout` (30 s)" in text
    assert _default(p, "--fence-timeout-s") == 10.0 and "`--fence-timeout-s` (10 s)" in text
    assert _default(p, "--log-dir") == "dra-logs" and "(default `dra-logs/`)" in text
    assert _join_timeout({}) == 600.0 and "`--rdzv-conf join_timeout=S` (600 s" in text
    # The console prefix is torchrun's --tee 3 by default.
    assert "default here: 3" in _options(p)["--tee"].help


def test_elastic_option_defaults_beyond_the_snippet_test() -> None:
    # test_docs_snippets checks the option names and most defaults; these rows it leaves out.
    text = (GUIDE / "elastic.md").read_text()
    o = dra.Options()
    assert o.heal is True and "| `heal` | True |" in text
    assert o.start_size == 0 and "| `start_size` | all launched |" in text
    s = o.sparsity
    assert (s["max_sparsity"], s["every"], s["alpha"]) == (0.9, 100, 0.3)
    assert "RigL's defaults (`max_sparsity` 0.9, `every` 100, `alpha` 0.3, ...)" in text


def test_policy_guide_defaults() -> None:
    text = (GUIDE / "policy.md").read_text()
    c = dra.ConvergencePhaseConfig()
    assert (c.grow_step, c.min_parallel_efficiency, c.plateau_size) == (1, 0.6, 1)
    for s in ("`grow_step` (default 1)", "`min_parallel_efficiency` (default 0.6)", "`plateau_size` (default 1)"):
        assert s in text, s
    e = dra.EngineConfig()
    flat = " ".join(text.split())
    assert e.goodput.min_marginal_efficiency == 0.5 and "`min_marginal_efficiency` (default 0.5:" in flat
    ca = e.convergence_aware
    assert (ca.batch_candidates, ca.price_floor, ca.min_gain, ca.plateau_price) == (24, 0.1, 0.02, 0.9)
    for s in ("`batch_candidates`, default 24", "`price_floor` (default 0.1", "`min_gain` (default 2 %)",
              "`plateau_price` (default 0.9)"):
        assert s in flat, s
    assert e.throughput.gamma == 1.0 and "γ is configured, not fitted (default 1:" in flat
    assert e.limits.amortise is True and "(`amortise`, on by default;" in flat
    assert e.decide_every == 10 and "it decides every `decide_every` steps (default 10)" in flat
    r = dra._core.RemainingWorkConfig()
    assert (r.min_class_jobs, r.declared_sigma, r.prior_count, r.curve_sigma, r.uninformed_sigma) == (3, 0.5, 2, 1.0, 1.5)
    for s in ("`min_class_jobs` = 3", "`declared_sigma` (0.5)", "`prior_count` = 2", "`curve_sigma` = 1.0",
              "`uninformed_sigma` = 1.5"):
        assert s in text, s


def test_rl_guide_longgen_costs_and_planner_defaults() -> None:
    import dra.rl

    text = (GUIDE / "rl.md").read_text()
    table = text[text.index("| parameter | value | derivation |", text.index("Costs of a `longgen` device")):]
    table = table[:table.index("\n\n")]
    scale = {"s": 1.0, "ms": 1e-3}
    seen: dict[str, float] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([a-z_]+)`", cells[0])
        values = [v.replace(",", "") for v in re.findall(r"\d[\d,]*(?:\.\d+)?(?: (?:s|ms)\b)?", cells[1])]
        assert len(names) == len(values), row
        for name, value in zip(names, values):
            number, _, unit = value.partition(" ")
            seen[name] = float(number) * scale.get(unit, 1.0)
    costs = dra.rl.LONGGEN_COSTS
    assert set(seen) == set(costs), (sorted(set(costs) - set(seen)), sorted(set(seen) - set(costs)))
    for name, value in seen.items():
        assert costs[name] == pytest.approx(value), name
    p = dra.rl.StageBalanceConfig()
    assert (p.planner, p.lookahead_draws, p.lookahead_max_move, p.lookahead_terminal_steps) == ("window", 12, 2, 3)
    flat = text.replace("\n", " ")
    assert "`lookahead_draws` (12)" in flat
    assert "(devices per decision, 2)" in flat and "valued after the horizon, 3)" in flat
    assert set(dra.rl.PIPELINE_SCENARIOS) == {"longgen", "longgen_reserve", "azure_code", "azure_conv_drift"}


def test_rl_live_defaults() -> None:
    from dra.rl.live.config import LiveConfig
    from dra.rl.live.model import ModelConfig, PolicyModel

    c = LiveConfig()
    assert (c.slots, c.cpus_per_slot, c.pretrain_steps) == (8, 0.2, 400)
    flat = (GUIDE / "rl.md").read_text().replace("\n", " ")
    assert "default 0.2 CPU, 8 slots" in flat and "pretrains the policy for 400 steps" in flat
    m = ModelConfig()
    assert (m.d_model, m.layers, m.heads) == (224, 4, 4) and "(d 224, 4 layers, 4 heads" in flat
    n = sum(p.numel() for p in PolicyModel(m).parameters())
    assert round(n / 1e6, 2) == 2.46 and "a 2.46 M-parameter causal transformer" in flat


def test_faults_guide_defaults() -> None:
    flat = " ".join((GUIDE / "faults.md").read_text().split())
    (p,) = _parsers_of(_bench_main("faults"), [])
    assert _default(p, "--fault-timeout-s") == 2.0 and "with `fault_timeout_s=2` (`--fault-timeout-s`)" in flat
    assert _default(p, "--fuzz-cases") == 10200 and "(`--fuzz-cases`, default 10,200;" in flat
    assert (_default(p, "--churn-model-mb"), _default(p, "--churn-resizes")) == (100.0, 11)
    assert "(`--churn-model-mb 100`, `--churn-resizes 11`)" in flat


def test_pool_guide_names_every_event_and_metric_the_pool_writes() -> None:
    # docs/guide/pool.md, "Events, metrics, Gantt": every kind of <state>/events.jsonl line and every
    # /metrics family the daemon writes (read from the pool's source: each is a literal there).
    text = (GUIDE / "pool.md").read_text()
    section = text[text.index("## Events, metrics, Gantt"):text.index("`dra.pool.gantt.plot(")]
    source = "\n".join(f.read_text() for f in (ROOT / "python" / "dra" / "pool").glob("*.py"))
    kinds = set(re.findall(r'"event": "([a-z_]+)"', source))
    assert 'kind = "preempt" if r.preemption else "shrink"' in source
    kinds |= {"preempt", "shrink"}
    named = set(re.findall(r"`([a-z_]+)`", section))
    assert kinds <= named, f"events the guide does not name: {sorted(kinds - named)}"
    metrics = set(re.findall(r"\b(dra_pool_[a-z_]+)", source))
    assert metrics and metrics == set(re.findall(r"`(dra_pool_[a-z_]+)", section)), metrics


def test_sage_benchmark_defaults_are_the_guides() -> None:
    # docs/guide/sage.md, "The benchmark": the setting its results table was measured at.
    flat = " ".join((GUIDE / "sage.md").read_text().split())
    (p,) = _parsers_of(_bench_main("sage"), [])
    d = {flag: _default(p, flag) for flag in ("--world", "--steps", "--hidden", "--rank", "--ramp-start",
                                                "--ramp-steps", "--sparsify-every", "--eval-every", "--target",
                                                "--latency-ms", "--burst-bytes", "--bucket-candidates", "--seeds")}
    assert d == {"--world": 2, "--steps": 400, "--hidden": 512, "--rank": 2, "--ramp-start": 50, "--ramp-steps": 200,
                 "--sparsify-every": 50, "--eval-every": 5, "--target": 0.95, "--latency-ms": 20.0,
                 "--burst-bytes": 16384, "--bucket-candidates": "1,4,25,256", "--seeds": 5}, d
    for s in ("An MLP (64-512-512-10", "400 steps", "rank 2, warm start", "(steps 50 → 250), an update every 50 steps",
              "(evaluated every 5 steps)", "first reaches 95 %", "with 20 ms added one way", "a 16 KiB bucket",
              "(1, 4, 25, 256 MB tried", "(5 seeds, medians"):
        assert s in flat, s
