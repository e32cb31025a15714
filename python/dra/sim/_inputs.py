"""What a simulation starts from: the policy names and reallocation costs, the shipped profiles and
workloads, the published figures to compare with, and the reallocation cost a user asks for."""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import weakref
from pathlib import Path
from typing import Any

from dra import _sim
from dra.sim._args import PLAIN_DECIMAL, check_csv, plain_decimal, shown_value, too_large

POLICIES: tuple[str, ...] = tuple(_sim.sim_policy_names)


def sim_policy_names() -> tuple[str, ...]:
    """Every policy the simulator runs now: `POLICIES` (built in) and those added with
    `add_cluster_policy`."""
    return tuple(e["name"] for e in _sim.policy_registry() if e["simulator"] is not None)


def add_cluster_policy(name: str, decide: Any, summary: str = "", in_place: bool = False) -> None:
    """Registers ``decide(inputs) -> list[int]`` as a cluster policy of this process's simulator:
    ``replay`` and ``study`` then run ``name`` as they run ``pollux`` or ``arbiter`` (same cluster,
    placement rule, reallocation cost and batch choice). ``inputs`` (valid during the call only)
    holds ``jobs`` (dicts of what a real scheduler knows: ``name``, ``job_class``, ``submit_s``,
    ``requested_replicas``, ``requested_batch``, ``declared_epochs``, ``max_devices``, ``devices``,
    ``restarts``, ``attained_device_s``, ``epochs_done``, ``work_done``, ``last_batch``),
    ``capacity``, ``nodes``, ``devices_per_node``, ``now`` and ``goodput(i, k)``; the answer is one
    device count per job, each in 0..``max_devices``, at most ``capacity`` in all, checked before
    anything changes. ``in_place``: its system resizes in place (``cost_mode="system"`` charges the
    in-place cost), else by checkpoint and restart. docs/guide/simulator.md, "Your own cluster
    policy"."""
    if not callable(decide):
        raise TypeError(f"decide: {decide!r} is not callable; pass a function inputs -> [device count per job]")
    _sim.sim_add_cluster_policy(name, decide, summary, bool(in_place))


def remove_cluster_policy(name: str) -> None:
    """Removes a policy added with `add_cluster_policy` (built-in ones stay)."""
    _sim.sim_remove_cluster_policy(name)


#: Dynamic policies `dra-sim study` compares by default with the static baselines: the DRA
#: framework's rule, the Pollux size rule per job, and dra's convergence-aware policy.
STUDY_POLICIES: tuple[str, ...] = ("convergence", "goodput", "convergence_aware")
#: Policies of the shared-cluster study (runs contend for one cluster).
SHARED_POLICIES: tuple[str, ...] = ("tiresias", "pollux", "arbiter", "convergence_aware")
#: The static baselines of a study: the request as made, the best fixed size in hindsight at the
#: user's batch, and the best fixed size and batch in hindsight (all within the same budget).
STUDY_BASELINES: tuple[str, ...] = tuple(_sim.sim_study_baselines)
#: Stand-in for the measured in-place resize cost (seconds); `--reallocation-cost inplace`.
IN_PLACE_RESIZE_COST_S: float = float(_sim.sim_in_place_resize_cost_stand_in_s)
#: The reference simulator's cost of one reallocation (checkpoint-restart), seconds.
POLLUX_REALLOCATION_COST_S: float = 30.0


def default_data_dir() -> Path:
    """The profiles and workloads dra ships (``data/pollux``), or ``$DRA_SIM_DATA`` when set.

    The editable install in ``.venv`` resolves it relative to the repository
    (``python/dra/sim/`` -> ``data/pollux``)."""
    env = os.environ.get("DRA_SIM_DATA")
    if env and not (Path(env) / "traces").is_dir():
        # Set but wrong: falling back to the shipped copy would silently give other data.
        why = "does not exist" if not Path(env).exists() else "holds no traces/ folder"
        raise FileNotFoundError(
            f"DRA_SIM_DATA: {env} {why}; point it at a folder holding traces/ and workloads/, "
            "or unset it to use the data dra ships"
        )
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parent / "data" / "pollux", here.parents[3] / "data" / "pollux"]
    for c in candidates:
        if (c / "traces").is_dir():
            return c
    raise FileNotFoundError(
        "dra.sim: no profiles found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); set DRA_SIM_DATA to a folder holding traces/ and workloads/, or pass --traces DIR"
    )


