"""``dra``: one command for everything dra runs.

    dra run ...           launch a training job, torchrun's flags (dra run --help)
    dra pool ...          the device pool: serve, submit, status, cancel, drain (dra pool --help)
    dra store --port P    host a dedicated c10d store for elastic jobs (until killed)
    dra info              what this build contains, as JSON
    dra sim ...           the cluster simulator: replay, study, rl (dra sim --help)
    dra bench ...         the benchmark suites, from a checkout (dra bench --help)

``python -m dra ...`` is the same command. The older entry points keep working: ``dra-sim``,
``python -m dra.bench``, ``python -m dra.pool.cli``, ``python -m dra.pool.launcher``.
"""

from __future__ import annotations

import sys

from dra._console import console

_COMMANDS = {
    "run": "launch a training job (torchrun's flags; workers survive each other)",
    "pool": "the device pool: serve, submit, status, cancel, drain",
    "store": "host a dedicated c10d store for elastic jobs until killed",
    "info": "print what this build of dra contains, as JSON",
    "sim": "the cluster simulator: replay, study, rl",
    "bench": "the benchmark suites (from a checkout of dra)",
}


def _usage() -> str:
    width = max(map(len, _COMMANDS))
    lines = ["usage: dra <command> [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in _COMMANDS.items()]
    lines += ["", "dra <command> --help describes each."]
    return "\n".join(lines)


def serve_store(port: int, host: str = "127.0.0.1") -> None:
    """Hosts a c10d TCPStore until killed: a dedicated store for elastic jobs, which must outlive
    every process of the job (point them at it with ``DRA_STORE=host:port``, and torchrun's
    ``--rdzv-endpoint``). Prints ``[dra] store listening on HOST:PORT`` once it is up.

    A c10d store has no authentication (torchrun's neither): whoever reaches it can write the
    job's keys. It listens on the loopback unless told otherwise; an address other nodes reach is
    warned about once, naming what to do."""
    import ipaddress
    import time

    from dra.launch.rendezvous import host_store

    store = host_store(host, int(port))
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        print(f"[dra] warning: the store on {host} has no authentication: anyone who reaches that address and port "
              "can write the job's keys; bind it to the nodes' private network and keep the port firewalled from "
              "everyone else", file=sys.stderr, flush=True)
    print(f"[dra] store listening on {host}:{store.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def _store(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="dra store", description=serve_store.__doc__)
    p.add_argument("--port", type=int, required=True, help="port to listen on (0: a free one, printed)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: the loopback, one node; for several nodes the address they "
                        "reach, e.g. 0.0.0.0 or the private network's: the store has no authentication)")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port: must lie in [0, 65535], got {args.port}")
    try:
        serve_store(args.port, args.host)
    except ValueError as e:
        print(f"dra store: {e}", file=sys.stderr)
        return 2
    return 0


def _info(argv: list[str]) -> int:
    import argparse
    import json

    import dra

    argparse.ArgumentParser(prog="dra info", description="Prints what this build of dra contains (version, torch, "
                            "compiler, backends), as JSON.").parse_args(argv)
    print(json.dumps(dra.build_info(), indent=2))
    return 0


@console("dra")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from dra.launch.cli import main as run

        return run(rest)
    if command == "pool":
        from dra.pool.cli import main as pool

        return pool(["pool", *rest])
    if command == "store":
        return _store(rest)
    if command == "info":
        return _info(rest)
    if command == "sim":
        from dra.sim.cli import main as sim

        return sim(rest)
    if command == "bench":
        from dra.bench.__main__ import main as bench

        return bench(rest)
    print(f"dra: unknown command '{command}'\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
