"""Starts a pool job's launcher as its owner, optionally in a network namespace of its own.

    python -I -m dra.pool._isolate --uid U --gid G --groups G1,G2 --cwd DIR [--private-network]
                                   [--cgroup DIR ...] -- COMMAND...

Run as root by the daemon; in this order: the pool's control-plane cgroups (``--cgroup``, one per
controller: a weight of CPU the launcher keeps when busy slots reserve every core; one it cannot
enter is said on stderr and the launcher starts anyway), a new network namespace with only loopback up (with
``--private-network``: the job's c10d store, which has no authentication, then answers the job's
own processes only), the supplementary groups, the gid, the uid (no way back to root), the change
to the job's directory (as the job's user: a directory it may not enter stays closed, whatever
was swapped in after the submission's check), then exec of the command (same pid: the daemon keeps
knowing its launcher). Any failure exits 126 with the
reason on stderr (the launcher's log), and the job fails with it.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP = 0x1


def private_network() -> None:
    """A network namespace of this process's own, its loopback up (nothing else in it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def become(uid: int, gid: int, groups: list[int]) -> None:
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if uid != 0 and (os.geteuid() == 0 or os.getegid() != gid):
        raise PermissionError("privileges were not dropped")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("_isolate: give the command after '--'", file=sys.stderr)
        return 126
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m dra.pool._isolate")
    p.add_argument("--uid", type=int, required=True)
    p.add_argument("--gid", type=int, required=True)
    p.add_argument("--groups", default="")
    p.add_argument("--private-network", action="store_true")
    p.add_argument("--cwd", default="/", help="the job's directory, entered after the uid is dropped")
    p.add_argument("--cgroup", action="append", default=[], help="a cgroup directory to enter first (as root)")
    args = p.parse_args(argv[:i])
    command = argv[i + 1:]
    for path in args.cgroup:
        try:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            print(f"[dra pool] the launcher stays out of the control-plane cgroup {path}: {e}", file=sys.stderr, flush=True)
    try:
        if args.private_network:
            private_network()
        become(args.uid, args.gid, [int(g) for g in args.groups.split(",") if g])
        os.chdir(args.cwd)
        os.execvpe(command[0], command, os.environ)
    except (OSError, ValueError, IndexError) as e:
        print(f"[dra pool] cannot start the job's launcher as uid {args.uid}: {e}", file=sys.stderr, flush=True)
        return 126
    return 126  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main())
