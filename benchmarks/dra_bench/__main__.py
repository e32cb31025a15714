"""``python -m dra.bench <suite> [--json PATH] [suite options]``: runs one benchmark suite."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import dra_bench
from dra.sim._args import check_output_path

#: Modules of the package that are not suites: Pollux's reference driver (run under its own
#: Python 3.8 by the sim suite) and the pool suite's security check.
HELPERS = {"pollux_reference", "pool_security"}
SHORT = {"step": "step_overhead"}  # short suite names


def suites() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(dra_bench.__path__)
                  if not m.name.startswith("_") and m.name not in HELPERS)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = suites()
    if not argv or argv[0] in ("-h", "--help"):
        named = [f"{n} ({', '.join(k for k, v in SHORT.items() if v == n)})" if n in SHORT.values() else n
                 for n in available]
        print(f"usage: python -m dra.bench <suite> [--json PATH] [options]\nsuites: {', '.join(named)}")
        return 0 if argv else 2
    name = argv.pop(0)
    name = SHORT.get(name, name)
    if name not in available:
        print(f"dra.bench: unknown suite '{name}'; available: {', '.join(available)}", file=sys.stderr)
        return 2
    json_path = next((v for flag, v in zip(argv, argv[1:]) if flag == "--json"), None)
    json_path = next((a.partition("=")[2] for a in argv if a.startswith("--json=")), json_path)
    try:
        if json_path is not None and "--help" not in argv and "-h" not in argv:
            check_output_path("--json", json_path)  # before the suite's minutes of work, not after
        module = importlib.import_module(f"dra_bench.{name}")
        return int(module.main(argv) or 0)
    except ValueError as e:  # a value the suite or dra refused, named by it
        if os.environ.get("DRA_TRACEBACK"):
            raise
        # A ValueError can also be a defect deep in a suite: where it came from, and how to see all of it.
        where = e.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        at = f" (at {os.path.basename(where.tb_frame.f_code.co_filename)}:{where.tb_lineno}; DRA_TRACEBACK=1 shows the " \
             "whole traceback)" if where is not None else ""
        print(f"python -m dra.bench {name}: error: {e}{at}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
