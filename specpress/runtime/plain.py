"""Plain autoregressive decoding with the target alone: the baseline every speculative run is judged by."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from specpress.errors import UsageError
from specpress.models.target import TargetModel


@dataclass
class Generation:
    tokens: list[int]  # generated ids (EOS included when hit)
    prefill_ms: float = 0.0
    step_ms: list[float] = field(default_factory=list)  # one target forward per generated token after the first

    @property
    def decode_ms(self) -> float:
        return self.prefill_ms + sum(self.step_ms)


def check_fits(target: TargetModel, prompt_len: int, max_new_tokens: int, label: str = "prompt",
               slack: int = 0) -> int:
    """Cache capacity needed; a clear error when the prompt plus budget exceeds the context.

    slack: positions the decoder needs beyond the user's --max-new-tokens (a draft tree's), reported apart.
    """
    need = prompt_len + max_new_tokens + slack + 1
    ctx = target.config.max_context
    if prompt_len >= ctx or need > ctx:
        extra = f" (+{slack} for the drafts)" if slack else ""
        raise UsageError(f"{label} has {prompt_len} tokens; with --max-new-tokens {max_new_tokens}{extra} it needs "
                         f"{need} positions but the model's context is {ctx}; shorten it or lower --max-new-tokens")
    return need


def next_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
               generator: torch.Generator | None) -> int:
    """logits [V] -> token id: argmax at temperature 0, else a sample from the processed distribution."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    from specpress.runtime.sampling import process_logits

    probs = process_logits(logits.float(), temperature, top_k, top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.inference_mode()
def decode_plain(target: TargetModel, prompt: Sequence[int], max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
                 eos_ids: Sequence[int] | None = None) -> Generation:
    """Greedy (temperature 0) or sampled decoding; stops after EOS or `max_new_tokens` tokens."""
    eos = set(target.config.eos_ids if eos_ids is None else eos_ids)
    cache = target.new_cache(check_fits(target, len(prompt), max_new_tokens))
    dev = target.lm_head.weight.device
    t0 = time.perf_counter()
    out = target(torch.tensor([list(prompt)], device=dev), cache=cache, logits="last")
    tok = next_token(out.logits[0, -1], temperature, top_k, top_p, generator)
    gen = Generation([tok], prefill_ms=(time.perf_counter() - t0) * 1e3)
    while len(gen.tokens) < max_new_tokens and tok not in eos:
        t0 = time.perf_counter()
        out = target(torch.tensor([[tok]], device=dev), cache=cache, logits="last")
        tok = next_token(out.logits[0, -1], temperature, top_k, top_p, generator)
        gen.step_ms.append((time.perf_counter() - t0) * 1e3)
        gen.tokens.append(tok)
    return gen
