"""torch's default process group follows the elastic world.

A ported DDP script keeps calling ``dist.all_reduce(metric)``, ``dist.barrier()`` or
``dist.all_gather_object`` on torch's default group, which its own ``init_process_group()`` made
over the processes launched. dra trains over a world of its own that grows and shrinks: a default
group left as it was spans processes that stand by or are gone (its collectives hang), and a
joiner's is a world of one (its collectives silently disagree with the others'). So after every
change of the world this process is a member of, before the script's code runs again, the members
re-create the default group over exactly the current members: the script's backend (and device),
rank and size the elastic ones, the script's timeout, a store keyed by the world epoch and its
members. Every member passes the same commit of a world epoch and calls this right after it, so the
re-creation, a collective, meets on every member.

Where it passed that commit decides which collectives of the script come next, so members meet by
it: those returning from ``dra.step`` (continuing members, a standby taken back) run the script's
code after that step, while a process admitted by its controller's construction (a joiner, a
replacement, a launched process that stood by from the start) or by ``rejoin``/``try_join`` starts
its code from there. When a new world holds members of both kinds, each kind first gets a group of
its own (its collectives meet among themselves: the step's metric on the members, nothing waiting
on a joiner that never runs that code), and at the next ``dra.step`` every member re-creates the
group over the whole world together. A per-step ``dist.all_reduce`` then disagrees once after a
joiner's admission (the joiner's value alone, the others' without it) instead of hanging.

The cases handled:
- no default group (the script made none, or destroyed it): nothing to do;
- a founding member of the first world whose group was made over exactly that world (every process
  launched started in it): the script's own group is kept, at no cost;
- a member after any change (a grow, a shrink, a recovery after a crash, a joiner's admission, a
  standby's return), or a first world that differs from the launch world: re-created;
- a process outside the world (standing by, released): its group is left; the members have
  destroyed theirs, so nobody waits on it (its own collectives fail; guard them by ``ctl.is_member``);
- a backend that cannot be re-created (MPI, a third-party one): left as it is, warned once;
- a re-creation that fails (a member died in between): no default group until the next change
  re-creates it, warned once (torch raises at the next collective instead of hanging);
- a member lost in one of the script's own collectives between two steps: the collective completes
  with this process's own value, a stand-in keeps the rank and size until the next ``dra.step``,
  whose recovery re-creates the group (``_collectives``);
- the script's groups made with ``dist.new_group`` over every rank: made again right after the
  default group, the objects the script holds standing for them (``_subgroups``).
"""

from __future__ import annotations

import gc
import sys
import warnings
import weakref
from datetime import timedelta
from typing import Any

from dra.elastic import _after_wrap, _collectives, _subgroups
from dra.elastic._pg import backend_config, backend_names, set_timeout, timeout_of

# Backends init_process_group builds from a store alone, with any rank and size.
_RECREATABLE = frozenset({"gloo", "nccl", "xccl"})


