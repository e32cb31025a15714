"""A controller at the edges of its process's life: how the process leaves the job when it ends
other than by the end of its training loop, and what a child forked from it may do.

- An exception nobody catches, in the main thread (``sys.excepthook``) or in the thread that
  trains (``threading.excepthook``: the thread that last called ``dra.step``), makes the process
  leave the job before Python prints it: its peers' step fails at once and their recovery does not
  wait for it. An exception in another thread (a logger's) is that thread's alone.
- ``exiting(code)``: a process that ends with a non-zero ``sys.exit`` code leaves the job the same
  way (``dra run``'s fork server knows the code; a plain interpreter does not tell it to its exit
  handlers, so there the process's exit reads as the end of its loop).
- A child made with ``os.fork()`` after ``init`` holds a copy of the controller that is not the
  job's: its exit handlers, hooks and end do nothing to the job, and the copy is never destroyed
  (its communicator's threads were not forked: destroying it waited on them for ever).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import weakref
from typing import Any

_controllers: list[weakref.ref[Any]] = []
_forever: list[Any] = []  # a forked child's copies, never destroyed
_installed = False
_launched: set[str] = set()  # the launches this process made an elastic controller in


def owns(controller: Any) -> bool:
    """Whether this process is the one that made ``controller`` (not a child forked from it)."""
    return getattr(controller, "_owner_pid", None) == os.getpid()


def attach(controller: Any) -> None:
    """Called once a controller is built: it leaves the job as the module says."""
    global _installed
    controller._owner_pid = os.getpid()
    launch = _launch()
    if launch is not None:  # (attach is for elastic controllers only)
        _launched.add(launch)
    _controllers[:] = [r for r in _controllers if r() is not None] + [weakref.ref(controller)]
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        _leave(f"uncaught {kind.__name__}: {value}")
        previous(kind, value, tb)

    sys.excepthook = hook
    previous_thread_hook = threading.excepthook

    def thread_hook(args: Any) -> None:
        if args.exc_type is not SystemExit and args.thread is not None:
            _leave(f"uncaught {args.exc_type.__name__} in thread {args.thread.name}: {args.exc_value}",
                   thread=args.thread.ident)
        previous_thread_hook(args)

    threading.excepthook = thread_hook
    os.register_at_fork(after_in_child=_forked)


def one_training_per_launch() -> None:
    """A launched process (``dra run``, torchrun, a job's store by hand) holds one elastic training:
    the job's keys on its store are named by the launch, so a second one (a sweep's next point)
    found the first's finished world there and every rank waited 30 s for a Gloo connection that
    never came. Refused at once, naming the fix; a plain interpreter (a world of its own each time)
    may run as many as it likes."""
    launch = _launch()
    if launch is not None and launch in _launched:
        raise RuntimeError(
            f"dra.elastic.init: this process already trained in this launch ({launch!r}: its store keys are the launch's, "
            "and the launcher follows one training); run each training in its own launch (a sweep: one `dra run` per "
            "point, or a DRA_JOB_ID of its own for processes started by hand)")


def _launch() -> str | None:
    """The launch this process is in (its job's keys are named by it), None under a plain interpreter."""
    keys = ("DRA_JOB_ID", "TORCHELASTIC_RUN_ID", "DRA_STORE")
    return "/".join(os.environ.get(k, "") for k in keys) if any(os.environ.get(k) for k in keys) else None


def exiting(code: int) -> None:
    """The process ends with ``code`` (``sys.exit``): a non-zero one leaves the job, as an
    uncaught exception does."""
    if code != 0:
        _leave(f"exit code {code}")


def _leave(reason: str, thread: int | None = None) -> None:
    for ref in _controllers:
        ctl = ref()
        if ctl is None or not owns(ctl):
            continue
        if thread is not None and getattr(ctl, "_step_thread", None) != thread:
            continue  # not the thread that trains
        ctl._abandon(reason[:300])


def _forked() -> None:
    for ref in _controllers:
        ctl = ref()
        if ctl is not None:
            _forever.append(ctl)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(ctl))  # kept past the interpreter's teardown too
