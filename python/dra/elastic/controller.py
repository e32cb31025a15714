"""The elastic controller behind ``dra.step`` under torchrun (DESIGN.md §3.3).

The protocol — membership over the job's c10d store, the leader's decisions, the per-epoch Gloo
world, the chunked state handoff, exactly-once data and crash recovery — is the C++
``dra::elastic::controller`` (include/dra/elastic/controller.hpp, src/elastic/), the same class a
LibTorch trainer uses. This module adds what only Python can do: the model wrapper whose backward
reduces the gradients, the guards that skip a failed step's optimizer/scheduler update, the state
provider for PyTorch objects (``_state.TorchState``) and ``dra.step`` integration.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterator

import torch

from dra import _controller, _core
from dra._core import elastic as _m
from dra.elastic import _state
from dra.elastic.sampler import ElasticSampler

# Test hook: when set, called as hook(controller, phase) at "rebuild", "state_transfer" and
# "reshard" of every world change, so tests can kill a process inside a resize for real.
# `controller` is the C++ controller (uid, step_index, epoch, ...).
_phase_hook = None


class ElasticStepStatus:
    """What ``dra.step`` returns under the elastic controller."""

    __slots__ = ("committed", "step", "world_size", "rank", "epoch", "event", "loss")

    def __init__(self) -> None:
        self.committed = False
        self.step = -1
        self.world_size = 0
        self.rank = -1
        self.epoch = -1
        self.event: dict[str, Any] | None = None
        self.loss = float("nan")

    def __repr__(self) -> str:
        return f"<ElasticStepStatus step={self.step} committed={self.committed} world={self.world_size} epoch={self.epoch}>"


class ElasticDataParallel(torch.nn.Module):
    """DDP semantics over the current elastic world: after ``backward`` every parameter's
    gradient is the mean over the global batch (each rank's gradient weighted by its share of
    the step's samples; equal shares make this the plain average over ranks, as DDP does).
    Parameters that received no gradient count as zero. The reduction is one flat all-reduce at
    the end of backward, done by the C++ controller."""

    def __init__(self, module: torch.nn.Module, controller: "ElasticController") -> None:
        super().__init__()
        self.module = module
        self._cpp = controller._cpp
        self._queued = False
        self._params = [p for p in module.parameters() if p.requires_grad]
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _on_grad(self, _param: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync)

    def _sync(self) -> None:
        self._queued = False
        self._cpp.reduce_gradients(self._params)


class _EventView:
    """The events this process emitted (parsed JSON objects), oldest first."""

    def __init__(self, cpp: Any) -> None:
        self._cpp = cpp

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self._cpp.events]


class ElasticController:
    """Elastic data-parallel controller: one per process, installed as ``dra.step``'s controller.

    Processes with uid < ``start_size`` form the first world; the others wait as candidates
    (inside this constructor) until the policy admits them or the job ends.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        *,
        scheduler: Any = None,
        policy: str = "convergence",
        min_size: int = 1,
        max_size: int | None = None,
        start_size: int | None = None,
        release: str = "standby",
        batch_mode: str = "fixed",
        decide_every: int = 10,
        resize_schedule: dict[int, int] | None = None,
        fault_timeout_s: float = 3.0,
        store_timeout_s: float = 30.0,
        chunk_mb: float = 16.0,
        events_path: str | None = None,
        status_every: int = 0,
        verify: bool = False,
        store_address: tuple[str, int] | None = None,
        join: bool | None = None,
        max_resize_retries: int = 3,
        **engine_options: Any,
    ) -> None:
        if not isinstance(sampler, ElasticSampler):
            raise ValueError(f"sampler: must be a dra.elastic.ElasticSampler, got {type(sampler).__name__}")
        if decide_every < 1:
            raise ValueError(f"decide_every: must be >= 1, got {decide_every}")
        engine = _controller.make_engine_config(policy=policy, min_size=min_size, max_size=max_size, **engine_options)
        if events_path:
            os.makedirs(os.path.dirname(os.path.abspath(events_path)), exist_ok=True)
        hook = _phase_hook
        self.inner = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.sampler = sampler
        self.release = release
        self.batch_mode = batch_mode
        self._state = _state.TorchState(model, optimizer, scheduler)
        # Everything else every process must agree on (the C++ side compares its own options).
        fingerprint = json.dumps(sorted((k, repr(v)) for k, v in engine_options.items()))
        self._cpp = _m.Controller(
            engine,
            self._state,
            sampler._s,
            start_size=-1 if start_size is None else int(start_size),
            release=release,
            batch_mode=batch_mode,
            decide_every=int(decide_every),
            schedule={int(k): int(v) for k, v in (resize_schedule or {}).items()},
            fault_timeout_s=float(fault_timeout_s),
            store_timeout_s=float(store_timeout_s),
            chunk_mb=float(chunk_mb),
            verify=bool(verify),
            events_path=events_path or "",
            status_every=int(status_every),
            max_resize_retries=int(max_resize_retries),
            config_fingerprint=fingerprint,
            phase_hook=hook,
            store_host=None if store_address is None else store_address[0],
            store_port=None if store_address is None else int(store_address[1]),
            join=join,
        )
        self.model = ElasticDataParallel(model, self)
        self.engine = self._cpp.engine
        self.events = _EventView(self._cpp)
        self._status = ElasticStepStatus()
        self._guard(optimizer, "step")
        if scheduler is not None:
            self._guard(scheduler, "step")

    # ------------------------------------------------------------------------------------------
    # public surface
    # ------------------------------------------------------------------------------------------
    uid = property(lambda self: self._cpp.uid)
    rank = property(lambda self: self._cpp.rank)
    world_size = property(lambda self: self._cpp.world_size)
    epoch = property(lambda self: self._cpp.epoch)
    step_index = property(lambda self: self._cpp.step_index)
    members = property(lambda self: list(self._cpp.members))
    role = property(lambda self: self._cpp.role)
    is_member = property(lambda self: self._cpp.is_member)
    resizes = property(lambda self: self._cpp.resizes)
    universe_size = property(lambda self: self._cpp.universe_size)
    start_size = property(lambda self: self._cpp.start_size)
    last_digest = property(lambda self: self._cpp.last_digest)
    store_address = property(lambda self: self._cpp.store_address)

    @property
    def last_event(self) -> dict[str, Any] | None:
        text = self._cpp.last_event
        return json.loads(text) if text else None

    @property
    def signals(self) -> _core.ConvergenceSignals:
        return self._cpp.engine.signals

    def registered_candidates(self) -> list[int]:
        """Candidates registered on the store now (standby processes and late joiners)."""
        return list(self._cpp.registered_candidates())

    def state_digest(self) -> int:
        """62-bit digest of the state handed to joiners (parameters, buffers, optimizer tensors)."""
        return int(self._cpp.state_digest())

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Data epochs, starting wherever the world is (a joiner starts mid-run)."""
        while self._cpp.next_epoch(int(num_epochs)):
            yield self.sampler.epoch

    def finish(self) -> None:
        """End of training: members meet once more, the leader tells standby processes to go."""
        self._cpp.finish()

    def step(self, loss: Any, **signals: Any) -> ElasticStepStatus:
        """One training step, after ``optimizer.step()``. Commits the step when its gradient
        reduction succeeded, feeds the policy, and resizes at decision steps. After a fault the
        survivors shrink and the step is redone by the next loop iteration."""
        st = self._status
        value = loss if type(loss) is float else float(loss.detach().item() if torch.is_tensor(loss) else loss)
        r = self._cpp.step(value)
        if signals and r.committed:  # gradient statistics, validation metric, timings
            _controller.Controller._extra(self, signals)  # type: ignore[arg-type]
        st.committed = r.committed
        st.event = json.loads(r.event) if r.event else None
        if r.committed:
            st.step = r.step
            st.loss = r.loss
        st.world_size = self._cpp.world_size
        st.rank = self._cpp.rank
        st.epoch = self._cpp.epoch
        if r.exit_requested:
            raise SystemExit(0)
        return st

    def _guard(self, obj: Any, name: str) -> None:
        """A failed step must not be applied: the optimizer/scheduler step is skipped."""
        original = getattr(obj, name)
        cpp = self._cpp

        @functools.wraps(original)  # keeps the LR scheduler's own marker on optimizer.step
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if cpp.failed or not cpp.is_member:
                return None
            return original(*args, **kwargs)

        setattr(obj, name, guarded)


def init(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: ElasticSampler, **options: Any) -> ElasticController:
    """Creates the elastic controller and installs it as the process-wide one behind ``dra.step``."""
    controller = ElasticController(model, optimizer, sampler, **options)
    _controller.reset(controller)  # type: ignore[arg-type]
    return controller
