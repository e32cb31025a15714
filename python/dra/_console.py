"""What every console command does at its edges: Ctrl-C (SIGINT) ends it with one line on stderr
and exit status 130, not a ``KeyboardInterrupt`` traceback; a reader that goes away (``dra info |
head -1``) ends it quietly, not with a ``BrokenPipeError`` traceback. A command cleans up what it
made in its own ``finally``/``except BaseException`` blocks, which run before this.

A progress line rewritten in place (``progress``) is ended before the command's own error
(``error``) or a traceback (``end_progress``), which start on a line of their own; Python warnings
and what C++ writes to stderr are not routed through it."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., int])

_open_line = [False]  # a progress line is on stderr without its newline


def progress(text: str, done: bool = False) -> None:
    """Writes ``text`` over the progress line on stderr (ended with a newline when ``done``)."""
    sys.stderr.write("\r" + text + ("\n" if done else ""))
    sys.stderr.flush()
    _open_line[0] = not done


def end_progress() -> None:
    """Ends an open progress line, so what comes next on stderr starts a line of its own."""
    if _open_line[0]:
        _open_line[0] = False
        try:
            sys.stderr.write("\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def error(prog: str, text: str) -> None:
    """``prog: error: text`` on stderr, on a line of its own."""
    end_progress()
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)


def console(prog: str) -> Callable[[F], F]:
    """Decorates a command's ``main(argv=None) -> int``."""

    def wrap(main: F) -> F:
        @functools.wraps(main)
        def guarded(*args, **kwargs):  # type: ignore[no-untyped-def]
            try:
                rc = main(*args, **kwargs)
                sys.stdout.flush()  # a reader gone before the last bytes: caught here, not at exit
                return rc
            except KeyboardInterrupt:
                _open_line[0] = False
                try:
                    # On a line of its own: a progress line ("\r... 3/40 runs") may be open.
                    print(f"\n{prog}: interrupted", file=sys.stderr, flush=True)
                except OSError:
                    pass
                return 130
            except BrokenPipeError:
                _open_line[0] = False
                # Nothing to say, and nothing more to write: the flush at exit would raise again.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 1
            except BaseException:
                end_progress()  # the traceback (or SystemExit's message) on a line of its own
                raise

        return guarded  # type: ignore[return-value]

    return wrap
