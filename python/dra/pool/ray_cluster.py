"""The pool beyond one machine, on a Ray cluster (optional: ``pip install -r requirements-ray.txt``).

- **Inventory from Ray's resources.** A node offers pool devices through two custom resources it
  is started with: ``dra_slot`` (how many devices) and a node tag ``dra_node_<name>`` (so a lease
  can be pinned to it). ``ray start --resources '{"dra_slot": 2, "dra_node_a": 1}'``. GPUs a node
  reports (``GPU``) become devices of type ``gpu`` (Ray sets ``CUDA_VISIBLE_DEVICES`` itself).
- **A placement group per lease** (one bundle: one ``dra_slot`` and a sliver of the node tag), and
  the worker started on the lease's node by an actor inside it (``_WorkerHost``), which runs the
  worker as a child process that dies with it (``PR_SET_PDEATHSIG``).
- **Nodes that leave or join.** ``RayCluster.watch`` reads Ray's node table every half second and
  also knocks at each node's raylet: a refused connection means its raylet is gone now, seconds
  before Ray's own health check (``health_check_period_ms`` x ``health_check_failure_threshold``)
  marks it dead. The pool then removes the node's devices and releases its leases
  (``PoolService.remove_node``), so no lease is granted on a dead node; the jobs' other workers
  shrink in place and finish. A node that joins (a new node id) adds its devices.
- **A bad address fails fast**: the head's port is knocked at before ``ray.init`` (which would
  retry for a minute), and the error names the address and the fix.

Leases on Ray are not enforced by cgroups: they are labelled ``soft`` (Ray's resources are logical
accounting), except GPUs (``CUDA_VISIBLE_DEVICES`` set by Ray).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

NODE_PREFIX = "dra_node_"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray pool needs Ray: pip install -r requirements-ray.txt") from None
    return ray


def _knock(host: str, port: int, timeout_s: float) -> str | None:
    """None when something listens at host:port, else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer in {timeout_s:g} s"
    except OSError as e:
        return e.strerror or str(e)


