"""An outside docs audit (2026-12-05): what a user met following the guides.

- ``ElasticSampler`` iterated alone (``for idx in sampler``, or a plain ``DataLoader``'s
  ``batch_sampler=``) with no controller never ended: after the epoch it yielded padding batches
  forever. Outside a controller it is a plain batch sampler now: one pass over the data epoch in
  its documented order, then the end (docs/guide/elastic.md).
- ``dra-sim rl --quiet`` still printed its "wrote PATH" lines, as did ``replay`` and ``study``:
  ``--quiet`` silences them in every subcommand.
- docs/guide/simulator.md listed a subset of the keys of the JSON documents ``dra-sim`` writes:
  each list (now docs/guide/simulator-json.md) is checked against what the commands write, both ways; likewise
  docs/guide/rl-json.md for ``dra-sim rl`` (both models).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import dra.elastic as de

ROOT = Path(__file__).resolve().parents[2]
DRA_SIM = str(Path(sys.executable).parent / "dra-sim")
# A cap far above one epoch's steps: an iteration that never ends stops here and fails the test.
CAP = 1000


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


# -- ElasticSampler outside a controller ---------------------------------------------------------

def test_elastic_sampler_alone_yields_one_epoch_in_its_order_then_ends() -> None:
    ds = _dataset(10)
    sampler = de.ElasticSampler(len(ds), 4, seed=3)
    batches = [b.tolist() for b in itertools.islice(sampler, CAP)]
    assert [len(b) for b in batches] == [4, 4, 2] == [len(b) for b in batches[:len(sampler)]]
    flat = [i for b in batches for i in b]
    assert flat == sampler.order().tolist() and sorted(flat) == list(range(10))  # each sample once
    assert flat != list(range(10))  # shuffled with its seed ...
    assert [b.tolist() for b in de.ElasticSampler(10, 4, seed=3)] == batches  # ... deterministically
    # Iterated again without set_epoch: the same epoch again (torch's sampler repeats its order too).
    assert [b.tolist() for b in itertools.islice(sampler, CAP)] == batches
    sampler.set_epoch(1)
    again = [b.tolist() for b in itertools.islice(sampler, CAP)]
    assert len(again) == 3 and sorted(i for b in again for i in b) == list(range(10)) and again != batches
    assert sampler.epoch == 1 and sampler.cursor == 0
    # drop_last and shuffle=False as documented.
    assert [b.tolist() for b in itertools.islice(de.ElasticSampler(10, 4, drop_last=True, shuffle=False), CAP)] == [
        [0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("workers", [0, 2])
def test_elastic_sampler_in_a_plain_dataloader_ends_its_epoch(workers: int) -> None:
    ds = _dataset(23)
    sampler = de.ElasticSampler(len(ds), 5, seed=1)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=workers)
    assert len(loader) == 5
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = [y.tolist() for _, y in itertools.islice(loader, CAP)]
        assert [len(b) for b in seen] == [5, 5, 5, 5, 3]
        assert sorted(i for b in seen for i in b) == list(range(23))
        assert [i for b in seen for i in b] == sampler.order().tolist()


def test_elastic_sampler_restored_mid_epoch_yields_the_rest_of_it() -> None:
    trained = de.ElasticSampler(20, 6, seed=2)
    trained._native.commit()  # one step committed in a job, then saved
    resumed = de.ElasticSampler(20, 6, seed=2)
    resumed.load_state_dict(trained.state_dict())
    rest = [b.tolist() for b in itertools.islice(resumed, CAP)]
    assert [i for b in rest for i in b] == resumed.order()[6:].tolist() and len(rest) == len(resumed) == 3


# -- dra-sim: --quiet and the JSON documents -----------------------------------------------------

WORKLOAD = "name,time,application,num_replicas,batch_size\na,0,cifar10,2,256\nb,100,ncf,1,256\nc,200,cifar10,4,512\n"

# Small runs of every subcommand that writes plots: (arguments, the progress prefix its lines carry).
COMMANDS: dict[str, list[str]] = {
    "replay": ["replay", "--workload", "{workload}", "--policy", "static", "--policy", "pollux",
               "--policy", "convergence_aware"],
    "study": ["study", "--runs", "3", "--resamples", "20"],
    "study-shared": ["study", "--runs", "4", "--resamples", "20", "--shared-cluster", "--jobs-per-cluster", "2"],
    "rl": ["rl", "--scenario", "long_tail", "--steps", "20"],
    "rl-pipeline": ["rl", "--pipeline-scenario", "longgen", "--steps", "4"],
}
_RUNS: dict[tuple[str, bool], tuple[subprocess.CompletedProcess[str], Path]] = {}


def _dra_sim(name: str, quiet: bool, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs a COMMANDS entry once per session with --json and --plots (and --quiet): (process, folder)."""
    if (name, quiet) not in _RUNS:
        out = tmp_path_factory.mktemp(f"{name}-{'quiet' if quiet else 'loud'}")
        (out / "w.csv").write_text(WORKLOAD)
        argv = [a.format(workload=out / "w.csv") for a in COMMANDS[name]]
        argv += ["--json", str(out / "out.json"), "--plots", str(out / "plots")] + (["--quiet"] if quiet else [])
        proc = subprocess.run([DRA_SIM, *argv], capture_output=True, text=True, timeout=120, cwd=out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _RUNS[(name, quiet)] = proc, out
    return _RUNS[(name, quiet)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["replay", "study", "rl", "rl-pipeline"])
def test_quiet_silences_the_wrote_lines_of_every_subcommand(name: str, tmp_path_factory) -> None:
    proc, out = _dra_sim(name, True, tmp_path_factory)
    plots = sorted((out / "plots").glob("*.png"))
    assert plots and (out / "out.json").exists()
    assert "wrote" not in proc.stderr and "[dra-sim" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip()  # the markdown table still goes to stdout
    # Without --quiet each file written is named, as before.
    loud, loud_out = _dra_sim(name, False, tmp_path_factory)
    named = re.findall(r"^\[dra-sim(?: rl)?\] wrote (\S+)$", loud.stderr, re.M)
    # The plots and the JSON (every subcommand here writes --json out.json).
    expected = [p.name for p in (loud_out / "plots").glob("*.png")] + ["out.json"]
    assert sorted(Path(p).name for p in named) == sorted(expected), loud.stderr


def _keys_at(doc: Any, path: str) -> set[str]:
    """The keys of every object at ``path`` in ``doc``: ``a.b`` descends, ``<name>`` takes every
    member of a mapping, ``a[]`` every element of a list."""
    objects = [doc]
    for part in filter(None, path.split(".")):
        step = []
        for o in objects:
            if part.startswith("<"):
                step += list(o.values())
            elif part.endswith("[]"):
                step += list(o[part[:-2]])
            else:
                step.append(o[part])
        objects = step
    assert objects and all(isinstance(o, dict) for o in objects), path
    return set().union(*(o.keys() for o in objects))


def _documented_keys(page: str, commands: str) -> dict[tuple[str, str], list[str]]:
    """docs/guide/<page>, blocks headed **<command>, `path`** or **<command>, top level** (command
    matching the regex `commands`): (command, path) -> the keys its list names."""
    text = (ROOT / "docs" / "guide" / page).read_text()
    out: dict[tuple[str, str], list[str]] = {}
    for block in re.split(rf"\n(?=\*\*(?:{commands}), )", text)[1:]:
        head = re.match(rf"\*\*({commands}), (?:`([^`]+)`|top level)\*\*", block)
        assert head, block[:80]
        out[(head.group(1), head.group(2) or "")] = re.findall(r"^- `([a-z0-9_]+)`:", block, re.M)
    return out


@pytest.mark.timeout(120)
def test_simulator_guide_lists_every_key_of_the_json_documents(tmp_path_factory) -> None:
    documented = _documented_keys("simulator-json.md", "replay|study")
    docs = {name: json.loads((_dra_sim(name, True, tmp_path_factory)[1] / "out.json").read_text())
            for name in ("replay", "study", "study-shared")}
    # Every list names each key once, and what the command writes there exactly (both ways); a key
    # only some objects at that path have (one policy's, the shared cluster's) counts.
    for (command, path), keys in documented.items():
        assert len(keys) == len(set(keys)), (command, path, keys)
        if command == "replay":
            written = _keys_at(docs["replay"], path)
            if path == "jobs[]":
                written |= {"run"}  # listed there as the study's
        else:
            written = _keys_at(docs["study"], path) | _keys_at(docs["study-shared"], path)
        assert set(keys) == written, (command, path, sorted(written - set(keys)), sorted(set(keys) - written))
    assert {path for _, path in documented} >= {"", "policies.<policy>", "policies.<policy>.vs.<baseline>", "jobs[]",
                                                "timelines.<policy>", "conditions", "specs[]"}
    # The study's job records are the replay's (with `run`), and each application's calibration has
    # the calibration's own keys.
    assert _keys_at(docs["study"], "jobs[]") == set(documented[("replay", "jobs[]")])
    calibration = "policies.convergence_aware.remaining_work_calibration.<fraction>"
    assert _keys_at(docs["replay"], calibration + ".by_application.<application>") == (
        set(documented[("replay", calibration)]) - {"by_application"})


@pytest.mark.timeout(120)
def test_rl_guide_lists_every_key_of_the_json_documents(tmp_path_factory) -> None:
    documented = _documented_keys("rl-json.md", "rl pipeline|rl")
    phase = json.loads((_dra_sim("rl", True, tmp_path_factory)[1] / "out.json").read_text())
    event = json.loads((_dra_sim("rl-pipeline", True, tmp_path_factory)[1] / "out.json").read_text())
    # Every run of both models is a run record with the keys listed under `dynamic`.
    runs = [*phase["statics"], phase["dynamic"], phase["oracle"], phase["colocated"]]
    runs += [r for k in ("barrier_free", "barrier", "synchronous") for r in event[k]]
    runs += [event[k] for k in ("dynamic", "dynamic_lookahead", "oracle_within_step", "colocated")]
    for (model, path), keys in documented.items():
        assert len(keys) == len(set(keys)), (model, path, keys)
        if path.startswith("dynamic"):
            assert model == "rl", path
            sub = path[len("dynamic"):].lstrip(".")
            for run in runs:
                if "switch_log" in sub and not run["switch_log"]:
                    continue
                written = _keys_at(run, sub)
                assert set(keys) == written, (run["name"], path, sorted(written - set(keys)), sorted(set(keys) - written))
            continue
        written = _keys_at(phase if model == "rl" else event, path)
        assert set(keys) == written, (model, path, sorted(written - set(keys)), sorted(set(keys) - written))
    # The event model's settings: the phase model's, `pipeline` aside, with three of its own.
    assert _keys_at(event, "settings") == (set(documented[("rl", "settings")]) - {"pipeline"}) | {
        "label", "oracle_lookahead", "lookahead_samples"}
    assert {p for m, p in documented if m == "rl pipeline"} >= {"", "summary", "summary.barrier", "summary.resizing",
                                                                 "summary.oracle", "summary.lookahead_planner", "summary.others"}
    assert {p for m, p in documented if m == "rl"} >= {"", "dynamic", "dynamic.phases", "dynamic.switch_log[]",
                                                        "dynamic.switch_log[].cost_split", "dynamic.roles", "settings", "summary"}
