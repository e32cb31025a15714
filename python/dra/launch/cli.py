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
launcher. Exit status as torchrun's: 0 when the job finished, 1 otherwise. docs/guide/elastic.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

from dra._argtypes import nonnegative_arg, nonnegative_int_arg, port_arg, positive_arg, std_streams_arg
from dra.launch.node import NodeLauncher, RunConfig


def _both(p: argparse.ArgumentParser, name: str, *extra: str, **kw) -> None:
    """A flag under torchrun's two spellings (--nproc-per-node and --nproc_per_node)."""
    names = [f"--{name}", *extra]
    if "-" in name:
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
    _both(p, "no-python", "--no_python", dest="no_python", action="store_true", help="run the script as an executable")
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
    return n


def _nnodes(value: str) -> tuple[int, int]:
    lo, _, hi = value.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--nnodes: expected N or MIN:MAX, got {value!r}") from None
    if not 1 <= a <= b:
        raise ValueError(f"--nnodes: needs 1 <= MIN <= MAX, got {value!r}")
    return a, b


def _command(args: argparse.Namespace, after_dashes: list[str]) -> list[str]:
    if args.training_script is None:
        return after_dashes
    if args.no_python and args.module:
        raise ValueError("--no-python and --module cannot go together (torchrun's rule)")
    if args.no_python:
        return [args.training_script, *args.training_script_args]
    if args.module:
        return [sys.executable, "-u", "-m", args.training_script, *args.training_script_args]
    return [sys.executable, "-u", args.training_script, *args.training_script_args]


def _ranks(text: str) -> set[int] | None:
    if not text:
        return None
    try:
        return {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"--local-ranks-filter: expected ranks such as 0,2, got {text!r}") from None


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
        if args.options is not None:
            import dra

            dra.Options(**json.loads(args.options))  # a bad option is named before anything starts
            os.environ["DRA_OPTIONS"] = args.options
        lo, hi = _nnodes(args.nnodes)
        tee = args.tee if args.tee is not None else (0 if args.redirects not in (None, 0) else 3)
        run_id = args.rdzv_id or (uuid.uuid4().hex[:12] if args.standalone else "job")
        conf = dict(kv.split("=", 1) for kv in args.rdzv_conf.split(",") if "=" in kv)
        if hi > 1 and args.rdzv_backend == "static" and args.rdzv_endpoint and args.master_port is None:
            host, _, port = args.rdzv_endpoint.rpartition(":")
            if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) <= 65535:
                raise ValueError(f"--rdzv-endpoint: expected HOST:PORT with a port 1-65535, got {args.rdzv_endpoint!r}")
            args.master_addr, args.master_port = host, int(port)
        if hi > 1 and args.rdzv_backend == "static":
            if args.node_rank is not None and args.node_rank >= hi:
                raise ValueError(f"--node-rank: {args.node_rank} is not a node of --nnodes {args.nnodes}; give 0 to {hi - 1}")
            if args.master_port == 0:
                raise ValueError("--master-port: 0 (a free port picked at random) cannot be found by the other nodes; "
                                 "give the port node 0 listens on")
        cfg = RunConfig(
            command=command, nproc=_nproc(args.nproc_per_node), min_nodes=lo, max_nodes=hi, node_rank=args.node_rank,
            rdzv_backend=args.rdzv_backend if hi > 1 or args.rdzv_endpoint else "static",
            rdzv_endpoint=args.rdzv_endpoint, run_id=run_id, rdzv_conf=conf, max_restarts=args.max_restarts,
            monitor_interval=args.monitor_interval, role=args.role, log_dir=args.log_dir, tee=tee,
            local_ranks=_ranks(args.local_ranks_filter), master_addr=args.master_addr, master_port=args.master_port,
            local_addr=args.local_addr, shutdown_timeout=args.shutdown_timeout, store_host=args.store_host,
            advertise=args.advertise, zygote=not args.no_zygote,
            preload=args.preload.split(",") if args.preload else ["torch", "dra", "dra.elastic"],
            fence_timeout_s=args.fence_timeout_s)
        if cfg.rdzv_backend == "c10d" and not cfg.rdzv_endpoint:
            raise ValueError("--rdzv-backend c10d: give --rdzv-endpoint HOST:PORT")
    except ValueError as e:
        print(f"dra run: {e}", file=sys.stderr)
        return 2
    try:
        return NodeLauncher(cfg).run()
    except (OSError, RuntimeError, TimeoutError, ValueError) as e:  # a rendezvous or a store that failed
        print(f"dra run: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


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
