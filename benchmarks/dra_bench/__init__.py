"""dra's benchmark suites (benchmark code, not part of the installed ``dra`` package).

Run one with ``python -m dra.bench <suite> --json PATH`` (or ``python -m dra_bench <suite>``). Each
suite measures a figure and its baseline side by side in the same run and writes
``{"suite", "machine", "results": [{"name", "value", "unit", "baseline", "ratio"}]}``. Speed goals
live here, never in tests. ``scripts/setup.sh`` puts this folder on the project venv's path.
"""
