"""The script's own collectives on torch's default group survive a member's death.

A member killed after its ``dra.step`` returned and before the others finished a collective of
the script's own (a ``dist.all_reduce`` of a metric after every step, the barrier and
``all_gather_object`` of an epoch's end) left them in a collective of a group with a dead member:
Gloo raised "Connection closed by peer" on the dead member's ring neighbours, which ended the
script, while the other members waited in it until those processes had exited. dra's own
reductions recover from that fault; the script's collectives did not.

Now, once dra follows the default group (``_default_group.DefaultGroup``), the collectives below
take such an error in, as torchft's error-swallowing process group does:

- the call completes as if every member had contributed this process's own value (a ``SUM``
  all-reduce is this value times the world's size, so a mean is this process's own; a gather holds
  this value in every slot; a broadcast leaves the receiver's value), and a warning says so once;
- the default group is let go at once, which closes its connections, so members still waiting in
  that collective fail within moments (and take it in the same way) instead of waiting for the
  script's timeout;
- until the next ``dra.step``, a stand-in default group keeps the rank and size the script knew
  (``dist.get_rank()`` and ``dist.get_world_size()`` answer as before) and does no communication:
  the guarded collectives complete the same way, any other collective raises, naming why, and a
  ``dist.new_group`` does no communication until that step makes it for real (``_subgroups``);
- at that ``dra.step`` dra's own reduction meets the fault, the world recovers (the dead member's
  samples are trained by the others), and the default group is re-created over the new world.

Guarded: ``all_reduce``, ``reduce``, ``all_gather``, ``all_gather_into_tensor``,
``all_gather_object``, ``gather_object``, ``broadcast``, ``broadcast_object_list``, ``barrier``,
``monitored_barrier``, on the default group (``group=None`` or ``dist.group.WORLD``) and on the
script's groups over the whole world (``_subgroups``), called through ``torch.distributed``
(``dist.all_reduce``), synchronously or with ``async_op=True``. Every wrapped call on a group of
the script's made for an earlier world (or on the default group of an earlier world, kept by the
script) runs on the one made for this world (``_subgroups``), and so do the ``QUERIES`` and the
group object's own methods (``g.size()``, ``g.allreduce(...)``: ``METHODS``, ``COMMUNICATING``).
An error that does not say a peer is gone (a wrong shape, a wrong dtype) is raised as before, and
so is one in a reduction or broadcast of a tensor over ``SNAPSHOT_MAX_BYTES`` (64 MiB: the tensor,
reduced in place, is copied before the call so that a collective that fails midway can put it
back).
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import sys
import threading
from typing import Any

GUARDED = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather_object",
           "broadcast", "broadcast_object_list", "barrier", "monitored_barrier")
# Collectives that only raise, naming why, while the stand-in holds (it would make their results up).
UNGUARDED = ("all_to_all", "all_to_all_single", "gather", "scatter", "scatter_object_list", "reduce_scatter",
             "reduce_scatter_tensor", "send", "recv", "isend", "irecv", "batch_isend_irecv")

# How a backend says a peer is gone: Gloo's transport ("Connection closed by peer", a reset, a
# broken pipe, a timeout waiting for it), NCCL's remote error, torch's own network errors.
# What takes a group and answers about it: run on the group made for the current world too.
QUERIES = ("get_rank", "get_world_size", "get_backend", "get_process_group_ranks", "get_group_rank", "get_global_rank",
           "destroy_process_group")
# ``dist.new_group`` is wrapped too (``_making``), and these methods of torch's ``ProcessGroup``
# (``_answering``): the object a script holds answers for, and communicates on, the group it stands
# for (torch's ``dist.*`` calls them on the group a wrapped call resolved; a script may too).
METHODS = ("size", "rank")
COMMUNICATING = ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "allgather_into_tensor_coalesced",
                 "_allgather_base", "all_gather_single", "all_gather_single_coalesced", "all_to_all_single", "alltoall",
                 "alltoall_base", "barrier", "monitored_barrier", "broadcast", "gather", "scatter", "reduce",
                 "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_single_coalesced",
                 "reduce_scatter_tensor_coalesced", "send", "recv", "recv_anysource")

_PEER_GONE = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|timed out|timeout|"
                        r"remote process exited|ncclRemoteError|communicator was aborted", re.IGNORECASE)

_handler: Any = None  # the DefaultGroup following the world (set by install)
_installed = False


def peer_gone(error: BaseException) -> bool:
    """Whether a collective's error says a member of its group is gone (died, cut off, stalled
    past the group's timeout), as opposed to a mistake in the call."""
    import torch.distributed as dist

    if isinstance(error, (ValueError, TypeError)):
        return False
    network = tuple(c for c in (getattr(dist, "DistNetworkError", None), getattr(dist, "DistBackendError", None)) if c)
    return isinstance(error, network) or bool(_PEER_GONE.search(str(error)))


