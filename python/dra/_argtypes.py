"""Argument types the command lines share (argparse ``type=``): values checked where they are
read, with an error naming the value and what to give instead."""

from __future__ import annotations

import argparse


def seed_arg(text: str) -> int:
    """A seed: an integer in [0, 2^64)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer; give a seed in [0, 2^64)") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give a seed in [0, 2^64)")
    return value


def finite_arg(text: str) -> float:
    """A finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"'{text}' is not finite; give a finite number")
    return value


def port_arg(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number; give 0-65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port; give 0-65535 (0: any free one)")
    return value
