"""The live RL loop's control channel (dra.rl.live.channel): every message the coordinator and its
workers exchange goes as checked JSON over the authenticated Unix socket, and nothing a peer sends
is unpickled, even by a peer that holds the key."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from multiprocessing.connection import Client, Listener
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dra.rl.live import channel
from dra.rl.live.channel import ChannelError
from dra.rl.live.config import LiveConfig
from dra.rl.live.coordinator import LiveRL
from dra.rl.live.model import ModelConfig, Sequence
from dra.rl.live.processes import WorkerError
from dra.rl.live.task import EOS, PromptStream
from dra.rl.live.worker import SlotWorker

KEY = b"0123456789abcdef"


@pytest.fixture
def pair():
    """(coordinator's end, worker's end) of a real Listener/Client pair on a Unix socket in a
    0700 directory, after the key's handshake, as the coordinator builds it."""
    d = tempfile.mkdtemp(prefix="dra-rl-test-")
    listener = Listener(os.path.join(d, "c.sock"), "AF_UNIX", authkey=KEY)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(listener.accept()), daemon=True)
    t.start()
    worker_end = Client(listener.address, "AF_UNIX", authkey=KEY)
    t.join(10)
    listener.close()
    shutil.rmtree(d, ignore_errors=True)
    yield got[0], worker_end
    got[0].close()
    worker_end.close()


