"""Another local user against dra's surfaces other than the pool's API (test_pool_security.py has
that one): what listens for a dra process, who can reach it, and what a peer can make it do.

Each attack runs as the unprivileged user ``nobody`` (setpriv, the system's Python: it needs only
the standard library), so these tests need root and skip without it."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
as_nobody_possible = pytest.mark.skipif(
    os.geteuid() != 0 or not _has_user("nobody") or not shutil.which("setpriv") or SYSTEM_PYTHON is None,
    reason="acts as the user nobody: needs root, a user 'nobody', setpriv and /usr/bin/python3")

#: The attacker: connects to every address it is given (a line "tcp PORT" or "unix PATH"), says
#: what happened, and holds each connection open without a byte sent (a peer that stalls a
#: handshake), until its stdin closes.
ATTACKER = r"""
import socket, sys
held = []
for line in sys.stdin:
    kind, addr = line.split(None, 1)
    addr = addr.strip()
    try:
        if kind == "tcp":
            s = socket.create_connection(("127.0.0.1", int(addr)), timeout=5)
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(addr)
        held.append(s)
        print("connected", kind, addr, flush=True)
    except OSError as e:
        print("refused", kind, addr, e.strerror, flush=True)
"""


def _nobody(code: str) -> subprocess.Popen[str]:
    nobody = pwd.getpwnam("nobody")
    return subprocess.Popen(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                             SYSTEM_PYTHON, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd="/")


def _my_listeners() -> set[tuple[str, str]]:
    """This process's listening sockets: ("tcp", port) on any address, ("unix", path)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out: set[tuple[str, str]] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                out.add(("tcp", str(int(f[1].rsplit(":", 1)[1], 16))))
    for row in Path("/proc/self/net/unix").read_text().splitlines()[1:]:
        f = row.split()
        if len(f) >= 8 and f[6] in inodes and int(f[3], 16) & 0x10000:  # __SO_ACCEPTCON: listening
            out.add(("unix", f[7]))
    return out


@as_nobody_possible
@pytest.mark.timeout(120)
def test_another_user_cannot_stall_or_reach_the_live_rl_coordinator(tmp_path: Path) -> None:
    """The live RL coordinator waits for its workers on a listener that takes checked JSON messages
    once a peer passes its key (dra/rl/live/channel.py; nothing is unpickled). The user nobody connects to every socket the coordinator listens on
    while its workers start and stalls there: the workers must still connect (the listener is a
    Unix socket in a directory only the coordinator's user can enter, so nobody's connect is
    refused), and the run must start. On a loopback TCP port, nobody's stalled handshake held
    the only accepting thread, and the start failed after its timeout."""
    from dra.rl.live.config import LiveConfig
    from dra.rl.live.coordinator import LiveRL
    from dra.rl.live.model import ModelConfig

    config = LiveConfig(slots=2, steps=1, use_cgroups=False, pretrain_steps=0, prompts_per_step=2, group_size=2,
                        rollout_slots=2, model=ModelConfig(d_model=16, layers=1, heads=2), timeout_s=60)
    # timeout_s: the workers' start (each imports torch: 5-15 s apiece on a loaded host, was 25 s for
    # both); a listener held by nobody's stalled handshake fails the start at this timeout all the same.
    before = _my_listeners()
    attacker = _nobody(ATTACKER)
    result: dict[str, object] = {}

    def start() -> None:
        try:
            result["live"] = LiveRL(config, tmp_path / "out", quiet=True)
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            result["error"] = e

    t = threading.Thread(target=start)
    t.start()
    told: set[tuple[str, str]] = set()
    try:
        while t.is_alive():
            for kind, addr in sorted(_my_listeners() - before - told):
                assert attacker.stdin is not None
                attacker.stdin.write(f"{kind} {addr}\n")
                attacker.stdin.flush()
                told.add((kind, addr))
            time.sleep(0.005)
        t.join()
    finally:
        assert attacker.stdin is not None
        attacker.stdin.close()  # it reads no more, and exits
        try:
            attacker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            attacker.kill()
            attacker.wait()
        assert attacker.stdout is not None
        lines = attacker.stdout.read().splitlines()
        attacker.stdout.close()
        live = result.get("live")
        if live is not None:
            live.close()  # type: ignore[attr-defined]
    assert "error" not in result, f"the coordinator did not start with nobody connected: {result.get('error')}; " \
                                  f"nobody: {lines}"
    assert told, "the coordinator listened on nothing this test saw"
    assert not any(line.startswith("connected unix") for line in lines), lines
    assert any(line.startswith("refused unix") for line in lines), lines  # it was told the socket, and refused


class _Custom:
    """A type torch's restricted loader does not know."""


class _Planted:
    """A pickle that runs code when unpickled: it creates the file it names."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (Path(self.path),))


def test_a_peers_state_manifest_runs_no_code_and_a_state_joiners_cannot_load_is_named_at_the_sender(tmp_path: Path) -> None:
    """The state handoff's manifest comes from another process of the world, that is from whoever
    the store admitted (a c10d store has no authentication). It was read with pickle.loads: a
    manifest that unpickles to code ran that code as the joiner."""
    import pickle

    import torch

    from dra.elastic._state import TorchState

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    joiner = TorchState(model, opt, None)
    planted = tmp_path / "ran"
    for payload in (pickle.dumps({"entries": [], "x": _Planted(str(planted))}),
                    pickle.dumps(_Planted(str(planted)), protocol=2)):
        with pytest.raises(ValueError, match="restricted loader"):
            joiner.prepare(payload)
        assert not planted.exists(), "the joiner ran the peer's code"

    # A real manifest travels and loads.
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=10)
    sender = TorchState(model, opt, sched)
    tensors, manifest, _ = sender.collect()
    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.AdamW(other.parameters())
    receiver = TorchState(other, other_opt, torch.optim.lr_scheduler.OneCycleLR(other_opt, 0.1, total_steps=10))
    targets = receiver.prepare(manifest)
    for dst, src in zip(targets, tensors):
        dst.copy_(src)
    receiver.load(manifest, targets)
    assert torch.equal(other.weight, model.weight)
    assert other_opt.state_dict()["state"][0]["exp_avg"].equal(opt.state_dict()["state"][0]["exp_avg"])

    # A scheduler state that holds a type the joiners' loader refuses: named at the sender, with the fix.
    sched.custom = _Custom()
    with pytest.raises(ValueError, match=r"the scheduler state holds a type .*add_safe_globals"):
        TorchState(model, opt, sched).collect()
