"""Plain autoregressive decoding with the target alone: the baseline every speculative run is judged by."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
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


def check_decode(target_dir: Path | str, prompt_tokens: int, max_new_tokens: int, dtype: str = "fp32",
                 label: str = "prompt") -> None:
    """Before the target is loaded: the longest prompt (`prompt_tokens`) plus --max-new-tokens within the
    target's context, and the KV cache decoding allocates for them within the memory free now (the
    target's alone: a lower bound, so a refusal is certain to be right)."""
    from types import SimpleNamespace

    from specpress import machine
    from specpress.models.io import read_config
    from specpress.models.target import TargetConfig

    cfg = TargetConfig.from_hf(read_config(target_dir), source=str(Path(target_dir) / "config.json"))
    capacity = check_fits(SimpleNamespace(config=cfg), prompt_tokens, max_new_tokens, label)
    need, free = machine.kv_bytes(cfg, capacity, machine.DTYPE_BYTES.get(dtype, 4)), machine.available_bytes()
    if free is not None and need > free:
        raise RequestError(f"--max-new-tokens {max_new_tokens} after {label} ({prompt_tokens} tokens) needs a KV "
                           f"cache of {capacity:,} positions: {machine.fmt_bytes(need)} for this target "
                           f"({cfg.num_hidden_layers} layers x {cfg.num_key_value_heads} KV heads x {cfg.head_dim} "
                           f"x {dtype}); {machine.fmt_bytes(free)} is available: lower --max-new-tokens")


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
