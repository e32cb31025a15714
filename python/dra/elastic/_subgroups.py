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
``dist.destroy_process_group(g)`` run on the group made for the current world, and so do its
own methods (``g.size()``, ``g.rank()``, ``g.allreduce(...)``: ``_collectives`` wraps torch's). Its collectives are guarded
like the default group's (``_collectives``). A default group the script kept a reference to
(``self.pg = dist.group.WORLD`` in a trainer's constructor) stands for the current default group the
same way once dra has re-created it.

Every member must make the same groups, or the re-creation (a collective) would not meet: the
members compare what they hold through the job's store first. A joiner's script has made the
groups the members made up to where it started; those the members made later (a metrics group
made lazily at the first evaluation and cached) are made on the joiner too and handed to its
script's own ``dist.new_group`` call for them, which would otherwise wait on members that never
call it again. Where the lists differ otherwise, only the groups every member holds are made again
and a warning names the difference.

A group over part of the world (``dist.new_group(ranks=[0, 1])``, ``dist.new_subgroups``) has no
meaning in a world of another size and is not re-created: a collective on it after the change
raises, saying so and what to do; so does one on a group the script destroyed. A group made while
a lost member's recovery is pending (``_collectives``: the stand-in default group holds until the
next ``dra.step``) does no communication until that step makes it for real.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dra.elastic._pg import backend_config, backend_names, set_timeout, timeout_of

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
        # groups not to run on, to name them in errors: id -> (weak group, why)
        self._stale: OrderedDict[int, tuple[weakref.ref, str]] = OrderedDict()
        # groups the members hold beyond this process's, made here too: ([backend, timeout], group)
        self._premade: list[tuple[list[Any], Any]] = []
        self._mismatch: str | None = None  # why the last re-creation left some out
        # default groups dra destroyed to make the world's anew (the script may hold one): id -> weak group
        self._defaults: OrderedDict[int, weakref.ref] = OrderedDict()
        self.made: list[str] = []  # names of the groups make() made since the caller last took them (store keys)

    def adopt(self, dist: Any, epoch: int | None) -> None:
        """Takes in the groups the script made since the last look (torch lists them in the order
        they were made), before the default group is destroyed with them."""
        c10d = dist.distributed_c10d
        if not dist.is_initialized():
            return
        default = c10d._get_default_group()
        size = default.size()
        for group in list(c10d._world.pg_map):
            if group is default or self.known(group):
                continue
            if any(g is group for _, g in self._premade):
                continue
            ranks = sorted(int(r) for r in c10d._world.pg_group_ranks.get(group, {}))
            if ranks == list(range(size)):
                self._follow(group, backend_config(dist, group), timeout_of(group) or default_timeout(),
                             group.bound_device_id)
            else:
                self._mark(group, f"made by dist.new_group(ranks={ranks}) in a world of {size} (world epoch "
                                  f"{-1 if epoch is None else epoch})")

    def _follow(self, group: Any, backend: str, timeout: timedelta | None, device: Any, current: Any = None) -> None:
        rec = Followed(weakref.ref(group), backend, timeout, device, group if current is None else current)
        self.followed.append(rec)
        self._by_id[id(group)] = rec
        self._by_id[id(rec.current)] = rec

    def _mark(self, group: Any, why: str) -> None:
        self._stale[id(group)] = (weakref.ref(group), why)
        while len(self._stale) > STALE_KEPT:
            self._stale.popitem(last=False)

    def retire_default(self, group: Any) -> None:
        """``group``, torch's default group until now, is about to be destroyed for the world's new
        one: the script's references to it stand for the default group from now on."""
        self._defaults[id(group)] = weakref.ref(group)
        while len(self._defaults) > STALE_KEPT:
            self._defaults.popitem(last=False)

    def _former_default(self, group: Any) -> bool:
        entry = self._defaults.get(id(group))
        return entry is not None and entry() is group

    def stands_in(self, group: Any) -> bool:
        """Whether ``group`` may stand for another or be gone (a followed group's object, an earlier
        default group, one made for an earlier world or destroyed): its methods ask ``resolve``."""
        i = id(group)
        return i in self._by_id or i in self._defaults or i in self._stale

    def known(self, group: Any) -> bool:
        """Whether ``group`` was looked at already (followed, or over part of the world)."""
        return self.record_of(group) is not None or self._stale_why(group) is not None

    def _stale_why(self, group: Any) -> str | None:
        entry = self._stale.get(id(group))
        return entry[1] if entry is not None and entry[0]() is group else None

    def lose_all(self) -> None:
        """The default group and every group made from it are about to be destroyed."""
        for rec in self.followed:
            if rec.current is not None and rec.current is not rec.original():
                self._by_id.pop(id(rec.current), None)
            rec.current = None
        self._premade.clear()

    def record_of(self, group: Any) -> Followed | None:
        rec = self._by_id.get(id(group))
        return rec if rec is not None and (group is rec.current or group is rec.original()) else None

    def resolve(self, dist: Any, group: Any, lost: bool, call: str) -> Any:
        """The group to run ``call`` on in place of ``group``: the current one of a followed group
        (the default stand-in while a lost member's recovery is pending), ``group`` itself where it
        is alive or unknown. Raises, naming why, for a group made for an earlier world or
        destroyed by the script."""
        if group is None:
            return None
        c10d = dist.distributed_c10d
        if self._former_default(group) and group not in c10d._world.pg_map:
            if dist.is_initialized():
                return c10d._get_default_group()
            raise RuntimeError(
                f"dra: {call} on torch's default group of an earlier world: dra re-created it over the elastic world, "
                "and there is none now (its re-creation failed: the warning said why); the next change of the world "
                "makes it again (docs/guide/elastic.md)")
        rec = self.record_of(group)
        if rec is None:
            why = self._stale_why(group)
            if why is None or group in c10d._world.pg_map:
                return group
            if why == "destroyed":
                raise RuntimeError(f"dra: {call} on a group the script destroyed with dist.destroy_process_group: "
                                   "make a new one with dist.new_group")
            raise RuntimeError(
                f"dra: {call} on a group {why}: the world has changed since (now {dist.get_world_size()} "
                "processes), and dra re-creates only the default group and the groups over every rank. Make this "
                "group again after a dra.step at which ctl.epoch changed, or make it over every rank "
                "(docs/guide/elastic.md)")
        if rec.current is not None and rec.current in c10d._world.pg_map:
            return rec.current
        if lost and dist.is_initialized():
            return c10d._get_default_group()  # the stand-in: same rank and size until the next dra.step
        why = self._mismatch or "the default group could not be re-created over the new world"
        raise RuntimeError(
            f"dra: {call} on a group made by dist.new_group over every rank: it was destroyed with the world it was "
            f"made for and not made again ({why}); make it again after a dra.step at which ctl.epoch changed "
            "(docs/guide/elastic.md)")

    def to_destroy(self, dist: Any, group: Any) -> Any:
        """What ``dist.destroy_process_group(group)`` destroys: a followed group's current one (the
        group is not made again, and using it afterwards raises), nothing for a group gone with an
        earlier world or destroyed before, else ``group``."""
        rec = self.record_of(group)
        if rec is not None:
            self._drop(rec)
            original = rec.original()
            if original is not None:
                self._mark(original, "destroyed")
            return rec.current
        if self._stale_why(group) is not None and group not in dist.distributed_c10d._world.pg_map:
            return None
        return group

    def _drop(self, rec: Followed) -> None:
        self.followed.remove(rec)
        for g in (rec.original(), rec.current):
            if g is not None and self._by_id.get(id(g)) is rec:
                del self._by_id[id(g)]

    def make(self, dist: Any, new_group: Any, a: dict[str, Any], default_backend: str, stand_in: str | None,
             bound: timedelta, split: bool) -> Any:
        """The script's ``dist.new_group(**a)`` (``new_group``: torch's own), its rendezvous bounded
        by ``bound`` (the script's timeout set after). While the stand-in holds (``stand_in``: its
        backend), a group over every rank does no communication until the next ``dra.step`` makes it
        for real, and one over part of the world is refused. A group over every rank the members made
        after this process started (made here at the last re-creation) is handed over by its backend
        and timeout. With ``split`` (a member of a world dra follows), a Gloo group over every rank
        gets a second one of dra's own to communicate on: the object the script holds would keep
        its connections open after a loss (an NCCL one is not doubled: a communicator's memory)."""
        if not dist.is_initialized():
            return new_group(**a)
        size = dist.distributed_c10d._get_default_group().size()
        ranks = a.get("ranks")
        whole = ranks is None or sorted(int(r) for r in ranks) == list(range(size))
        backend = backend_names_of(a.get("backend")) or default_backend
        timeout = a.get("timeout") or default_timeout()
        if stand_in is not None:
            if not whole:
                raise RuntimeError(
                    "dra: dist.new_group over part of the world cannot be made now: a member of the world was lost in "
                    "an earlier collective of this step, and the world recovers at the next dra.step; make it after "
                    "that step (docs/guide/elastic.md)")
            group = new_group(**{**a, "backend": stand_in, "pg_options": None, "device_id": None})
            self._follow(group, backend, timeout, a.get("device_id"))
            return group
        if whole:
            wanted = [backend, timeout.total_seconds()]
            for k, (signature, group) in enumerate(self._premade):
                if signature == wanted:
                    del self._premade[k]
                    self._follow(group, backend, timeout, a.get("device_id"))
                    return group
        for rec in [r for r in self.followed if r.original() is None]:  # the script let them go: so do we
            self._drop(rec)
            if rec.current is not None and rec.current in dist.distributed_c10d._world.pg_map:
                dist.distributed_c10d.destroy_process_group(rec.current)
        handle = new_group(**{**a, "timeout": min(bound, timeout)})
        set_timeout(handle, timeout)
        self.made += [g.group_name for g in (handle,) if hasattr(g, "group_name")]
        if whole and split and backend_names(backend) == ["gloo"]:
            current = new_group(backend=backend, timeout=min(bound, timeout), device_id=a.get("device_id"))
            set_timeout(current, timeout)
            self.made.append(current.group_name)
            self._follow(handle, backend, timeout_of(handle) or timeout, a.get("device_id"), current)
        return handle

    def recreate(self, dist: Any, store: Any, uid: int, members: list[int], bound: timedelta,
                 new_group: Any, device: Any) -> str | None:
        """Makes the followed groups again over the default group just made (``members``, this
        process ``uid``), as the members tell each other what they hold through ``store`` (bounded
        by ``bound``): every group when each member's list begins another's (those this process
        lacks are made for its script's own call, ``make``), else those every member holds, in the
        order made. Returns a warning where some are left out or one could not be made (None: all
        made). ``new_group``: torch's own; ``device``: the default group's."""
        self.lose_all()
        for rec in [r for r in self.followed if r.original() is None]:  # the script let it go
            self._drop(rec)
        mine = [r.signature() for r in self.followed]
        store.set(f"subgroups/{uid}", json.dumps(mine))
        keys = [f"subgroups/{u}" for u in members]
        store.wait(keys, bound)
        theirs = {u: json.loads(store.get(k).decode()) for u, k in zip(members, keys, strict=True)}
        longest = max(theirs.values(), key=len)
        problem = self._mismatch = None
        if all(s == longest[:len(s)] for s in theirs.values()):
            extra = longest[len(mine):]
            common = len(mine)
        else:
            extra = []
            common = min(next((i for i, (a, b) in enumerate(zip(mine, s)) if a != b), min(len(mine), len(s)))
                         for s in theirs.values())
            u = min(v for v, s in theirs.items() if s != mine)
            self._mismatch = (f"the members made different groups: process {uid} {json.dumps(mine)}, process {u} "
                              f"{json.dumps(theirs[u])} ([backend, timeout s] of each, in the order made)")
            problem = (f"dra: the groups made by dist.new_group differ between the members ({self._mismatch}); the "
                       f"first {common} every member holds are re-created over the new world, the others are not. "
                       "Make them on every process in the same order, or again after a dra.step at which ctl.epoch "
                       "changed (docs/guide/elastic.md)")
        todo = [(rec.signature(), rec) for rec in self.followed[:common]] + [(sig, None) for sig in extra]
        for signature, rec in todo:
            try:
                # As the default group: its rendezvous bounded by the store's timeout (a member that
                # died in between fails it), its collectives then given the script's timeout.
                timeout = None if signature[1] is None else timedelta(seconds=signature[1])
                group = new_group(backend=signature[0], timeout=bound if timeout is None else min(bound, timeout),
                                  device_id=rec.device if rec is not None else device)
                if timeout is not None:
                    set_timeout(group, timeout)
            except Exception as e:  # noqa: BLE001 - said by the caller; the group raises when used
                self._mismatch = f"making it again failed: {e}"
                return f"dra: a group made by dist.new_group could not be re-created over the new world ({e})"
            if rec is None:
                self._premade.append((signature, group))
            else:
                rec.current = group
                self._by_id[id(group)] = rec
        return problem

    def store_keys(self, name: str, rank: int) -> list[str]:
        """The keys this process's rendezvous of the groups just made wrote under the default
        group's store prefix ``name`` (erased two re-creations later, as the default group's)."""
        made = [rec.current for rec in self.followed if rec.current is not None] + [g for _, g in self._premade]
        return [f"{name}/0//{g.group_name}//{dev}//0/{rank}" for g in made for dev in ("cpu", "cuda")]


def default_timeout() -> timedelta:
    """torch's timeout for a group made without one."""
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout


def backend_names_of(backend: Any) -> str | None:
    """A ``backend`` argument of ``new_group`` as ``backend_config`` writes it (None: not given)."""
    if backend is None:
        return None
    text = str(backend).lower()
    names = {part.split(":")[-1].strip() for part in text.split(",") if part.strip()}
    return names.pop() if len(names) == 1 else text
