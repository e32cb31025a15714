"""Where this node's workers stand in the job: the node rendezvous of ``dra run``.

- one node (the default, ``--standalone``): the launcher hosts the job's store on a free port;
- ``--rdzv-backend c10d --rdzv-endpoint HOST:PORT``: torch's own dynamic rendezvous
  (``torch.distributed.elastic.rendezvous``, what torchrun uses), over the c10d store at the
  endpoint. A store already listening there (``dra store --port PORT``) is used as it is: the job
  then survives the loss of any node. Otherwise the node whose address matches HOST hosts it (as
  torchrun's agents do), and the job ends with that node;
- ``--node-rank K --master-addr HOST --master-port PORT``: torch's static form: node 0 hosts.

Every node then publishes its worker count, so global ranks are contiguous per node in node-rank
order, as under torchrun. The job's workers use the same store (``DRA_STORE`` = MASTER_ADDR:MASTER_PORT,
``TORCHELASTIC_USE_AGENT_STORE=True``): dra's keys live under ``dra/<run id>/``, torch's default
process group under its own prefix, the launchers' under ``dra_run/``.
"""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


def host_store(host: str, port: int, timeout_s: float = 60.0, flag: str = "--port") -> Any:
    """A c10d TCPStore this process hosts at host:port (0: a free port). An address this node does
    not have, or a port another program holds, is refused at once naming the address and the fix
    (torch retries such a listen until its timeout, then names only the errno)."""
    import errno
    import socket

    import torch.distributed as dist

    try:  # a probe first: its error is immediate and exact
        family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except socket.gaierror as e:
        raise ValueError(f"{host}: not an address this node can resolve ({e.strerror}); give an address or host "
                         "name of this node (127.0.0.1 for one node)") from None
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            free = " (0 picks a free one)" if flag == "--port" else ""
            raise ValueError(f"{flag} {port}: {host}:{port} is in use (another store or program listens there); give "
                             f"another {flag}{free}, or stop what holds it (ss -ltnp 'sport = :{port}' names it)") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"{host}: not an address of this node, so no store can listen there; give one of this "
                             "node's addresses (ip -brief address lists them; 127.0.0.1 for one node)") from None
        if e.errno == errno.EACCES:
            raise ValueError(f"{flag} {port}: this user may not listen on port {port}; give a port above 1023") from None
        raise
    return dist.TCPStore(host, int(port), None, True, timedelta(seconds=timeout_s), wait_for_workers=False)


@dataclass
class Placement:
    """This node's place in the job once the nodes met."""

    run_id: str
    group_rank: int
    group_world_size: int
    first_rank: int  #: the global rank of this node's local rank 0
    world_size: int  #: workers over every node
    nprocs: list[int]  #: workers per node, in node-rank order
    master_addr: str
    master_port: int
    store: Any  #: a torch Store for the launchers' own keys (prefixed dra_run/)
    server: Any = None  #: the TCPStore this process hosts (one node), kept alive with the launcher
    handler: Any = None  #: torch's rendezvous handler (c10d), shut down at the end
    extra: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    def close(self) -> None:
        if self.handler is not None:
            try:
                self.handler.shutdown()
            except Exception:  # noqa: BLE001 - the store may be gone (a node died): nothing to close
                pass
            self.handler = None


def bound_store_connections(port: int, seconds: float) -> None:
    """torch's store client bounds only its waits: a store operation whose request or answer a cut
    link holds blocks until the kernel gives the connection up (about 15 minutes of retransmissions),
    so a node cut off from the store never saw its beat fail and never fenced its workers. Every
    connected TCP socket of this process whose peer is the store's port gets TCP_USER_TIMEOUT: the
    kernel drops the connection once sent data stays unacknowledged for `seconds`, and the operation
    fails. A store that is only slow acknowledges what it receives and is not affected. (torch does
    not hand out its socket; dra's own store client bounds its connections the same way.)"""
    import os
    import socket
    import stat

    if not hasattr(socket, "TCP_USER_TIMEOUT") or not os.path.isdir("/proc/self/fd"):
        return
    for name in os.listdir("/proc/self/fd"):
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))  # the copy shares the connection's options
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type == socket.SOCK_STREAM and sock.getpeername()[1] == port:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, int(seconds * 1000)))
            except (OSError, IndexError, TypeError):
                pass


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a joiner's private world of one binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefixed(store: Any) -> Any:
    import torch.distributed as dist

    return dist.PrefixStore("dra_run", store)


def _gather_nprocs(store: Any, group_rank: int, group_world_size: int, nproc: int, timeout_s: float) -> list[int]:
    """Every node's worker count, in node-rank order (each node publishes its own). A long wait
    says on stderr which nodes it still waits for, and for how long yet (every 30 s, or half the
    timeout when that is shorter)."""
    say_every_s = min(30.0, timeout_s / 2)
    store.set(f"nproc/{group_rank}", str(nproc))
    keys = [f"nproc/{g}" for g in range(group_world_size)]
    start = time.monotonic()
    said = start
    while True:
        left = timeout_s - (time.monotonic() - start)
        try:
            store.wait(keys, timedelta(seconds=max(0.001, min(left, say_every_s))))
            return [int(store.get(k)) for k in keys]
        except Exception as e:  # noqa: BLE001 - torch raises its DistStoreError (a RuntimeError) on a timeout
            if "timeout" not in str(e).lower() and "timed out" not in str(e).lower():
                raise
        now = time.monotonic()
        if now - start >= timeout_s:
            missing = [g for g in range(group_world_size) if not store.check([f"nproc/{g}"])]
            raise TimeoutError(f"node {group_rank}: node(s) {', '.join(map(str, missing))} did not join within "
                               f"{timeout_s:g} s (--rdzv-conf join_timeout=S waits longer)")
        if now - said >= say_every_s * 0.95:
            said = now
            missing = [g for g in range(group_world_size) if not store.check([f"nproc/{g}"])]
            print(f"[dra run] node {group_rank}: waiting for node(s) {', '.join(map(str, missing))} to join "
                  f"({timeout_s - (now - start):.0f} s left)", file=sys.stderr, flush=True)


