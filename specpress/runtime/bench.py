"""`bench`: decode a prompt file and measure it. Without a drafter this is the plain baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from specpress.models.target import TargetModel, load_target
from specpress.models.tokenizer import load_tokenizer
from specpress.runtime.backends.base import AnyDrafter, TargetRunner
from specpress.runtime.coverage import eval_coverage
from specpress.runtime.metrics import compare_metrics, plain_metrics, spec_metrics
from specpress.runtime.plain import check_decode, check_fits, decode_plain
from specpress.runtime.prompts import Prompt, load_prompts
from specpress.runtime.sampling import SamplingParams


def load_bench_inputs(target_dir: str | Path, prompts_file: str | Path, dtype: str = "fp32",
                      max_new_tokens: int | None = None) -> tuple[TargetModel, list[Prompt]]:
    """The target and the prompts, read in that order of cost: the prompts first (checked against the
    target's config), then, with `max_new_tokens`, the decoding's context and KV memory checked
    (plain.check_decode), then the target's weights."""
    from specpress.models.io import read_config
    from specpress.models.target import TargetConfig

    cfg = TargetConfig.from_hf(read_config(target_dir), source=str(Path(target_dir) / "config.json"))
    tok = load_tokenizer(target_dir) if (Path(target_dir).expanduser() / "tokenizer.json").is_file() else None
    prompts = load_prompts(prompts_file, tok, cfg.vocab_size, cfg.max_context)
    if max_new_tokens is not None:
        i = max(range(len(prompts)), key=lambda j: len(prompts[j].ids))
        check_decode(target_dir, len(prompts[i].ids), max_new_tokens, dtype, label=f"prompt {i + 1}")
    return load_target(target_dir, dtype=dtype), prompts


def default_policy(family: str) -> str:
    from specpress.models.drafter import get_family

    return get_family(family).default_policy


def bench_plain(target: TargetRunner, prompts: list[Prompt], max_new_tokens: int, *,
                params: SamplingParams = SamplingParams(), seed: int = 0, config: dict[str, Any] | None = None,
                warmup_prompts: int = 0, on_prompt: Callable[[int], None] | None = None,
                keep_plain: bool = False) -> dict[str, Any]:
    """Decode every prompt with the target alone; returns the bench JSON object. `warmup_prompts` are
    decoded in full before timing (a compiled target meets its shapes untimed). keep_plain: the outputs
    again as "plain_outputs" (what bench_speculative adds with it)."""
    for i, p in enumerate(prompts):
        check_fits(target, len(p.ids), max_new_tokens, label=f"prompt {i + 1}")
    gen = torch.Generator().manual_seed(seed)
    for p in prompts[:warmup_prompts]:
        decode_plain(target, p.ids, max_new_tokens, params, gen)
    gen.manual_seed(seed)
    outputs, gen_ms, step_ms = [], [], []
    for i, p in enumerate(prompts):
        g = decode_plain(target, p.ids, max_new_tokens, params, gen)
        outputs.append(g.tokens)
        gen_ms.append(g.decode_ms)
        step_ms.extend(g.step_ms)
        if on_prompt:
            on_prompt(i)
    cfg = {"max_new_tokens": max_new_tokens, **sampling_config(params), "seed": seed, "prompts": len(prompts),
           "threads": torch.get_num_threads(), "warmup_prompts": warmup_prompts, **(config or {})}
    result = plain_metrics(outputs, gen_ms, step_ms, cfg)
    if keep_plain:
        result["plain_outputs"] = outputs
    return result


def sampling_config(params: SamplingParams) -> dict[str, Any]:
    return {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p}


def bench_speculative(target: TargetRunner, drafter: AnyDrafter, prompts: list[Prompt], max_new_tokens: int,
                      policy: Any, *, params: SamplingParams = SamplingParams(), seed: int = 0, drafter_bytes: int = 0,
                      config: dict[str, Any] | None = None, warmup_prompts: int = 0, plain_warmup_prompts: int = 0,
                      compare: AnyDrafter | None = None, compare_bytes: int = 0,
                      compare_label: dict[str, Any] | None = None,
                      on_prompt: Callable[[int], None] | None = None, keep_plain: bool = False) -> dict[str, Any]:
    """Speculative decoding of every prompt, with plain decoding of the same prompt interleaved
    (alternating which goes first) as the same-process baseline; at temperature 0 each output is
    checked against plain greedy decoding. `target`, `drafter` (and `compare`): runners (runtime/backends/base.py).

    Before timing, the first prompt is decoded for 8 tokens both ways; `warmup_prompts` more are decoded
    speculatively in full (a compiled drafter meets every shape it will see, so no compilation is timed)
    and `plain_warmup_prompts` plainly (for a compiled target). With `compare`, a second drafter decodes
    every prompt too, in the same interleave (plain, drafter, compare; reversed on odd prompts), and the
    JSON gains "compare": its metrics against the same plain runs, labelled by `compare_label`, and the
    two drafters' forward and round times (medians over prompts) with their ratio compare / drafter, and
    "paired": the mean per-prompt τ(compare) - τ(drafter) with its 95 % bootstrap CI (specpress/stats.py).
    keep_plain: the plain decodings' outputs as "plain_outputs" (the compressed-target comparison reads them).
    "eval_coverage" (and compare's): the share of the emitted tokens in a reduced draft vocabulary
    (runtime/coverage.py), None when the drafter drafts the target's whole vocabulary.
    """
    from specpress.runtime.drafting import check_policy
    from specpress.runtime.loop import speculative_generate, target_capacity

    drafters = [drafter] if compare is None else [drafter, compare]
    for d in drafters:
        check_policy(d.family, policy)
    for i, p in enumerate(prompts):
        target_capacity(target, len(p.ids), max_new_tokens, policy, label=f"prompt {i + 1}")
    spec_gens = [torch.Generator().manual_seed(seed) for _ in drafters]
    plain_gen = torch.Generator().manual_seed(seed + 1)
    warm = prompts[0].ids
    for d, g in zip(drafters, spec_gens):
        speculative_generate(target, d, warm, min(8, max_new_tokens), policy, params, g)
        for p in prompts[:warmup_prompts]:
            speculative_generate(target, d, p.ids, max_new_tokens, policy, params, g)
    decode_plain(target, warm, min(8, max_new_tokens), params, plain_gen)
    for p in prompts[:plain_warmup_prompts]:
        decode_plain(target, p.ids, max_new_tokens, params, plain_gen)
    for g in spec_gens:
        g.manual_seed(seed)
    plain_gen.manual_seed(seed + 1)
    specs: list[list[Any]] = [[] for _ in drafters]
    plain: list[Any] = []
    for i, p in enumerate(prompts):
        runs = [lambda: plain.append(decode_plain(target, p.ids, max_new_tokens, params, plain_gen))]
        runs += [lambda d=d, g=g, out=out: out.append(speculative_generate(target, d, p.ids, max_new_tokens, policy,
                                                                            params, g))
                 for d, g, out in zip(drafters, spec_gens, specs)]
        for fn in (runs if i % 2 == 0 else runs[::-1]):
            fn()
        if on_prompt:
            on_prompt(i)
    cfg = {"max_new_tokens": max_new_tokens, **sampling_config(params), "seed": seed, "prompts": len(prompts),
           "policy": str(policy), "threads": torch.get_num_threads(), "warmup_prompts": warmup_prompts,
           **(config or {})}
    result = spec_metrics(specs[0], plain, cfg, drafter_bytes, greedy=params.greedy)
    result["eval_coverage"] = eval_coverage(result["outputs"], getattr(drafters[0], "token_map", None))
    if keep_plain:
        result["plain_outputs"] = [g.tokens for g in plain]
    if compare is not None:
        from specpress.stats import paired_comparison

        result["compare"] = {**(compare_label or {}),
                             **compare_metrics(specs[0], specs[1], plain, compare_bytes, greedy=params.greedy),
                             "eval_coverage": eval_coverage([s.tokens for s in specs[1]],
                                                            getattr(drafters[1], "token_map", None)),
                             "paired": paired_comparison(_prompt_taus(specs[1]), _prompt_taus(specs[0]), seed=seed)}
    return result


def _prompt_taus(gens: list[Any]) -> list[float | None]:
    """τ of each prompt's speculative run (None for a prompt that needed no round)."""
    return [1 + sum(r.accepted for r in g.rounds) / len(g.rounds) if g.rounds else None for g in gens]
