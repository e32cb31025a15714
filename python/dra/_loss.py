"""What ``dra.step`` takes as the loss and the signals: a real number or a 0-d tensor, read once,
with a clear error for anything else; and the warning for a non-finite loss."""

from __future__ import annotations

import warnings
from typing import Any


def as_float(value: Any, what: str = "the loss") -> float:
    """A value dra.step takes (the loss, a signal): a real number or a 0-d tensor; anything else
    raises ValueError naming dra.step and the value (the same rule alone and in an elastic job)."""
    if isinstance(value, float):
        return float(value)  # a numpy float64 (a float subclass) as a plain float
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"dra.step: {what} is an int too large for a float ({str(value)[:20]}..., "
                             f"{len(str(value))} digits); pass a real number") from None
    if getattr(value, "is_meta", False) is True:
        raise ValueError(f"dra.step: {what} is a tensor on the meta device, which holds no value; compute it on a real "
                         "device (cpu or cuda) and pass that tensor, or its float")
    item = getattr(value, "item", None)
    shape = getattr(value, "shape", None)
    if item is None or shape is None or isinstance(value, (str, bytes)):
        shown = " ".join(repr(value).split())[:80]  # on one line: a tensor's repr spans several
        fix = ""
        if getattr(value, "loss", None) is not None:  # a model's output object (HuggingFace's ModelOutput)
            fix = "; pass its .loss (e.g. dra.step(outputs.loss))"
        elif isinstance(value, (tuple, list)) and value and all(getattr(v, "shape", None) is not None for v in value):
            fix = "; pass the loss itself, not the tuple it came in (e.g. dra.step(out[0]))"
        raise ValueError(f"dra.step: expected a float or a 0-d tensor as {what}, got {type(value).__name__} {shown}{fix}")
    if len(shape) != 0:
        raise ValueError(f"dra.step: expected a 0-d tensor as {what}, got shape {tuple(shape)}; pass loss.mean() or loss.sum()")
    number = item()
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise ValueError(f"dra.step: {what} holds {type(number).__name__} {number!r}, expected a real number")
    return float(number)


def warn_nonfinite(loss: float, index: int, stacklevel: int = 2, half: bool = False) -> None:
    """Warns about the first non-finite loss of a streak (the estimator counts every one). An inf
    float16 loss names its cause: float16 ends at 65504, so a loss above it (a sum over a batch, a
    loss of a model cast with .half()) is inf at every step."""
    cause = ""
    if half and loss in (float("inf"), float("-inf")):
        cause = ("; the loss is a float16 tensor and exceeded float16's range (largest 65504): compute the loss in "
                 "float32 (e.g. loss_fn(logits.float(), target), or outside autocast), scale it down (a mean instead "
                 "of a sum), or train in bfloat16, whose range is float32's")
    warnings.warn(
        f"dra.step: non-finite loss {loss!r} at step {index} ignored{cause} "
        f"(counted in signals.nonfinite_count; warned once per streak)",
        RuntimeWarning,
        stacklevel=stacklevel,
    )


def is_float16(loss: Any) -> bool:
    """Whether the loss is a float16 tensor (its inf is then most likely an overflow of that range)."""
    dtype = getattr(loss, "dtype", None)
    return dtype is not None and str(dtype) == "torch.float16"


def loss_value(value: Any) -> Any:
    """The loss as dra.step takes it: a float, or a 0-d floating-point tensor on a device (kept
    unread: reading it would synchronise the device); anything else as as_float reads it."""
    is_tensor = getattr(value, "is_cuda", False) and getattr(value, "shape", None) is not None
    if is_tensor and type(value).__module__.startswith("torch"):
        if len(value.shape) != 0:
            raise ValueError(
                f"dra.step: expected a 0-d tensor as the loss, got shape {tuple(value.shape)}; pass loss.mean() or loss.sum()"
            )
        return real_loss_tensor(value).detach()
    return as_float(value)


def real_loss_tensor(value: Any) -> Any:
    """The one rule for a loss tensor's dtype, on every device: floating point as it is; an integer
    one (int64 accuracy counts, say) as float64, as `as_float` takes a Python int; bool and complex
    raise ValueError."""
    import torch

    if value.is_floating_point():
        return value
    if value.dtype == torch.bool or value.is_complex():
        raise ValueError(f"dra.step: the loss holds {value.dtype}, expected a real number (floating point or integer)")
    return value.to(torch.float64)
