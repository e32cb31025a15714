"""The live RL loop's control channel between the coordinator and its workers: JSON, checked.

The connection is a ``multiprocessing.connection`` on a Unix socket whose peers showed the run's
key (an HMAC handshake over raw bytes), but a peer is still input, and input is never unpickled:
a message travels as ``send_bytes`` of UTF-8 JSON (stdlib ``json``; NaN and infinities as Python
writes them) and is checked on receipt against the one schema of its kind below: a JSON object
with a known ``cmd`` (coordinator to worker) or a known reply tag (worker to coordinator), every
field of the expected type, no field the schema does not name. Anything else raises
`ChannelError` naming the field and what was expected; a message longer than
`MAX_MESSAGE_BYTES` is refused before it is read. Nothing is rebuilt by class name: the one
dataclass that travels (a `Prompt`) goes as its named fields and comes back through its
constructor (`prompt_fields`, `prompt_from`); tuples arrive as lists. A sequence's
log-probabilities travel as base64 of raw little-endian float64 (`_Array`: one dtype per field,
from a fixed list), exact and ten times faster to write than JSON floats; the rest is a few
numbers per sequence, and weights never travel here (files and a Gloo group)."""

from __future__ import annotations

import array
import base64
import binascii
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dra.rl.live.task import Prompt

MAX_MESSAGE_BYTES = 256 << 20  # what a peer can make the other side read (and allocate) at once


class ChannelError(ValueError):
    """A message of the control channel that is not one the loop sends (or too long)."""


# ---- schemas ----------------------------------------------------------------------------------
# A schema is written with int, float (an int passes too), str, bool (never a number), a str
# constant, ANY (any JSON value: plain data, such as a controller's event dict) and the classes
# below. Each checks a value (`walk`) in one of three directions: CHECK only; OUT, to the wire
# form (an _Array's list becomes its bytes); IN, from it. `where` is the path for the error message,
# kept as nested (parent, key) pairs and written out only when a message is refused.

CHECK, OUT, IN = 0, 1, -1
_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _path(where: Any) -> str:
    parts = []
    while type(where) is tuple:
        where, key = where
        parts.append(f"[{key}]" if type(key) is int else f".{key}")
    return where + "".join(reversed(parts))