def data_folder(name: str, needed_by: str) -> Path:
    """A folder of the data in use (``workloads``, ``workloads-0.5``, ...), refused naming where the
    data came from when it is not there (an error naming only the first missing CSV left a
    ``$DRA_SIM_DATA`` user to guess)."""
    root = default_data_dir()
    folder = root / name
    if not folder.is_dir():
        env = os.environ.get("DRA_SIM_DATA")
        where = f"DRA_SIM_DATA: {env}" if env else f"the data dra ships, {root},"
        fix = ("add it, unset DRA_SIM_DATA, or give the workloads yourself" if env else
               "reinstall dra, or set DRA_SIM_DATA to a folder holding it")
        raise FileNotFoundError(f"{where} holds no {name}/ folder, which {needed_by} reads; {fix}")
    return folder


def workload_path(workload: str | os.PathLike[str]) -> Path:
    """Where a workload CSV is: the path as given when it is there (or absolute); else a relative
    path looked up in the copy dra ships, either as the docs write it from a checkout
    (``data/pollux/workloads/workload-1.csv``) or relative to that folder
    (``workloads-1.5/workload-3.csv``), so the documented commands work from an installed package
    in any folder. The path as given when neither holds it (its reader then names it)."""
    given = Path(workload)
    if given.exists() or given.is_absolute():
        return given
    parts = given.parts[2:] if given.parts[:2] == ("data", "pollux") else given.parts
    try:
        shipped = default_data_dir().joinpath(*parts) if parts else None
    except FileNotFoundError:
        return given
    return shipped if shipped is not None and shipped.is_file() else given


#: The folder each profile library was loaded from (``load_profiles``), for what the C++ object does
#: not expose (the most devices each profile measured).
_TRACES_OF: weakref.WeakKeyDictionary[Any, Path] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=8)
def _profiles_cached(traces: str) -> Any:
    profiles = _sim.SimProfiles(traces)  # its C++ reader refuses a repeated column name
    _TRACES_OF[profiles] = Path(traces)
    return profiles


def load_profiles(traces: str | os.PathLike[str] | None = None) -> Any:
    """The measured profiles under ``traces`` (default: the shipped copy), loaded once per path."""
    path = Path(traces) if traces is not None else default_data_dir() / "traces"
    return _profiles_cached(str(Path(path).resolve()))


@functools.lru_cache(maxsize=64)
def _measured_replicas_in(folder: str) -> int:
    """The most devices one application's profile measured: the largest ``num_replicas`` of its
    scalability.csv and the largest placement (devices per node, one digit a node) of its
    placements.csv (files the C++ reader has read already); beyond it step times are clamped."""
    import csv

    most = 0
    for name, read in (("scalability.csv", lambda r: int(float(r["num_replicas"]))),
                       ("placements.csv", lambda r: sum(int(c) for c in r["placement"].strip()))):
        path = Path(folder) / name
        if not path.is_file():
            continue
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = csv.DictReader(f, skipinitialspace=True)
            rows.fieldnames = [c.strip() for c in rows.fieldnames or []]
            for row in rows:
                try:
                    most = max(most, read(row))
                except (KeyError, TypeError, ValueError):
                    continue
    return most


def measured_replicas(profiles: Any, application: str) -> int | None:
    """The most devices ``application``'s profile measured (None: ``profiles`` was not loaded with
    ``load_profiles``, so its folder is unknown)."""
    folder = _TRACES_OF.get(profiles)
    if folder is None:
        return None
    return _measured_replicas_in(str(folder / application)) or None


#: The numeric columns of a workload CSV and how each must be written (``_args.check_csv``).
WORKLOAD_NUMBERS: dict[str, str] = {
    "time": "decimal",
    "num_replicas": "integer",
    "batch_size": "decimal",
    "declared_epochs": "decimal_or_empty",
}


def read_workload_rows(path: str | os.PathLike[str], profiles: Any = None) -> tuple[list[dict[str, Any]], list[int]]:
    """``read_workload`` and the file line of each job."""
    try:  # first, so a number's form is named the same way whatever the C++ reader thinks of its value
        lines = check_csv(path, WORKLOAD_NUMBERS, utf8=True)  # a job's name becomes a Python str
    except OSError:
        lines = None  # the reader names a file it cannot open
    jobs = list(_sim.sim_read_workload(str(path), profiles))
    lines = lines if lines is not None else check_csv(path, WORKLOAD_NUMBERS, utf8=True)
    renamed = [j["name"] for j, line in zip(jobs, lines) if j["name"].endswith(f"@{line}")]
    if renamed:  # a repeated name, made unique by the reader
        shown = ", ".join(renamed[:5]) + (f" (and {len(renamed) - 5} more)" if len(renamed) > 5 else "")
        print(f"[dra-sim] {path}: {len(renamed)} job name(s) repeat an earlier one; each is named by its line: {shown}",
              file=sys.stderr)
    return jobs, lines