def install(handler: Any) -> None:
    """Wraps torch.distributed's collectives (once per process); ``handler`` (the DefaultGroup)
    decides which calls are guarded and takes the loss in."""
    global _handler, _installed
    _handler = handler
    if _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in GUARDED + UNGUARDED:
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "__dra_guard__", False):
            continue
        wrapped = _guard(name, fn)
        setattr(c10d, name, wrapped)  # calls inside c10d (all_gather_object's all_gather) come here too
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)
    for name in QUERIES:  # the script's calls only: torch's own get the group a wrapped call resolved
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__dra_guard__", False):
            setattr(dist, name, _resolving(name, fn))
    if not getattr(dist.new_group, "__dra_guard__", False):
        dist.new_group = _making(dist.new_group)
    for name in ("new_subgroups", "new_subgroups_by_enumeration"):  # groups over parts of the world
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__dra_guard__", False):
            setattr(dist, name, _not_while_lost(name, fn))
    for name in METHODS + COMMUNICATING:
        raw = dist.ProcessGroup.__dict__.get(name)
        if raw is not None and not getattr(raw, "__dra_guard__", False):
            setattr(dist.ProcessGroup, name, _answering(name, raw, name in METHODS))
    _installed = True


def _answering(name: str, raw: Any, query: bool) -> Any:
    """A method of torch's ``ProcessGroup`` (``g.size()``, ``g.allreduce(...)``) run on the group
    ``g`` stands for: a followed group's object or a default group of an earlier world the script
    holds (``_subgroups``). A communicating one on a group made for an earlier world or destroyed
    raises, naming why (it would wait on that world); a ``query`` there answers for the group
    itself. torch's own calls on the groups it runs on take one lookup."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        handler = _handler
        if handler is not None and handler.subgroups.stands_in(self):
            try:
                self = handler.resolve(self, f"ProcessGroup.{name}")
            except RuntimeError:
                if not query:
                    raise
        return raw(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(raw, "__doc__", None)
    method.__dra_guard__ = True  # type: ignore[attr-defined]
    return method


def _not_while_lost(name: str, fn: Any) -> Any:
    """A call that makes groups over parts of the world: refused while the stand-in holds (made on
    it, they would do nothing and never be made for real)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _handler is not None and _handler.lost is not None:
            raise RuntimeError(
                f"dra: dist.{name} cannot run now: a member of the world was lost in an earlier collective of this "
                f"step ({_handler.lost}); the world recovers at the next dra.step: call it after that step "
                "(docs/guide/elastic.md)")
        return fn(*args, **kwargs)

    call.__dra_guard__ = True  # type: ignore[attr-defined]
    return call


