"""``dra run``: launch a training job as torchrun does, with workers that survive each other.

    dra run --nproc-per-node 4 train.py --epochs 3                  # torchrun's form
    dra run --nproc 4 -- python train.py --epochs 3                  # the program after -- runs as given
    dra run --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id run1 train.py
    dra run --pool http://127.0.0.1:8470 --job NAME                  # a device pool's job (docs/guide/pool.md)

torchrun's common flags and every environment variable its agent sets (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_ERROR_FILE, ...); the script's own
init_process_group() uses the launcher's store, as under torchrun. Worker output goes to
``--log-dir`` and, prefixed like torchrun's ``--tee`` (``[default0]:``), to the console. A worker
that dies does not stop the others (a dra job shrinks in place; ``--max-restarts`` starts
replacements that join in place); SIGTERM/SIGINT stop the job cleanly; the workers die with the
launcher. Exit status as torchrun's: 0 when the job finished, 1 otherwise. docs/guide/launch.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import uuid

from dra._argtypes import nonnegative_arg, nonnegative_int_arg, port_arg, positive_arg, std_streams_arg
from dra.launch._claim import log_dir
from dra.launch.node import NodeLauncher, RunConfig


def _both(p: argparse.ArgumentParser, name: str, *extra: str, **kw) -> None:
    """A flag under torchrun's two spellings (--nproc-per-node and --nproc_per_node)."""
    names = [f"--{name}", *extra]
    if "-" in name and "--" + name.replace("-", "_") not in names:
        names.append("--" + name.replace("-", "_"))
    p.add_argument(*names, **kw)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dra run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _both(p, "nproc-per-node", "--nproc", dest="nproc_per_node", default="1",
          help="workers on this node: a number, 'cpu', 'gpu' or 'auto' (torchrun's)")
    _both(p, "nnodes", default="1", help="nodes: N or MIN:MAX")
    _both(p, "node-rank", dest="node_rank", type=nonnegative_int_arg, default=None, help="this node's rank (static rendezvous)")
    _both(p, "rdzv-backend", dest="rdzv_backend", default="static", choices=["static", "c10d"])
    _both(p, "rdzv-endpoint", dest="rdzv_endpoint", default="", help="HOST:PORT of the c10d rendezvous store "
          "(a `dra store` there lets the job survive any node)")
    _both(p, "rdzv-id", "--job", dest="rdzv_id", default=None, help="the job's id, the same on every node (DRA_JOB_ID)")
    _both(p, "rdzv-conf", dest="rdzv_conf", default="", help="key=value,... passed to torch's rendezvous")
    p.add_argument("--standalone", action="store_true", help="one node, a store of its own (the default for one node)")
    _both(p, "max-restarts", dest="max_restarts", type=nonnegative_int_arg, default=0,
          help="a dra job: replacements started for dead workers (they join in place); another job: whole-group "
               "restarts, as torchrun")
    _both(p, "monitor-interval", dest="monitor_interval", type=positive_arg, default=0.1,
          help="seconds between looks at the workers (> 0)")
    p.add_argument("--role", default="default", help="ROLE_NAME and the console prefix")
    _both(p, "no-python", dest="no_python", action="store_true", help="run the script as an executable")
    p.add_argument("-m", "--module", action="store_true", help="the script is a module (python -m)")
    _both(p, "run-path", dest="run_path", action="store_true", help="accepted for torchrun's sake (a script is run by path)")
    _both(p, "log-dir", dest="log_dir", default="dra-logs", help="each worker's output file: <log-dir>/<job>.<rank>.log")
    p.add_argument("-r", "--redirects", type=std_streams_arg, default=None,
                   help="torchrun's: workers' output to files only (0-3)")
    p.add_argument("-t", "--tee", type=std_streams_arg, default=None,
                   help="torchrun's: workers' output to files and the console (0-3; default here: 3, prefixed)")
    _both(p, "local-ranks-filter", dest="local_ranks_filter", default="", help="local ranks shown on the console, e.g. 0,2")
    _both(p, "master-addr", dest="master_addr", default="127.0.0.1")
    _both(p, "master-port", dest="master_port", type=port_arg, default=None)
    _both(p, "local-addr", dest="local_addr", default=None)
    _both(p, "start-method", dest="start_method", default=None,
          help="accepted for torchrun's sake: workers are forked from a warm interpreter (same interpreter) or started")
    _both(p, "shutdown-timeout", dest="shutdown_timeout", type=nonnegative_arg, default=30.0,
          help="seconds from SIGTERM to SIGKILL when the job is stopped (>= 0)")
    _both(p, "signals-to-handle", dest="signals_to_handle", default=None, help="accepted for torchrun's sake")
    # dra's own
    p.add_argument("--store-host", default="127.0.0.1", help="address the one-node store listens on")
    p.add_argument("--advertise", default=None, help="address workers reach the one-node store at")
    p.add_argument("--no-zygote", action="store_true", help="plain processes, never the warm fork server")
    p.add_argument("--preload", default=None, help="modules the fork server imports (default torch,dra,dra.elastic)")
    p.add_argument("--options", default=None, help="elastic options for every worker, a JSON object (DRA_OPTIONS)")
    p.add_argument("--fence-timeout-s", type=positive_arg, default=10.0,
                   help="several nodes: a node that cannot reach the job's store this long stops its workers (> 0)")
    p.add_argument("--pool", default=None, help="run a device pool's job (its workers follow the pool's leases)")
    p.add_argument("--shrink-grace-s", type=nonnegative_arg, default=None,
                   help="pool: stop a worker asked back after this long (seconds >= 0; default: the job's shrink_grace_s, 30)")
    p.add_argument("--ray", default=None, help="pool: workers on a Ray cluster")
    p.add_argument("training_script", nargs="?", default=None)
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


