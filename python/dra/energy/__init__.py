"""Energy: readers, per-step/per-job accounting, and the energy-aware objectives (docs/design/sustainable.md).

Every figure says where it comes from: ``measured`` (NVML's or RAPL's counter was read),
``estimated`` (CPU-seconds x watts per core: nothing could be read), ``replayed`` (a recorded trace).

    meter = dra.energy.EnergyMeter()      # NVML, else RAPL, else the estimated CPU model
    ...one training step...
    step = meter.mark()                   # EnergyInterval(joules, seconds, source)
    meter.job.joules, meter.source, meter.notes
"""
from __future__ import annotations

from dra._core import (
    EnergyChoice,
    EnergyInterval,
    EnergyMeter,
    EnergyObjective,
    KnobSetting,
    choose_setting,
    process_cpu_seconds,
)

__all__ = [
    "EnergyChoice",
    "EnergyInterval",
    "EnergyMeter",
    "EnergyObjective",
    "KnobSetting",
    "choose_setting",
    "process_cpu_seconds",
]
