"""Numbers as ``dra-sim`` reads them, on its command line and in the CSV files it is given.

Only plain decimals are numbers here: ASCII digits with an optional fraction (``60``, ``0.5``,
``.5``). Python's ``int()``/``float()`` and C's ``strtod`` also take ``0x10`` (hex), ``1_000``,
``1e3``, ``+5``, `` 5 ``, ``inf`` and ``nan``; a time or a count written so is almost always a
mistake (a hex dump, a spreadsheet's formatting), so each is refused with the value, where it was
and what to write instead. The shared types of :mod:`dra._argtypes` are left as they are (other
commands use them)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path

_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_INTEGER = re.compile(r"[0-9]+", re.ASCII)

#: What a plain decimal is, for error messages.
PLAIN_DECIMAL = "digits with an optional fraction, e.g. 60 or 0.5 (no sign, exponent, hex, underscores, spaces, inf or nan)"
PLAIN_INTEGER = "digits only, e.g. 8 (no sign, fraction, exponent, hex, underscores or spaces)"


def plain_decimal(text: object) -> float | None:
    """``text`` as a float when it is a plain finite non-negative decimal, else None."""
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def plain_integer(text: object) -> int | None:
    """``text`` as an int when it is plain digits, else None."""
    if not isinstance(text, str) or not _INTEGER.fullmatch(text):
        return None
    return int(text)


def too_large(text: object) -> bool:
    """A plain decimal whose value does not fit a float (``999...9``, 309 digits and more)."""
    return isinstance(text, str) and bool(_DECIMAL.fullmatch(text)) and not math.isfinite(float(text))


def shown_value(text: str) -> str:
    """``text`` for a message: quoted, at most 40 characters of it, control characters (a tab, a
    NUL) written visibly as escapes."""
    def visible(part: str) -> str:
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in part)

    return f"'{visible(text)}'" if len(text) <= 40 else f"'{visible(text[:20])}...' ({len(text)} characters)"


def _fmt(value: float) -> str:
    return f"{value:g}" if value != int(value) or abs(value) >= 1e15 else str(int(value))


def decimal_arg(unit: str = "", *, low: float = 0.0, low_open: bool = False, high: float | None = None,
                why_high: str = "") -> Callable[[str], float]:
    """An argparse type: a plain decimal in [low, high] (``low_open``: above low)."""
    words = f" of {unit}" if unit else ""

    def parse(text: str) -> float:
        value = plain_decimal(text)
        if value is None and too_large(text):
            raise argparse.ArgumentTypeError(f"{shown_value(text)} is too large; give "
                                             f"{'at most ' + _fmt(high) if high is not None else 'a smaller number'}")
        if value is None:
            raise argparse.ArgumentTypeError(f"{shown_value(text)} is not a plain decimal number{words}; write {PLAIN_DECIMAL}")
        if value < low or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"{text} is out of range; give a number {'>' if low_open else '>='} {_fmt(low)}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text} is above the bound {_fmt(high)}{why_high}; give at most {_fmt(high)}")
        return value

    parse.__name__ = "decimal"
    return parse


def integer_arg(*, low: int = 0, high: int | None = None, why_high: str = "") -> Callable[[str], int]:
    """An argparse type: plain digits, a value in [low, high]."""

    def parse(text: str) -> int:
        value = plain_integer(text)
        if value is None:
            raise argparse.ArgumentTypeError(f"'{text}' is not a plain whole number; write {PLAIN_INTEGER}")
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is out of range; give a whole number >= {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above the bound {high}{why_high}; give at most {high}")
        return value

    parse.__name__ = "integer"
    return parse


def seed_arg(text: str) -> int:
    """A seed: plain digits, a value in [0, 2^64)."""
    if re.fullmatch(r"-[0-9]+", text, re.ASCII):
        raise argparse.ArgumentTypeError(f"{text} is out of range; give a seed in [0, 2^64)")
    value = plain_integer(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"'{text}' is not a plain whole number; give a seed in [0, 2^64), {PLAIN_INTEGER}")
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give a seed in [0, 2^64)")
    return value


def check_csv(path: str | Path, numbers: dict[str, str] | None = None, *, utf8: bool = False) -> list[int]:
    """Checks a CSV file the simulator's C++ reader (``dra::sim::csv_table``) reads, for what that
    reader lets through (it refuses hexadecimal, inf, nan and a repeated column name itself): in the
    columns of ``numbers`` (name -> ``"decimal"``, ``"decimal_or_empty"``
    or ``"integer"``), a cell that is not a plain decimal (``strtod`` reads ``0x10`` as 16); with
    ``utf8``, a line that is not UTF-8 text (its text reaches Python, whose decoding error named
    neither file nor line). Splits lines as that reader does (plain commas, no quoting, spaces and
    tabs around a cell trimmed, blank lines and lines of spaces skipped, a UTF-8 byte-order mark
    dropped); stops at a row whose field count differs from the header's, which that reader refuses.
    Returns the file line of each data row checked. Raises ValueError naming file, line, column and
    value."""
    numbers = numbers or {}
    if Path(path).is_dir():  # the C++ reader opens a folder and reads it as an empty file
        raise ValueError(f"{path} is a directory; give a CSV file")
    header: list[str] | None = None
    lines: list[int] = []
    columns: dict[str, int] = {}
    for line_no, data in enumerate(Path(path).read_bytes().split(b"\n"), start=1):
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if utf8:
                raise ValueError(
                    f"{path}:{line_no}: byte 0x{data[exc.start]:02x} (byte {exc.start + 1} of the line) is not "
                    "UTF-8 text; save the file as UTF-8"
                ) from None
            raw = data.decode("utf-8", errors="replace")
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip(" \t"):
            continue
        cells = line.split(",")
        if header is None:
            if line_no == 1 and cells[0].startswith("\ufeff"):
                cells[0] = cells[0][1:]
            header = [c.strip(" \t") for c in cells]
            seen: dict[str, int] = {}
            for i, name in enumerate(header):  # a name repeated: the C++ reader refuses it, by name
                seen.setdefault(name, i)
            columns = {name: seen[name] for name in numbers if name in seen}
            if not numbers:
                break  # the header was all to check
            continue
        if len(cells) != len(header):
            break  # the C++ reader refuses this row already
        for col, cell in enumerate(cells):
            bad = next((c for c in cell if (ord(c) < 32 and c != "\t") or ord(c) == 127), None)
            if bad is not None:
                name = header[col] if col < len(header) else str(col + 1)
                raise ValueError(f"{path}:{line_no}: column '{name}' ({col + 1}): {shown_value(cell)} holds a control "
                                 f"character ({repr(bad)[1:-1]}); remove it")
        lines.append(line_no)
        for name, kind in numbers.items():
            if name not in columns:
                continue
            col = columns[name]
            cell = cells[col]
            if kind == "decimal_or_empty" and cell.strip(" \t") == "":
                continue
            ok = plain_integer(cell) is not None if kind == "integer" else plain_decimal(cell) is not None
            if not ok and kind != "integer" and too_large(cell):
                raise ValueError(f"{path}:{line_no}: column '{name}' ({col + 1}): {shown_value(cell)} is too large a number; "
                                 "give a smaller one")
            if not ok:
                form = PLAIN_INTEGER if kind == "integer" else PLAIN_DECIMAL
                raise ValueError(
                    f"{path}:{line_no}: column '{name}' ({col + 1}): {shown_value(cell)} is not a plain "
                    f"{'whole number' if kind == 'integer' else 'decimal number'}; write {form}"
                )
    return lines


def check_output_paths(json: str | None = None, markdown: str | None = None, plots: str | None = None,
                       inputs: list[tuple[str, str]] | None = None) -> None:
    """Refuses, before anything is simulated, an output path that cannot be written (see
    :func:`check_output_path`), or that is one of the ``inputs`` (``(option, path)`` pairs: it
    would be overwritten) or another output (one would replace the other); paths are compared
    resolved (``./a.csv``, ``a.csv`` and a link to it are one file)."""
    outputs = [(f, p) for f, p in (("--json", json), ("--markdown", markdown), ("--plots", plots)) if p is not None]
    for flag, path in outputs:
        check_output_path(flag, path, folder=flag == "--plots")
    for i, (flag, path) in enumerate(outputs):
        for other, given in outputs[:i]:
            if _same_path(path, given):
                raise ValueError(f"{flag}: {path} is also the {other} output, and one would replace the other; "
                                 f"give {flag} and {other} different paths")
        for other, given in inputs or ():
            if _same_path(path, given):
                raise ValueError(f"{flag}: {path} is also the {other} input, which it would overwrite; "
                                 f"give {flag} another path")
    if plots is not None:
        check_plotting("--plots")


def _same_path(a: str, b: str) -> bool:
    """Whether two paths name one file or folder (resolved; the same file by another name too)."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.exists() and pb.exists():
            return pa.samefile(pb)
        return pa.resolve() == pb.resolve()
    except OSError:
        return False


