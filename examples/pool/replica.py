"""An inference replica for the device pool: serves a small language-model-shaped network.

Started by ``dra run`` on a lease (its CPU slot's cgroup holds it to the slot's quota). It
connects to the service's frontend (``DRA_SERVICE=host:port``), and for each request runs a
prefill over the prompt (one batched forward over ``ContextTokens / ctx_div`` tokens) and a decode
loop of ``GeneratedTokens`` single-token forwards, then answers with its compute time. It exits 0
when the frontend says stop or goes away, or on SIGTERM (how its launcher asks it back for the
pool): it finishes the request in hand, and only then exits.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Client

import torch

VOCAB, DIM, HIDDEN = 256, 128, 512


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


def main() -> int:
    host, port = os.environ["DRA_SERVICE"].rsplit(":", 1)
    model = build()
    conn = Client((host, int(port)), authkey=os.environ.get("DRA_SERVICE_KEY", "dra").encode())
    busy = [False, False]  # serving a request now; asked to stop

    def stop(signum: int, frame: object) -> None:
        busy[1] = True
        if not busy[0]:
            raise SystemExit(0)  # idle: nothing in hand, go now

    signal.signal(signal.SIGTERM, stop)
    conn.send({"hello": os.environ.get("DRA_LEASE_ID", "?")})
    while not busy[1]:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg.get("stop"):
            return 0
        busy[0] = True
        t = time.perf_counter()
        serve_one(model, msg["ctx"], msg["gen"])
        conn.send({"id": msg["id"], "compute_s": time.perf_counter() - t})
        busy[0] = False
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
