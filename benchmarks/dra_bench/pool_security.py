"""The pool's security check (the ``pool_security_escalations`` row of ``python -m dra.bench pool``
and tests/python/test_pool_security.py): the unprivileged user ``nobody`` attacks a pool run by
root that runs a root job, through the API (another's job, the operator's acts, TCP without the
token), the state files, the root job's network (its store), and from inside a job of its own (who
it runs as, /etc/shadow, its cgroup's limits).

The pool runs its jobs' launchers with its own interpreter as the jobs' users, so the check needs
an interpreter ``nobody`` can run. A virtual environment whose python links into a private home
(pyenv under a 0700 /root, as on this project's machines and CI) is not one: the check then builds
one that is (``shared_interpreter``: the system's Python of the same version, in a virtual
environment under a world-readable temporary directory, that sees this environment's packages
through a ``.pth`` file) and runs the whole check, pool daemon included, with it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "pool"


class NoInterpreter(RuntimeError):
    """No interpreter the attacking user can run: the check cannot take place here."""


def runs_python(user: str, python: str) -> str:
    """Why ``user`` cannot run ``python`` with this package ("" when it can)."""
    from dra.pool import _auth

    return _auth.can_run_python(_auth.owner_named(user), python) or ""


def shared_interpreter(user: str, base: Path) -> Path:
    """A python ``user`` can run that imports what this one imports: the system's Python of the
    same version, as a virtual environment in ``base`` (which must be a directory ``user`` can
    enter) whose ``.pth`` file adds this environment's site-packages. NoInterpreter when there is
    no such Python or ``user`` still cannot run it (the repository itself unreadable, say)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    own = os.path.realpath(sys.executable)
    candidates = [c for c in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}", shutil.which(f"python{version}"))
                  if c and os.path.isfile(c) and os.path.realpath(c) != own]
    if not candidates:
        raise NoInterpreter(f"no system Python {version} besides {own} that {user} could run; install python{version} "
                           "(Debian: apt-get install python3) or run the check from an interpreter outside a private home")
    env = base / "env"
    r = subprocess.run([candidates[0], "-m", "venv", "--without-pip", str(env)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise NoInterpreter(f"could not make a virtual environment with {candidates[0]}: {r.stderr.strip()[-500:]}")
    lib = next((env / "lib").glob("python*/site-packages"))
    # One line per directory: site runs a .pth line that starts with "import" (and processes the
    # .pth files it finds there, this package's editable install and dra_bench's path among them).
    lines = [f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages() if os.path.isdir(d)]
    (lib / "dra_parent_env.pth").write_text("".join(lines))
    python = env / "bin" / "python"
    why = runs_python(user, str(python))
    if why:
        raise NoInterpreter(f"{user} cannot run {python} either: {why} (is the repository readable by {user}?)")
    return python


def security_check(tmp: Path, user: str = "nobody", timeout_s: float = 150.0) -> dict[str, Any]:
    """Returns {"escalations": n, "attempts": {what: outcome}, "python": the interpreter the pool
    ran}: every attempt must be refused and the user's job must run as that user. Needs root
    (RuntimeError otherwise). When ``user`` cannot run this interpreter, the check runs in a
    subprocess with one it can run (``shared_interpreter``)."""
    if os.geteuid() != 0:
        raise RuntimeError("the security check needs root (it runs a pool as root and attacks it as another user)")
    if not runs_python(user, sys.executable):
        return {**_attack(Path(tmp), user, timeout_s), "python": sys.executable}
    base = Path(tempfile.mkdtemp(prefix="dra-sec-python-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)  # the user reaches the interpreter through it
        python = shared_interpreter(user, base)
        out = base / "report.json"
        code = ("import json, sys; from pathlib import Path; from dra_bench.pool_security import _attack; "
                "json.dump(_attack(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])), open(sys.argv[4], 'w'))")
        r = subprocess.run([str(python), "-c", code, str(tmp), user, str(timeout_s), str(out)], capture_output=True,
                           text=True, timeout=timeout_s + 240, cwd=str(ROOT))
        if r.returncode != 0:
            raise RuntimeError(f"the security check under {python} failed (exit {r.returncode}): {r.stderr[-3000:]}")
        return {**json.loads(out.read_text()), "python": f"{python} (the system's Python {sys.version_info.major}."
                f"{sys.version_info.minor} with this environment's packages: {sys.executable} is not runnable by {user})"}
    finally:
        shutil.rmtree(base, ignore_errors=True)


_ATTACKER = r"""
import json, os, sys
from dra.pool.server import PoolClient
url, victim, tcp, state, ports = sys.argv[1:6]
c = PoolClient(url)
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except (PermissionError, ValueError, OSError, RuntimeError) as e:
        out[name] = "refused: " + str(e)[:160]
attempt("read another's job spec", lambda: c.job_spec(victim))
attempt("cancel another's job", lambda: c.cancel(victim))
attempt("report for another's job", lambda: c.report(victim, {"rate_rps": 1e6}))
attempt("sync as another's launcher", lambda: c.sync(victim, [], [], None, failed=True, reason="attack"))
attempt("drain the pool", lambda: c.drain())
attempt("submit as root", lambda: c.submit({"name": "as-root", "user": "root", "command": ["id"], "cwd": "/tmp"}))
attempt("submit into a directory it cannot enter", lambda: c.submit({"name": "cwd", "command": ["id"], "cwd": "/root"}))
attempt("TCP without the token", lambda: PoolClient(tcp, token="").status())
attempt("TCP with a wrong token", lambda: PoolClient(tcp, token="x" * 43).status())
for f in ("pool.sqlite", "events.jsonl", "logs/" + victim + ".launcher.log", "token"):
    attempt("read state " + f, lambda f=f: open(os.path.join(state, f)).read(1))
import socket
for port in [int(p) for p in ports.split(",") if p]:
    attempt("connect to the root job's port " + str(port), lambda port=port: socket.create_connection(("127.0.0.1", port), timeout=2).close())
others = [j for j in c.status()["jobs"] if j["name"] == victim]
out["see another's report"] = "allowed" if others and others[0]["report"] is not None else "refused"
print(json.dumps(out))
"""

_JOB = r"""
import json, os, sys
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except OSError as e:
        out[name] = "refused: " + e.strerror
attempt("read /etc/shadow", lambda: open("/etc/shadow").read(1))
attempt("write into /etc", lambda: open("/etc/dra-escalation-probe", "w").write("x"))
cgroups = [p for p in os.environ.get("DRA_CGROUPS", "").split(":") if p]
cpu = next((p for p in cgroups if "/cpu/" in p), None)
if cpu:
    attempt("raise its own CPU quota", lambda: open(os.path.join(cpu, "cpu.cfs_quota_us"), "w").write("-1"))
    root = cpu.split("/dra/")[0]
    attempt("leave its cgroup for the root one", lambda: open(os.path.join(root, "cgroup.procs"), "w").write(str(os.getpid())))
import socket
for port in [int(p) for p in os.environ.get("VICTIM_PORTS", "").split(",") if p]:
    attempt("connect to the root job's port " + str(port), lambda port=port: socket.create_connection(("127.0.0.1", port), timeout=2).close())
json.dump(out, open(sys.argv[1], "w"))
"""


def _listening_ports(pid: int, own: bool = False) -> list[int]:
    """TCP ports listening in the network namespace of a process; ``own``: only its own sockets
    (a launcher's: its job's store)."""
    inodes = None
    if own:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and (inodes is None or fields[9] in inodes):  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _attack(tmp: Path, user: str, timeout_s: float) -> dict[str, Any]:
    """An unprivileged user attacks a pool run by root that runs a root job: through the API
    (another's job, the operator's acts, TCP without the token), the state files, the root job's
    network (its store), and from inside a job of its own (who it runs as, /etc/shadow, its
    cgroup's limits). Returns {"escalations": n, "attempts": {what: outcome}}: every attempt must
    be refused and the user's job must run as that user. Needs root (RuntimeError otherwise)."""
    from dra.pool import _auth
    from dra.pool.factory import make_service
    from dra.pool.server import PoolClient, PoolServer

    if os.geteuid() != 0:
        raise RuntimeError("the security check needs root (it runs a pool as root and attacks it as another user)")
    pw = pwd.getpwnam(user)
    base = Path(tempfile.mkdtemp(prefix="dra-sec-", dir="/tmp"))
    os.chmod(base, 0o711)  # the attacker reaches the pool's socket through it
    state = base / "state"
    state.mkdir()
    work = base / "work"  # the attacker's own directory
    work.mkdir()
    os.chown(work, pw.pw_uid, pw.pw_gid)
    token = _auth.load_token(state / "token", create=True)
    svc = make_service("slots:2", state, name=f"sec-{os.getpid()}", scale_every_s=1.0)
    server = PoolServer(svc, port=0, token=token).start()
    client = PoolClient(server.url)
    attempts: dict[str, str] = {}
    victim = "root-job"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        client.submit({"name": victim, "min_size": 1, "max_size": 1, "cwd": str(tmp), "log": str(tmp / "logs"),
                       "env": {"SECRET": "s3cr3t"}, "preload": ["torch", "dra", "dra.elastic", "sklearn.datasets"],
                       "command": [sys.executable, str(EXAMPLES / "train.py"), "--model", "mlp", "--data", "digits",
                                   "--epochs", "5000", "--out", str(tmp / "victim")]})
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if next(j for j in client.status()["jobs"] if j["name"] == victim)["report"]:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError("the root job never reported")
        # The root job's store (its launcher's listening socket). In a namespace of its own, a port
        # number something here happens to listen on too could not tell anything apart: left out.
        pid = svc.launchers[victim].pid
        ports = own = _listening_ports(pid, own=True)
        if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
            ports = sorted(set(own) - set(_listening_ports(os.getpid())))
            if own and not ports:  # said, not silently left out (a busy host: one run in a few hundred)
                attempts["api: connect to the root job's port"] = (
                    f"not tried: its store listens on port {own[0]} in a network namespace of its own, and something "
                    "in this namespace listens on that port too (a connection could not tell them apart)")
        setpriv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)}
        r = subprocess.run([*setpriv, sys.executable, "-c", _ATTACKER, server.url, victim, server.tcp_url or "",
                            str(state), ",".join(map(str, ports))], capture_output=True, text=True, timeout=120,
                           env=env, cwd=str(work))
        if r.returncode != 0:
            raise RuntimeError(f"the attacker could not run: {r.stderr[-2000:]}")
        for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items():
            attempts[f"api: {k}"] = v
        # The attacker's own job, submitted with the CLI as the attacker (the socket says who).
        script = work / "probe.py"
        script.write_text(_JOB)
        os.chown(script, pw.pw_uid, pw.pw_gid)
        spec = {"name": "mine", "cwd": str(work), "log": str(work / "logs"), "zygote": False,
                "env": {"VICTIM_PORTS": ",".join(map(str, ports))},
                "command": [sys.executable, str(script), str(work / "probe.json")]}
        spec_file = work / "mine.json"  # the attacker's own file (a pipe from this root process is not its to open)
        spec_file.write_text(json.dumps(spec))
        os.chown(spec_file, pw.pw_uid, pw.pw_gid)
        r = subprocess.run([*setpriv, sys.executable, "-m", "dra", "pool", "submit", "--pool", server.url, "--spec",
                            str(spec_file)], capture_output=True, text=True, timeout=60, env=env, cwd=str(work))
        if r.returncode != 0:
            raise RuntimeError(f"the attacker's job was refused: {r.stderr[-2000:]}")
        states = client.wait(["mine"], timeout_s=max(10.0, deadline - time.time()))
        probe = json.loads((work / "probe.json").read_text()) if (work / "probe.json").exists() else {}
        ran_as = (probe.get("uid"), probe.get("euid"), probe.get("gid"), probe.get("groups"))
        want = (pw.pw_uid, pw.pw_uid, pw.pw_gid, [pw.pw_gid])
        attempts["job ran as its submitter"] = "yes" if ran_as == want else f"no: {ran_as} ({states})"
        for k, v in probe.items():
            if k not in ("uid", "euid", "gid", "groups"):
                attempts[f"job: {k}"] = v
        victim_state = next(j["state"] for j in client.status()["jobs"] if j["name"] == victim)
        attempts["the root job still runs"] = "yes" if victim_state == "running" else f"no: {victim_state}"
    finally:
        try:
            client.cancel(victim)
            client.wait([victim], timeout_s=20)
        except Exception:  # noqa: BLE001 - the pool goes anyway
            pass
        server.close()
        shutil.rmtree(base, ignore_errors=True)
    escalations = sum(v.startswith("allowed") if k.startswith(("api:", "job:")) else not v.startswith("yes")
                      for k, v in attempts.items())
    return {"escalations": escalations, "attempts": attempts}


