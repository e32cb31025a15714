"""``python -m dra.bench <suite> [--json PATH] [suite options]``: runs one benchmark suite."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import dra_bench


def suites() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(dra_bench.__path__) if not m.name.startswith("_"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = suites()
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m dra.bench <suite> [--json PATH] [options]\nsuites: {', '.join(available)}")
        return 0 if argv else 2
    name = argv.pop(0)
    name = {"step": "step_overhead"}.get(name, name)  # short suite names
    if name not in available:
        print(f"dra.bench: unknown suite '{name}'; available: {', '.join(available)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"dra_bench.{name}")
    return int(module.main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
