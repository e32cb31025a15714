"""``python -m dra.bench <suite> [--json PATH] [options]``: runs a suite of ``benchmarks/dra_bench``.

The suites are looked for, in order, where ``DRA_BENCHMARKS`` points, already on the path (the
project venv has them through ``scripts/setup.sh``), beside the checkout this ``dra`` was installed
from (editable installs), and in ``./benchmarks``. The folder found goes on ``PYTHONPATH`` too, so
the worker processes a suite starts import it as well.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from dra._console import console


def _has_suites(folder: Path) -> bool:
    return (folder / "dra_bench" / "__main__.py").is_file()


def locate() -> Path | None:
    """The folder that holds the ``dra_bench`` package, or None."""
    env = os.environ.get("DRA_BENCHMARKS")
    if env:
        return Path(env).resolve() if _has_suites(Path(env)) else None
    spec = importlib.util.find_spec("dra_bench")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parents[1]
    import dra

    for folder in (Path(dra.__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks"):
        if _has_suites(folder):
            return folder
    return None


@console("python -m dra.bench")
def main(argv: list[str] | None = None) -> int:
    folder = locate()
    if folder is None:
        where = os.environ.get("DRA_BENCHMARKS")
        print(
            "dra.bench: the benchmark suites were not found"
            + (f" in DRA_BENCHMARKS={where!r} (it must hold dra_bench/)" if where else "")
            + "; they live in a checkout of dra, in benchmarks/dra_bench: run from the checkout, "
            "or set DRA_BENCHMARKS=/path/to/dra/benchmarks",
            file=sys.stderr,
        )
        return 2
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *paths])
    from dra_bench.__main__ import main as run_suite

    return run_suite(argv)


if __name__ == "__main__":
    sys.exit(main())
