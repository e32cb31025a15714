"""The cluster simulator: replay job workloads and the generated static-vs-dynamic study.

The simulation itself is C++ (``include/dra/sim/``, bound as ``dra._sim``, a module
built without torch, so neither ``import dra.sim`` nor ``dra-sim`` loads torch); this package
finds the shipped profiles, turns results into the JSON/markdown/plots users read, and computes
confidence intervals. Command line: ``dra-sim`` (see :mod:`dra.sim.cli`).

    import dra.sim
    out = dra.sim.replay("data/pollux/workloads/workload-1.csv", policies=["static", "arbiter"])
    print(out["policies"]["arbiter"]["avg_jct_s"])
"""

from __future__ import annotations

from dra.sim._inputs import (
    COST_MODES,
    DEFAULT_RESIZE_REPORT,
    IN_PLACE_RESIZE_COST_S,
    POLICIES,
    POLLUX_REALLOCATION_COST_S,
    SHARED_POLICIES,
    STUDY_BASELINES,
    STUDY_POLICIES,
    add_cluster_policy,
    cost_from_resize_report,
    costs_by_policy,
    default_data_dir,
    launch_cost,
    load_profiles,
    parse_cost,
    published_for,
    published_jct,
    read_workload,
    remove_cluster_policy,
    restart_cost_from_resize_report,
    sim_policy_names,
    workload_path,
)
from dra.sim._replay import replay, summarize
from dra.sim._report import markdown_replay, markdown_study, unfinished_note
from dra.sim._stats import bootstrap_ci
from dra.sim._study import study

__all__ = [
    "COST_MODES",
    "DEFAULT_RESIZE_REPORT",
    "IN_PLACE_RESIZE_COST_S",
    "POLICIES",
    "POLLUX_REALLOCATION_COST_S",
    "SHARED_POLICIES",
    "STUDY_BASELINES",
    "STUDY_POLICIES",
    "add_cluster_policy",
    "bootstrap_ci",
    "cost_from_resize_report",
    "costs_by_policy",
    "default_data_dir",
    "launch_cost",
    "load_profiles",
    "markdown_replay",
    "markdown_study",
    "unfinished_note",
    "parse_cost",
    "published_for",
    "published_jct",
    "read_workload",
    "remove_cluster_policy",
    "replay",
    "restart_cost_from_resize_report",
    "sim_policy_names",
    "study",
    "summarize",
    "workload_path",
]