def _making(fn: Any) -> Any:
    """The script's ``dist.new_group``, made by the handler (``_subgroups.Subgroups.make``)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _handler is None:
            return fn(*args, **kwargs)
        return _handler.new_group(fn, dict(signature.bind(*args, **kwargs).arguments))

    call.__dra_guard__ = True  # type: ignore[attr-defined]
    return call


def _resolving(name: str, fn: Any) -> Any:
    """A query on a group (first argument or ``group=``) asked of the group made for this world."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        handler = _handler
        group = kwargs.get("group", args[0] if args else None)
        if handler is not None and group is not None:
            if name == "destroy_process_group":
                import torch.distributed as dist

                current = handler.subgroups.to_destroy(dist, group)  # gone with an earlier world: nothing to do
                if current is None:
                    return None
            else:
                current = handler.resolve(group, f"dist.{name}")
            if current is not group:
                args, kwargs = ((current, *args[1:]), kwargs) if "group" not in kwargs else (args, {**kwargs, "group": current})
        out = fn(*args, **kwargs)
        if handler is not None and name in ("get_rank", "get_world_size") and handler.partial and not _torchs_own_call():
            handler.say_partial(f"dist.{name}()", out)
        return out

    call.__dra_guard__ = True  # type: ignore[attr-defined]
    return call


def _world_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def _torchs_own_call() -> bool:
    """Whether the query wrapped by the caller was asked by torch itself (a DataLoader's iterator
    reads the world's size), not by the script."""
    return str(sys._getframe(2).f_globals.get("__name__", "")).startswith("torch.")


class _Lost(Exception):  # noqa: N818 - not an error of the script's: a guarded call inside another lost a member
    """A guarded collective called by another (``all_gather_object``'s ``all_gather``) lost a
    member: the outer call completes (or raises) as a whole, its own way."""


class _Depth(threading.local):
    depth = 0


_local = _Depth()


def _guard(name: str, fn: Any) -> Any:
    signature = inspect.signature(fn)
    guarded = name in GUARDED

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        handler = _handler
        if handler is None:
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        group = bound.arguments.get("group")
        if group is not None:
            current = handler.resolve(group, f"dist.{name}")
            if current is not group:
                bound.arguments["group"] = group = current
                args, kwargs = bound.args, bound.kwargs
        if not handler.guards(group):
            return fn(*args, **kwargs)
        nested = _local.depth > 0
        if handler.lost is not None:  # the stand-in holds until the next dra.step
            if not guarded:
                raise RuntimeError(
                    f"dra: dist.{name} cannot run now: a member of the world was lost in an earlier collective of "
                    f"this step ({handler.lost}), and torch's default group is re-created over the world that "
                    f"recovers at the next dra.step; call it after that step (dra completes only {', '.join(GUARDED)} "
                    "in the meantime, docs/guide/elastic.md)")
            if nested:
                raise _Lost(handler.lost)
            return _completed(name, bound.arguments, handler.lost_size)
        behind = handler.behind()
        if behind is not None:  # the members ran this code when they ended that epoch: nobody to meet
            if not guarded:
                raise RuntimeError(f"dra: dist.{name} cannot meet the members now: {behind}. Guard the code after "
                                   "such a pass by ctl.update_skipped (docs/guide/elastic.md)")
            handler._warn("behind", f"dra: dist.{name} and the script's other collectives complete with this "
                                    f"process's own value, as if every member had contributed it: {behind}, and "
                                    "the members ran this code when they ended that epoch. Guard the code after "
                                    "such a pass by ctl.update_skipped (docs/guide/elastic.md)", stacklevel=3)
            return _completed(name, bound.arguments, _world_size(group))
        restore = _snapshot(name, bound.arguments) if guarded else None
        reason = None
        _local.depth += 1
        try:
            out = fn(*args, **kwargs)
        except _Lost as e:  # a call inside this one lost the member
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - a lost peer is taken in, anything else raised as it was
            if restore is None or not peer_gone(e):
                raise
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        finally:
            _local.depth -= 1
        if reason is None:
            if restore is not None and bound.arguments.get("async_op") and out is not None:
                return _GuardedWork(out, name, bound.arguments, restore)
            return out
        # Out of the except block: the traceback (whose frames hold the group) is gone, so letting
        # the group go, outermost, closes its connections now.
        if nested:
            raise _Lost(reason)
        handler.lose(f"dist.{name}", reason)
        if restore is None:  # an unguarded call (scatter_object_list) whose inner broadcast lost it
            raise RuntimeError(f"dra: dist.{name} lost a member of the world ({reason}); dra completes only "
                               f"{', '.join(GUARDED)}; the world recovers at the next dra.step")
        restore()
        return _completed(name, bound.arguments, handler.lost_size)

    call.__dra_guard__ = True  # type: ignore[attr-defined]
    return call


