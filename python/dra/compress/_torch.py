"""The torch side of dra.compress: collectives over torch.distributed, a gradient reducer that
runs a dra codec on a model's gradients, and RigL dynamic sparsity for a trainer's own sync."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from dra._core import RiglMasks, make_codec, rank_for_noise_scale


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
    gradient count as zero (every rank must have the same ones). With the ``masked`` codec the
    parameters' values go along (its mask-update steps read them) and ``apply_masks()`` zeroes the
    pruned weights after the optimizer step (what dra.Controller does at its step boundary)."""

    def __init__(self, model: torch.nn.Module, codec: str = "fp32", collective=None, seed: int = 0,
                 sparsity: dict | None = None) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"GradientReducer: parameter of dtype {p.dtype} on {p.device}; dra's codecs run on "
                                 "float32 CPU tensors (move the model to CPU float32 or use fp32 DDP)")
        self.codec = make_codec(codec, seed, sparsity or {})
        self.collective = collective if collective is not None else (
            TorchCollective() if dist.is_available() and dist.is_initialized() else LocalCollective())

    def reduce(self, exact: np.ndarray | None = None) -> None:
        """``exact``: a float32 array summed over the world in place alongside (uncompressed, in the
        codec's first all-reduce: a loss or a gradient norm at no extra round trip)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            grads.append(p.grad.numpy())
        weights = [p.detach().numpy() for p in self.params] if self.codec.update_next else None
        self.codec.reduce(grads, self.collective, weights, exact)

    def apply_masks(self) -> None:
        """``masked``: zeroes the pruned weights (call after the optimizer step)."""
        with torch.no_grad():
            for p, m in zip(self.params, self.codec.masks):
                if m is not None:
                    p.mul_(torch.from_numpy(m).view(p.shape).to(p.dtype))


class DynamicSparsifier:
    """RigL dynamic sparsity for a trainer that syncs its gradients itself (dra.Controller's
    ``compress="masked"`` does all of this inside the controller; both use dra's ``RiglMasks``).

    Every ``every`` steps (``update_due(step)``), while ``step < end_step``, each weight matrix's mask
    is updated the RigL way: the smallest-|w| active weights are dropped and the entries with the
    largest **dense** gradient are grown (ties broken by keys drawn from ``seed``, the same on
    every rank), after the active count moved to the target: the phase rule (dense while warming
    up or learning fast, sparser once steady, denser on divergence, a divergence right after a rise
    undoing it and capping later rises: ``rigl.ceiling``) or, with ``ramp_steps``, Zhu &
    Gupta's cubic ramp. On those steps the gradients must be the world's dense mean (sync them
    uncompressed there); ``mask_gradients()`` then keeps only entries active before and after the
    update (regrown weights start at zero, as in RigL), and ``apply()`` after the optimizer step
    zeroes the pruned weights. Only parameters with 2+ dimensions are sparsified.
    """

    def __init__(self, model: torch.nn.Module, every: int = 100, max_sparsity: float = 0.9, step_up: float = 0.2,
                 step_down: float = 0.3, alpha: float = 0.3, end_step: int = 10_000, ramp_start: int = 0,
                 ramp_steps: int = 0, seed: int = 0) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.rigl = RiglMasks(seed, max_sparsity=max_sparsity, every=every, alpha=alpha, end_step=end_step,
                              step_up=step_up, step_down=step_down, ramp_start=ramp_start, ramp_steps=ramp_steps)
        self.rigl.fit([tuple(p.shape) for p in self.params])
        self.history: list[tuple[int, float, str]] = []
        self._grown: dict[int, np.ndarray] = {}

    @property
    def sparsity(self) -> float:
        return self.rigl.sparsity

    @property
    def masks(self) -> list[np.ndarray]:
        """The sparsified parameters' masks (uint8, 1 active), in parameter order."""
        return [self.rigl.mask(i) for i in range(len(self.params)) if self.rigl.sparsified(i)]

    def update_due(self, step: int) -> bool:
        """Whether the update after ``step`` completed steps changes the masks (sync densely then)."""
        return self.rigl.update_due(step)

    def step(self, step: int, phase: str) -> bool:
        """Call after the gradient sync and before the optimizer step; returns True when the masks
        were updated (``step``: steps completed before this one)."""
        if not self.update_due(step):
            return False
        before = {i: self.rigl.mask(i) for i in range(len(self.params)) if self.rigl.sparsified(i)}
        target = self.rigl.target(step, phase)
        weights = [p.detach().reshape(-1).numpy() for p in self.params]
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).numpy()
                 for p in self.params]
        self.rigl.update(step, target, weights, grads)
        self._grown = {i: (self.rigl.mask(i) == 1) & (m == 0) for i, m in before.items()}
        self.history.append((step, target, phase))
        return True

    def mask_gradients(self) -> None:
        """Zeroes the gradient of pruned entries (and of entries grown at this step's update)."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                if p.grad is None or not self.rigl.sparsified(i):
                    continue
                keep = self.rigl.mask(i).astype(bool)
                if i in self._grown:
                    keep &= ~self._grown[i]
                p.grad.mul_(torch.from_numpy(keep).view(p.shape).to(p.grad.dtype))
        self._grown = {}

    def apply(self) -> None:
        """Zeroes the pruned weights (call after the optimizer step)."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                if self.rigl.sparsified(i):
                    p.mul_(torch.from_numpy(self.rigl.mask(i)).view(p.shape).to(p.dtype))

    def sparse_fraction(self) -> float:
        return self.rigl.sparse_fraction()


def rank_from_signals(signals, global_batch: float, min_rank: int = 1, max_rank: int = 8) -> int:
    """PowerSGD rank that follows the gradient noise scale of dra's estimator (see rank_for_noise_scale)."""
    return rank_for_noise_scale(signals.gns, signals.gns_valid, global_batch, min_rank, max_rank)
