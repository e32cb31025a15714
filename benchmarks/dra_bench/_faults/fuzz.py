"""The protocol-level store fuzzer: values another client might write, against every reader of
every key of the elastic protocol, many thousand times (``python -m dra.bench faults
--fuzz-cases N``; tests/python/test_faults_outside.py runs a few hundred).

Each case writes one value into one key family (``dra._core._testing.store_key_families()``) under a
fresh job prefix on a real store, then runs the protocol's readers of that key
(``dra._core._testing.read_store_value``): the protocol either takes the value ("read"), ignores it
with one warning ("ignored"), or raises a dra error that the controller handles ("handled").
Anything else is a crash, which Hypothesis shrinks to the smallest value that causes it. Values
come from Hypothesis (JSON of every type and depth, bytes, numbers at the edges, huge and empty
values) and from the live writer's own list (``tamper.WRONG_TYPES``).
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import time
from typing import Any

from dra_bench._faults.tamper import WRONG_TYPES


def _values() -> Any:
    import json

    from hypothesis import strategies as st

    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**64), max_value=2**64),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )
    documents = st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_FIELDS), inner, max_size=4)),
        max_leaves=12,
    )
    return st.one_of(
        documents.map(lambda d: json.dumps(d).encode()),
        st.binary(max_size=64),
        st.sampled_from(WRONG_TYPES),
        st.sampled_from((b"", b" ", b"0", b"1", b"-1", b"9223372036854775807", b"1e400", b"NaN")),
        st.integers(min_value=1, max_value=8).map(lambda k: b"x" * (k << 17)),  # 128 KiB .. 1 MiB
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


# The field names the protocol's messages use: documents with them reach past the first check.
_FIELDS = ("max_size", "min_size", "leave", "epoch", "members", "joined", "recovery", "rejected", "dismissed",
           "decision", "decided_step", "action", "target", "left", "batch_scale", "lr_scale", "reason", "policy",
           "sig", "model", "layout", "parent", "child", "v")  # fmt: skip


def run(address: str, cases: int, seed: int = 0) -> dict[str, Any]:
    """`cases` cases spread over every key family; returns the counts, and the crashes (each the
    smallest value Hypothesis found for it) with their family."""
    from dra._core import _testing

    host, port = address.rsplit(":", 1)
    families = list(_testing.store_key_families())
    per_family = max(1, -(-cases // len(families)))
    outcomes: collections.Counter[str] = collections.Counter()
    crashes: list[dict[str, Any]] = []
    counter = iter(range(10**9))
    t0 = time.monotonic()
    for family in families:
        case = _case(family, host, int(port), per_family, seed, counter, outcomes)
        # The warnings the protocol prints (one per value it ignores) are its normal answer here.
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), _quiet_fd2():
                case()
        except Exception as e:  # noqa: BLE001 - a crash: Hypothesis re-raises the smallest one
            inner = [f"{type(x).__name__}: {str(x)[:300]}" for x in getattr(e, "exceptions", ())]  # a FlakyFailure's
            crashes.append({"family": family, "error": f"{type(e).__name__}: {str(e)[:300]}", "raised": inner})
    total = sum(outcomes.values())
    by = collections.Counter(k.split(": ")[1] for k in outcomes.elements())
    return {
        "cases": total,
        "families": len(families),
        "read": by.get("read", 0),
        "ignored": by.get("ignored", 0),
        "handled": by.get("handled", 0),
        "crashes": crashes,
        "by_family": dict(sorted(outcomes.items())),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _case(family: str, host: str, port: int, examples: int, seed: int, counter: Any, outcomes: Any) -> Any:
    """The Hypothesis test of one key family (a closure: @given refuses a function with defaults)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from dra._core import _testing

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(value=_values())
    def case(value: bytes) -> None:
        outcome = _testing.read_store_value(host, port, f"fuzz/{os.getpid()}/{next(counter)}", family, value)
        outcomes[f"{family}: {outcome.split(':')[0]}"] += 1

    return case


@contextlib.contextmanager
def _quiet_fd2():
    """The C++ protocol warns on file descriptor 2: sent to /dev/null while the fuzzer runs."""
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
