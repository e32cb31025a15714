"""The pool beyond one machine, on a Ray cluster (optional: ``pip install -r requirements-ray.txt``).

- **Inventory from Ray's resources.** A node offers pool devices through two custom resources it
  is started with: ``dra_slot`` (how many devices) and a node tag ``dra_node_<name>`` (so a lease
  can be pinned to it). ``ray start --resources '{"dra_slot": 2, "dra_node_a": 1}'``. GPUs a named
  node reports (``GPU``) become devices of type ``gpu``. A cluster that offers no device, or two
  nodes of one name, is refused with the fix; a node with ``dra_slot`` and no name is said.
- **A placement group per lease** (one bundle: the lease's share of a ``dra_slot``, or of a ``GPU``
  for a GPU lease, and a sliver of the node tag), and the worker started on the lease's node by an
  actor inside it (``_WorkerHost``), which runs the worker as a child process that dies with it
  (``PR_SET_PDEATHSIG``), as the job's owner (the launcher's uid; a raylet run as root switches to
  it, one run as another user refuses), with ``CUDA_VISIBLE_DEVICES`` the GPU Ray reserved. A
  worker that cannot start there ends with exit code 127/126/1 and its log says why.
- **Nodes that leave or join.** ``RayCluster.watch`` reads Ray's node table every half second and
  also knocks at each node's raylet: a refused connection means its raylet is gone now, seconds
  before Ray's own health check (``health_check_period_ms`` x ``health_check_failure_threshold``)
  marks it dead. The pool then removes the node's devices and releases its leases
  (``PoolService.remove_node``), so no lease is granted on a dead node; the jobs' other workers
  shrink in place and finish. A node that joins (a new node id) adds its devices.
- **The head away.** When the cluster's head (its GCS) stops answering, every node is taken as
  away: nothing is granted on it, but its leases are kept (the head's loss says nothing of the
  nodes, whose workers run on). When the head answers again, each node either comes back as it
  was (its leases go on, no device granted twice) or is found lost, and only then are its leases
  fenced and released.
- **A bad address fails fast**: the head's port is knocked at before ``ray.init`` (which would
  retry for a minute), and the error names the address and the fix.

Leases on Ray are not enforced by cgroups: they are labelled ``soft`` (Ray's resources are logical
accounting), except GPUs (``CUDA_VISIBLE_DEVICES`` set by Ray).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

NODE_PREFIX = "dra_node_"
HEAD_MISSES = 3  # looks in a row at which the cluster's head did not answer before it counts as lost
TABLE_WAIT_S = 2.0  # how long one look waits for Ray's node table before it knocks at the head again


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


def worker_niceness() -> int:
    """The nice increment, over its raylet's, that a job's worker runs at on Ray:
    ``DRA_RAY_WORKER_NICENESS`` in the pool daemon's environment (its launchers inherit it), 0 by
    default (Ray's own default for its workers is 15). Checked when the pool connects."""
    text = os.environ.get("DRA_RAY_WORKER_NICENESS", "0")
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"DRA_RAY_WORKER_NICENESS: must be a whole number in [0, 19], got {text!r}; 0 runs a job's "
                         "workers at their raylet's priority, 15 at Ray's own default for its workers")
    return value


