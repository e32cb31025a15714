"""Who is calling the pool and what they may do (docs/design/pool.md, "Trust").

- On the Unix socket (the default) the kernel says who the caller is: its uid, gid and pid from
  the socket's peer credentials (``SO_PEERCRED``); nothing to forge, no secret to leak.
- On TCP (only when the operator asks for it) a caller shows the token from the operator's token
  file (mode 0600). From this host the token only lets it in: it is the user that owns its socket
  (the kernel's socket table), as on the Unix socket. From another host (``--allow-remote``),
  whose users nobody here knows, the token's holder acts as the operator.
- A job is owned by the uid that submitted it and runs as that user (its uid, primary gid and
  supplementary groups); only its owner or an operator (root, or the daemon's own user) reads,
  cancels or changes it. Draining the pool is an operator's act.
"""

from __future__ import annotations

import grp
import hmac
import ipaddress
import os
import pwd
import secrets
import socket
import stat
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Forbidden(PermissionError):
    """The caller may not do this (HTTP 403); the message says who may."""


class Unauthenticated(PermissionError):
    """The caller did not prove who it is (HTTP 401)."""


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    pid: int = 0
    # "unix" (peer credentials), "tcp" (this host: its socket's owner), "token" (TCP from another
    # host: the token's holder, as the operator), "local" (in-process)
    via: str = "local"
    host: str = ""  # a "token" caller's address

    @property
    def operator(self) -> bool:
        return self.uid == 0 or self.uid == os.geteuid()

    def name(self) -> str:
        return user_name(self.uid)

    def by(self) -> str:
        """Who acted, for the events: the caller's user, or a remote token holder's address (it
        acts as the operator; which user holds the token there nobody here knows)."""
        return f"token from {self.host}" if self.via == "token" else self.name()


def operators() -> str:
    """Who operates this pool, in words: root, and the daemon's user when it is not root."""
    return "root" if os.geteuid() == 0 else f"root or {user_name(os.geteuid())}"


def local_caller() -> Caller:
    """This process, calling the service in-process (an embedding program is its own operator)."""
    return Caller(os.geteuid(), os.getegid(), os.getpid(), "local")


def peer_credentials(sock: socket.socket) -> Caller:
    """The process at the other end of a Unix socket, as the kernel saw it connect."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Caller(uid, gid, pid, "unix")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(host.split("%")[0])
    return getattr(ip, "ipv4_mapped", None) or ip  # an IPv4 caller of an IPv6 socket: its IPv4 address


def tcp_peer_uid(sock: socket.socket) -> int | None:
    """The uid that owns the other end of a TCP connection from this host (loopback or any of its
    addresses), from the kernel's socket table (/proc/net/tcp, tcp6: a connection's two ends are
    rows of it, each with its owner); None for a peer elsewhere or one no process holds any more
    (a closed socket's row lingers while TCP ends, with uid 0 or no inode: never taken)."""
    try:
        want = tuple((_ip(h), p) for h, p in (sock.getpeername()[:2], sock.getsockname()[:2]))
    except (OSError, ValueError):
        return None

    def unhex(field: str) -> tuple[Any, int]:
        addr, port = field.split(":")
        raw = bytes.fromhex(addr)  # 32-bit words in the host's (little-endian) order
        return _ip(str(ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))), int(port, 16)

    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # an IPv4 peer of an IPv6 socket is in either
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()  # the peer's row: its local end, then ours; its uid, its inode
                    if len(cols) > 9 and cols[9] != "0" and (unhex(cols[1]), unhex(cols[2])) == want:
                        return int(cols[7])
        except (OSError, ValueError, StopIteration):
            continue
    return None


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this host (loopback, or one a socket here may bind)."""
    ip = _ip(host)
    if ip.is_loopback:
        return True
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def tcp_caller(sock: socket.socket, remote: bool = True) -> Caller:
    """Who calls on TCP, its token shown. From this host: the user that owns its socket, as on the
    Unix socket; the token only lets it in (a local user who held the token acted as root, and the
    events said root did it: an outside review). From another host (``--allow-remote``): the
    token's holder, as the operator, known by its address. A caller from this host whose socket is
    not found (closed already) is refused, never taken for a remote one; without ``remote``
    (--allow-remote) every caller whose socket is not found is refused. A caller in another network
    namespace of this host, or on this host's IPv6 link-local address, cannot be told from a remote
    one: with --allow-remote it counts as remote."""
    uid = tcp_peer_uid(sock)
    if uid is not None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        return Caller(uid, gid, 0, "tcp")
    try:
        host = str(_ip(sock.getpeername()[0]))
    except (OSError, ValueError):
        host = ""
    if not remote or not host or is_local_address(host):
        raise Unauthenticated("caller: the pool cannot tell which user of this host holds this connection (its "
                              "socket is not in the kernel's socket table: closed already?); call again and wait for "
                              "the answer, or use the pool's Unix socket")
    return Caller(os.geteuid(), os.getegid(), 0, "token", host)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass(frozen=True)
class Owner:
    """A job's owner: the user its processes run as."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    user: str
    home: str
    shell: str

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "gid": self.gid, "groups": list(self.groups), "user": self.user, "home": self.home,
                "shell": self.shell}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Owner:
        return Owner(int(d["uid"]), int(d["gid"]), tuple(int(g) for g in d.get("groups", [])), str(d["user"]),
                     str(d.get("home", "/")), str(d.get("shell", "/bin/sh")))


