"""The verifiable task of the live RL loop: repeat a symbol as many times as the prompt says.

A prompt is ``<bos> s d d d <sep>``: a symbol ``s`` (one of 8) and a target length ``k`` written
as three digits. The correct answer is ``s`` repeated ``k`` times, then ``<eos>``. The answer's
length is therefore set by the prompt, and ``k`` is drawn from a heavy-tailed distribution: the
``GeneratedTokens`` column of the Azure LLM inference trace (conversation service), scaled by
``length_scale`` (default 1/8: median 16, p99 75, max 125 tokens). How long a generation
really runs is up to the model (it stops when it emits ``<eos>``, or at the limit), so the tail
the rollout sees comes from the task through the policy, never from a sleep.

Reward (verifiable, in [0, 1]): 1 for the exact answer; otherwise
0.5 * (fraction of generated tokens equal to s) * exp(-|len - k| / (2 + k / 8)), so a policy that
repeats the right symbol and stops near k earns part of it and learning has a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PAD, BOS, SEP, EOS = 0, 1, 2, 3
DIGIT0 = 4  # tokens 4..13 are the digits 0..9
SYMBOL0 = 14  # tokens 14..21 are the symbols a..h
SYMBOLS = 8
VOCAB = SYMBOL0 + SYMBOLS
PROMPT_TOKENS = 6
MAX_ANSWER = 128  # the longest target; generation stops at MAX_ANSWER + 1 tokens


@dataclass(frozen=True)
class Prompt:
    """One prompt of the stream: its id, symbol token, target length and tokens."""

    pid: int
    symbol: int
    target: int
    tokens: tuple[int, ...]


def encode(symbol: int, target: int) -> tuple[int, ...]:
    if not 0 <= symbol < SYMBOLS:
        raise ValueError(f"symbol: must lie in [0, {SYMBOLS}), got {symbol}")
    if not 1 <= target <= MAX_ANSWER:
        raise ValueError(f"target: must lie in [1, {MAX_ANSWER}], got {target}")
    digits = f"{target:03d}"
    return (BOS, SYMBOL0 + symbol, *(DIGIT0 + int(c) for c in digits), SEP)


def reward(prompt: Prompt, answer: list[int] | tuple[int, ...]) -> tuple[float, bool]:
    """(reward, exact) of a generated answer (its tokens, ``<eos>`` included when emitted)."""
    body = list(answer)
    stopped = bool(body) and body[-1] == EOS
    if stopped:
        body = body[:-1]
    exact = stopped and len(body) == prompt.target and all(t == prompt.symbol for t in body)
    if exact:
        return 1.0, True
    if not body:
        return 0.0, False
    match = sum(1 for t in body if t == prompt.symbol) / len(body)
    closeness = math.exp(-abs(len(body) - prompt.target) / (2.0 + prompt.target / 8.0))
    return 0.5 * match * closeness * (1.0 if stopped else 0.5), False


class PromptStream:
    """Deterministic prompts: step s's prompts are the same for every schedule and every run with
    the same seed, so static and dynamic runs train on the same data."""

    def __init__(self, lengths: list[float], *, length_scale: float = 0.125, seed: int = 0) -> None:
        if not lengths:
            raise ValueError("lengths: the target-length distribution is empty")
        if not length_scale > 0:
            raise ValueError(f"length_scale: must be > 0, got {length_scale}")
        self.targets = np.clip(np.rint(np.asarray(lengths, dtype=np.float64) * length_scale), 1, MAX_ANSWER).astype(np.int64)
        self.seed = seed

    def prompts(self, step: int, count: int, scale: float = 1.0) -> list[Prompt]:
        """Step `step`'s prompts; `scale` stretches the target lengths (a length curriculum)."""
        rng = np.random.default_rng([self.seed, step])
        picks = rng.integers(0, len(self.targets), size=count)
        symbols = rng.integers(0, SYMBOLS, size=count)
        out = []
        for i in range(count):
            k = int(min(MAX_ANSWER, max(1, round(float(self.targets[picks[i]]) * scale))))
            s = int(symbols[i])
            out.append(Prompt(step * 1_000_000 + i, SYMBOL0 + s, k, encode(s, k)))
        return out

    def random_prompts(self, rng: np.random.Generator, count: int) -> list[Prompt]:
        """Prompts for supervised warm-up, from their own generator (not the RL stream)."""
        picks = rng.integers(0, len(self.targets), size=count)
        symbols = rng.integers(0, SYMBOLS, size=count)
        return [Prompt(-1, SYMBOL0 + int(s), int(self.targets[p]), encode(int(s), int(self.targets[p]))) for p, s in zip(picks, symbols)]
