"""`bench`: decode a prompt file and measure it. Without a drafter this is the plain baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from specpress.models.target import TargetModel, load_target
from specpress.models.tokenizer import load_tokenizer
from specpress.runtime.metrics import plain_metrics, spec_metrics
from specpress.runtime.plain import check_fits, decode_plain
from specpress.runtime.prompts import Prompt, load_prompts


def load_bench_inputs(target_dir: str | Path, prompts_file: str | Path, dtype: str = "fp32"
                      ) -> tuple[TargetModel, list[Prompt]]:
    target = load_target(target_dir, dtype=dtype)
    tok = load_tokenizer(target_dir) if (Path(target_dir).expanduser() / "tokenizer.json").is_file() else None
    prompts = load_prompts(prompts_file, tok, target.config.vocab_size)
    return target, prompts


def load_drafter_for(target: TargetModel, drafter_dir: str | Path, *, strict: bool = False,
                     warn: Callable[[str], None] = print) -> Any:
    """Load a drafter against `target`; a drafter built for another target warns, or fails with strict."""
    from specpress.errors import UsageError
    from specpress.models.drafter_io import load_drafter

    drafter = load_drafter(drafter_dir, target)
    if drafter.fingerprint_mismatch:
        msg = (f"drafter {drafter_dir} was built for a different target (differs in "
               f"{', '.join(drafter.fingerprint_mismatch)}); acceptance will suffer")
        if strict:
            raise UsageError(msg + "; drop --strict to run it anyway")
        warn("warning: " + msg)
    return drafter


def default_policy(family: str) -> str:
    from specpress.models.drafter import get_family

    return get_family(family).default_policy


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


def bench_speculative(target: TargetModel, drafter: Any, prompts: list[Prompt], max_new_tokens: int, policy: Any,
                      *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                      drafter_bytes: int = 0, config: dict[str, Any] | None = None, warmup_prompts: int = 0,
                      on_prompt: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Speculative decoding of every prompt, with plain decoding of the same prompt interleaved
    (alternating which goes first) as the same-process baseline; at temperature 0 each output is
    checked against plain greedy decoding.

    Before timing, the first prompt is decoded for 8 tokens both ways; `warmup_prompts` more are decoded
    speculatively in full (a compiled drafter meets every shape it will see, so no compilation is timed).
    """
    from specpress.runtime.backends.torch import as_drafter_runner
    from specpress.runtime.drafting import check_policy, draft_slots
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.sampling import SamplingParams

    drafter = as_drafter_runner(drafter)
    check_policy(drafter.family, policy)
    for i, p in enumerate(prompts):
        check_fits(target, len(p.ids), max_new_tokens, label=f"prompt {i + 1}", slack=draft_slots(policy) + 2)
    params = SamplingParams(temperature, top_k, top_p)
    spec_gen = torch.Generator().manual_seed(seed)
    plain_gen = torch.Generator().manual_seed(seed + 1)
    warm = prompts[0].ids
    speculative_generate(target, drafter, warm, min(8, max_new_tokens), policy, params, spec_gen)
    for p in prompts[:warmup_prompts]:
        speculative_generate(target, drafter, p.ids, max_new_tokens, policy, params, spec_gen)
    decode_plain(target, warm, min(8, max_new_tokens), temperature=temperature, top_k=top_k, top_p=top_p,
                 generator=plain_gen)
    spec_gen.manual_seed(seed)
    plain_gen.manual_seed(seed + 1)
    spec, plain = [], []
    for i, p in enumerate(prompts):
        def run_spec():
            spec.append(speculative_generate(target, drafter, p.ids, max_new_tokens, policy, params, spec_gen))

        def run_plain():
            plain.append(decode_plain(target, p.ids, max_new_tokens, temperature=temperature, top_k=top_k,
                                      top_p=top_p, generator=plain_gen))

        for fn in ((run_plain, run_spec) if i % 2 == 0 else (run_spec, run_plain)):
            fn()
        if on_prompt:
            on_prompt(i)
    cfg = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
           "seed": seed, "prompts": len(prompts), "policy": str(policy), "threads": torch.get_num_threads(),
           "warmup_prompts": warmup_prompts, **(config or {})}
    return spec_metrics(spec, plain, cfg, drafter_bytes, greedy=temperature == 0)
