"""State handoff: model, optimizer, scheduler, RNG and controller state to joiners.

The sender (the leader) describes its state in a manifest (names, shapes, dtypes of every tensor
plus the non-tensor state, pickled) and then streams the tensor bytes in chunks of at most
``chunk_bytes``: a chunk that is one contiguous piece of one tensor is sent straight from (and
received straight into) that tensor's storage; smaller tensors are packed into one reusable
staging buffer. Memory beyond the state itself is bounded by one chunk.
"""

from __future__ import annotations

import hashlib
import pickle
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dra.elastic._comm import GlooWorld

_TAG_MANIFEST = 71
_TAG_CHUNK = 72


def model_signature(model: torch.nn.Module) -> list[list[Any]]:
    """[name, shape, dtype] of every parameter and buffer: what a joiner must match."""
    return [[name, list(t.shape), str(t.dtype)] for name, t in model.state_dict().items()]


def signature_mismatch(mine: list[list[Any]], theirs: list[list[Any]]) -> str | None:
    """A readable description of the first difference, or None when they match."""
    a = {n: (s, d) for n, s, d in mine}
    b = {n: (s, d) for n, s, d in theirs}
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if missing:
        return f"joiner's model lacks {missing[:3]}{' ...' if len(missing) > 3 else ''}"
    if extra:
        return f"joiner's model has unexpected {extra[:3]}{' ...' if len(extra) > 3 else ''}"
    for name in a:
        if a[name] != b[name]:
            return f"'{name}': world has shape {a[name][0]} {a[name][1]}, joiner has {b[name][0]} {b[name][1]}"
    return None


@dataclass
class _Slot:
    tensor: torch.Tensor  # contiguous destination/source
    nbytes: int


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _plan(sizes: list[int], chunk_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Chunks as lists of (tensor index, byte offset, byte count); identical on both sides."""
    chunks: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    room = chunk_bytes
    for i, n in enumerate(sizes):
        off = 0
        while off < n:
            take = min(n - off, room)
            current.append((i, off, take))
            off += take
            room -= take
            if room == 0:
                chunks.append(current)
                current, room = [], chunk_bytes
    if current:
        chunks.append(current)
    return chunks


def collect(model: torch.nn.Module, optimizer, scheduler, extra: dict[str, Any]) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """The sender's tensors (contiguous) and the manifest describing them."""
    tensors: list[torch.Tensor] = []
    entries: list[tuple[str, Any, list[int], str]] = []
    for name, t in model.state_dict().items():
        tensors.append(t.detach().contiguous())
        entries.append(("model", name, list(t.shape), str(t.dtype)))
    opt_meta = None
    if optimizer is not None:
        sd = optimizer.state_dict()
        plain_state: dict[Any, dict[str, Any]] = {}
        for pid, st in sd["state"].items():
            plain_state[pid] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    tensors.append(v.detach().contiguous())
                    entries.append(("opt", (pid, k), list(v.shape), str(v.dtype)))
                else:
                    plain_state[pid][k] = v
        opt_meta = {"param_groups": sd["param_groups"], "plain_state": plain_state}
    manifest = {
        "entries": entries,
        "optimizer": opt_meta,
        # The controller guards scheduler.step with an instance attribute: not state.
        "scheduler": {k: v for k, v in scheduler.state_dict().items() if not callable(v)} if scheduler is not None else None,
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        },
        "extra": extra,
    }
    return tensors, manifest