# A tensor reduced or broadcast in place is copied before the call (a collective that fails
# midway leaves it partly reduced); one larger than this is not guarded (its error is raised).
SNAPSHOT_MAX_BYTES = 64 << 20


def _snapshot(name: str, a: dict[str, Any]) -> Any:
    """What puts the call's in-place tensor back as it was (a no-op where there is none); None
    where the call cannot be guarded (its tensor too large to copy)."""
    tensor = a.get("tensor") if name in ("all_reduce", "reduce", "broadcast") else None
    if tensor is None:
        return lambda: None
    if tensor.numel() * tensor.element_size() > SNAPSHOT_MAX_BYTES:
        return None
    copy_ = tensor.detach().clone()
    return lambda: tensor.detach().copy_(copy_)


class _GuardedWork:
    """An ``async_op=True`` call's work: its ``wait()`` takes a lost peer in as the call does."""

    def __init__(self, work: Any, name: str, arguments: dict[str, Any], restore: Any) -> None:
        self._work, self._name, self._arguments, self._restore = work, name, arguments, restore
        self._done = False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        if self._done:
            return True
        try:
            return bool(self._work.wait(*args, **kwargs))
        except Exception as e:  # noqa: BLE001
            if not peer_gone(e) or _handler is None:
                raise
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        self._work = None
        _handler.lose(f"dist.{self._name}", reason)
        self._restore()
        _completed(self._name, self._arguments, _handler.lost_size)
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._work.is_completed()

    def is_success(self) -> bool:
        return self._done or self._work.is_success()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._work, attr)


class _Done:
    """The work of a call completed without communication."""

    def wait(self, *_: Any, **__: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Any:
        import torch

        fut: Any = torch.futures.Future()
        fut.set_result(None)
        return fut


def _completed(name: str, a: dict[str, Any], size: int) -> Any:
    """Completes the call as if each of the world's ``size`` members had contributed this
    process's value; returns what the call returns."""
    import torch.distributed as dist

    if name in ("all_reduce", "reduce"):
        op = a.get("op")
        if op in (dist.ReduceOp.SUM, None):
            a["tensor"].mul_(size)
        elif op == dist.ReduceOp.PRODUCT:
            a["tensor"].pow_(size)
        # AVG, MIN, MAX and the bitwise ops of equal values are the value itself
    elif name == "all_gather":
        for t in a["tensor_list"]:
            t.copy_(a["tensor"])
    elif name == "all_gather_into_tensor":
        out, inp = a["output_tensor"], a["input_tensor"]
        out.view(-1).copy_(inp.reshape(-1).repeat(out.numel() // max(1, inp.numel())))
    elif name == "all_gather_object":
        lst = a["object_list"]
        for i in range(len(lst)):
            lst[i] = copy.deepcopy(a["obj"])
    elif name == "gather_object":
        lst = a.get("object_gather_list")
        if lst is not None:
            for i in range(len(lst)):
                lst[i] = copy.deepcopy(a["obj"])
    # broadcast, broadcast_object_list: the receiver keeps its value; barriers: nothing to do
    return _Done() if a.get("async_op") else None