class DefaultGroup:
    """What this process knows of torch's default group: the group it made (or kept) last and the
    world epoch it was made for. ``follow(controller)`` after every call that may change the world."""

    def __init__(self, founder: bool) -> None:
        self._founder = founder  # in the first world as the controller was made (not admitted later)
        self._start_epoch: int | None = None  # that first world's epoch
        self._group: Any = None  # the default group this process made or kept (None: none yet)
        self._epoch: int | None = None  # the world epoch self._group follows
        self._pending = False  # a re-creation failed: the next change tries again
        self._pending_config: tuple[str, Any, timedelta | None] = ("gloo", None, None)
        self._store: Any = None
        self._built: list[list[str]] = []  # this process's store keys of the last groups it made
        self._warned: set[str] = set()
        self._partial = False  # the group spans the members of one kind only: the whole world at the next step
        self._guarding = False  # self._group is one dra re-creates, so its collectives are guarded
        self.lost: str | None = None  # why a collective of the script's lost a member (the stand-in holds)
        self.lost_size = 0  # the world's size the script knew when it did
        self.subgroups = _subgroups.Subgroups()  # the script's groups over the whole world, made again with it
        self._outside: str | None = None  # why this process is outside the world (None: a member)
        self._bound = timedelta(seconds=30)  # the store's timeout: bounds a rendezvous (set at each new world)
        self._made_in: tuple[str, int] | None = None  # the job store's prefix of the default group and this rank
        self._controller: Any = None  # weakly, the controller it follows (whose loop may be behind the world)

    def follow(self, ctl: Any, position: str = "step") -> None:
        """``position``: where this process passed the world's last commit: ``"step"`` (returned
        from dra.step), ``"init"`` (its controller's construction) or ``"rejoin"``."""
        self._controller = weakref.ref(ctl)
        if not ctl.is_member or ctl.rank < 0:
            self._guarding = False  # outside the world, nobody waits on its group: its collectives fail as they do
            self._outside = f"process {ctl.uid} is outside the elastic world ({ctl.role})"
            if ctl.rank < 0 and ctl.role in ("finished", "released") and not ctl.status.exit_requested:
                self._say_outside(ctl)  # its script's code runs on (one released with release="exit" ends)
            return  # a member whose job just finished keeps the last world's group
        epoch = int(ctl.epoch)
        if self._start_epoch is None:
            self._start_epoch = epoch
        self._outside = None
        import torch.distributed as dist

        if not dist.is_available():
            return
        _collectives.install(self)
        if self.lost is not None:
            if epoch == self._epoch:
                raise RuntimeError(
                    f"dra: a collective of the script's lost a member of the world ({self.lost}), but no member "
                    f"left the world at this dra.step (still epoch {epoch}): the error was not a member's loss"
                    + ("; a dist.new_group that not every member called meets nobody (a group made on some "
                       "processes only)" if self.lost.startswith("dist.new_group") else "") + "; "
                    "torch's default group cannot go on")
            self.lost = None  # the world recovered: a group over it
            self._recreate(ctl, epoch, *self._pending_config, position)
            return
        if not dist.is_initialized():
            if self._pending and epoch != self._epoch:
                self._recreate(ctl, epoch, *self._pending_config, position)
            return
        group = dist.distributed_c10d._get_default_group()
        if group is self._group and epoch == self._epoch:
            if self._partial and position == "step":  # every member passed this step: the whole world now
                self._recreate(ctl, epoch, *self._pending_config, None)
            return  # the common case, every step: nothing changed
        backend = backend_config(dist, group)
        if group is not self._group and self._keeps_own_group(ctl, dist, epoch):
            self._group, self._epoch = group, epoch
            self._guarding = set(backend_names(backend)) <= _RECREATABLE
            self._bound = timedelta(seconds=float(ctl.options.store_timeout_s))
            if self._guarding:
                self._own_subgroups(ctl, dist, epoch)
            return
        if not set(backend_names(backend)) <= _RECREATABLE:
            if group is not self._group:  # warned once per group the script made
                self._warn(
                    "backend",
                    f"dra: torch's default process group uses backend {backend!r}, which dra cannot re-create over "
                    "the elastic world: its collectives (dist.all_reduce, dist.barrier) still span the processes it "
                    "was made for, and hang once one of them stands by or is gone. Initialise it with 'gloo' or "
                    "'nccl' (docs/guide/compatibility.md)",
                )
            self._group, self._epoch, self._guarding = group, epoch, False
            return
        self._recreate(ctl, epoch, backend, group.bound_device_id, timeout_of(group), position)

    def guards(self, group: Any) -> bool:
        """Whether a collective on ``group`` (None: the default one) is one this process guards:
        on the default group dra follows, or on the stand-in after a loss."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return False
        default = dist.distributed_c10d._get_default_group()
        if group is not None and group is not default:
            rec = self.subgroups.record_of(group)
            if rec is None and self._guarding and not self.subgroups.known(group) and \
                    group in dist.distributed_c10d._world.pg_map:
                self.subgroups.adopt(dist, self._epoch)  # one made since the last look: over the whole world?
                rec = self.subgroups.record_of(group)
            if rec is None:
                return False
            return self.lost is not None or (self._guarding and rec.current is group)
        return self.lost is not None or (self._guarding and default is self._group)

    def new_group(self, new_group: Any, arguments: dict[str, Any]) -> Any:
        """The script's ``dist.new_group(**arguments)`` (``_subgroups.Subgroups.make``); ``new_group``
        is torch's own. Out of the world it raises (it would wait on members that left); a member
        lost while it is made (its rendezvous is bounded by the store's timeout) is taken in as in a
        collective, and the group is made at the next ``dra.step``."""
        import torch.distributed as dist

        if self._outside is not None and dist.is_initialized():
            raise RuntimeError(
                f"dra: dist.new_group on {self._outside}: its default group is one the members have left, so a new "
                "group would wait on them; make groups only where ctl.is_member holds (docs/guide/elastic.md)")
        if self.lost is None:
            default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
            backend = backend_config(dist, default) if default is not None else "gloo"
            try:
                return self.subgroups.make(dist, new_group, arguments, backend, None, self._bound, self._guarding)
            except Exception as e:  # noqa: BLE001 - a lost member is taken in, anything else raised as it was
                if not _collectives.peer_gone(e):
                    raise
                self.lose("dist.new_group", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return self.subgroups.make(dist, new_group, arguments, self._pending_config[0], _STAND_IN, self._bound, False)

    def _own_subgroups(self, ctl: Any, dist: Any, epoch: int) -> None:
        """The script keeps its own default group (nothing changed since the launch): the groups it
        made over every rank get groups of dra's own to communicate on, so that a member lost in a
        collective on one closes it (the script's object would keep its connections open, and a
        member waiting in that collective would wait for its timeout, then be left out)."""
        self.subgroups.adopt(dist, epoch)
        if not self.subgroups.followed or any(backend_names(r.backend) != ["gloo"] for r in self.subgroups.followed):
            return  # the same on every founder (each made the same groups); an NCCL one is not doubled
        members = [int(u) for u in ctl.members]
        name = f"dra.default_group/{epoch}/{'-'.join(map(str, members))}/own"
        problem = self.subgroups.recreate(dist, dist.PrefixStore(name, self._job_store(ctl)), int(ctl.uid), members,
                                          self._bound, dist.distributed_c10d.new_group, None)
        if problem:
            self._warn("subgroups", problem)

    @property
    def partial(self) -> bool:
        """The default group spans the members of one kind only, until the next ``dra.step``."""
        return self._partial

    def say_partial(self, call: str, value: int) -> None:
        """Said once: ``call`` answered ``value`` for the group of this process's kind, not for the world."""
        ctl = self._controller() if self._controller is not None else None
        if ctl is None or "partial" in self._warned:
            return
        world = f"the elastic world has {ctl.world_size} processes and this one is its rank {ctl.rank}"
        self._warn("partial", f"dra: {call} answered {value} until the next dra.step: right after a joiner's "
                              "admission, the joiners and the members that go on each have a default group of their "
                              f"own (their next code differs), and {world} (ctl.world_size, ctl.rank). Read those "
                              "for anything every rank must agree on: a learning rate computed from the world's size "
                              "(under dra the global batch stays as launched), rank-0-only work "
                              "(docs/guide/elastic.md)", stacklevel=4)

    def behind(self) -> str | None:
        """Why a collective of the script's meets no member now (None: it meets them): this member's
        `range` loop is behind the world, and its last pass over the loader trained nothing (a
        standby admitted again, a joiner, walking epochs the world has finished). Its code after
        that pass (an epoch's validation and its all_reduce) is code the members ran when they
        ended that epoch: they are training on, and a collective here would wait on them, holding
        up their next step until the fault timeout took this process out of the world."""
        ctl = self._controller() if self._controller is not None else None
        sampler = getattr(ctl, "sampler", None)
        if ctl is None or sampler is None or not ctl.is_member or not sampler._catching_up():
            return None
        return (f"process {ctl.uid}'s loop is behind the world: its last pass over the loader, for data epoch "
                f"{sampler._requested}, trained nothing (the world is in data epoch {sampler.epoch})")

    def resolve(self, group: Any, call: str) -> Any:
        """The group a call of the script's on ``group`` runs on (``_subgroups.Subgroups.resolve``)."""
        import torch.distributed as dist

        return self.subgroups.resolve(dist, group, self.lost is not None, call)

    def lose(self, where: str, reason: str) -> None:
        """A collective of the script's (``where``) lost a member: lets the default group go now
        (its connections close, so members still waiting in that collective fail at once) and puts
        a stand-in in its place, with this process's rank and the world's size, until the next
        ``dra.step`` re-creates it over the recovered world."""
        import torch.distributed as dist

        if self.lost is not None:
            return
        group = dist.distributed_c10d._get_default_group()
        rank, size = dist.get_rank(), dist.get_world_size()
        self._pending_config = (backend_config(dist, group), group.bound_device_id, timeout_of(group))
        self.lost, self.lost_size = f"{where}: {reason}", size
        self.subgroups.retire_default(group)
        self._group = group = None  # nothing of it left here to hold its connections open
        self.subgroups.adopt(dist, self._epoch)
        self.subgroups.lose_all()
        dist.destroy_process_group()
        gc.collect()  # nothing of it left to hold its connections open
        stand_in = _stand_in(dist, rank, size)
        self._group = dist.distributed_c10d._get_default_group() if stand_in else None
        self._warn(
            "lost",
            f"dra: {where} lost a member of the world ({reason}). Until the next dra.step recovers the world and "
            "re-creates the groups, the script's collectives complete as if every member had contributed this "
            f"process's value (a sum is it times {size}, a mean is it), and a group it makes does no communication"
            + ("" if stand_in else " and dist.get_rank() raises (no stand-in group in this torch)")
            + " (docs/guide/elastic.md)",
        )

    def _say_outside(self, ctl: Any) -> None:
        """A process outside the world runs the script's code (the job ended while it stood by, or it
        was released to the caller): its default group is one the members have left."""
        import torch.distributed as dist

        if "outside" in self._warned or not dist.is_available() or not dist.is_initialized():
            return
        which = "the launch world's" if self._group is None else f"world epoch {self._epoch}'s"
        self._warn(
            "outside",
            f"dra: process {ctl.uid} is outside the elastic world ({ctl.role}); torch's default process group it "
            f"holds is {which}, which the members have left: its collectives (dist.all_reduce, dist.barrier) fail "
            "or time out here. Run them, and the leader-only work, only where ctl.is_member (ctl.is_leader) holds "
            "(docs/guide/elastic.md)",
        )

    def _keeps_own_group(self, ctl: Any, dist: Any, epoch: int) -> bool:
        """The script's own group is the world's: this process founded the first world, nothing has
        changed since, and the group spans exactly that world (every founding member sees the same
        sizes and members, so they all decide alike)."""
        size = int(ctl.world_size)
        return (
            self._founder
            and epoch == self._start_epoch
            and dist.get_world_size() == size
            and list(ctl.members) == list(range(size))
            and dist.get_rank() == int(ctl.rank)
        )

    def _recreate(self, ctl: Any, epoch: int, backend: str, device: Any, timeout: timedelta | None,
                  position: str | None) -> None:
        """A new default group over world ``epoch``: over the members of this process's kind
        (``position``) when the world holds both kinds, else (and with ``position`` None, at the
        step after such a split) over the whole world."""
        import torch.distributed as dist

        if dist.is_initialized():
            self.subgroups.adopt(dist, self._epoch)
            self.subgroups.retire_default(dist.distributed_c10d._get_default_group())
            dist.destroy_process_group()
        if self._made_in is not None and self._built:  # the rendezvous keys of the groups the script made
            prefix, was = self._made_in  # since: erased with that world's
            self._built[-1] += [f"{prefix}/0//{g}//{dev}//0/{was}" for g in self.subgroups.made for dev in ("cpu", "cuda")]
        self.subgroups.made.clear()
        self._made_in = None
        self.subgroups.lose_all()
        self._group, self._epoch, self._pending, self._partial = None, epoch, False, False
        self._pending_config = (backend, device, timeout)
        members = [int(u) for u in ctl.members]
        rank, size = int(ctl.rank), int(ctl.world_size)
        try:
            # The rendezvous is bounded by the store's timeout (a member that died in between fails it
            # rather than holding the others for the script's collective timeout); the collectives
            # then get the script's timeout.
            bound = self._bound = timedelta(seconds=float(ctl.options.store_timeout_s))
            name = f"dra.default_group/{epoch}/{'-'.join(map(str, members))}"
            if position is None:
                name += "/whole"
            else:
                kinds = self._kinds(dist.PrefixStore(name, self._job_store(ctl)), ctl.uid, members, position, bound)
                if len(set(kinds.values())) > 1:
                    members = [u for u in members if kinds[u] == position]  # the world's order, on each of them
                    rank, size = members.index(int(ctl.uid)), len(members)
                    name += f"/{position}"
                    self._partial = True
            _init_keeping_excepthook(
                dist,
                backend,
                store=dist.PrefixStore(name, self._job_store(ctl)),
                rank=rank,
                world_size=size,
                timeout=min(bound, timeout) if timeout is not None else bound,
                device_id=device,
            )
            if timeout is not None:
                set_timeout(dist.distributed_c10d._get_default_group(), timeout)
            # The script's groups over the whole world, made again over it (a collective: every
            # member holds the same ones, or none is made).
            problem = self.subgroups.recreate(dist, dist.PrefixStore(name, self._job_store(ctl)), int(ctl.uid),
                                              members, bound, dist.distributed_c10d.new_group, device)
            if problem:
                self._warn("subgroups", problem)
        except Exception as e:  # noqa: BLE001 - said, and tried again at the next change
            if dist.is_initialized():
                dist.destroy_process_group()
            self._pending = True
            self._warn(
                "failed",
                f"dra: torch's default process group could not be re-created over world epoch {epoch} ({e}); until the "
                "next change of the world re-creates it, the script's torch.distributed collectives raise (there is "
                "no default group)",
            )
            return
        self._group, self._guarding = dist.distributed_c10d._get_default_group(), True
        # Torch's rendezvous wrote this rank's address under the group's prefix (its default group
        # is named "0"; one key per device type); `_kinds` wrote kind/<uid>.
        base = f"dra.default_group/{epoch}/{'-'.join(map(str, ctl.members))}"
        self._made_in = (name, rank)
        self._erase_old(ctl, [f"{name}/0//{dev}//0/{rank}" for dev in ("cpu", "cuda")]
                        + self.subgroups.store_keys(name, rank) + [f"{name}/subgroups/{ctl.uid}"]
                        + ([] if position is None else [f"{base}/kind/{ctl.uid}"]))

    def _erase_old(self, ctl: Any, keys: list[str]) -> None:
        """The store keys this process wrote for the group it made two re-creations ago are erased
        (every member has made a group since, so no rendezvous reads them): a job changing its world
        often piled them up in its store for its whole life. Best effort: a store that no longer
        answers keeps them."""
        while len(self._built) >= 2:
            old = self._built.pop(0)
            try:
                store = self._job_store(ctl)
                for k in old:
                    store.delete_key(k)
            except Exception:  # noqa: BLE001 - the job's store is going away with the job
                pass
        self._built.append(keys)

    @staticmethod
    def _kinds(store: Any, uid: int, members: list[int], position: str, bound: timedelta) -> dict[int, str]:
        """Where every member passed the world's commit (each says it; bounded by ``bound``)."""
        store.set(f"kind/{uid}", position)
        keys = [f"kind/{u}" for u in members]
        store.wait(keys, bound)
        return {u: store.get(k).decode() for u, k in zip(members, keys, strict=True)}

    def _job_store(self, ctl: Any) -> Any:
        """A client of the job's store (every process of the job reaches it; the script's own
        default group may be on a store of its own, a joiner's on a private one)."""
        if self._store is None:
            import torch.distributed as dist

            host, _, port = str(ctl.store_address).rpartition(":")
            self._store = dist.TCPStore(
                host.strip("[]"),
                int(port),
                None,
                False,
                timedelta(seconds=float(ctl.options.store_timeout_s)),
                wait_for_workers=False,
            )
        return self._store

    def _warn(self, key: str, message: str, stacklevel: int = 4) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


_STAND_IN = "dra_lost"


def _stand_in(dist: Any, rank: int, size: int) -> bool:
    """A default group with ``rank`` and ``size`` that does no communication (torch's
    FakeProcessGroup, registered as backend 'dra_lost'); False where this torch has none."""
    try:
        from torch._C._distributed_c10d import FakeProcessGroup

        if not hasattr(dist.Backend, _STAND_IN.upper()):
            dist.Backend.register_backend(
                _STAND_IN,
                lambda common, options: FakeProcessGroup._create_internal(common.group_rank, common.group_size, options),
                extended_api=True,
                devices=["cpu", "cuda"],
            )
        _init_keeping_excepthook(dist, _STAND_IN, store=dist.HashStore(), rank=rank, world_size=size)
        return True
    except Exception:  # noqa: BLE001 - said by the caller's warning
        return False


def _init_keeping_excepthook(dist: Any, *args: Any, **kwargs: Any) -> None:
    """``dist.init_process_group`` with ``sys.excepthook`` as it was. torch wraps the hook in a
    closure of its own at each call (a rank prefix on tracebacks); made again at every change of
    the world, the chain grew by one closure per change: each traceback line carried one prefix per
    change, and past about 990 changes an uncaught exception hit Python's recursion limit before
    dra's own hook, so the process no longer left the job and the whole job failed. The script's own
    first call keeps its wrapper (its prefix names the rank the process was launched with)."""
    hook = sys.excepthook
    try:
        _after_wrap.torch_init_process_group(dist)(*args, **kwargs)  # dra's own re-creation, not the script's
    finally:
        sys.excepthook = hook
