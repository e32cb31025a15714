"""``dra``: the command line of the pool and the launcher.

    dra pool serve  [--inventory slots:4|slots:NxC|nvml|auto|ray:ADDRESS|FILE] [--state DIR] [--socket PATH]
                    [--port P [--host H] [--token-file F]] [--mode dynamic|static|static_naive]
    dra pool submit [--pool URL] (--spec FILE.json | --name N [--min-size ...]) [--env K=V] [--cwd DIR] [--ray]
                    -- COMMAND...
    dra pool status [--pool URL] [--json]
    dra pool cancel [--pool URL] NAME
    dra pool drain  [--pool URL] [--undo]
    dra pool schema                     (the job spec's JSON Schema)
    dra run ...     (see ``dra run --help``)

The pool listens on a Unix socket (``<state>/pool.sock``) and knows each caller from it; TCP only
with ``--port``, a token and loopback (``--allow-remote`` to insist otherwise). The pool URL
defaults to ``$DRA_POOL`` or ``unix:dra-pool/pool.sock``; on TCP give the token with
``--token-file`` or ``$DRA_POOL_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from dra._argtypes import (
    count_arg,
    fraction_arg,
    nonnegative_arg,
    nonnegative_int_arg,
    path_arg,
    port_arg,
    positive_arg,
)
from dra._console import console

LOOPBACK = ("127.0.0.1", "::1", "[::1]", "localhost")


def _serve(args: argparse.Namespace) -> int:
    from dra.pool import _auth, _clock, _state
    from dra.pool._quota import UserLimits
    from dra.pool._records import ENDED
    from dra.pool.factory import make_service
    from dra.pool.server import PoolServer

    state = Path(args.state)
    created = _first_missing(state)  # the topmost folder this start makes (None: the state was there)
    _state.state_dir(state)
    before = set(os.listdir(state)) if created is None else set()
    token_path = None if args.port is None or args.token_file else state / "token"
    made_token = token_path is not None and not token_path.exists() and not token_path.is_symlink()
    try:
        token = None
        if args.port is not None:
            token = _auth.load_token(args.token_file or state / "token", create=args.token_file is None)
            if args.host not in LOOPBACK:
                if not args.allow_remote:
                    raise ValueError(f"host: {args.host} is reachable from other machines; the pool binds to loopback "
                                     "(127.0.0.1) unless told --allow-remote")
                print(f"[dra pool] WARNING: the pool's API listens on {args.host}:{args.port}, reachable from other "
                      f"machines in clear text: anyone elsewhere who has the token runs jobs here as any user", file=sys.stderr,
                      flush=True)
        # Listeners first: a socket or port in use fails before the pool makes any cgroup.
        server = PoolServer(socket_path=args.socket or state / "pool.sock", host=args.host, port=args.port,
                            token=token, allow_remote=args.allow_remote)
        try:
            service = make_service(args.inventory, state, mode=args.mode, name=args.name,
                                   memory_gb=args.slot_memory_gb, heartbeat_timeout_s=args.heartbeat_timeout_s,
                                   scale_every_s=args.scale_every_s, orphan_limit_s=args.orphan_limit_s,
                                   restart_backoff_s=args.restart_backoff_s,
                                   silence_limit_s=args.silence_limit_s, guarantee_slots=not args.no_slot_guarantee,
                                   control_cpus=args.control_cpus or None,
                                   launcher_memory_gb=args.launcher_memory_gb or None,
                                   completion_aware=args.completion_aware, warm_launchers=args.warm_launchers,
                                   user_limits=UserLimits(active=args.max_active_per_user, kept=args.max_kept_per_user,
                                                          ended=args.max_ended, priority=args.user_priority),
                                   events_max_mb=args.events_max_mb)
        except BaseException:
            server.close()
            raise
    except BaseException:
        _undo_start(state, created, before, token_path if made_token else None)
        raise
    server.attach(service).start()
    # From the status (read under the service's lock): a Ray watcher may already be changing the inventory.
    devs = ", ".join(f"{d['id']} ({d['type']}, {d['enforcement']})" for d in service.status()["devices"])
    where = server.url + (f" and {server.tcp_url} (token)" if server.tcp_url else "")
    print(f"[dra pool] {args.mode} pool '{args.name}' serving {where}: {devs}", flush=True)
    print(f"[dra pool] state: {service.state_dir} (events.jsonl, pool.sqlite, logs/)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    grace_s = ray_head_grace_s()
    while not stop.wait(1.0):
        lost_at = service.ray_head_lost_at
        if lost_at is not None and _clock.now() - lost_at > grace_s:
            # Ray ends every process connected to a cluster whose head stays away: stop first, in
            # order (state saved, socket removed), and say what to do.
            print(f"[dra pool] the Ray cluster's head has been unreachable for {_clock.now() - lost_at:.0f} s (the pool "
                  f"waited {grace_s:g} s, under Ray's gcs_rpc_server_reconnect_timeout_s): this pool stops; start it "
                  f"again with the same --state once the cluster is back (the jobs' records are kept in {state})",
                  file=sys.stderr, flush=True)
            code = 3
            break
    # A job cancelled just before: its launcher is told at its next call and exits (while the API
    # still answers); then what still runs is known.
    service.stop()  # nothing granted or launched from now on; syncs are still answered
    service.wait_exiting()
    idle = service.stop_waiting_launchers()  # a waiting job's warm launcher runs nothing: it goes too
    if idle:
        print(f"[dra pool] stopped the launchers of {len(idle)} waiting job(s) ({', '.join(idle[:5])}"
              f"{', ...' if len(idle) > 5 else ''}): they run no worker; a daemon started again with --state "
              f"{state} starts them again", file=sys.stderr, flush=True)
    # Slots are kept when leases are live, so a restarted daemon finds its running jobs' cgroups.
    live = sorted({l.job for l in service.book.all() if l.state and service.jobs[l.job]["state"] not in ENDED})
    if live:
        print(f"[dra pool] stopping with {len(live)} job(s) still running ({', '.join(live[:5])}"
              f"{', ...' if len(live) > 5 else ''}): they go on, their leases' cgroups are kept, and a daemon "
              f"started again with --state {state} adopts them; to leave nothing behind, drain or cancel them "
              "and stop once they have ended", file=sys.stderr, flush=True)
    server.close(remove_slots=not live, wait_s=0.0)
    if not live:
        print("[dra pool] stopped: no job running" + (", the pool's cgroups removed" if service.slots is not None else ""),
              flush=True)
    return code


def ray_head_grace_s() -> float:
    """How long the daemon waits for a lost Ray head before it stops by itself: Ray ends a process
    whose head stays away longer than ``gcs_rpc_server_reconnect_timeout_s`` (60 s unless
    ``RAY_gcs_rpc_server_reconnect_timeout_s`` says otherwise); the pool stops 15 s before."""
    try:
        limit = float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", "60"))
    except ValueError:
        limit = 60.0
    return max(5.0, limit - 15.0) if math.isfinite(limit) else 45.0


def _first_missing(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist yet (None: ``path`` exists)."""
    missing = None
    for p in (path.absolute(), *path.absolute().parents):
        if p.exists() or p.is_symlink():
            break
        missing = p
    return missing


