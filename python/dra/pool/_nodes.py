"""Nodes that join or leave the pool's inventory (a Ray cluster's, seen by
``dra.pool.ray_cluster.RayCluster.watch``), and the loss of a Ray cluster's head: what the pool
changes and says when they do. A mixin of ``dra.pool.service.PoolService``, on its state, under
its lock.
"""

from __future__ import annotations

from typing import Any

from dra._core import pool as _p
from dra.pool import _clock


def _copy(d: Any) -> Any:
    """A device of its own: the inventory's devices are views into it, dangling once removed."""
    return _p.Device(id=d.id, type=d.type, node=d.node, group=d.group, memory_gb=d.memory_gb, compute=d.compute,
                     enforcement=d.enforcement)


class NodeMembership:
    def device(self, device_id: str) -> Any:
        """A device of the inventory, or of a node away with a Ray cluster's head (its leases held)."""
        if self.inventory.contains(device_id):
            return self.inventory.at(device_id)
        if device_id in self.away:
            return self.away[device_id]
        raise KeyError(f"device: no device '{device_id}' in the pool's inventory")

    def counted_inventory(self) -> Any:
        """The inventory a request is checked against: with the nodes away with a Ray cluster's
        head (a job submitted during an outage waits for them, it is not refused as never fitting)."""
        with self._lock:
            if not self.away:
                return self.inventory
            return _p.Inventory([_copy(d) for d in self.inventory.devices] + list(self.away.values()))

    def add_node(self, node: str, devices: list[Any]) -> list[str]:
        """A node joined, or came back with a Ray cluster's head: its devices join the inventory
        (the leases kept on them while it was away go on as they were)."""
        with self._lock:
            added = []
            for d in devices:
                if not self.inventory.contains(d.id):
                    self.inventory.add(d)
                    added.append(d.id)
                self.away.pop(d.id, None)
            if added:
                kept = sorted(l.id for l in self.book.all() if l.device in added)
                self._event({"event": "node_added", "node": node, "devices": added, **({"leases_kept": kept} if kept else {})})
        self._wake.set()
        return added

    def ray_head(self, back: bool, reason: str) -> None:
        """The Ray cluster's head was lost (its nodes were taken away before this call), or is back
        (its nodes come back, or are found lost, as the watcher reads Ray's table): one event each."""
        with self._lock:
            if back:
                lost_s = None if self.ray_head_lost_at is None else round(_clock.now() - self.ray_head_lost_at, 3)
                self.ray_head_lost_at = None
                self._event({"event": "ray_head_back", "lost_s": lost_s})
            else:
                self.ray_head_lost_at = _clock.now()
                self._event({"event": "ray_head_lost", "reason": reason})

    def remove_node(self, node: str, reason: str = "node lost", head: bool = False) -> list[str]:
        """A node left the cluster: its devices go, its leases are released (their workers went
        with the node; the jobs' other workers shrink in place). Each such lease is fenced: its
        job's launcher stops a worker of it that still runs (a node taken as lost may not be).

        ``head``: the node went with the Ray cluster's head, which says nothing of the node itself
        (its workers run on until Ray ends them, or the head is back). Its devices leave the
        inventory (nothing is granted there) but its leases are kept, neither released nor fenced,
        and no job is re-planned while it is away: released, its devices would be granted again
        when the head came back while the first workers still ran on them. When the head is back the
        node either comes back as it was (``add_node``: its leases go on) or is found lost (this
        call again, without ``head``: its kept leases are fenced and released then)."""
        with self._lock:
            here = [_copy(d) for d in self.inventory.devices if d.node == node]
            ids = {d.id for d in here} | {i for i, d in self.away.items() if d.node == node}
            removed: list[int] = []
            kept: list[int] = []
            for l in self.book.all():
                if l.device not in ids:
                    continue
                if head:
                    kept.append(l.id)
                    continue
                self._fence(l, reason)
                self._release(l.id, reason, removed)
            self.inventory.remove_node(node)
            if head:
                self.away.update({d.id: d for d in here})
            else:
                for i in ids:
                    self.away.pop(i, None)
            self._save_leases([], removed)
            if ids:
                self._event({"event": "node_removed", "node": node, "devices": sorted(ids), "leases": removed,
                             "reason": reason, **({"leases_kept": kept} if head else {})})
        self._wake.set()
        return sorted(ids)