#: The most workers one node starts (a typo such as 80000 for 8 would fork until the machine gives out)
#: and the most nodes a job names (each node's worker count is gathered by key).
MAX_NPROC = 1024
MAX_NODES = 65536


def _nproc(value: str) -> int:
    if value in ("cpu", "auto"):
        try:
            import torch

            if value == "auto" and torch.cuda.is_available():
                return torch.cuda.device_count()
        except ImportError:
            pass
        return os.cpu_count() or 1
    if value == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--nproc-per-node gpu: no CUDA device here")
        return torch.cuda.device_count()
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"--nproc-per-node: expected a number, 'cpu', 'gpu' or 'auto', got {value!r}") from None
    if n < 1:
        raise ValueError(f"--nproc-per-node: must be >= 1, got {n}; give a number of workers >= 1, 'cpu', 'gpu' or 'auto'")
    if n > MAX_NPROC:
        raise ValueError(f"--nproc-per-node: {n} workers on one node is more than {MAX_NPROC}; give the workers "
                         "this node runs (one per device or core), or 'cpu', 'gpu' or 'auto'")
    return n


def _nnodes(value: str) -> tuple[int, int]:
    lo, _, hi = value.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--nnodes: expected N or MIN:MAX, got {value!r}") from None
    if not 1 <= a <= b:
        raise ValueError(f"--nnodes: needs 1 <= MIN <= MAX, got {value!r}")
    if b > MAX_NODES:
        raise ValueError(f"--nnodes: {b} nodes is more than {MAX_NODES}; give the number of nodes (N or MIN:MAX)")
    return a, b


def _command(args: argparse.Namespace, after_dashes: list[str]) -> list[str]:
    if args.training_script is None:
        return after_dashes
    if args.no_python and args.module:
        raise ValueError("--no-python and --module cannot go together (torchrun's rule)")
    if args.no_python:
        _check_program(args.training_script, "--no-python: ")
        return [args.training_script, *args.training_script_args]
    if args.module:
        return [sys.executable, "-u", "-m", args.training_script, *args.training_script_args]
    _check_script(args.training_script)
    return [sys.executable, "-u", args.training_script, *args.training_script_args]


def _check_script(script: str) -> None:
    """A script python can run: a file, or a folder or zip with ``__main__.py`` (refused here, before
    anything starts, rather than as a traceback from every worker)."""
    where = f" (relative to {os.getcwd()})" if not os.path.isabs(script) else ""
    if not os.path.exists(script):
        raise ValueError(f"the training script {script!r} does not exist{where}; give the path of the script, "
                         "-m for a module, or the command after '--'")
    if os.path.isdir(script) and not os.path.isfile(os.path.join(script, "__main__.py")):
        raise ValueError(f"the training script {script!r} is a directory without __main__.py; give the script in it")
    if not os.access(script, os.R_OK):
        raise ValueError(f"the training script {script!r} cannot be read by this user; make it readable (chmod +r)")


def _check_program(program: str, what: str = "") -> None:
    """A program found as a shell finds it (on PATH, or by its path), executable."""
    if shutil.which(program) is not None:
        return
    if os.sep in program and os.path.isfile(program):
        raise ValueError(f"{what}{program!r} is not executable; make it so (chmod +x), or run it with its interpreter")
    where = "does not exist" if os.sep in program else "is not a program on PATH"
    raise ValueError(f"{what}{program!r} {where}; give the path of the program to run")


