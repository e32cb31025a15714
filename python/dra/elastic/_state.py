"""What a PyTorch trainer hands over to joiners: the state provider of the C++ controller.

The controller (``dra::elastic::controller``, src/elastic/controller.cpp) moves the bytes: a
manifest, then every tensor in chunks of at most ``chunk_mb`` (straight from and into the tensors'
storage where a chunk is one piece of one tensor), plus its own part (step counter, sampler
position). This provider says what the state is: the model's parameters and buffers, the
optimizer's tensors, and in the manifest the optimizer's param groups and scalar state,
the LR scheduler and the ``extra_state`` objects' state dicts (a GradScaler, an EMA model). Not the
random state: each process keeps its own, as under torch's DDP. The tensors of those state dicts (an EMA's copy of the model)
travel as tensors, after the optimizer's.

The manifest comes from another process, so it is never unpickled as such: it is written with
``torch.save`` and read with ``torch.load(weights_only=True)``, torch's restricted loader for
untrusted files (tensors, numbers, strings, containers and the few torch types a state dict holds;
no code). A state holding any other type is refused at the sender's first handoff, naming where it
is and how to allow it (``torch.serialization.add_safe_globals`` on every process).
"""

from __future__ import annotations

import io
from typing import Any

import torch

from dra._core import elastic as _m

_EXTRA = torch.nn.modules.module._EXTRA_STATE_KEY_SUFFIX  # "_extra_state"


def extra_state_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules with a state of their own beyond tensors (``get_extra_state`` /
    ``set_extra_state``: quantisation observers, fp8 scaling metadata, a forward counter), by the
    key their state takes in a state_dict (``<module>._extra_state``)."""
    base = torch.nn.Module.get_extra_state
    return {f"{name}.{_EXTRA}" if name else _EXTRA: m for name, m in model.named_modules()
            if getattr(type(m), "get_extra_state", base) is not base}


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers: its state_dict and its non-persistent buffers, which a
    state_dict leaves out: dra averages every buffer at each step (as torch's DDP syncs them all),
    and a joiner that kept its own mixed it into the world's (a forward counter went 5 -> 4 after a
    grow). Not the modules' extra state (extra_state_modules): its state_dict entry is what
    ``get_extra_state()`` built just now, any object; copied into, it changed nothing (a joiner kept
    its own counter and temperature), and a dict crashed the wrap."""
    extra = extra_state_modules(model)
    out = {k: v for k, v in model.state_dict().items() if k not in extra}
    for name, b in model.named_buffers():
        if name not in out and b is not None:
            out[name] = b.detach()
    return out


def model_signature(model: torch.nn.Module) -> list[list[Any]]:
    """[name, shape, dtype] of every parameter and buffer, and [key, [], "extra_state"] of every
    module's extra state: what a joiner must match."""
    return ([[name, list(t.shape), str(t.dtype)] for name, t in model_tensors(model).items()]
            + [[key, [], "extra_state"] for key in extra_state_modules(model)])


