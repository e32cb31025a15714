"""A host whose DNS resolver does not answer: c10d looks up the name of each peer it connects to
(once per process, until a lookup fails), so a process's first connection to the store waits out
the resolver. dra's store client gives that first contact room beyond a short store timeout and
names the cause. The test builds such a host: a network namespace whose only route leads to a
neighbour that never answers, with the resolver's wait set above the store timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

STALL_S = 6  # the resolver's wait per lookup (RES_OPTIONS timeout, one attempt)
STORE_TIMEOUT_S = 3  # below it: without the room for a first contact, the client fails

# Inside the namespace: loopback, and every other address routed to a neighbour that drops all.
NAMESPACE = (
    "ip link set lo up && ip link add v0 type veth peer name v1 && ip addr add 10.0.0.1/24 dev v0 && "
    "ip link set v0 up && ip link set v1 up && ip neigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev v0 && "
    "ip route add default via 10.0.0.2 dev v0 && exec \"$@\""
)

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from datetime import timedelta
    import torch.distributed as dist
    began = time.monotonic()
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    stalled = time.monotonic() - began
    if stalled < {stall} / 2:
        print(f"NOSTALL {{stalled:.1f}}", flush=True)
        sys.exit(0)
    child = subprocess.run([sys.executable, "-c", sys.argv[1], str(server.port)], capture_output=True, text=True,
                           timeout=120)
    sys.stdout.write(child.stdout)
    sys.stderr.write(child.stderr)
    print("capacity", server.get("dra/resolver/0/capacity").decode() if server.check(["dra/resolver/0/capacity"])
          else "absent", flush=True)
    sys.exit(child.returncode)
""").format(stall=STALL_S)

CHILD = textwrap.dedent("""
    import sys, time
    from dra._core.elastic import JobControl
    began = time.monotonic()
    control = JobControl(f"127.0.0.1:{sys.argv[1]}", "resolver", timeout_s=%d)
    control.set_capacity(1, 2)
    print(f"connected after {time.monotonic() - began:.1f} s", flush=True)
""") % STORE_TIMEOUT_S


def _namespaces_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to build a network namespace with a silent resolver")
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs `{tool}` to build a network namespace with a silent resolver")
    probe = subprocess.run(["unshare", "-n", "sh", "-c", NAMESPACE, "sh", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"network namespaces with veth pairs are not available here: {probe.stderr.strip()}")


def test_first_store_contact_outlasts_a_silent_resolver_and_names_it():
    _namespaces_or_skip()
    env = dict(os.environ, RES_OPTIONS=f"timeout:{STALL_S} attempts:1")
    run = subprocess.run(["unshare", "-n", "sh", "-c", NAMESPACE, "sh", sys.executable, "-c", PARENT, CHILD],
                         capture_output=True, text=True, timeout=180, env=env)
    out = run.stdout + run.stderr
    if "NOSTALL" in run.stdout:
        pytest.skip(f"this host's resolver answers without a network ({run.stdout.strip()}): nothing stalls")
    assert run.returncode == 0, out
    # The client connected although its store timeout is shorter than the resolver's wait...
    assert "connected after" in run.stdout, out
    waited = float(run.stdout.split("connected after ")[1].split(" s")[0])
    assert waited > STORE_TIMEOUT_S, out
    # ...its write arrived...
    assert "capacity absent" not in run.stdout, out
    # ...and the slow first contact is named with its cause and fix.
    assert "[dra] the first connection to the store at 127.0.0.1:" in run.stderr, out
    assert "RES_OPTIONS='timeout:1 attempts:1'" in run.stderr, out