def owner_of(uid: int, gid: int | None = None) -> Owner:
    """The user with this uid, with the groups the system gives it (initgroups' list)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:  # a uid without a passwd entry (a container's): its own gid, no groups
        g = gid if gid is not None else uid
        return Owner(uid, g, (g,), str(uid), "/", "/bin/sh")
    return Owner(uid, pw.pw_gid, tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))), pw.pw_name, pw.pw_dir,
                 pw.pw_shell)


def owner_named(user: str) -> Owner:
    try:
        return owner_of(pwd.getpwnam(user).pw_uid)
    except KeyError:
        raise ValueError(f"user: no user '{user}' on this machine; name an existing user") from None


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def run_as_kwargs(owner: Owner) -> dict[str, Any]:
    """subprocess.Popen arguments that start a process as the owner (uid, gid, supplementary
    groups set before exec); none when it is this process's own user."""
    if owner.uid == os.geteuid():
        return {}
    return {"user": owner.uid, "group": owner.gid, "extra_groups": list(owner.groups)}


def _as_owner(owner: Owner, output: bool = False) -> dict[str, Any]:
    """What a probe run as the owner gets: its ids, ``/`` as its directory, a bare environment, no
    descriptor of the daemon's and a session of its own. The daemon's own environment (a token, a
    cloud key in the operator's shell) went to every probe, whose /proc/<pid>/environ the
    submitting user reads; so did its stdin, stdout and stderr (an outside review took them from a
    probe with pidfd_getfd: lines forged in root's log, root's terminal read), and the probe sat in
    root's session with root's terminal as its own. ``output``: the caller captures the probe's
    stdout and stderr through pipes of its own."""
    quiet = {} if output else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    return {"cwd": "/", "env": {"PATH": "/usr/bin:/bin"}, "stdin": subprocess.DEVNULL, "close_fds": True,
            "start_new_session": True, **quiet, **run_as_kwargs(owner)}


def can_enter(path: str, owner: Owner) -> str | None:
    """None when the owner may use ``path`` as a working directory (checked as the owner, so
    permissions and ACLs count as the kernel applies them), else why not."""
    p = Path(path)
    if owner.uid == os.geteuid():
        if not p.is_dir():
            return f"'{path}' is not an existing directory"
        return None if os.access(p, os.X_OK) else f"'{path}' cannot be entered (permission denied)"
    try:
        r = subprocess.run(["test", "-d", path, "-a", "-x", path], timeout=10, **_as_owner(owner))
    except (OSError, subprocess.SubprocessError) as e:
        return f"'{path}' could not be checked as user {owner.user}: {e}"
    return None if r.returncode == 0 else f"'{path}' is not a directory user {owner.user} can enter"


