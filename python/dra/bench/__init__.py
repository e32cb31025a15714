"""Benchmark suites: ``python -m dra.bench <suite> --json PATH``.

Each suite measures a figure and its baseline side by side in the same run and writes
``{"suite", "machine", "results": [{"name", "value", "unit", "baseline", "ratio"}]}``.
Speed goals live here, never in tests.
"""
