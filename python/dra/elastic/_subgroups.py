"""Groups a script made with ``dist.new_group`` over the whole world follow it, as the default
group does.

A script training on NCCL often makes a Gloo group for the work it does on the CPU
(``dist.new_group(backend="gloo")`` for ``all_gather_object`` of metrics, a barrier around a save),
or a second group over every rank for overlapping traffic. dra re-creates torch's default group
after every change of the world (``_default_group``); destroying it destroys every group made from
it, so the script's group, used after the change, raised torch's "is not initialized in the world
group map", and one member's death ended the whole job there although dra's own reduction had
recovered.

Now each group over every rank of the default group it was made from (``ranks=None``, or every
rank listed) is re-created over the new world right after the default group, with the backend,
timeout and device it was made with, in the order the script made them. The object the script
holds stays its handle: collectives called through ``torch.distributed`` (``dist.all_reduce(t,
group=g)``) and ``dist.get_rank(g)``, ``dist.get_world_size(g)``, ``dist.get_backend(g)``,
``dist.get_process_group_ranks(g)``, ``dist.get_group_rank``, ``dist.get_global_rank`` and
``dist.destroy_process_group(g)`` run on the group made for the current world. Its collectives are
guarded like the default group's (``_collectives``). Methods called on the object itself
(``g.size()``, ``g.rank()``) answer for the world it was made for.

Every member must hold the same groups, or the re-creation (a collective) would not meet: the
members compare what they hold through the job's store first; where they differ (a group made on
some processes only, or made by the members after a joiner started), none is re-created and a
warning names the difference. A group over part of the world (``dist.new_group(ranks=[0, 1])``,
``dist.new_subgroups``) has no meaning in a world of another size and is not re-created: a
collective on it after the change raises, saying so and what to do.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dra.elastic._pg import backend_config, set_timeout, timeout_of

# Groups over part of the world kept to name them in errors (the oldest forgotten first).
STALE_KEPT = 256


@dataclass
class Followed:
    """One group of the script's over the whole world: the object the script holds (weakly: one the
    script let go is not made again), the one made for the current world (None while there is
    none), and what to make it again with."""

    original: weakref.ref
    backend: str
    timeout: timedelta | None
    device: Any
    current: Any = None

    def signature(self) -> list[Any]:
        return [self.backend, None if self.timeout is None else self.timeout.total_seconds()]


class Subgroups:
    """The script's groups made from torch's default group, known by the objects it holds."""

    def __init__(self) -> None:
        self.followed: list[Followed] = []
        self._by_id: dict[int, Followed] = {}  # id of a record's original or current group -> record
        # groups over part of the world, to name them in errors: id -> (weak group, ranks, size, epoch)
        self._stale: OrderedDict[int, tuple[weakref.ref, list[int], int, int]] = OrderedDict()
        self._mismatch: str | None = None  # why the last re-creation made none

    def adopt(self, dist: Any, epoch: int | None) -> None:
        """Takes in the groups the script made since the last look (torch lists them in the order
        they were made), before the default group is destroyed with them."""
        c10d = dist.distributed_c10d
        if not dist.is_initialized():
            return
        default = c10d._get_default_group()
        size = default.size()
        for group in list(c10d._world.pg_map):
            stale = self._stale.get(id(group))
            if group is default or self.record_of(group) is not None or (stale is not None and stale[0]() is group):
                continue
            ranks = sorted(int(r) for r in c10d._world.pg_group_ranks.get(group, {}))
            if ranks == list(range(size)):
                rec = Followed(weakref.ref(group), backend_config(dist, group), timeout_of(group),
                               group.bound_device_id, group)
                self.followed.append(rec)
                self._by_id[id(group)] = rec
            else:
                self._stale[id(group)] = (weakref.ref(group), ranks, size, -1 if epoch is None else epoch)
                while len(self._stale) > STALE_KEPT:
                    self._stale.popitem(last=False)

    def lose_all(self) -> None:
        """The default group and every group made from it are about to be destroyed."""
        for rec in self.followed:
            if rec.current is not None and rec.current is not rec.original():
                self._by_id.pop(id(rec.current), None)
            rec.current = None

    def record_of(self, group: Any) -> Followed | None:
        rec = self._by_id.get(id(group))
        return rec if rec is not None and (group is rec.current or group is rec.original()) else None

    def resolve(self, dist: Any, group: Any, lost: bool, call: str) -> Any:
        """The group to run ``call`` on in place of ``group``: the current one of a followed group
        (the default stand-in while a lost member's recovery is pending), ``group`` itself where it
        is alive or unknown. Raises, naming why, for a group made for an earlier world."""
        if group is None:
            return None
        c10d = dist.distributed_c10d
        rec = self.record_of(group)
        if rec is None:
            stale = self._stale.get(id(group))
            if stale is None or stale[0]() is not group or group in c10d._world.pg_map:
                return group
            _, ranks, size, epoch = stale
            raise RuntimeError(
                f"dra: {call} on a group made by dist.new_group(ranks={ranks}) in a world of {size} (world epoch "
                f"{epoch}): the world has changed since (now {dist.get_world_size()} processes), and dra re-creates "
                "only the default group and the groups over every rank. Make this group again after a dra.step at "
                "which ctl.epoch changed, or make it over every rank (docs/guide/elastic.md)")
        if rec.current is not None and rec.current in c10d._world.pg_map:
            return rec.current
        if lost and dist.is_initialized():
            return c10d._get_default_group()  # the stand-in: same rank and size until the next dra.step
        why = self._mismatch or "the default group could not be re-created over the new world"
        raise RuntimeError(
            f"dra: {call} on a group made by dist.new_group over every rank: it was destroyed with the world it was "
            f"made for and not made again ({why}); make it again after a dra.step at which ctl.epoch changed "
            "(docs/guide/elastic.md)")

    def to_destroy(self, group: Any) -> Any:
        """What ``dist.destroy_process_group(group)`` destroys: a followed group's current one (the
        group is not made again after that), nothing for a group destroyed with an earlier world,
        else ``group``."""
        rec = self.record_of(group)
        if rec is not None:
            self._drop(rec)
            return rec.current
        stale = self._stale.get(id(group))
        if stale is not None and stale[0]() is group:
            self._stale.pop(id(group))
            return None
        return group

    def _drop(self, rec: Followed) -> None:
        self.followed.remove(rec)
        for g in (rec.original(), rec.current):
            if g is not None and self._by_id.get(id(g)) is rec:
                del self._by_id[id(g)]

    def recreate(self, dist: Any, store: Any, uid: int, members: list[int], bound: timedelta,
                 new_group: Any) -> str | None:
        """Makes the followed groups again over the default group just made (``members``, this
        process ``uid``): those every member holds, in the order made, as the members tell each other
        through ``store`` (bounded by ``bound``). Returns a warning where they differ or one could
        not be made (None: all made). ``new_group``: torch's own."""
        self.lose_all()
        for rec in [r for r in self.followed if r.original() is None]:  # the script let it go
            self._drop(rec)
        mine = [r.signature() for r in self.followed]
        store.set(f"subgroups/{uid}", json.dumps(mine))
        keys = [f"subgroups/{u}" for u in members]
        store.wait(keys, bound)
        theirs = {u: json.loads(store.get(k).decode()) for u, k in zip(members, keys, strict=True)}
        # A joiner's script made the groups the members made up to where it started: the groups
        # every member holds, in the order made, are made again; any after them are not.
        common = len(mine)
        for s in theirs.values():
            common = min(common, len(s), next((i for i, (a, b) in enumerate(zip(mine, s)) if a != b), len(s)))
        problem = None
        self._mismatch = None
        if any(len(s) != common for s in theirs.values()):
            u, s = max(theirs.items(), key=lambda kv: (len(kv[1]) != common, kv[0]))
            self._mismatch = (f"the members hold different groups: process {uid} {json.dumps(mine)}, process {u} "
                              f"{json.dumps(s)} ([backend, timeout s] of each, in the order made)")
            problem = (f"dra: the groups made by dist.new_group differ between the members ({self._mismatch}); the "
                       f"first {common} every member holds are re-created over the new world, the others are not. "
                       "Make them on every process in the same order, or again after a dra.step at which ctl.epoch "
                       "changed (docs/guide/elastic.md)")
        for rec in self.followed[:common]:
            try:
                # As the default group: its rendezvous bounded by the store's timeout (a member that
                # died in between fails it), its collectives then given the script's timeout.
                timeout = bound if rec.timeout is None else min(bound, rec.timeout)
                rec.current = new_group(backend=rec.backend, timeout=timeout, device_id=rec.device)
                if rec.timeout is not None:
                    set_timeout(rec.current, rec.timeout)
            except Exception as e:  # noqa: BLE001 - said by the caller; the group raises when used
                self._mismatch = f"making it again failed: {e}"
                return f"dra: a group made by dist.new_group could not be re-created over the new world ({e})"
            self._by_id[id(rec.current)] = rec
        return problem

    def store_keys(self, name: str, rank: int) -> list[str]:
        """The keys this process's rendezvous of the groups just made wrote under the default
        group's store prefix ``name`` (erased two re-creations later, as the default group's)."""
        out = []
        for rec in self.followed:
            if rec.current is not None:
                out += [f"{name}/0//{rec.current.group_name}//{dev}//0/{rank}" for dev in ("cpu", "cuda")]
        return out
