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


def seed32_arg(text: str) -> int:
    """A seed that reaches NumPy's legacy generator (scikit-learn's ``random_state``, PowerSGD's
    ``random_seed``): an integer in [0, 2^32)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer; give a seed in [0, 2^32)") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give a seed in [0, 2^32) (NumPy's limit)")
    return value


def integer_arg(text: str) -> int:
    """Any integer (a seed that only names a run, negative ones too)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer; give an integer") from None


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


def positive_arg(text: str) -> float:
    """A finite number > 0 (a duration, a size)."""
    value = finite_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not > 0; give a finite number > 0")
    return value


def nonnegative_arg(text: str) -> float:
    """A finite number >= 0."""
    value = finite_arg(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; give a finite number >= 0")
    return value


def fraction_arg(text: str) -> float:
    """A share of one device: a finite number in (0, 1]."""
    value = finite_arg(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1]; give a share of one device in (0, 1] "
                                         "(more than a device: ask for more workers)")
    return value


def probability_arg(text: str) -> float:
    """A probability or a weight between its two ends: a finite number in [0, 1]."""
    value = finite_arg(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]; give a finite number in [0, 1]")
    return value


def count_arg(text: str) -> int:
    """A count: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer; give an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1; give an integer >= 1")
    return value


def nonnegative_int_arg(text: str) -> int:
    """An integer >= 0 (a rank, a number of restarts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer; give an integer >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give an integer >= 0")
    return value


def std_streams_arg(text: str) -> int:
    """torchrun's ``--tee`` / ``--redirects`` for every local rank: 0 (none), 1 (stdout), 2 (stderr), 3 (both)."""
    try:
        value = int(text)
    except ValueError:
        more = (" (a per-rank map such as 0:3,1:0 is not taken here: give one value for every rank, and "
                "--local-ranks-filter to choose the ranks shown)") if ":" in text else ""
        raise argparse.ArgumentTypeError(f"'{text}' is not one of 0, 1, 2, 3{more}; give 0 (none), 1 (stdout), "
                                         "2 (stderr) or 3 (both)") from None
    if not 0 <= value <= 3:
        raise argparse.ArgumentTypeError(f"{value} is not one of 0, 1, 2, 3; give 0 (none), 1 (stdout), 2 (stderr) "
                                         "or 3 (both)")
    return value


def path_arg(text: str) -> str:
    """A path: not empty (``Path("")`` is the current folder, which an empty value would silently mean)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; give a path (or leave the option out for its default)")
    return text