def send_state(world: GlooWorld, dsts: list[int], tensors: list[torch.Tensor], manifest: dict[str, Any], chunk_bytes: int) -> int:
    """Streams the state to ranks `dsts`. Returns the bytes of tensor data sent (per receiver)."""
    blob = pickle.dumps(manifest, protocol=pickle.HIGHEST_PROTOCOL)
    header = torch.tensor([len(blob)], dtype=torch.int64)
    world.send_many(header, dsts, _TAG_MANIFEST)
    world.send_many(torch.frombuffer(bytearray(blob), dtype=torch.uint8), dsts, _TAG_MANIFEST)
    views = [_byte_view(t) for t in tensors]
    staging: torch.Tensor | None = None
    for chunk in _plan([v.numel() for v in views], chunk_bytes):
        if len(chunk) == 1:
            i, off, n = chunk[0]
            world.send_many(views[i][off : off + n], dsts, _TAG_CHUNK)
            continue
        total = sum(n for _, _, n in chunk)
        if staging is None or staging.numel() < total:
            staging = torch.empty(chunk_bytes, dtype=torch.uint8)
        pos = 0
        for i, off, n in chunk:
            staging[pos : pos + n].copy_(views[i][off : off + n])
            pos += n
        world.send_many(staging[:total], dsts, _TAG_CHUNK)
    return sum(v.numel() for v in views)


def recv_state(world: GlooWorld, src: int, model: torch.nn.Module, optimizer, scheduler, chunk_bytes: int) -> tuple[dict[str, Any], int]:
    """Receives the state from rank `src` into model/optimizer/scheduler/RNG; returns (extra, bytes)."""
    header = torch.zeros(1, dtype=torch.int64)
    world.recv(header, src, _TAG_MANIFEST)
    blob = torch.empty(int(header.item()), dtype=torch.uint8)
    world.recv(blob, src, _TAG_MANIFEST)
    manifest = pickle.loads(blob.numpy().tobytes())
    model_sd = model.state_dict()
    targets: list[torch.Tensor] = []
    for kind, key, shape, dtype in manifest["entries"]:
        if kind == "model":
            mine = model_sd.get(key)
            if mine is None or list(mine.shape) != shape or str(mine.dtype) != dtype:
                # Checked at admission already; this guards a world whose model changed since.
                raise ValueError(f"state handoff: '{key}' {shape} {dtype} does not match this process's model")
            targets.append(mine if mine.is_contiguous() else torch.empty_like(mine))
        else:
            targets.append(torch.empty(shape, dtype=getattr(torch, dtype.split(".")[-1])))
    views = [_byte_view(t) for t in targets]
    staging: torch.Tensor | None = None
    for chunk in _plan([v.numel() for v in views], chunk_bytes):
        if len(chunk) == 1:
            i, off, n = chunk[0]
            world.recv(views[i][off : off + n], src, _TAG_CHUNK)
            continue
        total = sum(n for _, _, n in chunk)
        if staging is None:
            staging = torch.empty(chunk_bytes, dtype=torch.uint8)
        world.recv(staging[:total], src, _TAG_CHUNK)
        pos = 0
        for i, off, n in chunk:
            views[i][off : off + n].copy_(staging[pos : pos + n])
            pos += n
    opt_tensors: dict[Any, dict[str, torch.Tensor]] = {}
    with torch.no_grad():
        for (kind, key, _, _), t in zip(manifest["entries"], targets):
            if kind == "model":
                dst = model_sd[key]
                if dst.data_ptr() != t.data_ptr():
                    dst.copy_(t)
            else:
                pid, k = key
                opt_tensors.setdefault(pid, {})[k] = t
    if optimizer is not None and manifest["optimizer"] is not None:
        meta = manifest["optimizer"]
        state = {pid: dict(v) for pid, v in meta["plain_state"].items()}
        for pid, d in opt_tensors.items():
            state.setdefault(pid, {}).update(d)
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    if scheduler is not None and manifest["scheduler"] is not None:
        scheduler.load_state_dict(manifest["scheduler"])
    rng = manifest["rng"]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    return manifest["extra"], sum(v.numel() for v in views)


def param_digest(model: torch.nn.Module, optimizer=None) -> int:
    """A 62-bit digest of every parameter and buffer (and optimizer tensor), bit for bit."""
    h = hashlib.blake2b(digest_size=8)
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(_byte_view(t.detach().contiguous()).numpy().tobytes())
    if optimizer is not None:
        for pid, st in sorted(optimizer.state_dict()["state"].items()):
            for k, v in sorted(st.items()):
                if torch.is_tensor(v):
                    h.update(f"{pid}.{k}".encode())
                    h.update(_byte_view(v.detach().contiguous()).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 2