class RayCluster:
    """Connects to a Ray cluster and describes its pool devices."""

    def __init__(self, address: str = "auto", check: bool = True) -> None:
        """``check``: refuse a cluster that offers the pool no device, or two nodes of one name (the
        pool's; a launcher only places workers)."""
        worker_niceness()  # a bad setting fails here, before anything runs
        ray = _ray()
        connected = False
        if not ray.is_initialized():
            check_address(address)
            try:
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ValueError(f"ray: cannot connect to the Ray cluster at {address}: {e}") from None
            connected = True
        self.ray = ray
        self.address = address
        self.known: dict[str, dict[str, Any]] = {}  # the nodes the watcher knows alive
        self.problems: list[str] = []  # what the last look at Ray's node table left out, and why
        if check:
            try:
                nodes = self.nodes()
                named = [p for p in self.problems if not p.endswith("resource: left out")]  # names in conflict
                if named:
                    raise ValueError(f"ray: the Ray cluster at {address}: {'; '.join(named)}")
                if not any(i["slots"] or i["gpus"] for i in nodes.values()):
                    why = "; ".join(self.problems) or (
                        f"its alive nodes {', '.join(NODE_PREFIX + t for t in nodes)} have no dra_slot and no GPU"
                        if nodes else f"no alive node has a {NODE_PREFIX}<name> resource")
                    raise ValueError(f"ray: the Ray cluster at {address} offers the pool no devices ({why}): start "
                                     "each node with a name of its own and slots or GPUs, e.g. ray start --resources "
                                     "'{\"dra_slot\": 2, \"dra_node_a\": 1}'")
                for problem in self.problems:
                    print(f"[dra pool] ray: {problem}", file=sys.stderr, flush=True)
            except BaseException:
                if connected:
                    ray.shutdown()  # nothing left behind
                raise

    def node_gone(self, tag: str) -> str | None:
        """Why a node the watcher knows is gone now (its raylet refuses connections), else None:
        asked when a worker there ended, before its device can be granted again."""
        info = self.known.get(tag)
        return None if info is None else self.raylet_gone(info, timeout_s=0.3)

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Alive nodes with pool devices: tag name -> {"slots", "gpus", "node_id", "address", "port"}.
        A node without a tag, with two tags, or whose tag an alive node already has (the one the
        watcher knows first) is left out and said in ``problems``."""
        out: dict[str, dict[str, Any]] = {}
        problems = []
        known = {i["node_id"] for i in self.known.values()}
        for n in sorted(self.ray.nodes(), key=lambda n: n.get("NodeID") not in known):
            if not n.get("Alive"):
                continue
            res = n.get("Resources", {})
            where = f"node {n.get('NodeID', '?')[:12]} at {n.get('NodeManagerAddress')}"
            tags = sorted(k[len(NODE_PREFIX):] for k in res if k.startswith(NODE_PREFIX))
            if not tags:
                if res.get("dra_slot"):  # meant for the pool (a GPU node without a name may be others')
                    problems.append(f"{where} has dra_slot but no {NODE_PREFIX}<name> resource: left out")
                continue
            if len(tags) > 1:
                problems.append(f"{where} has {len(tags)} names ({', '.join(NODE_PREFIX + t for t in tags)}): left out; "
                                "give it one")
                continue
            if tags[0] in out:
                problems.append(f"{where} has the name {NODE_PREFIX}{tags[0]} of node {out[tags[0]]['node_id'][:12]} at "
                                f"{out[tags[0]]['address']}: left out; give each node a name of its own")
                continue
            out[tags[0]] = {"slots": int(res.get("dra_slot", 0)), "gpus": int(res.get("GPU", 0)), "node_id": n["NodeID"],
                            "address": n.get("NodeManagerAddress"), "port": n.get("NodeManagerPort")}
        self.problems = problems
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
              every_s: float = 0.5, on_head: Callable[[bool, str], Any] | None = None) -> threading.Event:
        """Calls on_lost(tag, reason) once for each node that is gone (Ray's table says so, or its
        raylet refuses connections) and on_joined(tag, devices) for each node that joins (or comes
        back); returns a stop event. The cluster's head (its GCS) is knocked at first, every time:
        when it has not answered for ``HEAD_MISSES`` looks in a row, every node is away with it
        (on_lost(tag, reason, head=True): no lease may be granted on a cluster without a head, and
        Ray's node table cannot be read to tell which nodes live) and on_head(False, reason) is
        called. When it answers again, on_head(True, ""), and at the first read of Ray's table each
        node that was away either comes back as it was (its node id listed alive, its raylet not
        refusing connections: on_joined) or is lost (on_lost, with why: dead, restarted, raylet
        gone)."""
        stop = threading.Event()
        known = self.known = dict(self.nodes())
        dead: set[str] = set()  # node ids seen gone (Ray's table may still call them alive a while)
        said = set(self.problems)
        gcs = self.ray.get_runtime_context().gcs_address
        gcs_host, _, gcs_port = str(gcs).rpartition(":")
        head = {"misses": 0, "lost": False, "ids": set()}  # the node ids that went with the head
        away: dict[str, Any] = {}  # tag -> node: nodes away with the head, not yet seen back or lost

        def head_answers() -> bool:
            why = _knock(gcs_host, int(gcs_port), min(1.0, max(0.2, every_s)))
            if why is None:
                if head["lost"]:
                    head["lost"] = False
                    dead.difference_update(head["ids"])  # the head is back: its nodes may come back with it
                    print(f"[dra pool] ray: the cluster's head (GCS at {gcs}) answers again", file=sys.stderr, flush=True)
                    if on_head is not None:
                        on_head(True, "")
                head["misses"] = 0
                return True
            head["misses"] += 1
            if head["misses"] >= HEAD_MISSES and not head["lost"]:
                head["lost"] = True
                reason = f"the Ray cluster's head (GCS at {gcs}) is unreachable ({why})"
                print(f"[dra pool] ray: {reason}: every node is taken as away (its leases kept, nothing granted); Ray ends the processes connected "
                      "to it (this pool, the jobs' launchers) if it does not come back in time "
                      "(gcs_rpc_server_reconnect_timeout_s, 60 s by default)", file=sys.stderr, flush=True)
                for tag, info in list(known.items()):
                    dead.add(info["node_id"])
                    head["ids"].add(info["node_id"])
                    away[tag] = info
                    del known[tag]
                    on_lost(tag, reason, head=True)
                if on_head is not None:
                    on_head(False, reason)
            return False

        table: dict[str, Any] = {"read": None}  # the read of Ray's node table in flight, if any

        def read_table() -> dict[str, dict[str, Any]] | None:
            """Ray's node table, or None while it does not answer within TABLE_WAIT_S: a read begun
            as the head went away blocks until Ray's client gives up (a minute), and the head's
            knock must go on meanwhile. At most one read is in flight, on a daemon thread."""
            read = table["read"]
            if read is None:
                read = table["read"] = {"done": threading.Event(), "nodes": None}

                def run(r: dict[str, Any] = read) -> None:
                    try:
                        r["nodes"] = self.nodes()
                    except Exception:  # noqa: BLE001 - the head is busy or gone: read again later
                        pass
                    r["done"].set()

                threading.Thread(target=run, name="dra-ray-table", daemon=True).start()
            if not read["done"].wait(TABLE_WAIT_S):
                return None
            table["read"] = None
            return read["nodes"]

        def loop() -> None:
            while not stop.wait(every_s):
                # This process left that cluster (ray.shutdown, or connected to another): stop.
                if not self.ray.is_initialized() or self.ray.get_runtime_context().gcs_address != gcs:
                    return
                if gcs_port.isdigit() and not head_answers():
                    continue  # Ray's node table cannot be read without the head
                nodes = read_table()
                if nodes is None:
                    continue
                alive = {t: i for t, i in nodes.items() if i["node_id"] not in dead}
                for problem in set(self.problems) - said:  # a node that joined and is left out
                    print(f"[dra pool] ray: {problem}", file=sys.stderr, flush=True)
                said.update(self.problems)
                if not away:
                    head["ids"].clear()  # every node away with the head is settled: back, or lost for good
                for tag, info in list(away.items()):  # the head is back: so is each node, or it is lost
                    del away[tag]
                    why = "Ray reports it dead" if tag not in alive else self.raylet_gone(info)
                    if tag in alive and alive[tag]["node_id"] != info["node_id"]:
                        why = "it restarted (a new node id)"
                    if why:
                        dead.add(info["node_id"])
                        on_lost(tag, f"{why}, seen when the cluster's head came back")
                    else:
                        known[tag] = info
                        if on_joined is not None:
                            on_joined(tag, self.devices({tag: info}))
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
    """Ray actor: runs one worker process on its node, as the job's owner.

    A Ray worker process runs as the user its raylet runs as. Run as root (the usual ``ray start``
    in a container), it starts the worker as the launcher's uid, gid and groups (the job's owner):
    the pool's promise that a job runs with its owner's privileges holds on Ray too. Run as a user
    who is neither root nor the owner, it cannot, and refuses (the worker would run as that user)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.code: int | None = None  # the exit code of a worker that could not be started

    def start(self, cmd: list[str], env: dict[str, str], cwd: str | None, log: str,
              owner: dict[str, Any] | None = None, gpu: bool = False) -> int:
        """The worker's pid, or 0 when it could not start (why: the last line of its log; poll
        gives 127, 126 or 1)."""
        me = os.geteuid()
        uid = me if owner is None else int(owner["uid"])
        as_owner: dict[str, Any] = {}
        refused = None
        if uid != me:
            if me == 0:
                as_owner = {"user": uid, "group": int(owner["gid"]),  # type: ignore[index]
                            "extra_groups": [int(g) for g in owner.get("groups", [])]}  # type: ignore[union-attr]
            elif uid != 0:
                refused = (f"ray: the job's owner is uid {uid} but Ray's worker processes on this node run as uid {me} "
                           f"and cannot switch user: the job would run with uid {me}'s privileges. Start the "
                           f"node's raylet as root (it then runs each job as its owner) or as uid {uid}")
        if gpu:  # the GPUs Ray reserved for this actor (its bundle), not the pool's index
            import ray

            env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ray.get_gpu_ids())}
        made = not os.path.isdir(os.path.dirname(log) or ".")
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        with open(log, "ab") as out:
            if as_owner:  # the owner reads and cuts its log
                os.fchown(out.fileno(), as_owner["user"], as_owner["group"])
                if made:
                    os.chown(os.path.dirname(log) or ".", as_owner["user"], as_owner["group"])
            if refused is None:
                try:
                    self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig, **as_owner)
                    return self.proc.pid
                except OSError as e:  # said in its log and by its exit code, not as a lost node
                    self.code = 127 if isinstance(e, FileNotFoundError) else 126 if isinstance(e, PermissionError) else 1
                    where = f" in {cwd}" if cwd else ""
                    refused = (f"ray: cannot start {cmd[0]}{where} on node {env.get('DRA_NODE', '?')} "
                               f"({socket.gethostname()}): {e.strerror or e}")
            self.code = self.code or 1
            out.write((refused + "\n").encode())
        return 0

    def poll(self) -> int | None:
        return self.code if self.proc is None else self.proc.poll()

    def kill(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)