class _RunsCode:
    """A pickle payload whose unpickling runs a shell command (creates a file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


# ---- the messages the loop sends, made as the loop makes them ----------------------------------
def _prompts() -> list[Any]:
    return PromptStream([12.0, 40.0, 90.0], length_scale=1.0, seed=3).prompts(2, 3)


def _seqs(batch: bool) -> list[dict[str, Any]]:
    return [{"prompt": channel.prompt_fields(p), "sample": j, **({"batch": 2} if batch else {})} for p in _prompts() for j in range(2)]


def _trajectories() -> list[dict[str, Any]]:
    """Trajectories as a worker reports them (SlotWorker._trajectory), log-probabilities that JSON
    cannot write included."""
    out = []
    for i, p in enumerate(_prompts()):
        s = Sequence(p, i, 3, tokens=[p.symbol] * (i + 2) + [EOS], logprobs=[-0.25, -1e-300, -math.inf][: i + 1] + [-0.5] * 2,
                     started=1.0, finished=1.5)
        out.append(SlotWorker._trajectory(SimpleNamespace(slot=1), s))  # type: ignore[arg-type]
    return out


def _commands() -> list[dict[str, Any]]:
    c = LiveConfig(model=ModelConfig(d_model=32, layers=1, heads=2), timeout_s=90)
    options = {"policy": "none", "release": "return", "start_size": 2, "capacity_poll_s": 0.0, "handoff": "deferred",
               "fault_timeout_s": 30.0, "store_timeout_s": 90, "events_path": "/tmp/x/events/j.jsonl"}
    shard = {"trajectories": [dict(t, advantage=0.5) for t in _trajectories()], "global_tokens": 7, "step": 3}
    return [
        {"cmd": "init", "model": asdict(c.model), "store_host": "127.0.0.1", "store_port": 29500, "slots": 4, "job": "rl-1-0", "lr": c.lr,
         "clip": c.clip, "max_grad_norm": c.max_grad_norm, "seed": c.seed, "rollout_slots": c.rollout_slots, "timeout_s": c.timeout_s},
        {"cmd": "reset", "weights": "/tmp/x/cache/start.pt", "run": "1-static", "uid": 2,
         "job": {"id": "rl-1-0-1-static", "steps": 5, "global_batch": 8, "options": options}},
        {"cmd": "phase", "role": "rollout", "version": 0, "seqs": _seqs(False), "more": True},  # the barrier loop
        {"cmd": "phase", "role": "rollout", "version": 1, "seqs": _seqs(True), "more": False, "load": "/tmp/x/stage/v1.bin",
         "progress": True},  # the pipeline
        {"cmd": "phase", "role": "rollout", "version": 1, "seqs": [], "more": False, "load": None, "progress": False},
        {"cmd": "phase", "role": "train", "shard": None, "digest": False},
        {"cmd": "phase", "role": "train", "shard": shard, "digest": True},
        {"cmd": "phase", "role": "train", "shard": shard, "digest": False, "publish": "/tmp/x/stage/v2.bin"},
        {"cmd": "phase", "role": "train", "shard": shard, "digest": False, "publish": None},
        {"cmd": "seqs", "seqs": _seqs(True), "more": True},
        {"cmd": "seqs", "seqs": [], "more": False},
        {"cmd": "sync", "source": 2, "version": 4, "digest": True},
        {"cmd": "boundary"}, {"cmd": "register"}, {"cmd": "end"}, {"cmd": "stop"},
    ]


def _replies() -> list[dict[str, Any]]:
    event = {"event": "resize", "epoch": 2, "joined": [3], "left": [], "state_bytes": 0, "seconds": 0.25, "note": None}
    handoff = {"bytes": 10, "skipped_bytes": 20, "deferred_bytes": 30, "deferred_s": 0.5, "wait_s": 0.0}
    train = {"slot": 2, "joined": True, "boundary_s": 0.0, "join_s": 0.1, "event": event, "rank": 1, "world": 2}
    return [
        {"hello": 3, "pid": 4242},
        {"ready": 3, "weights_group_s": 0.02},
        {"reset": 3, "uid": 1, "role": "rollout", "rank": -1},
        {"ended": 3, "role": "rollout"},
        {"ended": 2, "role": "train", "step_index": 5, "cursor": 40, "rank": 0, "world": 2, "resizes": 2, "param_digest": -12.5},
        {"boundary": 2, "released": True, "event": event, "boundary_s": 0.01, "wall_s": 0.02},
        {"boundary": 2, "released": False, "event": None, "boundary_s": 0.0, "wall_s": 0.0},
        {"registered": 1, "admitted": False},
        {"train_done": dict(train, train_s=0.1, compute_s=0.0, sync_s=0.0, tokens=0)},  # the pipeline's fill phase
        {"train_done": dict(train, trained_keys=[128, 129, 64000001], train_s=0.4, compute_s=0.2, sync_s=0.1, optimizer_step_s=0.01,
                            tokens=17, loss=math.nan, samples=3, publish_s=0.003, deferred_s=0.2, deferred_wait_s=0.05,
                            handoff=handoff, param_digest=1.5, optimizer_digest=math.inf)},
        {"gen": 0, "finished": _trajectories(), "want": 2, "progress": [[128, 4], [129, 0]]},
        {"gen": 0, "finished": [], "want": 0, "progress": None},
        {"rollout_done": {"slot": 0, "engine_start_s": 0.3, "leave_s": 0.0, "event": None, "busy_s": 1.25, "load_s": 0.01, "version": 2,
                          "rollout_s": 1.5, "segments": [[3, 12.5, 10, 0.02], [1, 40.0, 2, 0.004]]}},
        {"synced": 1, "sync_s": 0.02, "digest": None},
        {"synced": 1, "sync_s": 0.02, "digest": 3.25},
    ]


def _same(a: Any, b: Any) -> bool:
    """Equal as the receiver must see it: NaN equals NaN, tuples arrive as lists."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(b) is list and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_every_message_of_the_loop_round_trips_through_a_real_listener_and_client(pair) -> None:
    coordinator, worker = pair
    commands, replies = _commands(), _replies()
    assert {m["cmd"] for m in commands} == set(channel.COMMANDS)  # every kind the worker takes
    assert {channel.kind(m) for m in replies} == set(channel.REPLIES)  # every kind the coordinator takes
    for msg in commands:
        channel.send(coordinator, msg)
        got = channel.recv_command(worker)
        assert _same(msg, got), (msg, got)
    for msg in replies:
        channel.send(worker, msg)
        got = channel.recv_reply(coordinator)
        assert _same(msg, got), (msg, got)
    # The same shard to several trainers, encoded once.
    shard = commands[6]
    channel.send_all([coordinator, coordinator], shard)
    assert _same(shard, channel.recv_command(worker, "phase")) and _same(shard, channel.recv_command(worker, "phase"))
    # Log-probabilities arrive exactly, -inf and subnormals included, as Python floats.
    got_logprobs = [t["logprobs"] for t in channel.decode(channel.encode(replies[10]), commands=False)["finished"]]
    assert got_logprobs == [t["logprobs"] for t in _trajectories()] and got_logprobs[2][2] == -math.inf
    assert all(type(x) is float for lp in got_logprobs for x in lp)
    # A prompt comes back as its dataclass, through its constructor.
    channel.send(coordinator, {"cmd": "seqs", "seqs": _seqs(False), "more": False})
    back = channel.prompt_from(channel.recv_command(worker, "seqs")["seqs"][0]["prompt"])
    assert back == _prompts()[0] and type(back.tokens) is tuple
    with pytest.raises(ChannelError, match=r"prompt.target: expected an integer, got a string"):
        channel.prompt_from({"pid": 1, "symbol": 15, "target": "3", "tokens": [1]})


