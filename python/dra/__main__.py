"""``python -m dra <command>``: the package's commands.

- ``store --port P [--host H]``: host a dedicated c10d TCPStore for elastic jobs (same as
  ``python -m dra.elastic store``); it must outlive every process of the job.
- ``info``: print ``dra.build_info()`` as JSON.
- ``pool ...`` and ``run ...``: the device pool and the launcher (the ``dra`` command; docs/guide/pool.md).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command = argv[0]
    if command == "store":
        from dra.elastic.__main__ import main as elastic_main

        sys.argv = ["python -m dra", *argv]
        elastic_main()
        return 0
    if command in ("pool", "run"):
        from dra.pool.cli import main as pool_main

        return pool_main(argv)
    if command == "info":
        import dra

        print(json.dumps(dra.build_info(), indent=2))
        return 0
    print(f"python -m dra: unknown command '{command}'; use 'store' or 'info'", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