def can_see(path: str, owner: Owner) -> bool:
    """Whether the owner can reach ``path`` itself (it exists, as a file, folder or link, and the
    folders on the way let the owner through), checked as the owner: what the daemon says about a
    path must not tell a user about one in a folder it may not read (/root/.ssh exists?)."""
    if owner.uid == os.geteuid():
        return os.path.lexists(path)
    try:
        r = subprocess.run(["test", "-e", path, "-o", "-h", path], timeout=10, **_as_owner(owner))
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def can_make(path: str, owner: Owner) -> str | None:
    """None when ``path`` exists for the owner or the owner may make it, else the folder on the
    way that stops it (the nearest existing one, not a folder the owner may write to and enter),
    checked as the owner: a job whose ``cwd`` its user may enter but not write was accepted, then
    failed with "Permission denied: 'dra-logs'"."""
    p = os.path.abspath(path)
    if owner.uid == os.geteuid():
        while not os.path.lexists(p):
            p = os.path.dirname(p)
        return None if p == os.path.abspath(path) or os.access(p, os.W_OK | os.X_OK) else p
    look = ('p=$1; { [ -e "$p" ] || [ -h "$p" ]; } && exit 0; while p=$(dirname "$p"); [ ! -e "$p" ]; do :; done; '
            '[ -d "$p" ] && [ -w "$p" ] && [ -x "$p" ] || { echo "$p"; exit 1; }')
    try:
        r = subprocess.run(["sh", "-c", look, "sh", p], capture_output=True, text=True, timeout=10,
                           **_as_owner(owner, output=True))
    except (OSError, subprocess.SubprocessError):
        return None  # left to the launcher, which fails on it as the user
    return (r.stdout.strip() or p) if r.returncode else None


_PROBE = ("import importlib.util as u, sys; s = u.find_spec('dra'); s is None and sys.exit('it finds no package dra'); "
          "open(s.origin, 'rb').close()")


def can_run_python(owner: Owner, python: str) -> str | None:
    """None when the owner can run ``python`` and find this package with it (the job's launcher
    runs the daemon's interpreter as the job's user), else why not. A few tens of ms: the probe
    only starts the interpreter and opens the package's first file (importing it would import
    torch)."""
    if owner.uid == os.geteuid():
        return None
    try:
        r = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=30,
                           **_as_owner(owner, output=True))
    except OSError as e:  # the exec itself refused: a directory on its path the user may not enter
        return f"{e.strerror or e}"
    except subprocess.SubprocessError as e:
        return str(e)
    if r.returncode == 0:
        return None
    lines = (r.stderr or r.stdout).strip().splitlines()
    return lines[-1][:300] if lines else f"exit code {r.returncode}"


# -- the operator's token (TCP) --------------------------------------------------------------------
def load_token(path: str | Path, create: bool = False) -> str:
    """The token in ``path`` (created with a fresh random token, mode 0600, when ``create`` and
    absent). A token file others can read is refused: anyone who reads it is the operator."""
    path = Path(path)
    if create and not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"token file: {path} does not exist; give the path of an existing token file (`dra pool "
                         "serve` without --token-file writes one, mode 0600, in its state directory; a client may "
                         "set DRA_POOL_TOKEN instead)") from None
    if st.st_uid not in (0, os.geteuid()):
        raise ValueError(f"token file: {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}) or "
                         "root: its owner chose the token and would be the operator; remove it (without "
                         "--token-file the pool writes a fresh one) or give a token file of your own")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"token file: {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                         f"run chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ValueError(f"token file: {path} holds no token of at least 16 characters")
    return token


def token_matches(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def private_dir(path: str | Path, mode: int = 0o700) -> Path:
    """Makes (or tightens) a directory only its owner may write to."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    return path
