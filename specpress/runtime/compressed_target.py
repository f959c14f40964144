"""Decoding against a compressed target: what it changed against the float target. The compressed copy itself
is compress/quantize/target.py's `compressed_copy`.

    drift = greedy_agreement(float_outputs, compressed_outputs)
    comparison = float_comparison(compressed_result, float_result, seed)

The lossless reference of a speculative run on a compressed target is that target's own plain decoding
(bench and the sweep check it as for any target). What compression changed is reported against the float
target, on the same prompts:

  τ change      the same drafter on the float target: paired Δτ = mean over prompts of τ(compressed) -
                τ(float), its 95 % bootstrap CI (specpress/stats.py), and retention = τ(compressed) / τ(float)
                (pooled τ).
  greedy drift  the two targets' greedy continuations of each prompt, compared token by token from the
                start (`greedy_agreement`):
                  prefix agreement  mean over prompts of L / max(len(float), len(compressed)), where L is
                                    the number of leading tokens both continuations share (1.0 iff identical;
                                    after the first divergence the continuations no longer align, so later
                                    positions are not compared)
                  exact match       the share of prompts whose two continuations are identical
                  first divergence  L for each prompt that diverges (None where identical)
                Continuations stop at EOS or --max-new-tokens, as plain decoding does.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np


AGREEMENT_DEFINITION = ("prefix: mean over prompts of (leading tokens shared by the two targets' greedy "
                        "continuations) / (the longer continuation's length); exact: share of prompts with identical "
                        "continuations")


def greedy_agreement(reference: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How far `outputs` (the compressed target's greedy continuations) drift from `reference` (the float
    target's), prompt by prompt (module docstring)."""
    if len(reference) != len(outputs):
        raise ValueError(f"greedy agreement needs the same prompts: {len(reference)} vs {len(outputs)} continuations")
    prefix, first = [], []
    for ref, out in zip(reference, outputs, strict=True):
        ref, out = list(ref), list(out)
        n = 0
        while n < min(len(ref), len(out)) and ref[n] == out[n]:
            n += 1
        longest = max(len(ref), len(out))
        same = ref == out
        prefix.append(1.0 if longest == 0 else n / longest)
        first.append(None if same else n)
    diverged = [f for f in first if f is not None]
    return {"prefix": float(np.mean(prefix)) if prefix else None,
            "exact": sum(f is None for f in first) / len(first) if first else None,
            "exact_prompts": sum(f is None for f in first), "prompts": len(first),
            "median_first_divergence": float(statistics.median(diverged)) if diverged else None,
            "first_divergence": first, "definition": AGREEMENT_DEFINITION}


def float_comparison(result: dict[str, Any], float_result: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The compressed target's bench result against the float target's on the same prompts: τ and the
    paired Δτ (None without a drafter), and the greedy drift of the two targets' plain continuations."""
    from specpress.stats import paired_comparison

    out: dict[str, Any] = {"float_target": {k: float_result.get(k) for k in
                                            ("tau", "ar", "speedup", "tokens_per_s", "baseline_tokens_per_s",
                                             "lossless_mismatches")}}
    q_pp, f_pp = result.get("per_prompt"), float_result.get("per_prompt")
    if q_pp is not None and f_pp is not None:
        out["float_target"]["per_prompt_tau"] = [p["tau"] for p in f_pp]
        out["target_paired"] = paired_comparison([p["tau"] for p in q_pp], [p["tau"] for p in f_pp], seed=seed)
        out["target_retention"] = result["tau"] / float_result["tau"] if float_result.get("tau") else None
    out["target_agreement"] = greedy_agreement(float_result["plain_outputs"], result["plain_outputs"])
    return out
