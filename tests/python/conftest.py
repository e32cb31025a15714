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

# Serial seconds per file (`pytest --durations`, 2026-12-02, 2 cores); unlisted files count as 0
# and keep their alphabetical place after these.
_SECONDS = {
    "test_dropin.py": 242,
    "test_faults_outside.py": 178,
    "test_exhaustion_outside.py": 160,
    "test_pool.py": 200,
    "test_elastic_world.py": 125,
    "test_rl_live.py": 95,
    "test_bench_faults.py": 60,
    "test_elastic_nccl.py": 58,
    "test_elastic_torchrun_fault.py": 47,
    "test_pool_ray.py": 42,
    "test_elastic_loader.py": 38,
    "test_elastic_digits.py": 33,
    "test_elastic_compress.py": 28,
    "test_bench_nccl.py": 24,
    "test_elastic_steered.py": 24,
    "test_pool_lease_taken_outside.py": 25,
    "test_pool_security.py": 19,
}


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ARG001 - pytest's hook signature
    items.sort(key=lambda item: -_SECONDS.get(item.path.name, 0))  # stable: each file keeps its order