def signature_mismatch(mine: list[list[Any]], theirs: list[list[Any]]) -> str | None:
    """A readable description of the first difference, or None when they match (the C++ rule)."""
    return _m.signature_mismatch([tuple(x) for x in mine], [tuple(x) for x in theirs])


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.split(".")[-1])


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _moved(obj: Any, device: Any) -> Any:
    """obj with the tensors it holds (in dicts, lists and tuples) on device: a module's extra state
    travels on the CPU (a tensor saved on cuda:3 loads on cuda:3, which a joiner may not have)."""
    if torch.is_tensor(obj):
        return obj.detach().to(device)
    if isinstance(obj, dict):
        return {k: _moved(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_moved(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_moved(v, device) for v in obj)
    return obj


def _loads(data: bytes) -> Any:
    """A peer's manifest, through torch's restricted loader: no code runs whatever the bytes."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError or ValueError
        raise ValueError(f"state handoff: the world's state manifest was refused by torch's restricted loader "
                         f"({str(e).splitlines()[0]}); every process must run the same script, and a type a "
                         "state dict holds beyond tensors, numbers, strings and containers must be allowed "
                         "on every process with torch.serialization.add_safe_globals([...])") from None


def _check_loadable(manifest: dict[str, Any]) -> None:
    """Each part of the manifest through the loader the joiners use, so that a type they would
    refuse is named at the sender, with where it sits."""
    parts = {"optimizer": manifest["optimizer"], "scheduler": manifest["scheduler"]}
    parts.update({f"model's '{k}' (get_extra_state)": v for k, v in manifest["module_extra"].items()})
    parts.update({f"extra_state['{k}']": v["plain"] for k, v in manifest["extra_state"].items()})
    for where, part in parts.items():
        try:
            torch.load(io.BytesIO(_dumps(part)), weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"state handoff: the {where} state holds a type joiners may not load from a peer "
                             f"({str(e).splitlines()[0]}); keep such state to tensors, numbers, strings and "
                             "containers, or allow the type on every process with "
                             "torch.serialization.add_safe_globals([...]) before dra.init") from None


class TorchState(_m.StateProvider):
    """Model + optimizer + LR scheduler + extra state of one process, and which of the model's
    parameters are frozen."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                 extra_state: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.extra_state = dict(extra_state or {})
        self._checked = False
        # The state a joiner received in init, kept until its first forward (restore_received).
        # The job accumulates gradients across steps without no_sync() (seen by the model wrapper):
        # handed to joiners, so that every member holds a resize for an open window alike.
        self.accumulating = False
        self.keep_received = True
        self._received: tuple[dict[str, Any], list[torch.Tensor]] | None = None
        self._received_marks: tuple[Any, ...] | None = None

    def signature(self) -> list[list[Any]]:
        return model_signature(self.model)

    def layout(self) -> dict[str, str]:
        """What else the handoff sends, as the joiner must be able to load it: the optimizer's class
        and parameter groups (their sizes), the LR scheduler's class. Compared at start
        and admission, so a joiner with an Adam where the world has an SGD is refused before anything
        is sent."""
        out: dict[str, str] = {}
        if self.optimizer is not None:
            out["optimizer"] = _class_name(self.optimizer)
            out["optimizer.param_groups"] = "[" + ", ".join(f"{len(g['params'])} params" for g in self.optimizer.param_groups) + "]"
        out["scheduler"] = _class_name(self.scheduler) if self.scheduler is not None else "none"
        for name, obj in self.extra_state.items():
            out[f"extra_state.{name}"] = _class_name(obj)
        return out

    def collect(self) -> tuple[list[torch.Tensor], bytes, int]:
        """The tensors (the model's, then the optimizer's), the manifest, and the index of the first
        tensor a deferred handoff may deliver after the joiner's first forward and backward: the
        optimizer's, when every model tensor is contiguous (then they land in place at the joiner
        before its first forward); otherwise none is deferred."""
        tensors: list[torch.Tensor] = []
        entries: list[tuple[str, Any, list[int], str]] = []
        in_place = True
        for name, t in model_tensors(self.model).items():
            in_place = in_place and t.is_contiguous()
            tensors.append(t.detach().contiguous())
            entries.append(("model", name, list(t.shape), str(t.dtype)))
        first_deferrable = len(tensors) if in_place else -1
        opt_meta = None
        if self.optimizer is not None:
            sd = self.optimizer.state_dict()
            plain: dict[Any, dict[str, Any]] = {}
            for pid, st in sd["state"].items():
                plain[pid] = {}
                for k, v in st.items():
                    if torch.is_tensor(v):
                        tensors.append(v.detach().contiguous())
                        entries.append(("opt", (pid, k), list(v.shape), str(v.dtype)))
                    else:
                        plain[pid][k] = v
            opt_meta = {"param_groups": sd["param_groups"], "plain_state": plain}
        # extra_state: its state dicts' tensors (an EMA's copy of the model) travel with the others,
        # in chunks and covered by verify=True; the rest (a GradScaler's scale) in the manifest.
        extra_meta: dict[str, dict[str, Any]] = {}
        for name, obj in self.extra_state.items():
            sd = obj.state_dict()
            rest = {}
            for k, v in sd.items():
                if torch.is_tensor(v):
                    tensors.append(v.detach().contiguous())
                    entries.append(("extra", (name, k), list(v.shape), str(v.dtype)))
                else:
                    rest[k] = v
            extra_meta[name] = {"keys": list(sd.keys()), "plain": rest}
        manifest = {
            "entries": entries,
            # The modules' own extra state (get_extra_state): in the manifest, through torch's
            # restricted loader like the rest (tensors, numbers, strings, containers); applied with
            # set_extra_state before the joiner's first forward.
            "module_extra": {key: _moved(m.get_extra_state(), "cpu")
                             for key, m in extra_state_modules(self.model).items()},
            "optimizer": opt_meta,
            # Callables (a scheduler's lr_lambda) are code, not state.
            "scheduler": {k: v for k, v in self.scheduler.state_dict().items() if not callable(v)}
            if self.scheduler is not None
            else None,
            "extra_state": extra_meta,
            # Which parameters are frozen now (requires_grad False): a joiner trains and reduces the
            # same ones as the world, whatever its own script set before it joined.
            "frozen": [name for name, p in self.model.named_parameters() if not p.requires_grad],
            "accumulating": self.accumulating,
            # No random state: each process keeps its own, as under torch's DDP (a script seeding
            # each rank its own way, torch.manual_seed(seed + rank), keeps distinct dropout masks,
            # augmentations and DataLoader worker seeds per rank; copied, every rank drew the
            # sender's numbers from the first world on).
        }
        if not self._checked:  # once: what a peer's restricted loader will refuse, named here
            _check_loadable(manifest)
            self._checked = True
        return tensors, _dumps(manifest), first_deferrable if first_deferrable >= 0 else len(tensors)

    def prepare(self, manifest: bytes) -> list[torch.Tensor]:
        self._manifest = _loads(manifest)
        model_sd = model_tensors(self.model)
        targets: list[torch.Tensor] = []
        for kind, key, shape, dtype in self._manifest["entries"]:
            if kind == "model":
                mine = model_sd.get(key)
                if mine is None or list(mine.shape) != shape or str(mine.dtype) != dtype:
                    # Checked at admission already; this guards a world whose model changed since.
                    mine_text = "lacks it" if mine is None else f"has {list(mine.shape)} {mine.dtype}"
                    raise ValueError(
                        f"state handoff: the world's model has '{key}' {shape} {dtype}, and this process's model "
                        f"{mine_text}: the world's model changed after dra's init (a buffer or parameter created "
                        "in a forward after the wrap?). Build every part before the wrap: run one forward "
                        "before dra.elastic.init / DistributedDataParallel, on every process")
                # Bytes land straight in the model's storage when it is contiguous; a channels_last or
                # transposed one is received contiguous and copied in (empty_like kept its strides,
                # and the chunked transfer refused it: such a model could not start on 2 processes).
                targets.append(mine.detach() if mine.is_contiguous()
                               else torch.empty(mine.shape, dtype=mine.dtype, device=mine.device))
            else:
                targets.append(torch.empty(shape, dtype=_dtype(dtype)))
        if "frozen" in self._manifest:
            frozen = set(self._manifest["frozen"])
            for name, p in self.model.named_parameters():
                p.requires_grad_(name not in frozen)
        # A state without tensors (a GradScaler's) is loaded here, before the joiner's first forward
        # also with handoff="deferred" (load() comes after it then): the scale must be the world's
        # when that backward is reduced. One with tensors (an EMA, used after the optimizer's step)
        # is loaded in load(), once they arrived.
        self._load_module_extra(self._manifest)
        self.accumulating = bool(self._manifest.get("accumulating", False))
        with_tensors = {key[0] for kind, key, _, _ in self._manifest["entries"] if kind == "extra"}
        for name, meta in self._manifest["extra_state"].items():
            if name not in with_tensors:
                self._load_extra(name, meta, {})
        return targets

    def _load_module_extra(self, meta: dict[str, Any]) -> None:
        """The world's modules' extra state, through each module's set_extra_state."""
        mine = extra_state_modules(self.model)
        for key, value in meta.get("module_extra", {}).items():
            if key not in mine:
                raise ValueError(f"state handoff: the world's model has extra state '{key}' (get_extra_state), "
                                 "which this process's model lacks; every process must build the same model")
            device = next((t.device for t in [*mine[key].parameters(), *mine[key].buffers()]), None)
            mine[key].set_extra_state(value if device is None else _moved(value, device))

    def _load_extra(self, name: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        if name not in self.extra_state:
            raise ValueError(f"state handoff: the world sends extra_state '{name}', which this process does not have")
        values = {**meta["plain"], **tensors}
        self.extra_state[name].load_state_dict({k: values[k] for k in meta["keys"]})

    def load(self, manifest: bytes, tensors: list[torch.Tensor]) -> None:
        meta = self._manifest
        model_sd = model_tensors(self.model)
        opt_tensors: dict[Any, dict[str, torch.Tensor]] = {}
        extra_tensors: dict[str, dict[str, torch.Tensor]] = {}
        with torch.no_grad():
            for (kind, key, _, _), t in zip(meta["entries"], tensors):
                if kind == "model":
                    dst = model_sd[key]
                    if dst.data_ptr() != t.data_ptr():
                        dst.copy_(t)
                elif kind == "extra":
                    name, k = key
                    extra_tensors.setdefault(name, {})[k] = t
                else:
                    pid, k = key
                    opt_tensors.setdefault(pid, {})[k] = t
        for name, by_key in extra_tensors.items():
            self._load_extra(name, meta["extra_state"][name], by_key)
        if self.optimizer is not None and meta["optimizer"] is not None:
            state = {pid: dict(v) for pid, v in meta["optimizer"]["plain_state"].items()}
            for pid, d in opt_tensors.items():
                state.setdefault(pid, {}).update(d)
            self.optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
        if self.scheduler is not None and meta["scheduler"] is not None:
            self.scheduler.load_state_dict(meta["scheduler"])
        self._manifest = None
        if self.keep_received:
            # Until the process's first forward (dra.elastic._wrappers): the script's code after the
            # wrap may load a checkpoint or set a learning rate over what a joiner just received.
            self._received = (meta, [t.detach().to("cpu", copy=True) if kind == "model" else t
                                     for (kind, _, _, _), t in zip(meta["entries"], tensors)])

    def mark_received(self, keep: bool) -> None:
        """At the end of init: marks the state as the world left it (LR scaling at the change
        included), or drops the copy (a founder: the script's code after the wrap runs alike on
        every founder, a checkpoint loaded by all of them)."""
        if not keep or self._received is None:
            self._received, self.keep_received = None, keep
            return
        self._received_marks = self._marks({key for kind, key, _, _ in self._received[0]["entries"] if kind == "model"})

    def _marks(self, keys: set[str]) -> tuple[Any, ...]:
        """What tells a change since the state was received: each model tensor's version counter
        (an in-place load bumps it; an assignment makes another tensor), the optimizer's state
        object and hyperparameters, the scheduler's state."""
        tensors = model_tensors(self.model)
        versions = tuple((k, tensors[k].data_ptr(), tensors[k]._version) for k in sorted(keys) if k in tensors)
        opt = None
        if self.optimizer is not None:
            opt = (id(self.optimizer.state), repr([{k: v for k, v in g.items() if k != "params"}
                                                   for g in self.optimizer.param_groups]))
        sched = repr(self.scheduler.state_dict()) if self.scheduler is not None else None
        return versions, opt, sched

    def restore_received(self) -> bool:
        """At a joiner's first forward: when the script changed the model, optimizer or scheduler
        since the world's state arrived (a checkpoint loaded into ``model.module`` after the wrap, as
        torchvision's and DeiT's scripts resume; a learning rate scaled by the world size it saw),
        loads the world's state again and returns True: a joiner continues the world's training.
        Either way the copy is dropped, and no later state is kept."""
        kept, self._received, self.keep_received = self._received, None, False
        if kept is None or self._received_marks is None:  # received after init: no script code ran since
            return False
        meta, tensors = kept
        model = {key for kind, key, _, _ in meta["entries"] if kind == "model"}
        # model_tensors returns detached views: their storage and the version counter they share.
        if self._marks(model) == self._received_marks:
            return False
        changed = not self._holds(meta, tensors)  # touched but equal (accelerate's prepare(opt)): no word
        self._manifest = meta
        self._load_module_extra(meta)
        self.load(b"", tensors)
        return changed

    def _holds(self, meta: dict[str, Any], tensors: list[torch.Tensor]) -> bool:
        """Whether the state now equals what was received (values, hyperparameters, scheduler)."""
        now, manifest, _ = self.collect()
        current = _loads(manifest)
        if [e[:2] for e in current["entries"]] != [e[:2] for e in meta["entries"]] or len(now) != len(tensors):
            return False
        if current["optimizer"] != meta["optimizer"] or current["scheduler"] != meta["scheduler"]:
            return False
        return all(a.shape == b.shape and torch.equal(a.cpu(), b.cpu()) for a, b in zip(now, tensors))

    def scale_learning_rate(self, factor: float) -> None:
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] *= factor

    def _device_tensors(self) -> list[tuple[Any, Any, torch.Tensor]]:
        """(container, key, tensor) of every state tensor on a device: parameters and buffers
        (their .data is moved, so the optimizer's references stay valid) and optimizer state."""
        out: list[tuple[Any, Any, torch.Tensor]] = []
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if t.device.type != "cpu":
                out.append((t, None, t.data))
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                for k, v in st.items():
                    if torch.is_tensor(v) and v.device.type != "cpu":
                        out.append((st, k, v))
        return out

    def release_device(self) -> None:
        """Released to standby: the state moves to the CPU and the allocator's cached blocks go back,
        so that the device is free for another job (the CUDA context itself stays)."""
        self._released = []
        for owner, key, t in self._device_tensors():
            self._released.append((owner, key, t.device))
            if key is None:
                owner.data = t.to("cpu")
                owner.grad = None
            else:
                owner[key] = t.to("cpu")
        if self._released and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def restore_device(self) -> None:
        """Admitted again: the state returns to its device before the world's state arrives."""
        for owner, key, device in getattr(self, "_released", []):
            if key is None:
                owner.data = owner.data.to(device)
            else:
                owner[key] = owner[key].to(device)
        self._released = []
