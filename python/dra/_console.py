"""What every console command does at its edges: Ctrl-C (SIGINT) ends it with one line on stderr
and exit status 130, not a ``KeyboardInterrupt`` traceback; a reader that goes away (``dra info |
head -1``) ends it quietly, not with a ``BrokenPipeError`` traceback. A command cleans up what it
made in its own ``finally``/``except BaseException`` blocks, which run before this."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., int])


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
                try:
                    # On a line of its own: a progress line ("\r... 3/40 runs") may be open.
                    print(f"\n{prog}: interrupted", file=sys.stderr, flush=True)
                except OSError:
                    pass
                return 130
            except BrokenPipeError:
                # Nothing to say, and nothing more to write: the flush at exit would raise again.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 1

        return guarded  # type: ignore[return-value]

    return wrap
