"""``python -m dra <command>``: the ``dra`` command (python/dra/cli.py): run, pool, store, info,
sim, bench."""

from __future__ import annotations

import sys

from dra.cli import main

if __name__ == "__main__":
    sys.exit(main())
