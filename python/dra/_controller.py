"""``dra.Controller`` and ``dra.step``: the controller of one process.

The controller is the C++ ``dra::elastic::controller`` (include/dra/torch/elastic/controller.hpp);
this module adds only what needs Python: the model, optimizer and scheduler wrappers of an elastic
job, the loss's validation, and the warnings.
"""

from __future__ import annotations

import atexit
import functools
import numbers
import os
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from dra import _core, _lifecycle, _process
from dra._loss import as_float, is_float16, loss_value, warn_nonfinite
from dra._training_objects import (
    check_extra_state,
    check_no_new_buffers,
    check_training_objects,
    count_optimizer_step,
    optimizer_step_begins,
    watch_buffer_assignments,
    watch_module_changes,
    watch_other_optimizers,
)

StepStatus = _core.StepStatus


class Controller(_core.Controller):
    """The controller of one process: ``dra.step`` feeds it, its policy decides, and in an elastic
    job it resizes the data-parallel world in place.

    Alone, ``dra.Controller(**options)`` estimates signals and takes decisions; the world is this
    one process. In an elastic job (``dra.elastic.init(model, optimizer, sampler, **options)``, the
    same as ``dra.Controller(model=model, optimizer=optimizer, sampler=sampler, **options)``)
    it forms the world, hands state to joiners, and recovers from failures; train with
    ``ctl.model``, ``ctl.optimizer`` (and ``ctl.scheduler``), which apply a step only when its
    gradient reduction succeeded. ``dra.Options.names()`` lists the options; a bad one raises
    ValueError naming it.

    ``rank`` is this process's rank in the world *now*; ``uid`` its id for the job's life (the
    environment's ``RANK`` is only the launch id: after a resize, "save on rank 0" must test
    ``ctl.rank == 0``).
    """

    _buffers_of: Any = None  # the model whose buffers become the world's mean at every step
    _buffers_stale = False  # one of them was assigned anew since they were handed to the C++ side
    _in_optimizer_step = False  # between the optimizer's step pre- and post-hooks (LBFGS's closure)
    _default_group: Any = None  # torch's default group, following the world (elastic jobs only)
    _grads_dropped: tuple[Any, ...] | list[Any] = ()  # parameters whose gradient a failed reduction took
    _counts_steps = False  # a hook on the optimizer counts its steps
    _update_expected = False  # the latest dra.step committed: an optimizer step is due before the next reduction

    def __init__(
        self,
        config: _core.EngineConfig | None = None,
        /,
        *,
        model: Any = None,
        optimizer: Any = None,
        sampler: Any = None,
        scheduler: Any = None,
        extra_state: dict[str, Any] | None = None,
        store_address: tuple[str, int] | None = None,
        join: bool | None = None,
        broadcast_buffers: bool = True,
        find_unused_parameters: bool = False,
        **options: Any,
    ) -> None:
        try:
            self._build(config, model, optimizer, sampler, scheduler, extra_state, store_address, join,
                        broadcast_buffers, find_unused_parameters, options)
        except BaseException:
            if not self.__dict__.get("_built"):
                # The C++ part was never made: the half-made object stays reachable from the
                # traceback's frames, where a debugger, pytest or a crash reporter calls its repr
                # (or a method). Those read an object that does not exist and crashed the process
                # (SIGSEGV). It gets an inert local controller instead, and says it failed.
                _core.Controller.__init__(self, _core.Options())
                self.model = self.optimizer = self.scheduler = self.sampler = None
                self.__dict__["_failed"] = True
            raise

    def _build(self, config: Any, model: Any, optimizer: Any, sampler: Any, scheduler: Any, extra_state: Any,
               store_address: tuple[str, int] | None, join: bool | None, broadcast_buffers: bool,
               find_unused_parameters: bool, options: dict[str, Any]) -> None:
        if config is not None:
            if not isinstance(config, _core.EngineConfig):
                raise ValueError(f"config: expected a dra.EngineConfig, got {type(config).__name__}")
            if config.declared_steps != 0:
                raise ValueError(f"declared_steps: {config.declared_steps}: dra.Controller takes no declared budget (it "
                                 "would be ignored); leave EngineConfig.declared_steps at 0 here, or drive a "
                                 "dra.ResizeEngine(config) yourself")
            engine_keys = set(_engine_options(config)) | {"min_size", "max_size"}
            if engine_keys & set(options):
                raise ValueError("pass either an EngineConfig or keyword options for the engine, not both")
            options = {**_engine_options(config), **options}
        if model is None:
            given = [n for n, v in (("optimizer", optimizer), ("sampler", sampler), ("scheduler", scheduler),
                                    ("extra_state", extra_state)) if v is not None]
            if given:
                raise ValueError(f"model: None, with {' and '.join(given)} given; an elastic controller needs the module "
                                 "(dra.elastic.init(model, optimizer, sampler))")
            super().__init__(_core.Options(**options))
            self._built = True
            self.model = self.optimizer = self.scheduler = self.sampler = None
            return
        from dra.elastic import _default_group, _state, _wrappers
        from dra.elastic.sampler import ElasticSampler

        options = {**_environment_options(), **options}

        check_training_objects(model, optimizer, scheduler)
        check_extra_state(extra_state, model, optimizer, scheduler)
        for name, flag in (("broadcast_buffers", broadcast_buffers), ("find_unused_parameters", find_unused_parameters)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: expected True or False, got {flag!r}")
        if not isinstance(sampler, ElasticSampler):
            kind = type(sampler)
            raise ValueError(
                f"sampler: expected a dra.elastic.DistributedSampler or ElasticSampler, got "
                f"{'None' if sampler is None else f'{kind.__module__}.{kind.__qualname__}'}; import DistributedSampler "
                "from dra.elastic instead of torch.utils.data.distributed, build it over the training dataset and "
                "give it to the DataLoader as sampler= and to dra (its split follows the world)"
            )
        sampler._check_trainable()
        _lifecycle.one_training_per_launch()
        opts = _core.Options(**options)  # parsed and validated before anything is built
        if opts.events_path:
            _make_events_dir(opts.events_path)
        self._skipping = False
        self._awaiting_step = False  # a backward ran and its dra.step has not come yet
        self._stepped_on: tuple[Any, int] | None = None  # the loader batch the latest dra.step committed
        self._micro_fresh = 0  # batches accumulated under no_sync() since the previous reduction
        self._micro_step_due = False  # the latest backward was a no_sync() micro-batch
        self._window_open = False  # no_sync() backwards ran since the previous reducing one
        self._accumulates = False  # the model was ever put in no_sync(): the loader drops stale batches unseen
        # Optimizer steps taken (a hook on the user's optimizer, any way it is stepped), and as many
        # as the previous reducing backward saw: accumulation without no_sync() is told apart.
        self._optimizer_steps = self._optimizer_steps_seen = 0
        self._warned_accumulation = False
        if hasattr(optimizer, "register_step_post_hook"):
            self._counts_steps = True
            optimizer.register_step_post_hook(functools.partial(count_optimizer_step, weakref.ref(self)))
            optimizer.register_step_pre_hook(functools.partial(optimizer_step_begins, weakref.ref(self)))
        watch_other_optimizers(self, model, optimizer)
        watch_module_changes(self)
        # The C++ side holds the provider; the Python object behind its overrides must live as long.
        self._state = _state.TorchState(model, optimizer, scheduler, extra_state)
        super().__init__(
            opts,
            self._state,
            sampler._native,
            store_address=store_address,
            join=join,
            phase_hook=_testing_phase_hook(),
        )
        self._built = True
        sampler._follow(self)
        self.sampler = sampler
        if broadcast_buffers:
            self._buffers_of = model
            # BatchNorm's running statistics (and any buffer): the world's mean at every step, so
            # that every rank holds the same state, as DDP's broadcast_buffers keeps it. A buffer
            # the forward assigns anew (`self.ema = 0.9 * self.ema + ...`) is another tensor from
            # then on: the list is taken again at the next step (dra._training_objects.watch_buffer_assignments).
            self._set_buffers([b for b in model.buffers() if b is not None])
        # A buffer registered later is refused by name (check_no_new_buffers), averaged or not: a
        # joiner's model, as its script builds it, lacks it.
        self._buffer_model, self._buffer_names = model, {n for n, b in model.named_buffers() if b is not None}
        watch_buffer_assignments(self)
        # The end of a script that never calls finish() (a ported DDP loop): members meet once more
        # and the leader tells standbys to go, when the interpreter exits. An uncaught exception
        # leaves the job at once instead (the peers do not wait for this process).
        atexit.register(_finish_at_exit, weakref.ref(self))
        # A DataLoader's worker processes hold copies of this process's sockets: they die with it,
        # so that its peers see its connections close at once when it is killed.
        _process.die_with_parent_on_fork()
        # Under torchrun the agent supervises its node's workers: when it is killed, its worker dies
        # with it (as under `dra run`) instead of training on as an orphan nobody restarts or stops.
        if os.environ.get("TORCHELASTIC_RUN_ID") and os.getppid() != 1:
            _process.die_with_parent(signal.SIGKILL, os.getppid())
        if os.environ.get("DRA_STOP_ON_SIGTERM") == "1":
            _process.stop_on_sigterm(self)
        _lifecycle.attach(self)
        self.model = _wrappers.ElasticDataParallel(model, self, find_unused_parameters)
        self.optimizer = _wrappers.ElasticOptimizer(optimizer, self)
        self.scheduler = _wrappers.ElasticScheduler(scheduler, self) if scheduler is not None else None
        # torch's default group (the script's init_process_group()) follows the world from here on:
        # re-created over the members after every change, before the script's code runs again.
        self._founder = self.is_member and self.uid < self.start_size  # in the first world (not admitted later)
        self._state.mark_received(keep=not self._founder)
        self._default_group = _default_group.DefaultGroup(founder=self._founder)
        self._default_group.follow(self, "init")

    @property
    def _accumulating(self) -> bool:
        """Gradients accumulate across dra.step calls without no_sync() (the model wrapper saw it
        here, or the world had when this process joined: it came with the state)."""
        state = getattr(self, "_state", None)
        return bool(state is not None and state.accumulating)

    def step(self, loss: Any, **signals: Any) -> StepStatus:
        """One training step (what ``dra.step`` calls): commits it when its gradient reduction
        succeeded, feeds the policy, and resizes at decision steps. After a failure the
        survivors shrink and the step is redone by the next loop iteration."""
        return self._step_checked(loss_value(loss), signals, stacklevel=3, half=is_float16(loss))

    def _step_checked(self, value: Any, signals: dict[str, Any], stacklevel: int, half: bool = False) -> StepStatus:
        if self.sampler is not None and self._micro_step_due:
            # A micro-batch of a gradient-accumulation window: consumed at its backward, committed
            # with the window's last batch.
            self._micro_step_due = False
            return self._skip_step()
        if self.sampler is not None and self._skipping:
            # A stale prefetched batch was trained on locally: neither reduced nor committed.
            self._awaiting_step = self._skipping = False
            self.sampler._consumed()
            return self._skip_step()
        extra = {k: as_float(v, k) for k, v in signals.items() if v is not None}
        if self._buffers_stale:
            self._buffers_stale = False
            check_no_new_buffers(self)
            if self._buffers_of is not None:
                self._set_buffers([b for b in self._buffers_of.buffers() if b is not None])
        self._step_thread = threading.get_ident()  # the thread that trains (dra._lifecycle)
        awaiting, self._awaiting_step = getattr(self, "_awaiting_step", False), False  # this backward's step, from here on
        mark = self._batch_mark()
        if not awaiting and mark is not None and mark == self._stepped_on:
            raise RuntimeError(
                f"dra: dra.step called again for the batch its previous call (step {self.step_index - 1}) committed, "
                "with no backward since: call it once per batch, after backward and the optimizer's step (a "
                "logging helper that calls dra.step too counts as a second call; log the status the loop's call "
                "returned)")
        # Accumulating without no_sync() and no optimizer step since this step's backward: the window is
        # open, and a resize waits for the step that closes it (a joiner counts its window from its first
        # batch; admitted inside one, it stepped out of phase for good: found by an outside review).
        if self._accumulating:  # once set, it stays: the native flag is False until then
            self._set_window_open(self._optimizer_steps == self._optimizer_steps_seen)
        try:
            # A float, or a 0-d device tensor that the controller never reads at a step without a decision.
            status = self._step(value, **extra) if isinstance(value, float) else self._step_tensor(value, **extra)
        except ValueError:
            # A refused signal (checked before anything is done): no step was taken, so the backward still
            # awaits its dra.step, as after any exception caught between backward and dra.step.
            self._awaiting_step = awaiting
            raise
        if self.sampler is not None:
            refusal = self._refusal
            if refusal is not None:  # a rank did not train its batch: the step is redone
                self.sampler._refused(refusal["excess"])
            elif self.sampler._skipped_now:
                # An asynchronous backend committed the step before it could tell (it reported it):
                # the batches this rank skipped are dropped, so that the next steps line up again.
                self.sampler._refused(self.sampler._skipped_now)
            self.sampler._consumed()
        self._stepped_on = mark
        self._update_expected = status.committed
        if self._default_group is not None:
            self._default_group.follow(self)  # the step may have changed the world
        if self.nonfinite_started:
            warn_nonfinite(value if isinstance(value, float) else status.loss, status.step, stacklevel=stacklevel + 1,
                            half=half)
        if status.exit_requested:
            raise SystemExit(0)
        return status

    def rejoin(self) -> bool:
        """A process released with release='return' asks to be admitted again; waits until it is
        (True) or the job ends (False). Once admitted, torch's default group is the world's."""
        admitted = super().rejoin()
        if self._default_group is not None:
            self._default_group.follow(self, "rejoin")
        return admitted

    def try_join(self) -> bool:
        """rejoin() without waiting: True once admitted (torch's default group is then the
        world's), False while waiting or when the job has ended."""
        admitted = super().try_join()
        if self._default_group is not None:
            self._default_group.follow(self, "rejoin")
        return admitted

    def _batch_mark(self) -> tuple[Any, int] | None:
        """Which loader batch is in hand (the pass, the batches it delivered); None without a DataLoader."""
        sampler = self.sampler
        if sampler is None or not sampler._iterating or sampler._delivered == 0:
            return None
        return sampler._pass_token, sampler._delivered

    def _settle_missed_step(self) -> None:
        """The latest backward's dra.step never came (an exception caught after it, a loop that
        calls dra.step every N batches): the world committed that step without this process, which
        counts it now, and its batch is done with. At the next backward, or before the loader's
        next pass (else a step missed at a data epoch's end was counted against the next epoch's
        position: its first step trained twice and another never)."""
        if not self._awaiting_step:
            return
        self._awaiting_step = self._skipping = False
        self._catch_up_missed_step()
        if self.sampler is not None:
            if self._refusal is not None:  # that step was refused by the world: it is redone
                self.sampler._refused(self._refusal["excess"])
            self.sampler._consumed()

    @property
    def batch_dropped(self) -> bool:
        """Whether the batch in hand (the oldest one the loader handed out and ``dra.step`` has not
        consumed) will be dropped: trained on locally, neither reduced nor committed. True for the
        one-sample padding batches at the end of an epoch (while a DataLoader's prefetched batches
        may still be invalidated by a world change) and for a batch prefetched for a world that has
        changed. Test it to keep such iterations out of logs and metrics (``dra.step`` returns a
        status with ``committed`` False for them)."""
        if self.sampler is None:
            return False
        return self._skipping or not self.is_member or not self.sampler._current_is_fresh(self._micro_fresh)

    def _skip_update(self) -> bool:
        """Whether the current step's update must not be applied (failed or stale), or the loop's
        last pass over the loader only caught up with the world (a joiner's `range` loop walking
        the epochs the world has finished: its ``scheduler.step()`` after each such epoch would
        advance the learning rate past the world's)."""
        return (self.failed or self._skipping or not self.is_member
                or (self.sampler is not None and self.sampler._catching_up()))

    @property
    def update_skipped(self) -> bool:
        """After backward: whether this step's update is not applied (its reduction failed and it
        will be redone, or its batch is dropped), as ``ctl.optimizer.step()`` skips it. Guard every
        other update of state by it: ``scaler.step``/``scaler.update`` of a GradScaler (whose
        ``step`` raises on a step without gradients), an EMA's ``update_parameters``. True also
        after a pass over the loader that trained nothing because the loop is behind the world (a
        joiner's `range` loop walking the epochs the world has finished, until it reaches the
        world's): guard an epoch's own updates and logs by it there too."""
        return self._skip_update()

    def epochs(self, num_epochs: int, start: int = 0) -> Iterator[int]:
        """Data epochs ``start, start+1, ... num_epochs-1``, from wherever the world stands (a
        joiner starts mid-run); the end of the last one ends training for this process
        (``finish()``). ``start`` restarts a whole job from an epoch-granular checkpoint.

        Each epoch is yielded once. A body that leaves the loader before the epoch's end (a
        ``break``) ends that data epoch: its remaining samples are not trained, as with torch's
        sampler, whose next ``set_epoch`` starts a new order (break on what every rank sees alike:
        the step index, the status's world loss). A body that trains nothing raises."""
        if self.sampler is None:
            raise ValueError("epochs: a controller without a sampler has no data epochs (use dra.elastic.init)")
        for name, value in (("num_epochs", num_epochs), ("start", start)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"epochs: {name} must be an integer >= 0, got {value!r}")
        num_epochs, start = int(num_epochs), int(start)
        self.sampler._start_at(start)
        self._epochs_driven = True  # a stop ends this loop (the code after it runs), not the process
        sampler = self.sampler
        if (not self._founder and self.is_member and sampler.exhausted and start <= sampler.epoch < num_epochs
                and sampler._trained_epoch is None):
            # Admitted at the step that ended a data epoch: the members run that epoch's end after
            # the admission (a per-epoch scheduler's step, an EMA's update), and the state it
            # received does not hold it. So does this process, its pass training nothing, as a
            # `range` loop's does (it started at the next epoch: its schedule stayed a step behind
            # the world's for the rest of the job, and its parameters parted).
            sampler._requested, sampler._fresh_request = sampler.epoch, True
            try:
                yield sampler.epoch
            finally:
                sampler._requested = None
        while self.next_epoch(num_epochs):
            epoch, steps = sampler.epoch, self.step_index
            sampler._requested, sampler._fresh_request = epoch, True  # as set_epoch (a second pass goes over it again)
            yield epoch
            if not self.is_member or self.stopped or sampler.epoch != epoch or sampler.exhausted:
                continue
            if self.step_index == steps:
                raise RuntimeError(
                    f"epochs: the body of data epoch {epoch} trained no step ({len(sampler)} left); iterate the "
                    "loader inside it and call dra.step after each optimizer step, e.g. `for epoch in "
                    "ctl.epochs(n): for x, y in loader: ...`")
            self._leave_epoch_early()
        _release_torchrun_exit_barrier(self)

    def _leave_epoch_early(self) -> None:
        """The loop left the loader before the data epoch's end (a ``break`` on a step budget, a
        zip with a shorter loader): the rest of that epoch is not trained, an open accumulation
        window included (its gradients are dropped with it), as torch's sampler starts a new order
        at the next ``set_epoch``. Every member leaves at the same step (break on what every rank
        sees alike), so each ends the epoch here alike."""
        sampler = self.sampler
        position = sampler.state_dict()
        epoch, left = position["epoch"], int(sampler.epoch_size) - position["cursor"]
        window, why = "", "the loop left the loader early"
        if self._micro_fresh:
            window = f", {self._micro_fresh} batch(es) of an open accumulation window among them (their gradients dropped)"
            if sampler._delivered >= sampler._pass_total:  # the pass ran to its end with the window open
                why = ("the pass ended inside an accumulation window: close each window at the epoch's last batch, "
                       "`(i + 1) % accum == 0 or i + 1 == len(loader)`, docs/guide/elastic.md")
            self._micro_fresh = 0
            self._window_open = False
            for p in self.model._params:
                p.grad = None
        if self.rank == 0:
            print(f"[dra] data epoch {epoch} left after step {self.step_index}: its last {left} sample(s) are not "
                  f"trained ({why}){window}", file=sys.stderr, flush=True)
        sampler._native.set_position(epoch, int(sampler.epoch_size), position["global_batch"], position["seed"])

    def state_dict(self) -> dict[str, Any]:
        """Where the job stands (committed steps and the sampler's position): save it with the model
        and optimizer to restart the whole job later (docs/guide/elastic.md, "Checkpoint and restart")."""
        out: dict[str, Any] = {"step_index": self.step_index}
        if self.sampler is not None:
            out["sampler"] = self.sampler.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state_dict()`` on every process, right after the controller is made."""
        if self.sampler is not None and "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        self.resume_at(int(state["step_index"]))

    def __repr__(self) -> str:
        if self.__dict__.get("_failed"):
            return "<dra.Controller whose construction failed (an inert local controller)>"
        return f"<dra.Controller {self.role} uid={self.uid} rank={self.rank} world={self.world_size} step={self.step_index}>"


def _environment_options() -> dict[str, Any]:
    """Options a launcher gives an elastic job without touching its code: DRA_OPTIONS, a JSON
    object, read and checked in C++ as a LibTorch trainer reads it (the script's own keywords win)."""
    return _core._environment_options()


def _make_events_dir(path: str) -> None:
    """The events file's folder; one that cannot be made is warned about, never raised (diagnostics
    never stop training: the controller warns again, once, if the file cannot be written)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        warnings.warn(f"events_path: cannot make {folder!r} ({e}); training goes on without the events file",
                      RuntimeWarning, stacklevel=3)


def _finish_at_exit(ref: weakref.ref[Controller]) -> None:
    controller = ref()
    if controller is not None and _lifecycle.owns(controller):  # not in a child forked from it
        _say_epoch_cut(controller)
        controller.finish()
        _release_torchrun_exit_barrier(controller)


def _say_epoch_cut(controller: Controller) -> None:
    """A job that ends inside a data epoch (a step budget, or a framework that counts its batches
    per epoch itself and stopped one short after a redone step) leaves the rest of it untrained:
    said once, by rank 0, as a loop leaving the loader early is."""
    sampler = getattr(controller, "sampler", None)
    if sampler is None or controller.rank != 0 or controller.step_index <= 0:
        return
    native = sampler._native
    left = int(native.epoch_size) - int(native.cursor)
    if not native.exhausted and int(native.cursor) > 0 and left > 0:
        print(f"[dra] the job ended inside data epoch {native.epoch} after step {controller.step_index}: its last "
              f"{left} sample(s) were not trained", file=sys.stderr, flush=True)


def _release_torchrun_exit_barrier(controller: Controller) -> None:
    """torchrun's agents wait in an exit barrier for every agent of the rendezvous (300 s; torchrun
    has no flag for it): after a node died, the survivors' agents would sit out the whole timeout.
    Once the job is done, a finished process of it checks the barrier in for everyone, in the
    rendezvous store when it is the job's dedicated store (DRA_STORE as --rdzv-endpoint: the crash
    recipe of docs/guide/launch.md). Agents then leave as soon as their own workers ended. The
    keys are torchrun's (torch.distributed.elastic: the rendezvous round's prefix and
    ``torchelastic/agent/terminal_state``); tests/python/test_dropin.py checks them on this torch."""
    run_id, address = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("DRA_STORE")
    if controller.role != "finished" or not run_id or not address or os.environ.get("DRA_LAUNCHER"):
        return
    try:
        from datetime import timedelta

        import torch.distributed as dist

        host, _, port = address.rpartition(":")
        store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=5), wait_for_workers=False)
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        for rendezvous_round in range(restarts + 8):  # a round per re-rendezvous; later ones never come
            store.set(f"torch.rendezvous.{run_id}.{rendezvous_round}/torchelastic/agent/terminal_state/last_member",
                      "<val_ignored>")
    except Exception as e:  # noqa: BLE001 - the store is gone: the agents' barrier times out as torchrun's would
        print(f"[dra] torchrun's exit barrier not released ({e})", file=sys.stderr, flush=True)


def _engine_options(config: _core.EngineConfig) -> dict[str, Any]:
    """An EngineConfig as options (dra.Controller(config) keeps working)."""
    options = {
        "policy": config.policy,
        "decide_every": config.decide_every,
        "resize_cost_s": config.costs.resize_cost_s,
        "horizon_steps": config.costs.horizon_steps,
        "estimator": config.estimator,
        "throughput": config.throughput,
        "limits": config.limits,
    }
    # Every policy's settings section, from the registry (include/dra/policy/registry.hpp).
    options.update({section: getattr(config, section) for section in _core.policy_sections()})
    return options


def _testing_phase_hook() -> Any:
    """The hook dra.testing.set_phase_hook installed (tests kill processes inside a resize with
    it), or None: dra.testing is not imported by user code."""
    testing = sys.modules.get("dra.testing")
    return getattr(testing, "_phase_hook", None)


_default: Controller | None = None


def _install(controller: Controller | None) -> None:
    """Points dra.step at `controller` (straight into C++ for a controller without a world whose
    class keeps Controller.step)."""
    fast = controller if controller is not None and type(controller).step is Controller.step else None
    _core._set_step_target(_step_slow, warn_nonfinite, fast)


def default_controller() -> Controller:
    """The process-wide controller that ``dra.step`` uses (created on first use)."""
    global _default
    if _default is None:
        _default = Controller()
        _install(_default)
    return _default


def reset(controller: Controller | None = None) -> Controller:
    """Replaces the process-wide controller (a fresh default one when None) and returns it."""
    global _default
    if controller is not None and not isinstance(controller, Controller):
        raise ValueError(f"controller: expected a dra.Controller, got {type(controller).__name__}")
    _default = controller if controller is not None else Controller()
    _install(_default)
    return _default


def _step_slow(*args: Any, **signals: Any) -> StepStatus:
    """dra.step for everything the C++ fast path does not take (elastic worlds, keywords, device
    tensors, values to check, a subclass's own step())."""
    if len(args) != 1:
        raise TypeError(f"dra.step: takes the loss as its one positional argument, got {len(args)}; pass the "
                        "optional signals by keyword (dra.step(loss, validation=..., step_time_s=...))")
    loss = args[0]
    controller = _default if _default is not None else default_controller()
    if type(controller).step is not Controller.step:
        return controller.step(loss, **signals)
    return controller._step_checked(loss_value(loss), signals, stacklevel=3, half=is_float16(loss))


def _refuse_copy(what: str, fix: str) -> Any:
    def refuse(self: Any, *_: Any) -> Any:
        raise TypeError(f"{type(self).__name__}: {what}; {fix}")

    return refuse


for _cls, _what, _fix in (
    (_core.StepStatus, "the controller's live status (the same object every step, changed by the next "
     "dra.step) cannot be pickled or copied", "keep status.to_dict(), a plain dict"),
    (_core.ConvergenceSignals, "a view into the estimator (changed by the next step) cannot be pickled or copied",
     "keep signals.to_dict(), a plain dict"),
    (_core.Decision, "a decision cannot be pickled or copied", "keep decision.to_dict(), a plain dict"),
    (_core.Controller, "a controller holds a live engine (and, in a job, its world's connections): it cannot be "
     "pickled or copied", "make another one with dra.Controller(**options) where it is needed"),
):
    for _name in ("__reduce_ex__", "__copy__", "__deepcopy__"):
        setattr(_cls, _name, _refuse_copy(_what, _fix))
del _cls, _what, _fix, _name

# dra.step: a C function. `dra.step(<float or 0-d tensor>)` on a controller without a world steps
# the C++ controller directly (no Python frame; a CUDA loss is not read); every other call runs
# _step_slow above.
step = _core.step
_install(None)
