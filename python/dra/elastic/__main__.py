"""``python -m dra.elastic store --port P``: a dedicated c10d TCPStore for elastic jobs."""

from __future__ import annotations

import argparse

from dra.elastic._store import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dra.elastic")
    sub = parser.add_subparsers(dest="command", required=True)
    store = sub.add_parser("store", help="host a c10d TCPStore until killed")
    store.add_argument("--port", type=int, required=True)
    store.add_argument("--host", default="0.0.0.0")
    args = parser.parse_args()
    if args.command == "store":
        serve(args.port, args.host)


if __name__ == "__main__":
    main()