class RaySpawner:
    """The launcher's spawner on Ray: a placement group per lease on its node, the worker started
    there by a _WorkerHost actor. Same interface as the local spawner."""

    def __init__(self, address: str = "auto") -> None:
        self.cluster = RayCluster(address, check=False)
        self.niceness = worker_niceness()
        ray = self.cluster.ray
        self.host_cls = ray.remote(num_cpus=0)(_WorkerHost)
        self.hosts: dict[str, tuple[Any, Any]] = {}
        self._drops: list[threading.Thread] = []  # placement-group removals still running (close waits)
        self.pids: dict[str, int] = {}
        self.starting: dict[str, Any] = {}  # wid -> the start call's ObjectRef, until it answered
        self.polling: dict[str, Any] = {}  # wid -> a poll call's ObjectRef, until it answered
        self.cancelled: list[tuple[str, int]] = []  # killed before Ray placed them (their exits)
        # Whom the workers run as: this launcher's user (the job's owner), on every node.
        self.owner = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}

    def spawn(self, wid: str, cmd: list[str], env: dict[str, str], cgroups: list[str], log: Any,
              cwd: str | None) -> int:
        """Asks Ray for the lease's placement group and a host actor in it, without waiting (the
        launcher's loop must keep heartbeating): the worker starts when Ray has placed them."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node = env.get("DRA_NODE", "")
        share = float(env.get("DRA_DEVICE_SHARE") or 1.0)
        # The lease's share of its device, in the resource Ray counts it by: a fraction of a slot
        # takes that fraction of a dra_slot (two halves share one slot), a GPU lease takes GPU.
        gpu = bool(re.search(r"/gpu\d+$", env.get("DRA_DEVICE", "")))
        bundle: dict[str, float] = {"GPU" if gpu else "dra_slot": share}
        if node:
            bundle[NODE_PREFIX + node] = 0.001
        pg = placement_group([bundle], strategy="STRICT_PACK")
        # Ray starts its worker processes at nice +15 (its worker_niceness), and the worker this
        # actor starts would inherit that: on a node busy with anything else, a job's workers got
        # about 2 % of a core each (a world of 3 not formed in 150 s beside 3 busy loops; 5 s
        # unloaded). RAY_worker_niceness in the actor's runtime env sets it (Ray's job supervisor
        # starts itself at 0 this way): 0 unless the operator says otherwise.
        host = self.host_cls.options(num_gpus=share if gpu else 0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0),
                                     runtime_env={"env_vars": {"RAY_worker_niceness": str(self.niceness)}}).remote()
        started = host.start.remote(cmd, env, cwd, str(log), self.owner, gpu)
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

        entry = self.hosts.pop(wid, None)
        if entry is None:
            return  # dropped already (kill drops a worker still being placed)
        host, pg = entry
        self.starting.pop(wid, None)
        self.polling.pop(wid, None)

        def drop() -> None:  # off the loop: calls about a dead node's actor can take a while
            try:
                self.cluster.ray.kill(host)
            except Exception:  # noqa: BLE001 - the actor is gone already: its group still goes
                pass
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - its node is gone
                pass

        t = threading.Thread(target=drop, daemon=True)
        t.start()
        self._drops = [d for d in self._drops if d.is_alive()] + [t]

    def close(self) -> None:
        for wid in list(self.hosts):
            self.kill(wid)  # a worker still being placed is dropped here
            if wid in self.hosts:
                time.sleep(0.1)
                self._drop(wid)
        # The drops run off the loop; a launcher exiting at once took them with it (daemon threads),
        # and the placement groups stayed, holding their devices.
        deadline = time.monotonic() + 30.0
        for t in self._drops:
            t.join(max(0.0, deadline - time.monotonic()))
