"""The live loop's policy: a small causal transformer, its training forward, and a rollout engine
with a KV cache and continuous batching.

Sampling is Gumbel-max with noise that is a hash of (seed, prompt id, sample index, position,
token), not a random generator's state, so a sequence's tokens depend only on the weights and
its identity: the same on any rollout worker, under any split, in any order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dra.rl.live.task import EOS, MAX_ANSWER, PROMPT_TOKENS, VOCAB, Prompt

MAX_LEN = PROMPT_TOKENS + MAX_ANSWER + 2


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 224
    layers: int = 4
    heads: int = 4
    vocab: int = VOCAB
    max_len: int = MAX_LEN


class Block(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc1 = nn.Linear(c.d_model, 4 * c.d_model)
        self.fc2 = nn.Linear(4 * c.d_model, c.d_model)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        return (q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Causal self-attention over whole sequences; also returns k, v (for a prefill)."""
        b, t, d = x.shape
        q, k, v = self._split(x)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)))), k, v

    def decode(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, span: int) -> torch.Tensor:
        """One new token per row: x [c, 1, d]; kc/vc [c, heads, max_len, hd] (this layer's cache
        rows of the active slots, written in place at `pos`); attends to positions <= pos."""
        c, _, d = x.shape
        q, k, v = self._split(x)
        rows = torch.arange(c)
        kc[rows, :, pos] = k[:, :, 0]
        vc[rows, :, pos] = v[:, :, 0]
        keys, vals = kc[:, :, :span], vc[:, :, :span]
        mask = torch.arange(span).unsqueeze(0) <= pos.unsqueeze(1)  # [c, span]
        a = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask[:, None, None, :])
        x = x + self.proj(a.transpose(1, 2).reshape(c, 1, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class PolicyModel(nn.Module):
    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = c = config or ModelConfig()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.max_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_f(x) @ self.tok.weight.T  # tied output embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [b, t, vocab] for right-padded token rows [b, t]."""
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for blk in self.blocks:
            x, _, _ = blk(x)
        return self._logits(x)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- deterministic sampling noise ---------------------------------------------------------------
_M = 2**64


def _s64(v: int) -> int:
    v %= _M
    return v - _M if v >= 2**63 else v


_GOLDEN, _MUL1, _MUL2 = _s64(0x9E3779B97F4A7C15), _s64(0xBF58476D1CE4E5B9), _s64(0x94D049BB133111EB)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic; arithmetic shifts)."""
    z = z + _GOLDEN
    z = (z ^ (z >> 30)) * _MUL1
    z = (z ^ (z >> 27)) * _MUL2
    return z ^ (z >> 31)


def gumbel_noise(seed: int, keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [n, vocab], a pure function of (seed, key, position, token)."""
    base = _mix(_mix(keys.to(torch.int64) * 1_000_003 + positions.to(torch.int64)) + seed)
    z = _mix(base.unsqueeze(1) + torch.arange(vocab, dtype=torch.int64).unsqueeze(0))
    u = ((z >> 11) & ((1 << 53) - 1)).to(torch.float64) / float(1 << 53)
    return -torch.log(-torch.log(u.clamp_min(1e-300).clamp_max(1 - 1e-16))).to(torch.float32)


# ---- rollout engine -----------------------------------------------------------------------------
@dataclass
class Sequence:
    """One generation: prompt, sample index within its group, and what was generated."""

    prompt: Prompt
    sample: int
    version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0

    @property
    def key(self) -> int:
        return self.prompt.pid * 64 + self.sample


class RolloutEngine:
    """Continuous batching on one worker: at most `slots` sequences decode at once, one token per
    active sequence per iteration; a finished sequence frees its slot for the next one. Records
    every iteration's (concurrency, context tokens, seconds) for the stage-balance policy."""

    def __init__(self, model: PolicyModel, slots: int, seed: int) -> None:
        c = model.config
        self.model, self.slots, self.seed = model, slots, seed
        hd = c.d_model // c.heads
        self.k = torch.zeros(c.layers, slots, c.heads, c.max_len, hd)
        self.v = torch.zeros_like(self.k)
        self.active: dict[int, Sequence] = {}
        self.pos = torch.zeros(slots, dtype=torch.int64)  # next position to write per slot
        self.iterations: list[tuple[int, int, float]] = []  # (concurrency, context tokens, seconds)

    def free_slots(self) -> int:
        return self.slots - len(self.active)

    @torch.no_grad()
    def admit(self, seqs: list[Sequence]) -> list[Sequence]:
        """Prefills the prompts of new sequences and samples their first token; returns the ones
        that finished already (a first token <eos>)."""
        if not seqs:
            return []
        free = [s for s in range(self.slots) if s not in self.active][: len(seqs)]
        if len(free) < len(seqs):
            raise ValueError(f"admit: {len(seqs)} sequences but {len(free)} free slots")
        tokens = torch.tensor([list(s.prompt.tokens) for s in seqs])
        x = self.model.tok(tokens) + self.model.pos(torch.arange(tokens.shape[1]))
        idx = torch.tensor(free)
        for layer, blk in enumerate(self.model.blocks):
            x, k, v = blk(x)
            self.k[layer, idx, :, : tokens.shape[1]] = k
            self.v[layer, idx, :, : tokens.shape[1]] = v
        logits = self.model._logits(x[:, -1])
        now = time.perf_counter()
        for slot, s in zip(free, seqs):
            self.active[slot] = s
            s.started = now
            self.pos[slot] = tokens.shape[1]
        return self._sample(free, logits)

    @torch.no_grad()
    def step(self) -> list[Sequence]:
        """One decode iteration of every active sequence; returns those that finished."""
        if not self.active:
            return []
        t0 = time.perf_counter()
        slots = sorted(self.active)
        idx = torch.tensor(slots)
        pos = self.pos[idx]
        last = torch.tensor([self.active[s].tokens[-1] for s in slots])
        x = (self.model.tok(last) + self.model.pos(pos)).unsqueeze(1)
        span = int(pos.max()) + 1
        for layer, blk in enumerate(self.model.blocks):
            kc, vc = self.k[layer, idx], self.v[layer, idx]  # gathered copies of the active rows
            x = blk.decode(x, kc, vc, pos, span)
            self.k[layer, idx, :, :span] = kc[:, :, :span]
            self.v[layer, idx, :, :span] = vc[:, :, :span]
        self.pos[idx] += 1
        logits = self.model._logits(x[:, 0])
        done = self._sample(slots, logits)
        self.iterations.append((len(slots), int(pos.sum()), time.perf_counter() - t0))
        return done

    def _sample(self, slots: list[int], logits: torch.Tensor) -> list[Sequence]:
        seqs = [self.active[s] for s in slots]
        keys = torch.tensor([s.key for s in seqs])
        positions = torch.tensor([len(s.tokens) for s in seqs])
        noise = gumbel_noise(self.seed, keys, positions, logits.shape[-1])
        logp = torch.log_softmax(logits.float(), dim=-1)
        choice = torch.argmax(logp + noise, dim=-1)
        picked = logp.gather(1, choice.unsqueeze(1)).squeeze(1)
        done = []
        now = time.perf_counter()
        for slot, s, tok, lp in zip(slots, seqs, choice.tolist(), picked.tolist()):
            s.tokens.append(int(tok))
            s.logprobs.append(float(lp))
            if tok == EOS or len(s.tokens) > MAX_ANSWER:
                s.finished = now
                del self.active[slot]
                done.append(s)
        return done


def answer_logprobs(model: PolicyModel, prompts: list[tuple[int, ...]], answers: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities [b, L] of each answer token under `model` (teacher forcing) and the mask
    [b, L] of real (non-padding) answer positions."""
    lengths = [len(a) for a in answers]
    width = PROMPT_TOKENS + max(lengths)
    rows = torch.zeros(len(answers), width, dtype=torch.int64)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        rows[i, :PROMPT_TOKENS] = torch.tensor(p)
        rows[i, PROMPT_TOKENS : PROMPT_TOKENS + len(a)] = torch.tensor(a)
    logits = model(rows[:, :-1])[:, PROMPT_TOKENS - 1 :]
    targets = rows[:, PROMPT_TOKENS:]
    logp = torch.log_softmax(logits, dim=-1).gather(2, targets.unsqueeze(2)).squeeze(2)
    mask = torch.arange(targets.shape[1]).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return logp, mask


def init_model(seed: int, config: ModelConfig | None = None) -> PolicyModel:
    torch.manual_seed(seed)
    model = PolicyModel(config)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=0.02 / (math.sqrt(2 * model.config.layers) if name.endswith(("proj.weight", "fc2.weight")) else 1.0))
    return model
