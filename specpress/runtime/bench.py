"""`bench`: decode a prompt file and measure it. Without a drafter this is the plain baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from specpress.models.target import TargetModel, load_target
from specpress.models.tokenizer import load_tokenizer
from specpress.runtime.metrics import plain_metrics
from specpress.runtime.plain import check_fits, decode_plain
from specpress.runtime.prompts import Prompt, load_prompts


def load_bench_inputs(target_dir: str | Path, prompts_file: str | Path, dtype: str = "fp32"
                      ) -> tuple[TargetModel, list[Prompt]]:
    target = load_target(target_dir, dtype=dtype)
    tok = load_tokenizer(target_dir) if (Path(target_dir).expanduser() / "tokenizer.json").is_file() else None
    prompts = load_prompts(prompts_file, tok, target.config.vocab_size)
    return target, prompts


def bench_plain(target: TargetModel, prompts: list[Prompt], max_new_tokens: int, *, temperature: float = 0.0,
                top_k: int = 0, top_p: float = 1.0, seed: int = 0, config: dict[str, Any] | None = None,
                on_prompt: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Decode every prompt with the target alone; returns the bench JSON object."""
    for i, p in enumerate(prompts):
        check_fits(target, len(p.ids), max_new_tokens, label=f"prompt {i + 1}")
    gen = torch.Generator().manual_seed(seed)
    outputs, gen_ms, step_ms = [], [], []
    for i, p in enumerate(prompts):
        g = decode_plain(target, p.ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=gen)
        outputs.append(g.tokens)
        gen_ms.append(g.decode_ms)
        step_ms.extend(g.step_ms)
        if on_prompt:
            on_prompt(i)
    cfg = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
           "seed": seed, "prompts": len(prompts), "threads": torch.get_num_threads(), **(config or {})}
    return plain_metrics(outputs, gen_ms, step_ms, cfg)
