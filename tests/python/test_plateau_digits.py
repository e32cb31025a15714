"""The plateau detector against a live training loss: the digits MLP (real data, real SGD).

The windowed test alone raised a plateau early in this run (the digits main job dropped to one
process at step 130 of 860); with the scale-free history guard the simulator and the
convergence-aware policy use (estimator_config.plateau_history_fraction), no plateau is reported
before half of the run. The guard is the default (the live controller's, the pool's and the
simulator's)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import dra

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from digits_data import build_model, load_data  # noqa: E402

STEPS = 860


def _digits_losses(seed: int) -> list[float]:
    torch.manual_seed(seed)
    x_train, _, y_train, _ = load_data(seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses: list[float] = []
    while len(losses) < STEPS:
        order = torch.randperm(len(x_train))
        for start in range(0, len(order) - 32 + 1, 32):
            idx = order[start : start + 32]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().item())
            if len(losses) == STEPS:
                break
    return losses


def _first_plateau(losses: list[float], config: dra.EstimatorConfig) -> int | None:
    est = dra.ConvergenceEstimator(config)
    for step, loss in enumerate(losses):
        est.update_loss(step, loss)
        if est.signals.plateau:
            return step
    return None


def test_no_plateau_before_half_of_the_digits_run() -> None:
    for seed in (0, 1):
        losses = _digits_losses(seed)
        guarded = _first_plateau(losses, dra.EstimatorConfig())  # the default: the history guard on
        assert dra.EstimatorConfig().plateau_history_fraction == 0.25
        windowed = _first_plateau(losses, dra.EstimatorConfig(plateau_history_fraction=0.0))
        print(f"seed {seed}: first plateau windowed-only at step {windowed}, with the history guard at {guarded}")
        assert guarded is None or guarded >= STEPS // 2, (seed, guarded)