def check_plotting(flag: str) -> None:
    """Refuses, before any work, plots asked for where matplotlib is missing: dra installs it only
    with its ``plot`` extra (the project's venv has it), and the import would fail after the run."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            f"{flag}: the plots need matplotlib, which is not installed here ({exc}); "
            "pip install 'dra[plot]' (or matplotlib), or drop " + flag
        ) from None


def check_output_path(flag: str, path: str, *, folder: bool = False) -> None:
    """Refuses, before any work, an output path that cannot be written: empty, a folder where a
    file goes (``folder`` False) or a file where a folder goes, or in a place where nothing can be
    created (a read-only folder, ``/proc``). Raises ValueError naming the option, the path and the
    fix."""
    import tempfile

    want = "a folder" if folder else "a file path"
    if not path.strip():
        raise ValueError(f"{flag}: the path is empty; give {want}")
    p = Path(path)
    if not folder and p.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give a file path")
    if folder and p.exists() and not p.is_dir():
        raise ValueError(f"{flag}: {path} is a file; give a directory")
    where = p if folder else p.parent
    while not where.exists() and where != where.parent:
        where = where.parent  # the nearest folder that exists: the rest is created
    if not where.is_dir():
        raise ValueError(f"{flag}: {path}: {where} is a file, so nothing can be created under it; give {want} elsewhere")
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        raise ValueError(f"{flag}: {path}: cannot create files in {where} ({exc.strerror or exc}); "
                         "give a writable path") from None
