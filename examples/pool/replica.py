"""An inference replica for the device pool: serves a small language-model-shaped network.

Started by ``dra run`` on a lease (its CPU slot's cgroup holds it to the slot's quota). It
connects to the service's frontend (``DRA_SERVICE=host:port``), and for each request runs a
prefill over the prompt (one batched forward over ``ContextTokens / ctx_div`` tokens) and a decode
loop of ``GeneratedTokens`` single-token forwards, then answers with its compute time. It exits 0
when the frontend says stop or goes away (a replica the pool takes back is stopped by its
launcher; the frontend re-queues its request).
"""

from __future__ import annotations

import os
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
    conn.send({"hello": os.environ.get("DRA_LEASE_ID", "?")})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg.get("stop"):
            return 0
        t = time.perf_counter()
        serve_one(model, msg["ctx"], msg["gen"])
        conn.send({"id": msg["id"], "compute_s": time.perf_counter() - t})


if __name__ == "__main__":
    raise SystemExit(main())
