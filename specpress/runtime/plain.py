"""Plain autoregressive decoding with the target alone: the baseline every speculative run is judged by."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from specpress.errors import RequestError
from specpress.runtime.backends.base import TargetRunner
from specpress.runtime.sampling import SamplingParams, sample


@dataclass
class Generation:
    tokens: list[int]  # generated ids (EOS included when hit)
    prefill_ms: float = 0.0
    step_ms: list[float] = field(default_factory=list)  # one target forward per generated token after the first

    @property
    def decode_ms(self) -> float:
        return self.prefill_ms + sum(self.step_ms)


def check_fits(target: TargetRunner, prompt_len: int, max_new_tokens: int, label: str = "prompt",
               slack: int = 0) -> int:
    """Cache capacity needed; a clear error when the prompt plus budget exceeds the context.

    slack: positions the decoder needs beyond the user's --max-new-tokens (a draft tree's), reported apart.
    """
    need = prompt_len + max_new_tokens + slack + 1
    ctx = target.config.max_context
    if prompt_len >= ctx or need > ctx:
        extra = f" (+{slack} for the drafts)" if slack else ""
        raise RequestError(f"{label} has {prompt_len} tokens; with --max-new-tokens {max_new_tokens}{extra} it needs "
                           f"{need} positions but the model's context is {ctx}; shorten it or lower --max-new-tokens")
    return need


@torch.inference_mode()
def decode_plain(target: TargetRunner, prompt: Sequence[int], max_new_tokens: int,
                 params: SamplingParams = SamplingParams(), generator: torch.Generator | None = None,
                 eos_ids: Sequence[int] | None = None) -> Generation:
    """Greedy (temperature 0) or sampled decoding; stops after EOS or `max_new_tokens` tokens.
    Each token is `sampling.sample` of the last logits, as the speculative loop picks its first token."""
    eos = set(target.config.eos_ids if eos_ids is None else eos_ids)
    cache = target.new_cache(check_fits(target, len(prompt), max_new_tokens))
    dev = target.device
    t0 = time.perf_counter()
    out = target.forward(torch.tensor([list(prompt)], device=dev), cache=cache, logits="last")
    tok = int(sample(out.logits[0, -1], params, generator))
    gen = Generation([tok], prefill_ms=(time.perf_counter() - t0) * 1e3)
    while len(gen.tokens) < max_new_tokens and tok not in eos:
        t0 = time.perf_counter()
        out = target.forward(torch.tensor([[tok]], device=dev), cache=cache, logits="last")
        tok = int(sample(out.logits[0, -1], params, generator))
        gen.step_ms.append((time.perf_counter() - t0) * 1e3)
        gen.tokens.append(tok)
    return gen