def read_workload(path: str | os.PathLike[str], profiles: Any = None) -> list[dict[str, Any]]:
    """Jobs of a workload CSV; a malformed row raises ValueError naming file, line and column. A
    column name the header repeats and a number that is not a plain decimal (``0x10``, ``1e3``,
    ``+5``, `` 5 ``) are refused too."""
    return read_workload_rows(path, profiles)[0]


def check_requests(path: str | os.PathLike[str], jobs: list[dict[str, Any]], lines: list[int], capacity: int,
                   fix: str) -> None:
    """Refuses jobs that request more devices than the simulated cluster has (they could never run
    as requested; capping them would simulate another workload), naming each (the first five)."""
    big = [(line, j) for line, j in zip(lines, jobs) if j["replicas"] > capacity]
    if not big:
        return
    named = "; ".join(f"line {line} job '{j['name']}' requests {j['replicas']}" for line, j in big[:5])
    more = f" (and {len(big) - 5} more)" if len(big) > 5 else ""
    raise ValueError(
        f"{path}: {len(big)} job(s) request more devices than the simulated cluster has ({capacity}): {named}{more}; "
        f"{fix}, or lower num_replicas in those rows to at most {capacity}"
    )


def check_measured(path: str | os.PathLike[str], jobs: list[dict[str, Any]], lines: list[int], profiles: Any) -> None:
    """Refuses requests the measured profiles cannot represent, which the simulator would run as
    another job (``replay`` and ``study`` alike): a batch that cannot give each device the smallest
    measured per-device batch (the job would be cut to fewer devices, or charged a clamped step
    time), and more devices than the profile measured (step times clamped there). Names file, line,
    job and value of each (the first five) and the fix."""
    thin, wide = [], []
    for line, j in zip(lines, jobs):
        least = profiles.info(j["application"])["min_local_batch"]
        most = max(1, int(j["batch"] / least + 1e-9))
        if j["replicas"] > most:
            thin.append(f"line {line} job '{j['name']}' requests {j['replicas']} devices at batch {j['batch']:g}, "
                        f"at most {most} at {j['application']}'s smallest per-device batch {least:g}")
        top = measured_replicas(profiles, j["application"])
        if top is not None and j["replicas"] > top:
            wide.append((line, j, top))

    def some(items: list[str]) -> str:
        return f"{'; '.join(items[:5])}{f' (and {len(items) - 5} more)' if len(items) > 5 else ''}"

    if thin:
        raise ValueError(f"{path}: {len(thin)} request(s) the simulator would cut to fewer devices: {some(thin)}; "
                         "lower num_replicas or raise batch_size")
    if wide:
        named = [f"line {line} job '{j['name']}' requests {j['replicas']} devices, {j['application']}'s profile "
                 f"measures at most {top}" for line, j, top in wide]
        raise ValueError(f"{path}: {len(wide)} request(s) beyond the devices the profiles measured (step times would "
                         f"be clamped there): {some(named)}; lower num_replicas to at most "
                         f"{min(t for _, _, t in wide)}, or give --traces measured further")


def check_policies(policies: Any) -> None:
    """Refuses a policy named twice (``--policy``, ``policies=``): it would run twice and repeat its
    per-job records."""
    seen: set[str] = set()
    for p in policies or ():
        if p in seen:
            raise ValueError(f"policy (--policy): '{p}' is given more than once; give each policy once")
        seen.add(p)


def published_jct(data_dir: Path | None = None) -> dict[str, Any]:
    """The Pollux artifact's published average JCTs: ``{"loads": {load: {"avg_jct_s": {scheduler:
    {workload: s}}}}, "workload_sha256": {sha256: {"workload", "load"}}}``, {} when absent."""
    try:
        path = (data_dir or default_data_dir()) / "published_jct.json"
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def published_for(workload: str | os.PathLike[str], data_dir: Path | None = None) -> dict[str, Any]:
    """Published figures for a workload CSV, matched by the SHA-256 of its bytes (never by file
    name: the 0.5x and 2.0x variants share names with the 1.0x ones). ``{}`` for any other CSV;
    otherwise ``{"workload", "load", "avg_jct_s": {scheduler: s}}``."""
    import hashlib

    doc = published_jct(data_dir)
    digest = hashlib.sha256(Path(workload).read_bytes()).hexdigest()
    match = doc.get("workload_sha256", {}).get(digest)
    if not match:
        return {}
    figures = doc["loads"][match["load"]]["avg_jct_s"]
    return {
        "workload": match["workload"],
        "load": match["load"],
        "avg_jct_s": {k: v[match["workload"]] for k, v in figures.items() if match["workload"] in v},
    }