def check_address(address: str, timeout_s: float = 3.0) -> None:
    """Raises ValueError, naming the address and the fix, when no Ray head answers there."""
    if address in ("auto", ""):
        if os.environ.get("RAY_ADDRESS"):
            return check_address(os.environ["RAY_ADDRESS"], timeout_s)
        if not os.path.exists("/tmp/ray/ray_current_cluster"):
            raise ValueError("ray: no Ray cluster runs on this machine ('auto' found none); start one with "
                             "ray start --head, or give its address (ray:HOST:PORT)")
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray: '{address}' is not HOST:PORT (the head's GCS address, e.g. 127.0.0.1:6379)")
    why = _knock(host, int(port), timeout_s)
    if why:
        raise ValueError(f"ray: no Ray cluster answers at {address} ({why}); start one (ray start --head) or "
                         "fix the address")
    return None


class RayCluster:
    """Connects to a Ray cluster and describes its pool devices."""

    def __init__(self, address: str = "auto") -> None:
        ray = _ray()
        if not ray.is_initialized():
            check_address(address)
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ValueError(f"ray: cannot connect to the Ray cluster at {address}: {e}") from None
        self.ray = ray
        self.known: dict[str, dict[str, Any]] = {}  # the nodes the watcher knows alive

    def node_gone(self, tag: str) -> str | None:
        """Why a node the watcher knows is gone now (its raylet refuses connections), else None:
        asked when a worker there ended, before its device can be granted again."""
        info = self.known.get(tag)
        return None if info is None else self.raylet_gone(info, timeout_s=0.3)

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Alive nodes with pool devices: tag name -> {"slots", "gpus", "node_id", "address", "port"}."""
        out = {}
        for n in self.ray.nodes():
            if not n.get("Alive"):
                continue
            res = n.get("Resources", {})
            tags = [k[len(NODE_PREFIX):] for k in res if k.startswith(NODE_PREFIX)]
            if not tags:
                continue
            out[tags[0]] = {"slots": int(res.get("dra_slot", 0)), "gpus": int(res.get("GPU", 0)), "node_id": n["NodeID"],
                            "address": n.get("NodeManagerAddress"), "port": n.get("NodeManagerPort")}
        return out

    def devices(self, nodes: dict[str, dict[str, Any]] | None = None) -> list[Any]:
        from dra._core import pool as P

        devs = []
        for tag, info in sorted((self.nodes() if nodes is None else nodes).items()):
            for i in range(info["slots"]):
                devs.append(P.Device(id=f"{tag}/slot{i}", type="ray-slot", node=tag, group=0, memory_gb=0.0,
                                     enforcement="soft"))
            for i in range(info["gpus"]):
                devs.append(P.Device(id=f"{tag}/gpu{i}", type="gpu", node=tag, group=0, memory_gb=0.0,
                                     enforcement="cuda_visible_devices"))
        return devs

    @staticmethod
    def raylet_gone(info: dict[str, Any], timeout_s: float = 1.0) -> str | None:
        """Why a node's raylet is gone (its port refuses connections), None while it answers or
        cannot be told (no answer in time: the machine may be busy; Ray's health check decides)."""
        if not info.get("address") or not info.get("port"):
            return None
        why = _knock(str(info["address"]), int(info["port"]), timeout_s)
        return f"its raylet is gone ({why})" if why == "connection refused" else None

    def watch(self, on_lost: Callable[..., Any], on_joined: Callable[[str, list[Any]], Any] | None = None,
              every_s: float = 0.5) -> threading.Event:
        """Calls on_lost(tag, reason) once for each node that is gone (Ray's table says so, or its
        raylet refuses connections) and on_joined(tag, devices) for each node that joins; returns a
        stop event."""
        stop = threading.Event()
        known = self.known = dict(self.nodes())
        dead: set[str] = set()  # node ids seen gone (Ray's table may still call them alive a while)

        def loop() -> None:
            while not stop.wait(every_s):
                try:
                    alive = {t: i for t, i in self.nodes().items() if i["node_id"] not in dead}
                except Exception:  # noqa: BLE001 - the head is busy: try again
                    continue
                for tag, info in list(known.items()):
                    why = "Ray reports it dead" if tag not in alive else self.raylet_gone(info)
                    if tag in alive and alive[tag]["node_id"] != info["node_id"]:
                        why = "it restarted (a new node id)"
                    if why:
                        dead.add(info["node_id"])
                        del known[tag]
                        on_lost(tag, why)
                for tag, info in alive.items():
                    if tag not in known and info["node_id"] not in dead:
                        known[tag] = info
                        if on_joined is not None:
                            on_joined(tag, self.devices({tag: info}))

        threading.Thread(target=loop, name="dra-ray-watch", daemon=True).start()
        return stop


def _pdeathsig() -> None:  # in the worker, before exec: die with the actor that started it
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _WorkerHost:
    """Ray actor: runs one worker process on its node."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, cmd: list[str], env: dict[str, str], cwd: str | None, log: str) -> int:
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig)
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)


class RaySpawner:
    """The launcher's spawner on Ray: a placement group per lease on its node, the worker started
    there by a _WorkerHost actor. Same interface as the local spawner."""

    def __init__(self, address: str = "auto") -> None:
        self.cluster = RayCluster(address)
        ray = self.cluster.ray
        self.host_cls = ray.remote(num_cpus=0)(_WorkerHost)
        self.hosts: dict[str, tuple[Any, Any]] = {}
        self.pids: dict[str, int] = {}
        self.starting: dict[str, Any] = {}  # wid -> the start call's ObjectRef, until it answered
        self.polling: dict[str, Any] = {}  # wid -> a poll call's ObjectRef, until it answered
        self.cancelled: list[tuple[str, int]] = []  # killed before Ray placed them (their exits)

    def spawn(self, wid: str, cmd: list[str], env: dict[str, str], cgroups: list[str], log: Any,
              cwd: str | None) -> int:
        """Asks Ray for the lease's placement group and a host actor in it, without waiting (the
        launcher's loop must keep heartbeating): the worker starts when Ray has placed them."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node = env.get("DRA_NODE", "")
        bundle: dict[str, float] = {"dra_slot": 1.0}
        if node:
            bundle[NODE_PREFIX + node] = 0.001
        pg = placement_group([bundle], strategy="STRICT_PACK")
        host = self.host_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
        started = host.start.remote(cmd, env, cwd, str(log))
        self.hosts[wid] = (host, pg)
        self.starting[wid] = started
        return 0  # its pid is known once the actor started it

    def poll(self) -> list[tuple[str, int]]:
        ray = self.cluster.ray
        out, self.cancelled = self.cancelled, []
        for wid, (host, _pg) in list(self.hosts.items()):
            try:
                ref = self.starting.get(wid)
                if ref is not None:
                    ready, _ = ray.wait([ref], timeout=0)
                    if not ready:
                        continue  # still being placed / started
                    self.pids[wid] = ray.get(ref)
                    del self.starting[wid]
                # Never block the launcher's loop: a poll is asked for, and read once it answered.
                ref = self.polling.get(wid)
                if ref is None:
                    self.polling[wid] = host.poll.remote()
                    continue
                ready, _ = ray.wait([ref], timeout=0)
                if not ready:
                    continue
                del self.polling[wid]
                code = ray.get(ref)
            except Exception:  # noqa: BLE001 - the actor (its node) is gone: the worker died with it
                self.polling.pop(wid, None)
                code = -int(signal.SIGKILL)
            if code is not None:
                out.append((wid, int(code)))
                self._drop(wid)
        return out

    def kill(self, wid: str, sig: int = signal.SIGKILL) -> None:
        if wid in self.starting and sig == signal.SIGKILL:
            # Not started yet (its placement group may wait for a node that is gone): cancelled.
            self.cancelled.append((wid, -int(sig)))
            self._drop(wid)
            return
        if wid in self.hosts:
            try:
                self.hosts[wid][0].kill.remote(int(sig))
            except Exception:  # noqa: BLE001
                pass

    def _drop(self, wid: str) -> None:
        from ray.util.placement_group import remove_placement_group

        host, pg = self.hosts.pop(wid)
        self.starting.pop(wid, None)
        self.polling.pop(wid, None)

        def drop() -> None:  # off the loop: calls about a dead node's actor can take a while
            try:
                self.cluster.ray.kill(host)
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - its node is gone
                pass

        threading.Thread(target=drop, daemon=True).start()

    def close(self) -> None:
        for wid in list(self.hosts):
            self.kill(wid)
            time.sleep(0.1)
            self._drop(wid)