def local(run_id: str, nproc: int, host: str, advertise: str | None, port: int = 0) -> Placement:
    """One node: a store of our own on ``port`` (``--master-port``, as torchrun's; 0: a free one)."""
    server = host_store(host, port, flag="--master-port" if port else "--port")
    return Placement(run_id, 0, 1, 0, nproc, [nproc], advertise or host, server.port, _prefixed(server), server=server)


def static(run_id: str, nproc: int, nnodes: int, node_rank: int, master_addr: str, master_port: int,
           timeout_s: float) -> Placement:
    """torch's static rendezvous: node 0 hosts the store at master_addr:master_port."""
    import torch.distributed as dist

    if node_rank == 0:
        store = host_store(master_addr, master_port, timeout_s, flag="--master-port")
    else:
        store = dist.TCPStore(master_addr, master_port, None, False, timedelta(seconds=timeout_s),
                              wait_for_workers=False)
    ours = _prefixed(store)
    # Each node rank once, and one --nnodes for all (node 0's store is new with every launch): a
    # second launcher given the same --node-rank ran the same ranks twice, and a node told another
    # --nnodes waited for a node that never comes.
    if node_rank != 0:
        ours.wait(["nnodes/0"], timedelta(seconds=timeout_s))
        theirs = int(ours.get("nnodes/0"))
        if theirs != nnodes:
            raise ValueError(f"--nnodes: this node (rank {node_rank}) has {nnodes}, node 0 has {theirs}; give every node "
                             "the same --nnodes")
    else:
        ours.set("nnodes/0", str(nnodes))
    if ours.add(f"claim/{node_rank}", 1) > 1:
        raise ValueError(f"--node-rank {node_rank}: another launcher joined this job ({master_addr}:{master_port}) "
                         "as that node already; give each node its own --node-rank")
    nprocs = _gather_nprocs(ours, node_rank, nnodes, nproc, timeout_s)
    return Placement(run_id, node_rank, nnodes, sum(nprocs[:node_rank]), sum(nprocs), nprocs, master_addr,
                     master_port, ours, server=store if node_rank == 0 else None)


def dynamic(run_id: str, nproc: int, min_nodes: int, max_nodes: int, endpoint: str, local_addr: str | None,
            conf: dict[str, str], timeout_s: float) -> Placement:
    """torch's c10d dynamic rendezvous (torchrun's ``--rdzv-backend c10d``)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    params = RendezvousParameters(backend="c10d", endpoint=endpoint, run_id=run_id, min_nodes=min_nodes,
                                  max_nodes=max_nodes, local_addr=local_addr, **conf)
    handler = get_rendezvous_handler(params)
    info = handler.next_rendezvous()
    ours = _prefixed(info.store)
    nprocs = _gather_nprocs(ours, info.rank, info.world_size, nproc, timeout_s)
    host, _, port = endpoint.rpartition(":")
    return Placement(run_id, info.rank, info.world_size, sum(nprocs[:info.rank]), sum(nprocs), nprocs, host,
                     int(port), ours, handler=handler)


class NodeBeats:
    """Launchers' liveness and exit over the store: each node raises ``beat/<node>``; a node that
    ended writes ``exited/<node>``. Before leaving, a node waits (bounded) for the others still
    beating, so that the one hosting the store does not take it from workers that still use it;
    a node whose beat stands still is dead and waited for no longer (no 300 s exit barrier)."""

    def __init__(self, placement: Placement, stale_s: float = 3.0) -> None:
        self.p = placement
        self.stale_s = stale_s
        self._seen: dict[int, tuple[int, float]] = {}
        self._last_beat = 0.0

    def beat(self) -> None:
        """Raises this node's counter (at most twice a second). Raises when the store is unreachable."""
        now = time.monotonic()
        if now - self._last_beat >= 0.5:
            self.p.store.add(f"beat/{self.p.group_rank}", 1)
            self._last_beat = now

    def wait_for_others(self, limit_s: float = 60.0) -> list[int]:
        """Marks this node exited; waits until every other node exited or stopped beating. Returns the
        nodes taken for dead."""
        store, me = self.p.store, self.p.group_rank
        try:
            store.set(f"exited/{me}", "1")
        except Exception:  # noqa: BLE001 - the store is gone: nobody to wait for
            return []
        deadline = time.monotonic() + limit_s
        others = [g for g in range(self.p.group_world_size) if g != me]
        dead: list[int] = []
        while others and time.monotonic() < deadline:
            for g in list(others):
                try:
                    if store.check([f"exited/{g}"]):
                        others.remove(g)
                        continue
                    count = store.add(f"beat/{g}", 0)
                except Exception:  # noqa: BLE001
                    return dead
                seen = self._seen.get(g)
                now = time.monotonic()
                if seen is None or seen[0] != count:
                    self._seen[g] = (count, now)
                elif now - seen[1] > self.stale_s:
                    others.remove(g)
                    dead.append(g)
            time.sleep(0.1)
        return dead
