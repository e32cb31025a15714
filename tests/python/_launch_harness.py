"""Shared by the tests that run `dra run` or the pool as a user would: the environment of a launch,
tagged with the test's token (the `token` fixture, conftest.py) so that the test kills exactly its
processes; whether a process still runs."""

from __future__ import annotations

import os


def _env(token: str) -> dict[str, str]:
    env = dict(os.environ, DRA_TEST_TOKEN=token, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("DRA_STORE", "DRA_JOB_ID", "DRA_OPTIONS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    return env


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (ended, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