def test_a_pickle_from_a_peer_holding_the_key_runs_nothing_at_the_coordinator(pair, tmp_path) -> None:
    """A worker (or anything that holds the key) sends a pickle whose unpickling creates a file: the
    coordinator's receive refuses it, names the slot and why, and the file is never made."""
    coordinator, worker = pair
    marker = tmp_path / "pwned-coordinator"
    live = LiveRL.__new__(LiveRL)  # only what _recv uses: the connections, the timeout, the workers (none)
    live.conns, live.config, live.procs, live.out = {3: coordinator}, SimpleNamespace(timeout_s=10.0), [], tmp_path
    worker.send(_RunsCode(marker))
    with pytest.raises(WorkerError, match=r"slot 3: message: not (UTF-8 )?JSON"):
        live._recv(3)
    assert not marker.exists(), "the coordinator unpickled what a worker sent"


@pytest.mark.timeout(180)
def test_a_pickle_from_a_coordinator_holding_the_key_runs_nothing_at_the_worker(tmp_path) -> None:
    """A real worker process (python -m dra.rl.live.worker) connects with the key it was given and
    is sent a pickle whose unpickling creates a file: it refuses it, fails with a message saying
    why, and the file is never made."""
    marker = tmp_path / "pwned-worker"
    d = tempfile.mkdtemp(prefix="dra-rl-test-")
    listener = Listener(os.path.join(d, "c.sock"), "AF_UNIX", authkey=KEY)
    got: list[Any] = []
    threading.Thread(target=lambda: got.append(listener.accept()), daemon=True).start()
    env = dict(os.environ, DRA_RL_COORD=listener.address, DRA_RL_SLOT="0", DRA_RL_AUTH=KEY.hex(), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "dra.rl.live.worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not got and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got, f"the worker did not connect (exit {proc.poll()})"
        conn = got[0]
        assert conn.poll(60)
        conn.recv_bytes()  # its hello, whatever it is
        conn.send(_RunsCode(marker))
        out, _ = proc.communicate(timeout=60)
        conn.close()
    finally:
        listener.close()
        shutil.rmtree(d, ignore_errors=True)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert not marker.exists(), "the worker unpickled what the coordinator's socket sent"
    assert proc.returncode != 0
    assert b"ChannelError: message: not" in out and b"JSON" in out, out.decode(errors="replace")[-2000:]


@pytest.mark.parametrize(("data", "commands", "why"), [
    (b"{not json", True, r"message: not JSON \(Expecting property name"),
    (b"\xff\xfe{}", False, r"message: not UTF-8 JSON"),
    (b"[1, 2]", True, r"message: expected a JSON object, got a list"),
    (b'{"cmd": "exec", "code": "import os"}', True, r"message.cmd: expected one of \['boundary', .*\], got 'exec'"),
    (b'{"cmd": 7}', True, r"message.cmd: expected one of .*, got 7"),
    (b'{"pid": 1}', False, r"expected a field 'cmd' .* or exactly one reply tag .*, got fields \['pid'\]"),
    (b'{"hello": 1, "ready": 1, "pid": 2, "weights_group_s": 0}', False, r"exactly one reply tag"),
    (b'{"cmd": "sync", "source": "0", "version": 1, "digest": false}', True, r"command 'sync'.source: expected an integer, got a string"),
    (b'{"cmd": "sync", "source": 0, "version": 1.0, "digest": false}', True, r"command 'sync'.version: expected an integer, got a number"),
    (b'{"cmd": "sync", "source": true, "version": 1, "digest": false}', True, r"command 'sync'.source: expected an integer, got a boolean"),
    (b'{"cmd": "sync", "source": 0, "version": 1}', True, r"command 'sync': field 'digest' missing"),
    (b'{"cmd": "stop", "then": "rm -rf /"}', True, r"command 'stop': unknown field 'then'"),
    (b'{"cmd": "phase", "role": "attack"}', True, r"command 'phase'.role: expected one of \['rollout', 'train'\], got 'attack'"),
    (b'{"cmd": "phase", "role": "rollout", "version": 0, "more": false, "seqs": [{"prompt": {"pid": 1, "symbol": 15, "target": 3, '
     b'"tokens": [1, "x"]}, "sample": 0}]}', True, r"command 'phase'.seqs\[0\].prompt.tokens\[1\]: expected an integer, got a string"),
    (b'{"synced": 1, "sync_s": NaN, "digest": Infinity}', False, None),  # NaN and infinities are numbers
    (b'{"synced": NaN, "sync_s": 0, "digest": null}', False, r"reply 'synced'.synced: expected an integer, got a number"),
    (b'{"gen": 0, "want": 1, "progress": [[1, 2, 3]], "finished": []}', False,
     r"reply 'gen'.progress\[0\]: expected a list of 2 items, got a list of 3"),
    (b'{"cmd": "stop"}', False, r"message: expected a reply, got a command \('stop'\)"),
    (b'{"hello": 0, "pid": 1}', True, r"message: expected a command, got a reply \('hello'\)"),
    (b'[' * 100000 + b']' * 100000, True, r"message: not accepted JSON \(RecursionError"),
    (b'{"hello": ' + b"9" * 5000 + b', "pid": 1}', False, r"message: not accepted JSON \(ValueError"),
])
def test_malformed_messages_are_refused_naming_the_problem(pair, data, commands, why) -> None:
    coordinator, worker = pair
    sender, receiver = (coordinator, worker) if commands else (worker, coordinator)
    sender.send_bytes(data)
    recv = channel.recv_command if commands else channel.recv_reply
    if why is None:
        got = recv(receiver)
        assert math.isnan(got["sync_s"]) and got["digest"] == math.inf
        return
    with pytest.raises(ChannelError, match=why):
        recv(receiver)


def _gen_with_logprobs(wire: Any) -> bytes:
    t = dict(_trajectories()[0])
    t["logprobs"] = wire
    return json.dumps({"gen": 0, "finished": [t], "want": 0, "progress": None}).encode()


@pytest.mark.parametrize(("wire", "why"), [
    ([-0.5, -0.25], r"finished\[0\].logprobs: expected an array \{dtype, shape, b64\}, got a list"),
    ({"dtype": "|O", "shape": [1], "b64": "AAAAAAAAAAA="}, r"finished\[0\].logprobs.dtype: expected '<f8', got '\|O'"),
    ({"dtype": "<i8", "shape": [1], "b64": "AAAAAAAAAAA="}, r"logprobs.dtype: expected '<f8', got '<i8'"),
    ({"dtype": "<f8", "shape": [2], "b64": "AAAAAAAAAAA="}, r"logprobs: 8 bytes for shape \[2\] of <f8 \(16 expected\)"),
    ({"dtype": "<f8", "shape": [1, 1], "b64": "AAAAAAAAAAA="}, r"logprobs.shape: expected \[length\]"),
    ({"dtype": "<f8", "shape": [1], "b64": "not base64!"}, r"logprobs.b64: not base64"),
    ({"dtype": "<f8", "shape": [1], "b64": "AAAAAAAAAAA=", "module": "os"}, r"logprobs: expected an array .* with fields"),
])
def test_bad_arrays_are_refused_naming_the_field(pair, wire, why) -> None:
    coordinator, worker = pair
    worker.send_bytes(_gen_with_logprobs(wire))
    with pytest.raises(ChannelError, match=why):
        channel.recv_reply(coordinator, "gen")


def test_an_unexpected_kind_and_what_cannot_travel_are_named(pair) -> None:
    coordinator, worker = pair
    channel.send(coordinator, {"cmd": "stop"})
    with pytest.raises(ChannelError, match=r"message: expected 'seqs', got command 'stop'"):
        channel.recv_command(worker, "seqs")
    # The sender checks too: a bug is named where it is made, and nothing is sent.
    with pytest.raises(ChannelError, match=r"reply 'synced'.sync_s: expected a number, got float64"):
        channel.send(worker, {"synced": 0, "sync_s": np.float64(0.5), "digest": None})
    with pytest.raises(ChannelError, match=r"a builtins.set cannot travel"):
        channel.send(worker, {"boundary": 1, "released": True, "event": {"joined": {1, 2}}, "boundary_s": 0.0, "wall_s": 0.0})
    assert not coordinator.poll(0.1)


def test_oversized_messages_are_refused_before_they_are_read(pair, monkeypatch) -> None:
    coordinator, worker = pair
    # A length prefix past the limit (the connection's own framing, nothing after it): refused
    # unread, nothing allocated for it, no wait for a body that never comes.
    os.write(worker.fileno(), struct.pack("!i", channel.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(ChannelError, match=r"message: longer than the channel's limit of 268435456 bytes; refused unread"):
        channel.recv_reply(coordinator)
    # Under a smaller limit, a real message past it (the other way: the refused connection reads
    # no more): the sender refuses to send it, and a receiver refuses it when sent anyway.
    big = {"cmd": "seqs", "seqs": _seqs(True) * 20, "more": False}
    data = channel.encode(big)
    monkeypatch.setattr(channel, "MAX_MESSAGE_BYTES", len(data) - 1)
    with pytest.raises(ChannelError, match=rf"message: {len(data)} bytes, more than the channel's limit of {len(data) - 1} bytes"):
        channel.send(coordinator, big)
    assert not worker.poll(0.1)
    coordinator.send_bytes(data)
    with pytest.raises(ChannelError, match=rf"message: longer than the channel's limit of {len(data) - 1} bytes; refused unread"):
        channel.recv_command(worker)