def _undo_start(state: Path, created: Path | None, before: set[str], token: Path | None) -> None:
    """A start that failed (a port or socket in use, a bad inventory, a state that cannot be read)
    leaves nothing it made: the token file it wrote, and under the state's lock (unless another
    daemon serves that state now: then what is there is that daemon's) the state folder it made,
    or the files it added to one that was there. The pool's cgroups and its own lock are already
    undone by make_service."""
    from dra.pool._state import StateLock

    if token is not None:
        token.unlink(missing_ok=True)
    try:
        lock = StateLock(state)
    except (ValueError, OSError):
        return
    try:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        else:
            for name in set(os.listdir(state)) - before:
                p = state / name
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
    finally:
        lock.release()


CLI_TIMEOUT_S = 30.0


def _client(args: argparse.Namespace) -> Any:
    from dra.pool import _auth
    from dra.pool.client import PoolClient

    token = _auth.load_token(args.token_file) if getattr(args, "token_file", None) else None
    # A person at the command line would rather wait than be told a busy daemon is gone: on a
    # loaded host one answer (a scheduling pass, a state write) can take seconds.
    return PoolClient(args.pool, timeout_s=CLI_TIMEOUT_S, token=token)


def _submit(args: argparse.Namespace, command: list[str]) -> int:
    spec: dict[str, Any] = {}
    if args.spec:
        try:
            spec = json.loads(Path(args.spec).read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--spec: cannot read {args.spec}: {e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"--spec: {args.spec} is not JSON ({e}); give a JSON object of the job's fields") from None
        if not isinstance(spec, dict):
            raise ValueError(f"--spec: {args.spec} holds a JSON {type(spec).__name__}; give a JSON object of the "
                             "job's fields") from None
    for key in ("name", "kind", "device_type", "memory_gb", "fraction", "min_size", "max_size", "priority", "user",
                "log", "max_restarts"):
        v = getattr(args, key)
        if v is not None:
            spec[key] = v
    if args.rigid:
        spec["elastic"] = False
    if args.ray is not None:
        spec["ray"] = args.ray
    if command:
        spec["command"] = command
    env = dict(spec.get("env") or {})
    if "PATH" in os.environ:  # the submitter's PATH, as a shell would find the command
        env.setdefault("PATH", os.environ["PATH"])
    for item in args.env or []:
        key, eq, value = item.partition("=")
        if not eq:
            if key not in os.environ:
                raise ValueError(f"env: '{key}' is not set here; give --env {key}=VALUE")
            value = os.environ[key]
        env[key] = value
    if env:
        spec["env"] = env
    spec["cwd"] = str(Path(args.cwd).absolute()) if args.cwd else spec.get("cwd", os.getcwd())
    answer = _client(args).submit(spec)
    print(json.dumps(answer))
    if answer.get("note"):
        print(f"[dra pool] note: {answer['note']}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    st = _client(args).status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"pool {st['pool']} ({st['mode']}{', draining' if st['draining'] else ''}): "
          f"{sum(1 - d['free'] for d in st['devices']):g} of {len(st['devices'])} devices leased")
    away = st.get("away") or []
    if st.get("ray_head_lost_s") is not None:
        print(f"  the Ray cluster's head has been unreachable for {st['ray_head_lost_s']:.0f} s: nothing is granted; "
              f"{len(away)} device(s) away with it keep their leases until each node is seen back or lost")
    for d in st["devices"] + away:
        holders = [f"{l['job']}#{l['id']}{'*' if l['state'] == 'releasing' else ''}" for l in st["leases"]
                   if l["device"] == d["id"]]
        where = "away" if d in away else d["enforcement"]
        print(f"  {d['id']:<12} {d['type']:<14} {where:<20} {' '.join(holders) or '-'}")
    for j in st["jobs"]:
        why = f"  ({j['reason']})" if j.get("reason") else ""
        if j.get("restarts"):
            last = f"; last failure: {j['last_failure']}" if j.get("last_failure") else ""
            soon = f" in {j['restart_in_s']:.0f} s" if j.get("restart_in_s") else ""
            why += f"  [restart {j['restarts']} of {j.get('max_restarts', '?')}{soon}{last}]"
        if j["kind"] == "inference" and j["state"] == "running":
            why += f"  {_autoscaler_line(j)}"
        print(f"  job {j['name']:<14} {j.get('user', '?'):<10} {j['state']:<9} {j['kind']:<9} {j['priority']:<8} "
              f"workers {j['workers']} [{j['min_size']}..{j['max_size']}]{' elastic' if j['elastic'] else ' rigid'}{why}")
    return 0


def _autoscaler_line(j: dict) -> str:
    """A running service's autoscaler: the replicas it wants and, where the caller may see them, the
    load, queue and age of the report it acts on."""
    if j.get("replicas_wanted") is None:
        return "[no load report yet: held at its minimum]"
    seen = j.get("report_age_s") is not None
    load = (f" (load {j['load_rps'] or 0:g} requests/s, queue {j['queue'] or 0:g}, report {j['report_age_s']:.0f} s "
            f"old{'; silent: counted as no load' if j.get('report_stale') else ''})") if seen else ""
    return f"[wants {j['replicas_wanted']}{load}]"


@console("dra")
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
    from dra.pool.client import default_url

    url = default_url()
    s = pool.add_parser("serve", help="run the pool daemon")
    s.add_argument("--inventory", default="auto", help="slots:N, slots:NxC, nvml, auto, ray[:ADDRESS] or a JSON file")
    s.add_argument("--state", type=path_arg, default="dra-pool", help="state directory (SQLite, events.jsonl, logs, the socket)")
    s.add_argument("--socket", type=path_arg, default=None, help="the API's Unix socket (default <state>/pool.sock)")
    s.add_argument("--port", type=port_arg, default=None, help="also serve TCP on this port (needs the token)")
    s.add_argument("--host", default="127.0.0.1", help="TCP address (loopback unless --allow-remote)")
    s.add_argument("--token-file", type=path_arg, default=None, help="TCP token file, mode 0600 (default <state>/token, made if absent)")
    s.add_argument("--allow-remote", action="store_true", help="let --host be reachable from other machines")
    s.add_argument("--mode", choices=["dynamic", "static", "static_naive"], default="dynamic")
    s.add_argument("--name", default="pool",
                   help="the pool's name: its cgroups are dra/<name> (default pool); one daemon per name per machine")
    s.add_argument("--slot-memory-gb", type=positive_arg, default=2.0, help="each CPU slot's memory limit (GB)")
    s.add_argument("--heartbeat-timeout-s", type=positive_arg, default=3.0)
    s.add_argument("--silence-limit-s", type=positive_arg, default=None,
                   help="how long a lease past its heartbeat timeout stays with a job whose launcher is still alive "
                        "(a loaded host) before the launcher counts as hung (default: max(30, 10 x the timeout))")
    s.add_argument("--scale-every-s", type=positive_arg, default=2.0)
    s.add_argument("--completion-aware", action="store_true",
                   help="tilt the arbiter by each training job's remaining work (its declared_steps, steps and loss; "
                        "the simulator's convergence_aware policy)")
    s.add_argument("--restart-backoff-s", type=nonnegative_arg, default=10.0,
                   help="how long a failed job with restarts left (max_restarts) waits before its first restart; "
                        "doubling with each, at most 300 s (default 10)")
    s.add_argument("--orphan-limit-s", type=positive_arg, default=None,
                   help="how long launchers keep jobs running while the daemon is away (default: no limit)")
    s.add_argument("--warm-launchers", type=count_arg, default=4,
                   help="how many of one user's waiting jobs have their launcher (and its torch) started before "
                        "they get devices (default 4); the others start theirs as those are granted or end")
    s.add_argument("--max-active-per-user", type=count_arg, default=100,
                   help="how many jobs not yet ended one user may have (default 100; root and the pool's own user: "
                        "no bound)")
    s.add_argument("--max-ended", type=count_arg, default=10_000,
                   help="how many ended jobs the pool keeps on record in all, everyone's (default 10000; past it the "
                        "oldest are forgotten: their record and launcher log)")
    s.add_argument("--max-kept-per-user", type=count_arg, default=1000,
                   help="how many jobs of one user the pool keeps on record, ended ones included (default 1000; past it "
                        "the user's oldest ended jobs are forgotten, and only as many jobs not ended are refused)")
    s.add_argument("--user-priority", choices=["low", "normal", "high", "critical"], default="normal",
                   help="the highest priority class a user who is not an operator may submit (default normal: high "
                        "and critical preempt everyone's jobs, so they are the operator's to give)")
    s.add_argument("--events-max-mb", type=positive_arg, default=64.0, metavar="MB",
                   help="the size at which <state>/events.jsonl is rotated to events.jsonl.1 (three rotated files "
                        "kept, the oldest deleted; default 64)")
    s.add_argument("--no-slot-guarantee", action="store_true",
                   help="CPU slots are caps only (no cpu.shares reserving their quota against other processes)")
    s.add_argument("--control-cpus", type=float, default=0.5, metavar="C",
                   help="the CPU weight, in cores, of the jobs' launchers (a cgroup beside the slots): what they get "
                        "when busy slots reserve every core (default 0.5; 0: no such cgroup)")
    s.add_argument("--launcher-memory-gb", type=nonnegative_arg, default=4.0, metavar="GB",
                   help="the most memory one job's launcher and fork server may use (a cgroup of their own in the "
                        "control plane's: a job's preload modules run its own code there; default 4, 0: no limit)")
    sb = pool.add_parser("submit", help="submit a job (its command after '--')")
    sb.add_argument("--pool", default=url)
    sb.add_argument("--token-file", type=path_arg, default=None, help="the pool's token file (TCP)")
    sb.add_argument("--spec", type=path_arg, help="a JSON job spec; flags override its fields")
    sb.add_argument("--name")
    sb.add_argument("--kind", choices=["training", "inference"])
    sb.add_argument("--device-type", dest="device_type")
    sb.add_argument("--memory-gb", dest="memory_gb", type=nonnegative_arg)
    sb.add_argument("--fraction", type=fraction_arg)
    sb.add_argument("--min-size", dest="min_size", type=count_arg)
    sb.add_argument("--max-size", dest="max_size", type=count_arg)
    sb.add_argument("--priority")
    sb.add_argument("--rigid", action="store_true", help="a fixed size (elastic=false)")
    sb.add_argument("--max-restarts", dest="max_restarts", type=nonnegative_int_arg, default=None,
                    help="start the job again from its command after it failed, at most this many times (default 0)")
    sb.add_argument("--env", action="append", metavar="KEY[=VALUE]",
                    help="a variable for the job (KEY alone: its value here); repeatable. PATH is passed by default")
    sb.add_argument("--cwd", type=path_arg, default=None, help="the job's working directory (default: this one)")
    sb.add_argument("--log", type=path_arg, default=None, help="directory for the workers' logs (default <cwd>/dra-logs)")
    sb.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                    help="run through the pool's Ray cluster (a Ray pool does it anyway)")
    sb.add_argument("--user", default=None, help="run the job as this user (operators only)")
    st = pool.add_parser("status", help="devices, leases and jobs")
    st.add_argument("--pool", default=url)
    st.add_argument("--token-file", type=path_arg, default=None)
    st.add_argument("--json", action="store_true")
    c = pool.add_parser("cancel", help="cancel a job (its workers are stopped, its leases released)")
    c.add_argument("--pool", default=url)
    c.add_argument("--token-file", type=path_arg, default=None)
    c.add_argument("name")
    d = pool.add_parser("drain", help="accept no new job; running ones finish")
    d.add_argument("--pool", default=url)
    d.add_argument("--token-file", type=path_arg, default=None)
    d.add_argument("--undo", action="store_true", help="accept jobs again")
    pool.add_parser("schema", help="print the job spec's JSON Schema")
    args = p.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "schema":
            from dra.pool._spec import schema

            print(json.dumps(schema(), indent=2))
            return 0
        if args.command == "submit":
            return _submit(args, command)
        if args.command == "status":
            return _status(args)
        client = _client(args)
        print(json.dumps(client.cancel(args.name) if args.command == "cancel" else client.drain(undo=args.undo)))
        return 0
    except BrokenPipeError:
        raise  # the reader went away (dra pool schema | head): @console ends quietly
    except (ValueError, ConnectionError, PermissionError, RuntimeError, json.JSONDecodeError, OSError) as e:
        print(f"dra pool {args.command}: {e}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    raise SystemExit(main())
