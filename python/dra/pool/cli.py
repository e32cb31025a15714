"""``dra``: the command line of the pool and the launcher.

    dra pool serve  [--inventory slots:4|nvml|auto|ray:ADDRESS|FILE] [--state DIR] [--port P] [--mode dynamic|static]
    dra pool submit [--pool URL] (--spec FILE.json | --name N [--min-size ...] -- COMMAND...)
    dra pool status [--pool URL] [--json]
    dra pool cancel [--pool URL] NAME
    dra pool drain  [--pool URL]
    dra run ...     (see ``dra run --help``)

The pool URL defaults to ``$DRA_POOL`` or http://127.0.0.1:8470.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8470"


def _serve(args: argparse.Namespace) -> int:
    from dra.pool.server import PoolServer
    from dra.pool.service import make_service

    service = make_service(args.inventory, args.state, mode=args.mode, name=args.name, memory_gb=args.slot_memory_gb,
                           heartbeat_timeout_s=args.heartbeat_timeout_s, scale_every_s=args.scale_every_s,
                           completion_aware=args.completion_aware)
    server = PoolServer(service, args.host, args.port).start()
    devs = ", ".join(f"{d.id} ({d.type}, {d.enforcement})" for d in service.inventory.devices)
    print(f"[dra pool] {args.mode} pool '{args.name}' serving {server.url}: {devs}", flush=True)
    print(f"[dra pool] state: {service.state_dir} (events.jsonl, pool.sqlite); metrics: {server.url}/metrics", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    # Slots are kept when leases are live, so a restarted daemon finds its running jobs' cgroups.
    server.close(remove_slots=not any(l.state for l in service.book.all()))
    return 0


def _submit(args: argparse.Namespace, command: list[str]) -> int:
    from dra.pool.server import PoolClient

    spec: dict[str, Any] = json.loads(open(args.spec).read()) if args.spec else {}
    for key in ("name", "kind", "device_type", "memory_gb", "fraction", "min_size", "max_size", "priority"):
        v = getattr(args, key)
        if v is not None:
            spec[key] = v
    if args.rigid:
        spec["elastic"] = False
    if command:
        spec["command"] = command
    spec.setdefault("cwd", os.getcwd())
    print(json.dumps(PoolClient(args.pool).submit(spec)))
    return 0


def _status(args: argparse.Namespace) -> int:
    from dra.pool.server import PoolClient

    st = PoolClient(args.pool).status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"pool {st['pool']} ({st['mode']}{', draining' if st['draining'] else ''}): "
          f"{sum(1 - d['free'] for d in st['devices']):g} of {len(st['devices'])} devices leased")
    for d in st["devices"]:
        holders = [f"{l['job']}#{l['id']}{'*' if l['state'] == 'releasing' else ''}" for l in st["leases"]
                   if l["device"] == d["id"]]
        print(f"  {d['id']:<12} {d['type']:<14} {d['enforcement']:<20} {' '.join(holders) or '-'}")
    for j in st["jobs"]:
        print(f"  job {j['name']:<14} {j['state']:<9} {j['kind']:<9} {j['priority']:<8} "
              f"workers {j['workers']} [{j['min_size']}..{j['max_size']}]{' elastic' if j['elastic'] else ' rigid'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        from dra.launch.cli import main as run_main

        return run_main(argv[1:])
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="dra", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="area", required=True)
    sub.add_parser("run", help="start and supervise a job's workers (dra run --help)")
    pool = sub.add_parser("pool", help="the device pool").add_subparsers(dest="command", required=True)
    url = os.environ.get("DRA_POOL", DEFAULT_URL)
    s = pool.add_parser("serve", help="run the pool daemon")
    s.add_argument("--inventory", default="auto", help="slots:N, nvml, auto, ray[:ADDRESS] or a JSON file")
    s.add_argument("--state", default="dra-pool", help="state directory (SQLite, events.jsonl, logs)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8470)
    s.add_argument("--mode", choices=["dynamic", "static"], default="dynamic")
    s.add_argument("--name", default="pool")
    s.add_argument("--slot-memory-gb", type=float, default=2.0)
    s.add_argument("--heartbeat-timeout-s", type=float, default=3.0)
    s.add_argument("--scale-every-s", type=float, default=2.0)
    s.add_argument("--completion-aware", action="store_true",
                   help="tilt the arbiter by each training job's remaining work (its declared_steps, steps and loss; "
                        "the simulator's convergence_aware policy)")
    sb = pool.add_parser("submit", help="submit a job (its command after '--')")
    sb.add_argument("--pool", default=url)
    sb.add_argument("--spec", help="a JSON job spec; flags override its fields")
    sb.add_argument("--name")
    sb.add_argument("--kind", choices=["training", "inference"])
    sb.add_argument("--device-type", dest="device_type")
    sb.add_argument("--memory-gb", dest="memory_gb", type=float)
    sb.add_argument("--fraction", type=float)
    sb.add_argument("--min-size", dest="min_size", type=int)
    sb.add_argument("--max-size", dest="max_size", type=int)
    sb.add_argument("--priority")
    sb.add_argument("--rigid", action="store_true", help="a fixed size (elastic=false)")
    st = pool.add_parser("status", help="devices, leases and jobs")
    st.add_argument("--pool", default=url)
    st.add_argument("--json", action="store_true")
    c = pool.add_parser("cancel", help="cancel a job (its workers are stopped, its leases released)")
    c.add_argument("--pool", default=url)
    c.add_argument("name")
    d = pool.add_parser("drain", help="accept no new job; running ones finish")
    d.add_argument("--pool", default=url)
    args = p.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "submit":
            return _submit(args, command)
        if args.command == "status":
            return _status(args)
        from dra.pool.server import PoolClient

        client = PoolClient(args.pool)
        print(json.dumps(client.cancel(args.name) if args.command == "cancel" else client.drain()))
        return 0
    except (ValueError, ConnectionError) as e:
        print(f"dra pool {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
