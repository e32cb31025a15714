"""The measured state of the resize benchmarks: a model of a given size in megabytes."""

from __future__ import annotations

import os


def blob_model(mb: float):
    """`mb` MB of float32 parameters in 4 MB tensors; forward(x) is a scalar touching them all."""
    import torch

    class _Blob(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            n = max(1, int(round(mb / 4)))
            per = int(mb * (1 << 20) / 4 / n)
            self.blocks = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(per)) for _ in range(n)])

        def forward(self, x):
            return sum((p * x).sum() for p in self.blocks) * 1e-6

    torch.manual_seed(int(os.environ.get("RANK", "0")))
    return _Blob()