def _ranks(text: str, nproc: int) -> set[int] | None:
    if not text:
        return None
    try:
        ranks = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"--local-ranks-filter: expected ranks such as 0,2, got {text!r}") from None
    outside = sorted(r for r in ranks if not 0 <= r < nproc)
    if outside:
        raise ValueError(f"--local-ranks-filter: {','.join(map(str, outside))} is not a local rank of "
                         f"--nproc-per-node {nproc}; give local ranks 0 to {nproc - 1}")
    return ranks


def _conf(text: str) -> dict[str, str]:
    """``--rdzv-conf key=value,...``."""
    items = [kv for kv in text.split(",") if kv.strip()]
    bad = [kv for kv in items if "=" not in kv or not kv.split("=", 1)[0].strip()]
    if bad:
        raise ValueError(f"--rdzv-conf: {bad[0]!r} is not key=value; give key=value,... (e.g. join_timeout=600)")
    return {k.strip(): v.strip() for k, v in (kv.split("=", 1) for kv in items)}


def _join_timeout(conf: dict[str, str]) -> float:
    """How long a node waits for the others (torchrun's ``--rdzv-conf join_timeout=S``, 600 s)."""
    text = conf.get("join_timeout", "600")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"--rdzv-conf: join_timeout={text!r} is not a number of seconds > 0; give e.g. join_timeout=600")
    return value


def _endpoint(text: str, default_port: int | None) -> str:
    """``--rdzv-endpoint HOST[:PORT]`` checked (torchrun's c10d default port: 29400) and its host resolved."""
    host, colon, port = text.rpartition(":")
    if not colon or host.endswith(":") and not host.startswith("["):  # no port, or a bare IPv6 address
        host, port = text, ""
    if not port and default_port is not None:
        port = str(default_port)
    if port == "0":
        raise ValueError(f"--rdzv-endpoint: {text!r}: port 0 (a free port picked at random) cannot be found by other "
                         "nodes; give the port the store listens on (one node needs no --rdzv-* flags, or --standalone)")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) <= 65535:
        raise ValueError(f"--rdzv-endpoint: expected HOST:PORT with a port 1-65535, got {text!r}")
    _resolve(host.strip("[]"), "--rdzv-endpoint")
    return f"{host}:{int(port)}"


def _resolve(host: str, flag: str) -> None:
    import socket

    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as e:
        raise ValueError(f"{flag}: cannot resolve the host {host!r} ({e}); give a name or address the nodes "
                         "reach each other at") from None


