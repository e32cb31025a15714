"""Communication-efficient gradient sync and dynamic sparsification (docs/design/sustainable.md).

The codecs are dra's torch-free C++ core (``include/dra/compress``); here they run on a torch
model's gradients through a collective (``TorchCollective`` over ``torch.distributed``):

    reducer = dra.compress.GradientReducer(model, "powersgd:4")
    loss.backward(); reducer.reduce(); optimizer.step()
    reducer.codec.bytes_sent, reducer.codec.bytes_dense

Codec specs: ``fp32``, ``fp16``, ``bf16``, ``powersgd:<rank>``, ``topk:<fraction>``,
``random:<keep fraction>`` (a random mask drawn identically on every rank), ``masked[:<max
sparsity>]`` (sparse training: RigL masks derived identically on every rank, only active entries
travel; ``dra.Controller(compress="masked", sparsity={...})`` runs it inside the controller).
"""
from __future__ import annotations

from dra._core import (
    GradientCodec,
    RiglMasks,
    cubic_sparsity,
    make_codec,
    next_sparsity,
    rank_for_noise_scale,
    rigl_tie_seed,
    rigl_update,
    rigl_update_fraction,
)
from dra.compress._torch import DynamicSparsifier, GradientReducer, LocalCollective, TorchCollective

__all__ = [
    "DynamicSparsifier",
    "GradientCodec",
    "GradientReducer",
    "LocalCollective",
    "RiglMasks",
    "TorchCollective",
    "cubic_sparsity",
    "make_codec",
    "next_sparsity",
    "rank_for_noise_scale",
    "rigl_tie_seed",
    "rigl_update",
    "rigl_update_fraction",
]
