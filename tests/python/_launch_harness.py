"""Shared by the tests that run `dra run` as a user would: the environment of a launch, tagged with
the test's token (the `token` fixture, conftest.py) so that the test kills exactly its processes."""

from __future__ import annotations

import os


def _env(token: str) -> dict[str, str]:
    env = dict(os.environ, DRA_TEST_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    return env
