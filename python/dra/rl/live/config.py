"""The live RL loop's settings (``LiveConfig``) and the lengths its task draws from.

The slots and their quota, the GRPO step (prompts, group, updates), the length workload (an Azure
trace column or the calibrated reasoning workload, data/rl-lengths), the policy model and its
warm-up, the stage-balance policy's options for dynamic runs. docs/guide/rl.md ("Live")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dra.rl as rl
from dra.rl.live.model import ModelConfig


@dataclass
class LiveConfig:
    slots: int = 8
    cpus_per_slot: float = 0.2
    use_cgroups: bool = True
    steps: int = 30
    prompts_per_step: int = 8
    group_size: int = 4
    rollout_slots: int = 32  # sequences one rollout engine decodes at once
    lr: float = 2e-4
    clip: float = 0.2
    max_grad_norm: float = 1.0
    seed: int = 0
    length_scale: float = 0.125
    drift: float = 1.0  # target lengths grow to this multiple by the last step (a length curriculum)
    trace: str = "conv"  # a shipped Azure trace, or "reasoning": the calibrated long-generation workload (data/rl-lengths)
    updates_per_step: int = 4  # mini-batch updates per step (the pipeline without a barrier moves devices between them)
    pretrain_steps: int = 400
    pretrain_batch: int = 16
    pretrain_lr: float = 2e-3
    pretrain_seed: int = 0  # the warm-up (the "pretrained model") does not change with the RL seed
    model: ModelConfig = field(default_factory=ModelConfig)
    policy: dict[str, Any] = field(default_factory=dict)  # StageBalanceConfig options (dynamic runs)
    timeout_s: float = 300.0
    # The trainers' world hands a joiner only what it lacks: "deferred" (its parameters are checked
    # by digest, the Adam moments arrive during its first forward and backward) or "full".
    handoff: str = "deferred"

    def validate(self) -> None:
        # Types and ranges first, each named with its value, before any slot, process or model is made.
        for name in ("slots", "steps", "prompts_per_step", "group_size", "rollout_slots", "updates_per_step",
                     "pretrain_steps", "pretrain_batch", "seed", "pretrain_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}: expected an integer, got {value!r} ({type(value).__name__})")
        for name, low in (("rollout_slots", 1), ("pretrain_steps", 0), ("pretrain_batch", 1), ("seed", 0),
                          ("pretrain_seed", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: must be >= {low}, got {getattr(self, name)}")
        for name in ("cpus_per_slot", "lr", "clip", "max_grad_norm", "length_scale", "pretrain_lr", "timeout_s", "drift"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
        if not isinstance(self.use_cgroups, bool):
            raise ValueError(f"use_cgroups: expected True or False, got {self.use_cgroups!r}")
        if not isinstance(self.model, ModelConfig):
            raise ValueError(f"model: expected a dra.rl.live.model.ModelConfig, got {self.model!r:.80}; "
                             "e.g. model=ModelConfig(**{'d_model': 64})")
        if not isinstance(self.policy, dict):
            raise ValueError(f"policy: expected a dict of StageBalanceConfig options, got {self.policy!r:.80}")
        unknown = sorted(k for k in self.policy if k != "planner" and
                         (not isinstance(k, str) or k.startswith("_") or not hasattr(rl.StageBalanceConfig(), k)))
        if unknown:
            valid = ", ".join(k for k in dir(rl.StageBalanceConfig()) if not k.startswith("_") and k != "validate")
            raise ValueError(f"policy: unknown option {unknown[0]!r}; valid options: {valid}")
        for fixed in ("devices", "group_size"):  # the loop sets them (slots, group_size): a value here was taken over them
            if fixed in self.policy:
                raise ValueError(f"policy.{fixed}: set by the run itself ({'slots' if fixed == 'devices' else fixed}); "
                                 f"drop it from policy and give {'slots' if fixed == 'devices' else fixed}")
        try:  # every option's own check now, not at the first decision with the workers started
            rl.StageBalanceConfig(**{"devices": max(self.slots, 2), "group_size": self.group_size,
                                     **{k: v for k, v in self.policy.items() if k != "planner"}}).validate()
        except (TypeError, ValueError) as e:
            raise ValueError(f"policy: {e}") from None
        if self.trace != "reasoning" and str(self.trace) not in rl.TRACES and not Path(str(self.trace)).is_file():
            raise ValueError(f"trace: {self.trace!r} is neither a shipped trace ({', '.join(rl.TRACES)}), 'reasoning' nor "
                             "a CSV file")
        if self.slots < 2:
            raise ValueError(f"slots: must be >= 2 (one per role), got {self.slots}")
        if self.steps < 1:
            raise ValueError(f"steps: must be >= 1, got {self.steps}")
        if self.prompts_per_step < 1 or self.group_size < 2:
            raise ValueError("prompts_per_step must be >= 1 and group_size >= 2 (GRPO compares samples of a prompt)")
        if not self.drift > 0:
            raise ValueError(f"drift: must be > 0 (1: none), got {self.drift}")
        if self.handoff not in ("deferred", "full"):
            raise ValueError(f"handoff: must be 'deferred' or 'full', got {self.handoff!r}")
        if self.updates_per_step < 1 or (self.prompts_per_step * self.group_size) % self.updates_per_step:
            raise ValueError(f"updates_per_step: must divide the step's batch ({self.prompts_per_step * self.group_size} sequences), "
                             f"got {self.updates_per_step}")
        planner = self.policy.get("planner", "window")
        if planner not in ("window", "lookahead"):
            raise ValueError(f"policy.planner: must be 'window' (decide_window) or 'lookahead' (the look-ahead planner on the "
                             f"leader's snapshot), got {planner!r}")
        if self.prompts_per_step * self.group_size < self.slots:
            raise ValueError(f"prompts_per_step x group_size: a step's batch ({self.prompts_per_step * self.group_size}) must give "
                             f"every one of the {self.slots} slots at least one sample when all but one train")



#: The calibrated reasoning workload scaled to the live model's longest answer (20,480 -> 128
#: tokens): use with ``length_scale=1.0``.
REASONING_SCALE = 128.0 / 20480.0


def task_lengths(trace: str) -> list[float]:
    """The task's target lengths: a shipped Azure trace column, or ("reasoning") the calibrated
    reasoning workload's per-prompt lengths (its hard prompts included; a GRPO group's spread
    comes from what the model generates) scaled by REASONING_SCALE."""
    if trace != "reasoning":
        return rl.trace_lengths(trace)
    pool = rl.reasoning_lengths(steps=1, seed=11, prompts_per_step=8192, group_size=1, drift_final_scale=1.0,
                                reasoning={**rl.LONGGEN_WORKLOAD["reasoning"], "group_sigma": 0.0})[0]
    return [max(1.0, x * REASONING_SCALE) for x in pool]