def _resize_report(path: str | os.PathLike[str], what: str, value_of: Any) -> float:
    """The slower of the shrink (4->2) and grow (2->4) rows of a ``dra.bench resize`` report at the
    largest state it measured, each row's figure as ``value_of(row)`` picks it (None: not there)."""
    import re

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what}: cannot read resize report {path}: {exc}") from None
    by_size: dict[float, list[float]] = {}
    for r in doc.get("results", []) if isinstance(doc, dict) else []:
        m = re.fullmatch(r"(shrink_4to2|grow_2to4)_([0-9.]+)MB", str(r.get("name", "")))
        value = value_of(r) if m else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            by_size.setdefault(float(m.group(2)), []).append(float(value))
    if not by_size:
        raise ValueError(
            f"{what}: {path} has no shrink_4to2_<N>MB / grow_2to4_<N>MB figures; "
            "expected the JSON of `python -m dra.bench resize --json PATH`"
        )
    return max(by_size[max(by_size)])


def cost_from_resize_report(path: str | os.PathLike[str]) -> float:
    """The in-place resize cost measured by ``python -m dra.bench resize --json PATH``: the slower of
    dra's shrink (4->2) and grow (2->4), at the largest model state the report measured."""
    return _resize_report(path, "reallocation cost", lambda r: r.get("value"))


def restart_cost_from_resize_report(path: str | os.PathLike[str]) -> float:
    """The checkpoint-restart cost measured beside dra's resize by ``python -m dra.bench resize``:
    the slower of the torchrun restarts (its ``torchrun_restart`` baselines) at the largest state."""

    def restart(r: dict[str, Any]) -> Any:
        base = r.get("baseline")
        return base.get("value") if isinstance(base, dict) and base.get("name") == "torchrun_restart" else None

    return _resize_report(path, "restart cost", restart)


def _default_resize_report() -> Path:
    """The copy the package ships (``dra/sim/data/``, installed from the wheel) or, in a checkout
    (the editable install), ``docs/results/sim/resize-100MB.json``; the packaged path when neither
    is there."""
    here = Path(__file__).resolve()
    candidates = [here.parent / "data" / "resize-100MB.json",
                  here.parents[3] / "docs" / "results" / "sim" / "resize-100MB.json"]
    return next((c for c in candidates if c.is_file()), candidates[0])


#: The measured resize report the system view reads by default (in-place resize and torchrun restart
#: measured side by side, 100 MB of state; docs/results/sim/resize-100MB.json, shipped in the package).
DEFAULT_RESIZE_REPORT: Path = _default_resize_report()

#: The two ways of charging a reallocation. ``same``: every policy pays the same cost per change
#: (policy quality, like for like). ``system``: each policy pays its own system's mechanism, dra's
#: in-place resize or a checkpoint-restart (the registry's ``mechanism``).
COST_MODES: tuple[str, ...] = ("same", "system")


