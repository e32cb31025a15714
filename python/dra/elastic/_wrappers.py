"""What an elastic job trains with: the model, optimizer and scheduler of the user, wrapped.

``ctl.model`` reduces the gradients over the current world at the end of backward (DDP's
semantics); ``ctl.optimizer`` and ``ctl.scheduler`` apply a step only when that reduction
succeeded, so a step interrupted by a failure is redone without having been applied anywhere.
Nothing of the user's objects is patched: the wrappers hold them.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from dra._training_objects import restore_dropped_grads
from dra.elastic import _after_wrap


class ElasticDataParallel(torch.nn.Module):
    """DDP semantics over the current elastic world (``ctl.model``, or
    ``dra.elastic.DistributedDataParallel``): after ``backward`` every parameter's
    gradient is the mean over the global batch (each rank's gradient weighted by its share of
    the step's samples; equal shares make this the plain average over ranks, as DDP does).
    Parameters that received no gradient count as zero; frozen ones (``requires_grad`` False as
    the backward starts) are not reduced and keep ``.grad`` None. As DDP does, the reduction is bucketed
    and overlapped with backward: each parameter reports its gradient to the C++ controller as
    soon as it is accumulated, and a bucket (~25 MiB, in reverse parameter order) is all-reduced
    once complete (on CUDA on a stream of its own) while backward goes on; the end of backward
    waits for the rest. A batch that a data loader prefetched for a world that has changed since
    is trained on locally and then dropped (no reduction). As with DDP, ``.module`` is the model;
    ``.controller`` is the process's dra.Controller.

    Gradient accumulation is DDP's recipe: every backward of a window but the last inside
    ``with model.no_sync():``; the last one reduces the window's summed gradients, and its
    ``dra.step`` commits the window's batches as one step (a micro-batch's ``dra.step`` commits
    nothing). A failure redoes the whole window."""

    def __init__(self, module: torch.nn.Module, controller: Any, find_unused_parameters: bool = False) -> None:
        super().__init__()
        self.module = module
        self.controller = controller
        _after_wrap.watch(self)  # torch's own DDP around it from now on is refused
        # DDP's find_unused_parameters: a parameter no rank had a gradient for on a step keeps none
        # (None, as in one process: the optimizer skips it); otherwise it receives a zero gradient.
        self._unused_to_none = find_unused_parameters
        self._reported = 0  # reduced parameters whose gradient came in this backward
        self._warned_unused = False
        self._queued = False
        self._active = False
        self._no_sync = False  # inside no_sync(): this backward accumulates locally
        self._micro = False  # the running backward is a micro-batch (no_sync)
        self._zeroing = False  # the running backward's batch is dropped inside a window: its gradient counts as 0
        self._pre_hooks = False
        self._forward_sync: bool | None = None  # the latest forward's decision (DDP's), until its backward
        self._outer_armed = False  # an output's gradient came: the end of its backward calls _sync
        #: Seconds the latest backward spent inside the gradient reductions (blocking all-reduces on
        #: CPU; on CUDA only their launch): the exposed communication of a step.
        self.reduce_s = 0.0
        # Every parameter of the module, and which of them the reduction covers: those that require
        # a gradient. A script may freeze or unfreeze parts as it trains (a backbone frozen for the
        # first epochs): the reduced set follows requires_grad at each backward's start
        # (_follow_trainable; a part frozen around one forward only, as a GAN's discriminator for the
        # generator's loss, is trainable again by then and reduced).
        self._all_params = list(module.parameters())
        self._trainable: list[bool] = []
        self._params: list[torch.Tensor] = []
        self._index: dict[int, int] = {}
        self._hooked: set[int] = set()  # with the gradient hook (they required a gradient once)
        self._unhooked = list(self._all_params)
        self._pre_hooked: set[int] = set()
        self._follow_trainable()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        self._check_parameters_unchanged()
        if self.controller._state.keep_received:
            self._restore_received()
        # As DDP decides it: the backward of this forward does not reduce when no_sync() (or
        # require_backward_grad_sync False) held while the forward ran.
        self._forward_sync = not self._no_sync
        if self._outer_armed and not _in_backward():  # not a checkpoint's recompute: a backward that raised left it
            self._outer_armed = False
        if not self._queued:
            self._hook_trainable()
        out = self.module(*args, **kwargs)
        if not torch.compiler.is_compiling():
            for t in torch.utils._pytree.tree_leaves(out):
                # Not a leaf (a parameter returned as it is): its hooks would stay, one more each forward.
                if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._on_output_grad)
        return out

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        """The gradient of one of the forward's outputs, in the backward that runs through the
        model: the end of that backward finishes the reduction. The first parameter's gradient may
        come inside a nested backward (a ``checkpoint(..., use_reentrant=True)`` recomputes its part
        and backpropagates it in a backward of its own), and a callback queued from there ran at the
        end of that nested backward: the reduction finished before the rest of the model's gradients
        came, and they started another one (refused as accumulation without no_sync())."""
        if not self._outer_armed:
            self._outer_armed = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        """Queued by the first output or parameter gradient of a backward (both may be queued in one
        backward: the first to run reduces, the other finds nothing queued)."""
        self._outer_armed = False
        if self._queued:
            self._sync()

    def _restore_received(self) -> None:
        """A joiner's first forward: the world's state again if the script changed it after init
        (a checkpoint loaded into ``model.module`` after the wrap, as torchvision's and DeiT's
        resume; an LR scaled by the world size it saw). Its parameters parted from the world's at
        every step, silently."""
        ctl = self.controller
        if ctl._state.restore_received():
            warnings.warn(f"dra: process {ctl.uid} joined a running world, and its script changed the model, "
                          "optimizer or scheduler after dra's init (a checkpoint loaded after the wrap? a learning "
                          "rate set from the world size?): the world's state was restored, as a joiner continues "
                          "the world's training. Load checkpoints before the wrap, or only when ctl.step_index is 0 "
                          "(docs/guide/compatibility.md)", RuntimeWarning, stacklevel=3)

    def _check_parameters_unchanged(self) -> None:
        """The model's parameters are those it had at init: a module or parameter assigned since (a
        new head, ``model.fc = nn.Linear(...)``) would be stepped with each rank's own gradient, and
        a process that joins builds the model its script builds at the start. Looked at only after
        torch registered a module or parameter somewhere (dra._training_objects.watch_module_changes)."""
        ctl = self.controller
        if not ctl._modules_changed:
            return
        ctl._modules_changed = False
        now = list(self.module.parameters())
        if len(now) == len(self._all_params) and all(a is b for a, b in zip(now, self._all_params)):
            return
        ctl._modules_changed = True  # refused again at the next forward
        known = {id(p) for p in self._all_params}
        added = [n for n, p in self.module.named_parameters() if id(p) not in known]
        current = {id(p) for p in now}
        gone = len([p for p in self._all_params if id(p) not in current])
        shown = ", ".join(f"'{n}'" for n in added[:3]) + (f" and {len(added) - 3} more" if len(added) > 3 else "")
        raise RuntimeError(
            "dra: the model's parameters changed after dra.elastic.init / DistributedDataParallel ("
            + (f"new: {shown}" if added else "") + (", " if added and gone else "") + (f"{gone} replaced or removed" if gone else "")
            + "): a module or parameter assigned to the model mid-run (a new head, model.fc = nn.Linear(...)) is not "
            "reduced (each rank would step it with its own gradient) and a process that joins builds the model its "
            "script builds at the start. Build every part before wrapping, and give its parameters to the optimizer "
            "then: a head used from step N on starts frozen (requires_grad_(False)) and is unfrozen there; re-initialise "
            "a layer in place (model.fc.reset_parameters() with a seed every rank shares) instead of assigning a new "
            "one (docs/guide/compatibility.md, \"Limits of the drop-in\")")

    @property
    def require_backward_grad_sync(self) -> bool:
        """DDP's flag (nanoGPT sets it): False makes backwards accumulate locally, as no_sync()."""
        return not self._no_sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        if not value:
            self._register_pre_hooks()
        self._no_sync = not value

    def _follow_trainable(self) -> None:
        """The reduced parameters are those that require a gradient as a backward starts. A
        parameter frozen since the previous backward drops out (its gradient stays None, so the
        optimizer leaves it as it is: it was given a zero gradient, which momentum and weight
        decay still moved); one unfrozen since is reduced from now on (its local gradient was
        applied unreduced, and the ranks diverged). Every rank runs the same script, so every
        rank's set is the same (a joiner takes the world's requires_grad with the state)."""
        trainable = [p.requires_grad for p in self._all_params]
        if trainable == self._trainable:
            return
        self._trainable = trainable
        self._params = [p for p, t in zip(self._all_params, trainable) if t]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._hook_trainable()

    def _hook_trainable(self) -> None:
        """Hooks on every parameter that requires a gradient (at a forward: one unfrozen since the
        previous backward reports its gradient as soon as it is accumulated, as the others do, and
        starts the reduction when it is the first). Looks only at the parameters without a hook:
        none in a model that never froze anything."""
        if not any(p.requires_grad for p in self._unhooked):
            return
        for p in self._unhooked:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad)
                self._hooked.add(id(p))
        self._unhooked = [p for p in self._unhooked if id(p) not in self._hooked]
        if self._pre_hooks:
            self._hook_pre_grads()

    def _hook_pre_grads(self) -> None:
        for p in self._all_params:
            if id(p) in self._hooked and id(p) not in self._pre_hooked:
                p.register_hook(self._pre_grad)
                self._pre_hooked.add(id(p))

    def _register_pre_hooks(self) -> None:
        if not self._pre_hooks:
            # Before a gradient is accumulated: a dropped batch inside a window must add nothing.
            self._hook_pre_grads()
            self._pre_hooks = True
            self.controller._accumulates = True

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync``: a backward inside accumulates its gradient locally, unreduced; the
        next backward outside reduces everything accumulated since the previous reduction, and
        its step consumes all those batches at once (every rank must accumulate as many; a batch
        dropped for a changed world adds nothing)."""
        self._register_pre_hooks()
        previous, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = previous

    def _pre_grad(self, grad: torch.Tensor) -> torch.Tensor | None:
        if not self._queued:
            self._start_backward(None)
        return torch.zeros_like(grad) if self._zeroing else None

    def _on_grad(self, param: torch.Tensor) -> None:
        if param.grad is not None and param.grad.layout != torch.strided:
            raise RuntimeError(
                f"dra: parameter '{self._name_of(param)}' received a {param.grad.layout} gradient; dra reduces dense "
                "gradients only. Make its gradient dense (nn.Embedding/nn.EmbeddingBag with sparse=False, and an "
                "optimizer for dense gradients: Adam instead of SparseAdam) (docs/guide/compatibility.md, \"Limits "
                "of the drop-in\")")
        if not self._queued:
            self._start_backward(param)
        index = self._index.get(id(param))
        if index is None:  # frozen as this backward started: not reduced
            return
        self._reported += 1
        if self._active:
            t0 = time.perf_counter()
            self.controller._gradient_ready(index)
            self.reduce_s += time.perf_counter() - t0

    def _name_of(self, param: torch.Tensor) -> str:
        return next((n for n, p in self.module.named_parameters() if p is param), "?")

    def _carries_gradient(self, firing: int) -> bool:
        """Whether a gradient from before this backward is still held (not stepped, not zeroed)
        by a parameter other than the one whose hook fires (an unused one holds zeros: every one
        is looked at; this runs only when no optimizer step came since the previous reduction)."""
        return any(i != firing and p.grad is not None and bool(p.grad.count_nonzero() > 0)
                   for i, p in enumerate(self._params))

    def _check_accumulation(self, firing: int) -> None:
        """A reducing backward while the gradient of the previous reduced one is still held and
        no optimizer step came between: gradient accumulation without ``no_sync()``."""
        ctl = self.controller
        stepped = ctl._optimizer_steps != ctl._optimizer_steps_seen
        ctl._optimizer_steps_seen = ctl._optimizer_steps
        expected, ctl._update_expected = ctl._update_expected, False
        if stepped or ctl._window_open or not ctl._counts_steps:
            return
        if not self._carries_gradient(firing):
            # The previous step was committed and its gradient zeroed, but no optimizer stepped: an
            # update skipped on this rank (a loss spike judged on its own loss, or a non-finite norm
            # on every rank alike). The world compares states at this reduction: identical ones go
            # on, a differing one is taken again (before, the ranks parted for good, silently).
            if expected:
                ctl._note_update_skipped()
            return
        ctl._state.accumulating = True  # resizes wait for a step that closes a window (dra._controller)
        if ctl._awaiting_step:
            raise RuntimeError(
                "dra: gradient accumulation without no_sync(): this backward adds to the gradient of a previous "
                "reduced backward that neither an optimizer step nor dra.step followed. Accumulate as with DDP: wrap "
                "every backward of the window but the last in `with model.no_sync():`, then optimizer.step() and "
                "dra.step(loss) once per window (docs/guide/elastic.md, \"Gradient accumulation\")")
        if not ctl._warned_accumulation:
            ctl._warned_accumulation = True
            warnings.warn(
                "dra: gradients accumulate over several dra.step calls without an optimizer step between: each batch "
                "is committed as its own step, and a failure inside the window drops the gradients of its earlier "
                "batches. Wrap every backward of the window but the last in `with model.no_sync():` and call "
                "dra.step once per window", stacklevel=4)

    def _check_one_reduction_per_batch(self) -> None:
        """A reducing backward on the batch whose previous reducing backward has not reached
        ``dra.step`` yet (no new batch came from the loader between them): two losses
        backpropagated one after the other on one batch, as a GAN's discriminator and generator
        steps. A step reduces once and consumes its batch once; the second backward would be
        counted as the next step, consuming the next batch's samples unseen. Raised before anything
        is reduced (on every rank alike: they run the same loop)."""
        ctl = self.controller
        sampler = ctl.sampler
        if sampler is None or not sampler._iterating or sampler._delivered == 0:
            self._reduced_at = None  # indices taken without a DataLoader: batches cannot be told apart
            return
        here = (sampler._pass_token, sampler._delivered)
        previous, self._reduced_at = getattr(self, "_reduced_at", None), here
        if ctl._awaiting_step and previous == here:
            self._reduced_at = None
            if ctl._in_optimizer_step:
                raise RuntimeError(
                    "dra: the optimizer evaluated its closure again within one step (torch.optim.LBFGS with "
                    "max_iter > 1 or a line search): each evaluation's backward would reduce and commit a batch of its "
                    "own, so the step's samples would be counted several times. Give LBFGS max_iter=1 and no "
                    "line_search_fn (one evaluation per step, dra.step after each; the iterations become steps), or "
                    "an optimizer that evaluates once (docs/guide/compatibility.md, \"Limits of the drop-in\")")
            raise RuntimeError(
                "dra: a second backward that reduces gradients on the same batch before dra.step (two losses "
                "backpropagated one after the other: loss1.backward(retain_graph=True); loss2.backward(), or a GAN's "
                "discriminator and generator steps): a step reduces its gradients once and commits its batch once, so "
                "this one would be counted as the next step and that step's samples never trained. Backpropagate once "
                "per batch: sum the losses, (loss1 + loss2).backward() (the same gradients); for a GAN, compute the "
                "generator's loss through "
                "the discriminator with its parameters frozen (D.requires_grad_(False)), call (d_loss + "
                "g_loss).backward(), step one optimizer holding both models (param groups), then dra.step once "
                "(docs/guide/compatibility.md, \"Limits of the drop-in\")")

    def _check_one_batch_per_micro(self, micro: bool) -> None:
        """A backward on the batch a no_sync() backward of this window already trained (no new batch
        came from the loader between them): SAM's two passes (the first under no_sync), or one
        loader batch split into chunks each backpropagated under no_sync. Every backward of a
        window is counted as a batch of its own, so the window would commit (and consume) batches
        it never trained. Raised before this backward changes anything (on every rank alike)."""
        ctl = self.controller
        sampler = ctl.sampler
        if sampler is None or not sampler._iterating or sampler._delivered == 0:
            self._micro_at = None  # indices taken without a DataLoader: batches cannot be told apart
            return
        here = (sampler._pass_token, sampler._delivered)
        last, self._micro_at = getattr(self, "_micro_at", None), (here if micro else None)
        if ctl._window_open and last == here:
            self._micro_at = None
            raise RuntimeError(
                "dra: a second backward on the batch a no_sync() backward already trained (SAM's two passes, or one "
                "batch split into chunks): dra counts every backward of an accumulation window as a batch of its own, "
                "so the window would commit batches it never trained. For SAM, take the first pass's gradient with "
                "torch.autograd.grad(loss, params) (no no_sync(), no backward), then backpropagate the second pass "
                "once; for chunks, let the DataLoader hand out the chunks (a smaller batch_size) or sum the chunks' "
                "losses into one backward (docs/guide/compatibility.md, \"Limits of the drop-in\")")

    def _start_backward(self, firing_param: torch.Tensor | None) -> None:
        """The first gradient of this backward (``firing_param``'s, None before its accumulation):
        the reduction starts (unless the batch is stale or a micro-batch of a window)."""
        ctl = self.controller
        self._check_parameters_unchanged()
        self._follow_trainable()
        firing = self._index.get(id(firing_param), -1) if firing_param is not None else -1
        # A micro-batch when no_sync held at its backward or at its forward (DDP decides at the
        # forward: `with model.no_sync():` around the forward alone accumulates there too).
        micro = self._no_sync or self._forward_sync is False
        self._check_one_batch_per_micro(micro)
        self._forward_sync = None
        if not micro:
            # The same batch first: two losses backpropagated one after the other are told to sum
            # them (accumulation's fix, no_sync(), would be refused for them in turn).
            self._check_one_reduction_per_batch()
            self._check_accumulation(firing)
        self._queued = True
        self._reported = 0
        self.reduce_s = 0.0
        if not self._outer_armed:  # else the end of the backward through the outputs calls _sync
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        ctl._micro_step_due = False  # a micro-batch whose dra.step never came
        ctl._settle_missed_step()  # the previous backward never reached dra.step
        before = ctl._micro_fresh  # batches of this window trained so far
        fresh = ctl.sampler is None or ctl.sampler._current_is_fresh(before)
        self._micro = micro
        # A stale batch inside a window, or one loaded in place of an empty share, adds nothing.
        self._zeroing = (not fresh and (self._micro or before > 0)) or (
            fresh and ctl.sampler is not None and ctl.sampler._current_is_empty())
        self._active = False
        if self._micro:
            ctl._micro_fresh += int(fresh)
        elif not fresh and before == 0:
            ctl._skipping = True
        else:
            in_flight, skipped = ctl.sampler._batch_check() if ctl.sampler is not None else (-1, 0)
            self._active = ctl._begin_reduction(self._params, in_flight, skipped, before + int(fresh), self._unused_to_none)

    def _sync(self) -> None:
        self._queued = False
        ctl = self.controller
        self._zeroing = False
        if self._micro:
            # A micro-batch: trained locally, its gradient kept for the window's reduction. It is
            # consumed now; its dra.step (if the loop calls one) commits nothing.
            self._micro = False
            ctl._micro_step_due = ctl._window_open = True
            if ctl.sampler is not None:
                ctl.sampler._consumed()
            return
        ctl._micro_fresh = 0  # the window closes with this reduction (a failed one is redone whole)
        ctl._window_open = False
        ctl._awaiting_step = True
        if self._reported < len(self._params) and not self._unused_to_none and not self._warned_unused:
            self._warn_unused()
        t0 = time.perf_counter()
        ok = False if ctl._skipping else ctl._finish_reduction()
        self.reduce_s += time.perf_counter() - t0
        self._active = False
        if not ok:
            # The step will not be applied: without gradients, torch's optimizers skip every
            # parameter, so even an unwrapped optimizer.step() changes nothing (ctl.optimizer
            # skips the call altogether). A parameter that held a gradient tensor gets a zero one
            # back once that step is over (dra._training_objects.restore_dropped_grads), as the script's
            # zero_grad(set_to_none=False) would have left it: left None, an expert no batch
            # routed to afterwards was no longer moved by AdamW's momentum and decay, and the
            # result differed from the run without the fault.
            ctl._grads_dropped = [p for p in self._params if p.grad is not None]
            for p in self._params:
                p.grad = None


    def _warn_unused(self) -> None:
        """Once per process: a parameter that requires a gradient had none after this backward
        (the loss did not use it here; one held from earlier, not zeroed, cannot be told apart)."""
        params = {id(p) for p in self._params}
        names = [n for n, p in self.module.named_parameters() if id(p) in params and p.grad is None]
        if not names:
            return
        self._warned_unused = True
        shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        warnings.warn(
            f"dra: parameter(s) {shown} had no gradient in this backward on this process (the loss did not use them); "
            "dra gives each the world's mean gradient, zero where no process used it, where torch's DDP would raise. "
            "Momentum, Adam's moments and weight decay then still move a parameter no process used. Pass "
            "find_unused_parameters=True (as to DDP) to leave its .grad None on such a step, as in one process "
            "(docs/guide/compatibility.md). Said once per process.", stacklevel=2)


def _in_backward() -> bool:
    """Whether autograd is running a backward on this thread (a checkpoint's recompute runs the
    forward inside one)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


class _Guarded:
    """Holds a torch object; ``step`` runs only when the current step's reduction succeeded."""

    def __init__(self, inner: Any, controller: Any) -> None:
        self._inner = inner
        self._controller = controller

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self._controller._skip_update():
            restore_dropped_grads(self._controller)
            return None
        return self._inner.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<dra {type(self).__name__} of {self._inner!r}>"


class ElasticOptimizer(_Guarded):
    """The user's optimizer: ``step()`` is applied only when the step's gradient reduction
    succeeded; everything else (``zero_grad``, ``param_groups``, ``state_dict``...) is the
    optimizer's own. With ``handoff="deferred"`` the optimizer state a joiner is still receiving
    is loaded first (and a sender waits until its state has left)."""

    def step(self, *args: Any, **kwargs: Any) -> Any:
        self._controller._complete_handoff()
        out = super().step(*args, **kwargs)
        self._zero_pruned_state()
        return out

    def _zero_pruned_state(self) -> None:
        """``compress="masked"``: the pruned weights and their optimizer state (momentum, Adam's
        moments) are zeroed, so a connection RigL grows later starts from zero, as in RigL."""
        pairs = self._controller._sparsity_masks()
        if not pairs:
            return
        state = getattr(self._inner, "state", {})
        with torch.no_grad():
            for param, mask in pairs:
                for value in state.get(param, {}).values():
                    if torch.is_tensor(value) and value.shape == param.shape:
                        value.mul_(mask)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._inner


class ElasticScheduler(_Guarded):
    """The user's LR scheduler: ``step()`` is applied only when the step's gradient reduction
    succeeded (a redone step must not advance the schedule twice)."""

    @property
    def scheduler(self) -> Any:
        return self._inner
