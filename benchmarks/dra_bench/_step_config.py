"""What ``python -m dra.bench step`` measures: the models, the variants and their phases, the
comparisons it reports and the goal (see :mod:`dra_bench.step_overhead`)."""

from __future__ import annotations

# Per model: architecture, global batch, and the default steps of each variant per round and
# warm-up steps (the wide model's step is ~30x longer).
MODELS: dict[str, dict[str, int]] = {
    "digits": {"hidden": 128, "depth": 1, "global_batch": 32, "steps": 60, "warmup": 20},
    "wide": {"hidden": 1024, "depth": 2, "global_batch": 256, "steps": 15, "warmup": 5},
}
VARIANTS = ("plain", "dra", "bare", "local", "plain2")
PHASES = ("data", "forward", "backward", "optimizer", "dra_step")
GOAL_PCT = 1.0
# name: (variant, baseline variant). "aa" is the A/A control: the same DDP job twice, whose
# "overhead" shows how far the measurement itself scatters on this machine.
COMPARISONS = {"vs_plain": ("dra", "plain"), "vs_bare": ("dra", "bare"), "aa": ("plain2", "plain")}
