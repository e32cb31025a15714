"""``python -m dra <command>``: the package's commands.

- ``store --port P [--host H]``: host a dedicated c10d TCPStore for elastic jobs; it must outlive
  every process of the job (point them at it with ``DRA_STORE=host:port``). Prints
  ``[dra] store listening on HOST:PORT`` once it is up (port 0: a free port).
- ``info``: print ``dra.build_info()`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta


def serve_store(port: int, host: str = "0.0.0.0") -> None:
    """Hosts a c10d TCPStore until killed."""
    import torch.distributed as dist

    store = dist.TCPStore(host, int(port), None, True, timedelta(seconds=60), wait_for_workers=False)
    print(f"[dra] store listening on {host}:{store.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    store = sub.add_parser("store", help="host a c10d TCPStore for elastic jobs until killed")
    store.add_argument("--port", type=int, required=True, help="port to listen on (0: a free one, printed)")
    store.add_argument("--host", default="0.0.0.0", help="address to bind (default: all)")
    sub.add_parser("info", help="print what this build of dra contains, as JSON")
    args = parser.parse_args(argv)
    if args.command == "store":
        if not 0 <= args.port <= 65535:
            parser.error(f"--port: must lie in [0, 65535], got {args.port}")
        serve_store(args.port, args.host)
        return 0
    import dra

    print(json.dumps(dra.build_info(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
