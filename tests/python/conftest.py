"""Test order: the longest test files first; and the `token` fixture.

scripts/test.sh runs the files on several workers (pytest-xdist, --dist loadfile), which hand out
whole files in collection order. Started last, a long file would run alone at the end while the
other workers idle; started first, the short files fill in around it. The order only moves whole
files (each file's tests keep theirs) and changes no test's outcome.
"""

from __future__ import annotations

import uuid

import pytest

from dra.testing import kill_tagged


@pytest.fixture
def token():
    """An environment token for the processes a test starts (DRA_TEST_TOKEN, _launch_harness._env):
    the test kills exactly those at the end."""
    value = uuid.uuid4().hex
    yield value
    kill_tagged("DRA_TEST_TOKEN", value)

# Seconds per file (the sum of its tests over 5 s: `pytest --durations`, 2026-12-07, 3 workers on 2
# loaded cores); unlisted files count as 0 and keep their alphabetical place after these.
_SECONDS = {
    "test_loops_outside.py": 563,
    "test_dropin.py": 551,
    "test_pool.py": 411,
    "test_elastic_world.py": 230,
    "test_exhaustion_outside.py": 208,
    "test_faults_outside.py": 163,
    "test_elastic_heal.py": 136,
    "test_elastic_compress.py": 136,
    "test_rl_sim.py": 131,
    "test_outside_scripts.py": 127,
    "test_pool_soak_outside.py": 120,
    "test_eval_outside.py": 117,
    "test_elastic_digits.py": 97,
    "test_unused_params.py": 94,
    "test_pool_lease_taken_outside.py": 92,
    "test_bench_faults.py": 92,
    "test_rl_live_outside.py": 90,
    "test_step_outcome_agreed.py": 86,
    "test_example_single.py": 80,
    "test_codecs_outside.py": 79,
    "test_rng_outside.py": 78,
    "test_elastic_torchrun_fault.py": 78,
    "test_network_faults_outside.py": 76,
    "test_pool_ray.py": 67,
    "test_launch_runs_apart_outside.py": 67,
    "test_bench_nccl.py": 61,
    "test_launch_outside.py": 60,
    "test_loop_end_outside.py": 59,
    "test_pool_outside.py": 57,
    "test_main_job_interrupted.py": 56,
    "test_resume_outside.py": 44,
    "test_standby_dismissal.py": 41,
    "test_elastic_units.py": 40,
    "test_fault_left_excludes_leavers.py": 38,
    "test_store_keys_outside.py": 37,
    "test_plateau_digits.py": 36,
    "test_elastic_loader.py": 33,
    "test_cpp_compat.py": 33,
    "test_pool_jobs_outside.py": 32,
    "test_pool_daemon_stop.py": 32,
    "test_bench_step.py": 27,
    "test_rl_live.py": 26,
    "test_models_outside.py": 26,
    "test_subgroups_outside.py": 25,
    "test_exit_after_error.py": 25,
}


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ARG001 - pytest's hook signature
    items.sort(key=lambda item: -_SECONDS.get(item.path.name, 0))  # stable: each file keeps its order
