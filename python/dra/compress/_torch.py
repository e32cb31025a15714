"""The torch side of dra.compress: collectives over torch.distributed, a gradient reducer that
runs a dra codec on a model's gradients, and the RigL-style dynamic sparsifier."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from dra._core import make_codec, next_sparsity, rank_for_noise_scale, rigl_update, rigl_update_fraction


class TorchCollective:
    """A dra collective over a torch.distributed process group (Gloo on CPU)."""

    def __init__(self, group=None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)

    def allreduce_sum(self, array: np.ndarray) -> None:
        dist.all_reduce(torch.from_numpy(array), group=self.group)

    def allgather(self, payload: bytes) -> bytes:
        mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=self.group)
        return b"".join(t.numpy().tobytes() for t in out)


class LocalCollective:
    """A world of one process (no communication): for single-process runs and tests."""

    world_size = 1

    def allreduce_sum(self, array: np.ndarray) -> None:
        pass

    def allgather(self, payload: bytes) -> bytes:
        return payload


class GradientReducer:
    """Runs a dra codec over a model's gradients after backward(): they become the (approximate)
    mean over the world, in place. Replaces DDP's bucketed all-reduce; parameters without a
    gradient are skipped (every rank must have the same ones)."""

    def __init__(self, model: torch.nn.Module, codec: str = "fp32", collective=None, seed: int = 0) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"GradientReducer: parameter of dtype {p.dtype} on {p.device}; dra's codecs run on "
                                 "float32 CPU tensors (move the model to CPU float32 or use fp32 DDP)")
        self.codec = make_codec(codec, seed)
        self.collective = collective if collective is not None else (
            TorchCollective() if dist.is_available() and dist.is_initialized() else LocalCollective())

    def reduce(self) -> None:
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            grads.append(p.grad.numpy())
        self.codec.reduce(grads, self.collective)


class DynamicSparsifier:
    """RigL-style dynamic sparsity whose target follows the convergence phase.

    Every ``every`` steps (after the gradients were all-reduced, so every rank holds the same
    weights and gradients), the target sparsity moves with the phase (dense while warming up or
    learning fast, sparser once steady or on a plateau, denser on divergence) and each weight
    matrix's mask is updated by dra's ``rigl_update``: no mask is exchanged, every rank derives the
    same one. Regrown weights start at zero, as in RigL. Only parameters with 2+ dimensions are
    sparsified (biases and norms stay dense). Call ``mask_gradients()`` before the gradient sync
    (so a ``masked`` codec sends only active entries) and ``apply()`` after the optimizer step.
    """

    def __init__(self, model: torch.nn.Module, every: int = 200, max_sparsity: float = 0.9, step_up: float = 0.2,
                 step_down: float = 0.3, alpha: float = 0.3, end_step: int = 10_000, initial_sparsity: float = 0.0,
                 follow_phase: bool = True, schedule=None) -> None:
        if every < 1:
            raise ValueError(f"every: must be >= 1, got {every}")
        self.params = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        self.masks = [np.ones(p.numel(), dtype=np.uint8) for p in self.params]
        self.every, self.max_sparsity, self.step_up, self.step_down = every, max_sparsity, step_up, step_down
        self.alpha, self.end_step, self.follow_phase = alpha, end_step, follow_phase
        self.schedule = schedule  # step -> target sparsity; replaces the phase rule when given
        self.sparsity = 0.0
        self.history: list[tuple[int, float, str]] = []
        if initial_sparsity > 0:
            self._update(0, initial_sparsity, 0.0)

    def mask_tensors(self) -> list[torch.Tensor]:
        return [torch.from_numpy(m).view(p.shape) for m, p in zip(self.masks, self.params)]

    def mask_gradients(self) -> None:
        with torch.no_grad():
            for p, m in zip(self.params, self.mask_tensors()):
                if p.grad is not None:
                    p.grad.mul_(m)

    def apply(self) -> None:
        with torch.no_grad():
            for p, m in zip(self.params, self.mask_tensors()):
                p.mul_(m)

    def _update(self, step: int, target: float, fraction: float) -> None:
        with torch.no_grad():
            for p, mask in zip(self.params, self.masks):
                w = p.detach().reshape(-1).numpy()
                g = p.grad.detach().reshape(-1).numpy() if p.grad is not None else np.zeros_like(w)
                before = mask.copy()
                rigl_update(mask, w, g, target, fraction)
                regrown = torch.from_numpy((mask == 1) & (before == 0)).view(p.shape)
                p.masked_fill_(regrown, 0.0)  # RigL: regrown connections start at zero
        self.sparsity = target
        self.apply()

    def step(self, step: int, phase: str) -> bool:
        """Call after the gradient sync (gradients all-reduced) and before the optimizer step.
        Returns True when the masks were updated at this step."""
        if step == 0 or step % self.every:
            return False
        if self.schedule is not None:
            target = float(self.schedule(step))
        elif self.follow_phase:
            target = next_sparsity(self.sparsity, phase, self.max_sparsity, self.step_up, self.step_down)
        else:
            target = self.max_sparsity
        self._update(step, target, rigl_update_fraction(self.alpha, step, self.end_step))
        self.history.append((step, target, phase))
        return True

    def sparse_fraction(self) -> float:
        total = sum(m.size for m in self.masks)
        return 1.0 - sum(int(m.sum()) for m in self.masks) / max(total, 1)


def rank_from_signals(signals, global_batch: float, min_rank: int = 1, max_rank: int = 8) -> int:
    """PowerSGD rank that follows the gradient noise scale of dra's estimator (see rank_for_noise_scale)."""
    return rank_for_noise_scale(signals.gns, signals.gns_valid, global_batch, min_rank, max_rank)
