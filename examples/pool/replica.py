"""An inference replica for the device pool: serves a small language-model-shaped network.

Started by ``dra run`` on a lease (its CPU slot's cgroup holds it to the slot's quota). It
connects to the service's frontend on a Unix socket (``DRA_SERVICE=/path/to/socket``) and talks
JSON lines, nothing else (no pickle): the frontend checks, from the socket's peer credentials,
that the replica runs as the service's user, and the replica checks the frontend runs as its own
user or root. For each request it runs a prefill over the prompt (one batched forward over
``ContextTokens / ctx_div`` tokens) and a decode loop of ``GeneratedTokens`` single-token
forwards, then answers with its compute time. It exits 0 when the frontend says stop or goes away,
or on SIGTERM (how its launcher asks it back for the pool): it finishes the request in hand, and
only then exits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time

import torch

VOCAB, DIM, HIDDEN = 256, 128, 512
MAX_LINE = 1 << 16


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(),
                               torch.nn.Linear(HIDDEN, VOCAB)).eval()


@torch.inference_mode()
def serve_one(model: torch.nn.Module, ctx_tokens: int, gen_tokens: int) -> int:
    prompt = torch.randint(0, VOCAB, (max(1, ctx_tokens),))
    logits = model(prompt)
    token = logits[-1].argmax().reshape(1)
    for _ in range(gen_tokens):
        token = model(token)[-1].argmax().reshape(1)
    return int(token)


def peer_uid(sock: socket.socket) -> int:
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]


def main() -> int:
    model = build()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["DRA_SERVICE"])
    if peer_uid(sock) not in (os.geteuid(), 0):
        raise SystemExit(f"the frontend at {os.environ['DRA_SERVICE']} runs as uid {peer_uid(sock)}: not ours")
    reader = sock.makefile("rb")
    busy = [False, False]  # serving a request now; asked to stop

    def stop(signum: int, frame: object) -> None:
        busy[1] = True
        if not busy[0]:
            raise SystemExit(0)  # idle: nothing in hand, go now

    signal.signal(signal.SIGTERM, stop)
    sock.sendall((json.dumps({"hello": os.environ.get("DRA_LEASE_ID", "?")}) + "\n").encode())
    while not busy[1]:
        try:
            line = reader.readline(MAX_LINE)
        except OSError:
            return 0
        if not line:
            return 0
        msg = json.loads(line)
        if msg.get("stop"):
            return 0
        busy[0] = True
        t = time.perf_counter()
        serve_one(model, int(msg["ctx"]), int(msg["gen"]))
        sock.sendall((json.dumps({"id": msg["id"], "compute_s": time.perf_counter() - t}) + "\n").encode())
        busy[0] = False
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
