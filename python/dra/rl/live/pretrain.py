"""Supervised warm-up of the live loop's policy: RL post-training starts from a pretrained model.

A few hundred teacher-forced steps on prompts from their own generator (not the RL stream) give
a policy that repeats the right symbol and stops near the target length, often not exactly: RL
then has reward to gain. The result is cached by its settings (``cache_dir``) so every schedule
of a benchmark starts from the same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from dra.rl.live.model import ModelConfig, PolicyModel, answer_logprobs, init_model
from dra.rl.live.task import EOS, PromptStream


def pretrain(
    stream: PromptStream,
    *,
    steps: int = 300,
    batch: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    config: ModelConfig | None = None,
    cache_dir: str | Path | None = None,
    quiet: bool = False,
) -> PolicyModel:
    config = config or ModelConfig()
    key = hashlib.sha256(
        json.dumps([steps, batch, lr, seed, config.__dict__, stream.seed, int(stream.targets.sum()), len(stream.targets)]).encode()
    ).hexdigest()[:16]
    path = Path(cache_dir) / f"rl-live-pretrained-{key}.pt" if cache_dir else None
    model = init_model(seed, config)
    if path is not None and path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model
    rng = np.random.default_rng(seed + 17)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    t0 = time.perf_counter()
    for step in range(steps):
        prompts = stream.random_prompts(rng, batch)
        answers = [[p.symbol] * p.target + [EOS] for p in prompts]
        logp, mask = answer_logprobs(model, [p.tokens for p in prompts], answers)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not quiet and (step % 50 == 0 or step == steps - 1):
            print(f"[dra.rl pretrain] step {step}/{steps} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}-{threading.get_ident()}")  # two warm-ups at once never share one
        torch.save(model.state_dict(), tmp)
        tmp.replace(path)
    return model
