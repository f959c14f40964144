"""Logits -> token distribution, shared by plain sampling and speculative verification.

Both paths call `process_logits` with the same settings, so the distribution speculative decoding
reproduces is exactly the one plain sampling draws from. Order (as HF and vLLM): temperature, then
top-k, then top-p. Temperature 0 means greedy: a one-hot at the argmax (first index on ties).
Randomness comes only from an explicit `torch.Generator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from specpress.errors import RequestError, UsageError


def _check(temperature: float, top_k: int, top_p: float) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise UsageError(f"temperature must be a finite number >= 0 (0 = greedy), found {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise UsageError(f"top_k must be an integer >= 0 (0 = off), found {top_k!r}")
    if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise UsageError(f"top_p must be in (0, 1] (1 = off), found {top_p!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next token is chosen. temperature 0 = greedy; top_k 0 and top_p 1 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        _check(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: Tensor) -> Tensor:
        """logits [..., V] -> probs [..., V] (float32)."""
        return process_logits(logits, self.temperature, self.top_k, self.top_p)


def process_logits(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """logits [..., V] -> probabilities [..., V] (float32, rows sum to 1).

    temperature == 0: one-hot at the argmax. Otherwise softmax(logits / T) restricted to the top_k
    largest logits (ties at the k-th value are kept) and then to the smallest prefix of the sorted
    distribution whose mass reaches top_p (the most likely token is always kept), renormalized.
    """
    _check(temperature, top_k, top_p)
    x = logits.float()
    if temperature == 0:
        return torch.zeros_like(x).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    x = x / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # [..., V]
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """probs [..., V] -> token ids [...] (long), one draw per row."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> Tensor:
    """Plain decoding: logits [..., V] -> token ids [...] (long). Greedy needs no generator."""
    if params.greedy:
        return logits.argmax(-1)
    if generator is None:
        raise RequestError("sampling at temperature > 0 needs an explicit torch.Generator (pass generator=)")
    return sample_from(params.probs(logits), generator)