def _check_listen(host: str) -> None:
    """The one-node store listens on ``--store-host``: an address of this machine."""
    import socket

    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.bind(infos[0][4])
    except (OSError, UnicodeError) as e:
        raise ValueError(f"--store-host: cannot listen on {host!r} ({e}); give an address of this machine "
                         "(127.0.0.1, or 0.0.0.0 with --advertise for workers elsewhere)") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    after: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        before = p.parse_args(argv[:i])
        if before.training_script is None:  # `dra run [flags] -- COMMAND`: the command runs as given
            argv, after = argv[:i], argv[i + 1:]
    args = p.parse_args(argv)
    try:
        if args.pool or args.ray:
            return _run_pool(args, after or None, p)
        command = _command(args, after)
        if not command:
            p.error("give the script (dra run [flags] train.py ARGS) or the command after '--'")
        if after:
            _check_program(after[0], "the command after '--': ")
        if args.options is not None:
            import dra

            try:
                options = json.loads(args.options)
            except ValueError as e:
                raise ValueError(f"--options: {args.options!r} is not JSON ({e}); give a JSON object such as "
                                 """'{"policy": "none"}'""") from None
            if not isinstance(options, dict):
                raise ValueError(f"--options: {args.options!r} is not a JSON object; give one such as "
                                 """'{"policy": "none"}'""")
            dra.Options(**options)  # a bad option is named before anything starts
            os.environ["DRA_OPTIONS"] = args.options
        lo, hi = _nnodes(args.nnodes)
        if args.standalone and hi > 1:
            raise ValueError(f"--standalone is one node, --nnodes {args.nnodes} is more; drop --standalone and give "
                             "--rdzv-backend c10d --rdzv-endpoint HOST:PORT (or --node-rank with --master-addr/--master-port)")
        if hi > 1 and args.rdzv_backend == "static" and not args.rdzv_endpoint and (
                args.node_rank is None or args.master_port is None):
            raise ValueError(f"--nnodes {args.nnodes}: give --rdzv-backend c10d --rdzv-endpoint HOST:PORT, or --node-rank "
                             "with --master-addr and --master-port")
        nproc = _nproc(args.nproc_per_node)
        tee = args.tee if args.tee is not None else (0 if args.redirects not in (None, 0) else 3)
        run_id = args.rdzv_id or (uuid.uuid4().hex[:12] if args.standalone else "job")
        if "/" in run_id or "\0" in run_id or run_id in (".", ".."):
            raise ValueError(f"--rdzv-id: {run_id!r} cannot name the job's log files (<log-dir>/<id>.<rank>.log); "
                             "give an id without '/'")
        conf = _conf(args.rdzv_conf)
        if args.rdzv_endpoint and (args.rdzv_backend == "c10d" or hi > 1):
            args.rdzv_endpoint = _endpoint(args.rdzv_endpoint, default_port=29400 if args.rdzv_backend == "c10d" else None)
        if hi == 1 and not args.rdzv_endpoint:
            _check_listen(args.store_host)
        elif args.rdzv_backend == "static" and not args.rdzv_endpoint:
            _resolve(args.master_addr, "--master-addr")
        if hi > 1 and args.rdzv_backend == "static" and args.rdzv_endpoint and args.master_port is None:
            host, _, port = args.rdzv_endpoint.rpartition(":")
            args.master_addr, args.master_port = host, int(port)
        if hi > 1 and args.rdzv_backend == "static":
            if args.node_rank is not None and args.node_rank >= hi:
                raise ValueError(f"--node-rank: {args.node_rank} is not a node of --nnodes {args.nnodes}; give 0 to {hi - 1}")
            if args.master_port == 0:
                raise ValueError("--master-port: 0 (a free port picked at random) cannot be found by the other nodes; "
                                 "give the port node 0 listens on")
        cfg = RunConfig(
            command=command, nproc=nproc, min_nodes=lo, max_nodes=hi, node_rank=args.node_rank,
            rdzv_backend=args.rdzv_backend if hi > 1 or args.rdzv_endpoint else "static",
            rdzv_endpoint=args.rdzv_endpoint, run_id=run_id, rdzv_conf=conf, max_restarts=args.max_restarts,
            monitor_interval=args.monitor_interval, role=args.role, log_dir=args.log_dir, tee=tee,
            local_ranks=_ranks(args.local_ranks_filter, nproc), master_addr=args.master_addr, master_port=args.master_port,
            local_addr=args.local_addr, shutdown_timeout=args.shutdown_timeout, store_host=args.store_host,
            advertise=args.advertise, zygote=not args.no_zygote,
            preload=args.preload.split(",") if args.preload else ["torch", "dra", "dra.elastic"],
            fence_timeout_s=args.fence_timeout_s, rdzv_timeout_s=_join_timeout(conf))
        if cfg.rdzv_backend == "c10d" and not cfg.rdzv_endpoint:
            raise ValueError("--rdzv-backend c10d: give --rdzv-endpoint HOST:PORT")
        log_dir(cfg.log_dir)  # a folder the logs can go to, before anything starts
    except ValueError as e:
        print(f"dra run: {e}", file=sys.stderr)
        return 2
    launcher = None
    try:
        launcher = NodeLauncher(cfg)
        code = launcher.run()
    except ValueError as e:  # refused with its fix (a port in use, a node rank taken)
        print(f"dra run: {e}", file=sys.stderr)
        code = 1
    except (OSError, RuntimeError, TimeoutError) as e:  # a rendezvous or a store that failed
        print(f"dra run: {type(e).__name__}: {e}", file=sys.stderr)
        code = 1
    except Exception as e:
        if not type(e).__module__.startswith("torch.distributed.elastic.rendezvous"):
            raise
        # torch's RendezvousError family (not an OSError): an endpoint that never answered, a closed rendezvous
        cause = f" ({e.__cause__})" if e.__cause__ is not None else ""
        print(f"dra run: {type(e).__name__}: {e}{cause}; check --rdzv-endpoint {cfg.rdzv_endpoint} (a `dra store` "
              "listening there, or this node's address) and --rdzv-id", file=sys.stderr)
        code = 1
    if launcher is not None and launcher.console_stuck:
        os._exit(code)  # every worker has ended; the console's flush at exit would wait on it
    return code


def _run_pool(args: argparse.Namespace, command: list[str] | None, p: argparse.ArgumentParser) -> int:
    """The device pool's launcher (python/dra/pool/launcher.py): workers follow a pool job's leases."""
    from dra.pool.launcher import Launcher

    if args.pool and not args.rdzv_id:
        p.error("--job is required with --pool")
    command = command or (_command(args, []) if args.training_script else None)
    launcher = Launcher(command, job=args.rdzv_id or "job", pool=args.pool, nproc=_nproc(args.nproc_per_node),
                        store_host=args.store_host, advertise=args.advertise, log_dir=args.log_dir,
                        zygote=not args.no_zygote, preload=args.preload.split(",") if args.preload else None,
                        shrink_grace_s=args.shrink_grace_s, ray=args.ray)
    return launcher.run()
