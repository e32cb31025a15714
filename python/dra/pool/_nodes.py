"""Nodes that join or leave the pool's inventory (a Ray cluster's, seen by
``dra.pool.ray_cluster.RayCluster.watch``), and the loss of a Ray cluster's head: what the pool
changes and says when they do. A mixin of ``dra.pool.service.PoolService``, on its state, under
its lock.
"""

from __future__ import annotations

from typing import Any

from dra.pool import _clock


class NodeMembership:
    def add_node(self, node: str, devices: list[Any]) -> list[str]:
        """A node joined (or came back): its devices join the inventory."""
        with self._lock:
            added = []
            for d in devices:
                if not self.inventory.contains(d.id):
                    self.inventory.add(d)
                    added.append(d.id)
            if added:
                self._event({"event": "node_added", "node": node, "devices": added})
        self._wake.set()
        return added

    def ray_head(self, back: bool, reason: str) -> None:
        """The Ray cluster's head was lost (its nodes were removed before this call), or is back
        (its nodes join again as the watcher sees them): one event each."""
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
        ``head``: the node went with the Ray cluster's head, which says nothing of the node
        itself: its workers are not fenced (they run on until Ray ends them, or the head is back)."""
        with self._lock:
            removed: list[int] = []
            for l in self.book.all():
                if self.inventory.contains(l.device) and self.inventory.at(l.device).node == node:
                    if not head:
                        self._fence(l, reason)
                    self._release(l.id, reason, removed)
            gone = self.inventory.remove_node(node)
            self._save_leases([], removed)
            if gone:
                self._event({"event": "node_removed", "node": node, "devices": gone, "leases": removed,
                             "reason": reason})
        self._wake.set()
        return gone
