"""``python -m dra.bench <suite>``: finds the benchmark suites and runs one.

The suites are benchmark code and live beside the library in a checkout (``benchmarks/dra_bench``),
never in the installed package; this entry only locates them.
"""