def _what(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


class _Spec:
    def walk(self, value: Any, where: Any, direction: int) -> Any:
        raise NotImplementedError


class _Any(_Spec):
    def walk(self, value: Any, where: Any, direction: int) -> Any:
        return value


ANY = _Any()


class _Scalar(_Spec):
    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.accepts = (int, float) if kind is float else (kind,)

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if type(value) not in self.accepts:
            raise ChannelError(f"{_path(where)}: expected {_NAMES[self.kind]}, got {_what(value)}")
        return value


class _Const(_Spec):  # the selector of a _OneOf variant
    def __init__(self, value: str) -> None:
        self.value = value

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if value != self.value:
            raise ChannelError(f"{_path(where)}: expected {self.value!r}, got {value!r:.80}")
        return value


def _spec(s: Any) -> _Spec:
    if isinstance(s, _Spec):
        return s
    if s in _NAMES:
        return _Scalar(s)
    if type(s) is str:
        return _Const(s)
    raise TypeError(f"channel: not a schema: {s!r}")


class _Opt(_Spec):
    def __init__(self, spec: Any) -> None:
        self.spec = _spec(spec)

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        return None if value is None else self.spec.walk(value, where, direction)


class _List(_Spec):
    def __init__(self, spec: Any) -> None:
        self.spec = _spec(spec)
        # A list of numbers (tokens, keys) is checked in one pass over its items' types.
        self.numbers = frozenset(self.spec.accepts) if isinstance(self.spec, _Scalar) and self.spec.kind in (int, float) else None

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if type(value) is not list:
            raise ChannelError(f"{_path(where)}: expected a list, got {_what(value)}")
        if self.numbers is not None and self.numbers.issuperset(map(type, value)):
            return value
        return _rewritten(value, ((i, self.spec.walk(x, (where, i), direction)) for i, x in enumerate(value)), direction)


class _Tuple(_Spec):  # a list of fixed length, one spec per position
    def __init__(self, *specs: Any) -> None:
        self.specs = [_spec(s) for s in specs]

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if type(value) is not list or len(value) != len(self.specs):
            raise ChannelError(f"{_path(where)}: expected a list of {len(self.specs)} items, got {_what(value)}"
                               + (f" of {len(value)}" if type(value) is list else ""))
        return _rewritten(value, ((i, s.walk(x, (where, i), direction)) for i, (x, s) in enumerate(zip(value, self.specs))), direction)


class _Obj(_Spec):
    def __init__(self, required: dict[str, Any], optional: dict[str, Any] | None = None) -> None:
        # (spec, the exact Python type of a scalar field: most values have it and pass inline)
        self.required = {k: (_spec(s), _exact(_spec(s))) for k, s in required.items()}
        self.optional = {k: (_spec(s), _exact(_spec(s))) for k, s in (optional or {}).items()}

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if type(value) is not dict:
            raise ChannelError(f"{_path(where)}: expected an object, got {_what(value)}")
        changed: list[tuple[str, Any]] = []
        for k, (s, exact) in self.required.items():
            if k not in value:
                raise ChannelError(f"{_path(where)}: field '{k}' missing")
            x = value[k]
            if type(x) is not exact:
                y = s.walk(x, (where, k), direction)
                if y is not x:
                    changed.append((k, y))
        if len(value) > len(self.required):
            for k, x in value.items():
                if k in self.required:
                    continue
                entry = self.optional.get(k)
                if entry is None:
                    raise ChannelError(f"{_path(where)}: unknown field {k!r:.80}")
                if type(x) is not entry[1]:
                    y = entry[0].walk(x, (where, k), direction)
                    if y is not x:
                        changed.append((k, y))
        return _rewritten(value, changed, direction)


def _exact(spec: _Spec) -> type | None:
    return spec.kind if isinstance(spec, _Scalar) else None


def _rewritten(value: Any, changes: Any, direction: int) -> Any:
    """`value` with the items its walk changed (an array to or from its wire form): in place on the
    way in (a message just decoded), in a copy on the way out (the sender's message is its own)."""
    out = value
    for k, y in changes:
        if y is value[k]:
            continue
        if out is value and direction == OUT:
            out = value.copy()
        out[k] = y
    return out


class _OneOf(_Spec):  # an object whose field `key` (a string) selects its schema
    def __init__(self, key: str, variants: dict[str, _Obj]) -> None:
        self.key, self.variants = key, variants

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if type(value) is not dict:
            raise ChannelError(f"{_path(where)}: expected an object, got {_what(value)}")
        choice = value.get(self.key)
        if type(choice) is not str or choice not in self.variants:
            raise ChannelError(f"{_path((where, self.key))}: expected one of {sorted(self.variants)}, got {choice!r:.80}")
        return self.variants[choice].walk(value, where, direction)


class _Array(_Spec):
    """A list of numbers (a sequence's log-probabilities) that travels as ``{"dtype", "shape",
    "b64"}``: base64 of its raw little-endian bytes, the field's one dtype (``<f8``: Python's
    floats, so every value comes back exactly, NaN and infinities included; ``<i8``), from a
    fixed list. Several times faster to write and read than a JSON list of floats."""

    CODES = {"<i8": "q", "<f8": "d"}  # the dtypes an array may have (nothing else is decoded), as array codes

    def __init__(self, dtype: str) -> None:
        self.dtype, self.code = dtype, self.CODES[dtype]
        self.items = _List(int if dtype == "<i8" else float)

    def walk(self, value: Any, where: Any, direction: int) -> Any:
        if direction == IN:
            return self._decode(value, where)
        self.items.walk(value, where, CHECK)
        if direction == CHECK:
            return value
        try:
            a = array.array(self.code, value)
        except OverflowError:
            raise ChannelError(f"{_path(where)}: an integer outside int64") from None
        if sys.byteorder != "little":
            a.byteswap()
        return {"dtype": self.dtype, "shape": [len(value)], "b64": base64.b64encode(a.tobytes()).decode("ascii")}

    def _decode(self, value: Any, where: Any) -> list[Any]:
        if type(value) is not dict or value.keys() != {"dtype", "shape", "b64"}:
            raise ChannelError(f"{_path(where)}: expected an array {{dtype, shape, b64}}, got {_what(value)}"
                               + (f" with fields {sorted(value)[:8]}" if type(value) is dict else ""))
        dtype, shape, data = value["dtype"], value["shape"], value["b64"]
        if dtype != self.dtype:
            raise ChannelError(f"{_path((where, 'dtype'))}: expected {self.dtype!r}, got {dtype!r:.40}")
        if type(shape) is not list or len(shape) != 1 or type(shape[0]) is not int or shape[0] < 0:
            raise ChannelError(f"{_path((where, 'shape'))}: expected [length], got {shape!r:.40}")
        if type(data) is not str:
            raise ChannelError(f"{_path((where, 'b64'))}: expected a string, got {_what(data)}")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ChannelError(f"{_path((where, 'b64'))}: not base64 ({e})") from None
        if len(raw) != shape[0] * 8:
            raise ChannelError(f"{_path(where)}: {len(raw)} bytes for shape {shape} of {dtype} ({shape[0] * 8} expected)")
        out = array.array(self.code, raw)
        if sys.byteorder != "little":
            out.byteswap()
        return out.tolist()


_PROMPT = _Obj({"pid": int, "symbol": int, "target": int, "tokens": _List(int)})
_SEQ = _Obj({"prompt": _PROMPT, "sample": int}, {"batch": int})  # a sequence to generate
_TRAJECTORY = _Obj(  # a generated sequence (worker.SlotWorker._trajectory); the coordinator adds its advantage
    {"key": int, "pid": int, "sample": int, "version": int, "prompt": _List(int), "tokens": _List(int), "logprobs": _Array("<f8"),
     "reward": float, "exact": bool, "gen_s": float, "target": int, "slot": int},
    {"advantage": float})
_EVENT = _Opt(ANY)  # the controller's world change at a boundary (StepStatus.event): a plain dict

COMMANDS: dict[str, _Obj | _OneOf] = {  # coordinator -> worker, by "cmd"
    "init": _Obj({"model": _Obj({"d_model": int, "layers": int, "heads": int, "vocab": int, "max_len": int}), "store_host": str,
                  "store_port": int, "slots": int, "job": str, "lr": float, "clip": float, "max_grad_norm": float, "seed": int,
                  "rollout_slots": int, "timeout_s": float}),
    "stop": _Obj({}),
    "reset": _Obj({"weights": str, "run": str, "uid": int,
                   "job": _Obj({"id": str, "steps": int, "global_batch": int,
                                "options": _Obj({"policy": str, "release": str, "start_size": int, "capacity_poll_s": float,
                                                 "handoff": str, "fault_timeout_s": float, "store_timeout_s": float,
                                                 "events_path": str})})}),
    "boundary": _Obj({}),
    "register": _Obj({}),
    "end": _Obj({}),
    "phase": _OneOf("role", {
        "rollout": _Obj({"role": "rollout", "version": int, "seqs": _List(_SEQ), "more": bool},
                        {"load": _Opt(str), "progress": bool}),
        "train": _Obj({"role": "train", "shard": _Opt(_Obj({"trajectories": _List(_TRAJECTORY), "global_tokens": int, "step": int})),
                       "digest": bool},
                      {"publish": _Opt(str)}),
    }),
    "sync": _Obj({"source": int, "version": int, "digest": bool}),
    "seqs": _Obj({"seqs": _List(_SEQ), "more": bool}),  # the answer to a rollout worker's "gen" that wants more
}

REPLIES: dict[str, _Obj] = {  # worker -> coordinator, by the one tag field they carry (the slot)
    "hello": _Obj({"hello": int, "pid": int}),
    "ready": _Obj({"ready": int, "weights_group_s": float}),
    "reset": _Obj({"reset": int, "uid": int, "role": str, "rank": int}),
    "ended": _Obj({"ended": int, "role": str},
                  {"step_index": int, "cursor": int, "rank": int, "world": int, "resizes": int, "param_digest": float}),
    "boundary": _Obj({"boundary": int, "released": bool, "event": _EVENT, "boundary_s": float, "wall_s": float}),
    "registered": _Obj({"registered": int, "admitted": bool}),
    "train_done": _Obj({"train_done": _Obj(
        {"slot": int, "joined": bool, "boundary_s": float, "join_s": float, "event": _EVENT, "rank": int, "world": int,
         "train_s": float, "compute_s": float, "sync_s": float, "tokens": int},
        {"trained_keys": _List(int), "optimizer_step_s": float, "loss": float, "samples": int, "publish_s": float,
         "deferred_s": float, "deferred_wait_s": float, "handoff": _Opt(ANY), "param_digest": float, "optimizer_digest": float})}),
    "gen": _Obj({"gen": int, "finished": _List(_TRAJECTORY), "want": int, "progress": _Opt(_List(_Tuple(int, int)))}),
    "rollout_done": _Obj({"rollout_done": _Obj(
        {"slot": int, "engine_start_s": float, "leave_s": float, "event": _EVENT, "busy_s": float, "load_s": float, "version": int,
         "rollout_s": float, "segments": _List(_Tuple(float, float, float, float))})}),  # (concurrency, mean context, iterations, s)
    "synced": _Obj({"synced": int, "sync_s": float, "digest": _Opt(float)}),
}


def kind(msg: Any) -> str:
    """The kind of a message, checked: its ``cmd`` (a command) or its one reply tag."""
    if type(msg) is not dict:
        raise ChannelError(f"message: expected a JSON object, got {_what(msg)}")
    if "cmd" in msg:
        cmd = msg["cmd"]
        if type(cmd) is not str or cmd not in COMMANDS:
            raise ChannelError(f"message.cmd: expected one of {sorted(COMMANDS)}, got {cmd!r:.80}")
        return cmd
    tags = [t for t in REPLIES if t in msg]
    if len(tags) != 1:
        raise ChannelError(f"message: expected a field 'cmd' (one of {sorted(COMMANDS)}) or exactly one reply tag "
                           f"(one of {sorted(REPLIES)}), got fields {sorted(msg)[:20]}")
    return tags[0]


def _body(msg: Any, commands: bool, expected: tuple[str, ...], direction: int) -> dict[str, Any]:
    """`msg` walked in `direction` if it is a command (`commands`) or a reply of the loop, of a kind
    in `expected` (any when empty), every field as its schema says; else ChannelError naming what
    is wrong."""
    k = kind(msg)
    is_command = "cmd" in msg
    if is_command != commands:
        raise ChannelError(f"message: expected a {'command' if commands else 'reply'}, got a {'command' if is_command else 'reply'} "
                           f"({k!r})")
    if expected and k not in expected:
        raise ChannelError(f"message: expected {' or '.join(map(repr, expected))}, got {'command' if commands else 'reply'} {k!r}")
    if not is_command:
        return REPLIES[k].walk(msg, f"reply '{k}'", direction)
    body = COMMANDS[k].walk({f: v for f, v in msg.items() if f != "cmd"}, f"command '{k}'", direction)
    return {"cmd": k, **body}


# ---- encoding -----------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    # The encoder calls this for what it cannot write itself, in the plain-data fields (a
    # controller's event or handoff): numpy scalars become numbers; nothing else is guessed at.
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise ChannelError(f"message: a {type(value).__module__}.{type(value).__qualname__} cannot travel on the channel (plain data only)")


_ENCODER = json.JSONEncoder(default=_plain, separators=(",", ":"))  # made once (json.dumps with options makes one per call)


def encode(msg: dict[str, Any]) -> bytes:
    """The bytes of a message, checked on the way (a bad one is named where it is made)."""
    wire = _body(msg, "cmd" in msg if type(msg) is dict else False, (), OUT)
    data = _ENCODER.encode(wire).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ChannelError(f"message: {len(data)} bytes, more than the channel's limit of {MAX_MESSAGE_BYTES} bytes")
    return data


def decode(data: bytes, *, commands: bool, expected: tuple[str, ...] = ()) -> dict[str, Any]:
    """The message in `data`, checked against its kind's schema (of a kind in `expected`, any when
    empty): ChannelError names what is wrong."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ChannelError(f"message: {len(data)} bytes, more than the channel's limit of {MAX_MESSAGE_BYTES} bytes")
    try:
        msg = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ChannelError(f"message: not UTF-8 JSON ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ChannelError(f"message: not JSON ({e.msg} at byte {e.pos}; starts {data[:16]!r})") from None
    except (ValueError, RecursionError) as e:  # an integer too long to convert, nesting too deep
        raise ChannelError(f"message: not accepted JSON ({type(e).__name__}: {str(e)[:120]})") from None
    return _body(msg, commands, expected, IN)


def send(conn: Any, msg: dict[str, Any]) -> None:
    conn.send_bytes(encode(msg))


def send_all(conns: Iterable[Any], msg: dict[str, Any]) -> None:
    """One message to several workers, encoded once (a training step's batch goes to every trainer)."""
    data = encode(msg)
    for conn in conns:
        conn.send_bytes(data)


def _recv(conn: Any, commands: bool, expected: tuple[str, ...]) -> dict[str, Any]:
    try:
        data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    except OSError as e:
        if "bad message length" in str(e):  # the length prefix says more than the limit: nothing was read
            raise ChannelError(f"message: longer than the channel's limit of {MAX_MESSAGE_BYTES} bytes; refused unread") from None
        raise
    return decode(data, commands=commands, expected=expected)


def recv_command(conn: Any, *expected: str) -> dict[str, Any]:
    """The next message on the worker's side: a command of the coordinator (of a kind in `expected`)."""
    return _recv(conn, True, expected)


def recv_reply(conn: Any, *expected: str) -> dict[str, Any]:
    """The next message on the coordinator's side: a worker's reply (of a kind in `expected`)."""
    return _recv(conn, False, expected)


# ---- the dataclass that travels ---------------------------------------------------------------
def prompt_fields(prompt: Prompt) -> dict[str, Any]:
    return {"pid": prompt.pid, "symbol": prompt.symbol, "target": prompt.target, "tokens": list(prompt.tokens)}


def prompt_from(fields: Mapping[str, Any]) -> Prompt:
    """The Prompt of checked fields (`_PROMPT`), through its constructor."""
    _PROMPT.walk(fields, "prompt", CHECK)
    return Prompt(fields["pid"], fields["symbol"], fields["target"], tuple(fields["tokens"]))