def costs_by_policy(
    policies: list[str],
    mode: str = "same",
    *,
    cost: float | str | None = None,
    in_place_cost: float | str | None = None,
    restart_cost: float | str | None = None,
) -> dict[str, float]:
    """Seconds each policy pays per reallocation. ``same``: ``cost`` for all (default: Pollux's
    30 s). ``system``: policies whose system resizes in place pay ``in_place_cost`` (default: the
    measured resize report's slower resize), the others ``restart_cost`` (default: Pollux's 30 s;
    a resize report gives the measured torchrun restart). A cost the mode or the policies would
    not use is refused (it would be silently ignored): ``in_place_cost``/``restart_cost`` under
    ``same``, ``cost`` under ``system``, ``in_place_cost`` when no policy resizes in place,
    ``restart_cost`` when none restarts."""
    if mode not in COST_MODES:
        raise ValueError(f"cost mode: '{mode}' is not one of {', '.join(COST_MODES)}")
    if mode == "same":
        given = [n for n, v in (("in_place_cost (--in-place-cost)", in_place_cost),
                                ("restart_cost (--restart-cost)", restart_cost)) if v is not None]
        if given:
            raise ValueError(
                f"{' and '.join(given)}: not used by cost mode 'same', where every policy pays the one reallocation "
                "cost (--reallocation-cost); drop it, or charge each policy its own mechanism with cost mode 'system' "
                "(--cost-mode system)"
            )
        value = parse_cost(POLLUX_REALLOCATION_COST_S if cost is None else cost)
        return {p: value for p in policies}
    if cost is not None:
        raise ValueError(
            f"reallocation cost (--reallocation-cost) {cost}: not used by cost mode 'system', where each policy pays "
            "its own mechanism's cost; give --in-place-cost / --restart-cost instead, or use cost mode 'same'"
        )
    mechanism = {e["name"]: e["mechanism"] for e in _sim.policy_registry()}
    in_place_policies = [p for p in policies if mechanism.get(p) == "in_place"]
    restart_policies = [p for p in policies if mechanism.get(p) != "in_place"]
    for given, users, name, kind in ((in_place_cost, in_place_policies, "in_place_cost (--in-place-cost)", "resizes in place"),
                                     (restart_cost, restart_policies, "restart_cost (--restart-cost)", "restarts from a checkpoint")):
        if given is not None and not users:
            those = [p for p in POLICIES if (mechanism.get(p) == "in_place") == (kind == "resizes in place")]
            raise ValueError(
                f"{name} {given}: no policy run here {kind} (policies: {', '.join(policies)}), so it would be ignored; "
                f"drop it or add one that does ({', '.join(those)})"
            )
    if in_place_cost is None:
        in_place_cost = str(DEFAULT_RESIZE_REPORT) if DEFAULT_RESIZE_REPORT.is_file() else "inplace"
    in_place = parse_cost(in_place_cost, "in-place cost")
    restart = _restart_seconds(restart_cost)
    return {p: in_place if p in in_place_policies else restart for p in policies}


def _restart_seconds(restart_cost: float | str | None) -> float:
    if restart_cost is None:
        return POLLUX_REALLOCATION_COST_S
    if isinstance(restart_cost, str) and restart_cost.strip().lower().endswith(".json"):
        return restart_cost_from_resize_report(restart_cost.strip())
    return parse_cost(restart_cost, "restart cost")


def launch_cost(mode: str, costs: dict[str, float], restart_cost: float | str | None = None) -> float:
    """Seconds every policy's job pays at its first start, one value for all. ``same``: the one
    reallocation cost (as the reference charges every start). ``system``: the restart cost, since a
    job's launch is no cheaper under a system that resizes in place (charging each policy its own
    mechanism at launch gave dra's jobs 0.23 s to start against 30 s for the others')."""
    if mode == "same":
        return next(iter(costs.values()), POLLUX_REALLOCATION_COST_S)
    return _restart_seconds(restart_cost)


def parse_cost(text: str | float, what: str = "reallocation cost") -> float:
    """A reallocation cost in seconds; ``inplace`` means the in-place resize cost, ``pollux`` 30 s,
    a path to a ``dra.bench resize`` JSON report the cost it measured (``cost_from_resize_report``).
    Seconds are written as a plain decimal (``30``, ``0.23``): ``0x10``, ``1e3``, ``1_000``, `` 5 ``,
    ``inf`` and ``nan`` are refused."""
    if isinstance(text, bool):
        raise ValueError(f"{what}: {text!r} is not a number of seconds")
    if isinstance(text, (int, float)):
        value = float(text)
    elif text.strip().lower().endswith(".json"):
        value = cost_from_resize_report(text.strip())
    elif text.strip().lower() in ("inplace", "in-place", "in_place"):
        value = IN_PLACE_RESIZE_COST_S
    elif text.strip().lower() == "pollux":
        value = POLLUX_REALLOCATION_COST_S
    else:
        parsed = plain_decimal(text)
        if parsed is None and too_large(text):
            raise ValueError(f"{what}: {shown_value(text)} is too large a number of seconds; give a smaller one")
        if parsed is None:
            raise ValueError(
                f"{what}: '{text}' is not a number of seconds, 'inplace', 'pollux' or a `dra.bench resize` JSON report; "
                f"write seconds as {PLAIN_DECIMAL}"
            )
        value = parsed
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: must be a finite number of seconds >= 0, got {text}")
    return value
