"""The one definition of every reported metric (DESIGN.md "Metrics"), assembled into bench's JSON."""

from __future__ import annotations

import statistics
from typing import Any, Sequence


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def plain_metrics(outputs: list[list[int]], gen_ms: list[float], step_ms: list[float],
                  config: dict[str, Any]) -> dict[str, Any]:
    """Metrics of plain target decoding: one target forward per token, so tau = 1 by definition.

    gen_ms: wall time per prompt (prefill + decode); step_ms: every decode step (forward + pick).
    """
    tokens = sum(len(o) for o in outputs)
    seconds = sum(gen_ms) / 1e3
    tps = tokens / seconds if seconds > 0 else 0.0
    return {
        "tau": 1.0,
        "ar": [],
        "histogram": {},
        "draft_ms": 0.0,
        "verify_ms": median(step_ms),
        "other_ms": 0.0,
        "tokens_per_s": tps,
        "baseline_tokens_per_s": tps,
        "speedup": 1.0,
        "lossless_mismatches": 0 if config.get("temperature", 0) == 0 else None,
        "drafter_bytes": 0,
        "outputs": outputs,
        "config": config,
    }


def spec_metrics(spec: list[Any], plain: list[Any], config: dict[str, Any], drafter_bytes: int,
                 greedy: bool) -> dict[str, Any]:
    """Metrics of a speculative run with its plain baseline measured in the same process, interleaved.

    spec: SpecGeneration per prompt; plain: Generation per prompt (same prompts, same order).
    tau = 1 + accepted / rounds (tokens per target verify forward, bonus included);
    ar[k-1] = P(accepted >= k) over rounds; draft/verify/other ms = mean per round;
    draft_forward_ms = mean drafter compute per round (inside draft_ms and other_ms);
    overhead = the loop's own time, outside the drafter's and the target's forwards
    (draft + other - draft_forward); overhead_fraction = its share of all round time;
    speedup = plain ms/token / speculative ms/token over all prompts.
    """
    rounds = [r for g in spec for r in g.rounds]
    n_rounds = len(rounds)
    accepted = sum(r.accepted for r in rounds)
    drafted = sum(r.drafted for r in rounds)
    depth = max((r.accepted for r in rounds), default=0)
    hist: dict[str, int] = {}
    for r in rounds:
        hist[str(r.accepted)] = hist.get(str(r.accepted), 0) + 1
    overhead = sum(r.overhead_ms for r in rounds)
    round_ms = sum(r.draft_ms + r.verify_ms + r.other_ms for r in rounds)
    spec_tokens = sum(len(g.tokens) for g in spec)
    spec_s = sum(g.total_ms for g in spec) / 1e3
    plain_tokens = sum(len(g.tokens) for g in plain)
    plain_s = sum(g.decode_ms for g in plain) / 1e3
    tps = spec_tokens / spec_s if spec_s else 0.0
    base = plain_tokens / plain_s if plain_s else 0.0
    per_prompt = [{"rounds": len(g.rounds), "accepted": sum(r.accepted for r in g.rounds),
                   "tau": 1 + sum(r.accepted for r in g.rounds) / len(g.rounds) if g.rounds else None}
                  for g in spec]
    return {
        "tau": 1 + accepted / n_rounds if n_rounds else 1.0,
        "ar": [sum(r.accepted >= k for r in rounds) / n_rounds for k in range(1, depth + 1)] if n_rounds else [],
        "histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "rounds": n_rounds,
        "draft_ms": sum(r.draft_ms for r in rounds) / n_rounds if n_rounds else 0.0,
        "verify_ms": sum(r.verify_ms for r in rounds) / n_rounds if n_rounds else 0.0,
        "other_ms": sum(r.other_ms for r in rounds) / n_rounds if n_rounds else 0.0,
        "draft_forward_ms": sum(r.draft_forward_ms for r in rounds) / n_rounds if n_rounds else 0.0,
        "overhead_ms": overhead / n_rounds if n_rounds else 0.0,
        "overhead_fraction": overhead / round_ms if round_ms else 0.0,
        "tokens_per_s": tps,
        "baseline_tokens_per_s": base,
        "speedup": tps / base if base else 0.0,
        "lossless_mismatches": sum(g.tokens != p.tokens for g, p in zip(spec, plain)) if greedy else None,
        "drafter_bytes": drafter_bytes,
        "per_prompt": per_prompt,
        "outputs": [g.tokens for g in spec],
        "config": config,
    }


def _per_prompt_median(gens: list[Any], ms: Any) -> float:
    """Median over prompts of the mean per round of `ms(round)` (prompts without rounds are skipped)."""
    return median([sum(ms(r) for r in g.rounds) / len(g.rounds) for g in gens if g.rounds])


def compare_metrics(base: list[Any], other: list[Any], plain: list[Any], drafter_bytes: int,
                    greedy: bool) -> dict[str, Any]:
    """`bench --compare-drafter`: the other drafter's metrics (spec_metrics' definitions, the same plain
    runs) and both drafters' per-prompt mean drafter forward ms and round ms per round, as medians over
    prompts, with the ratios other / base (below 1: the other drafter is faster)."""
    out = {k: v for k, v in spec_metrics(other, plain, {}, drafter_bytes, greedy).items()
           if k not in ("outputs", "per_prompt", "config")}
    forward = lambda r: r.draft_forward_ms  # noqa: E731
    round_ms = lambda r: r.draft_ms + r.verify_ms + r.other_ms  # noqa: E731
    for name, ms in (("draft_forward_ms", forward), ("round_ms", round_ms)):
        mine, theirs = _per_prompt_median(other, ms), _per_prompt_median(base, ms)
        out[f"{name}_median"], out[f"base_{name}_median"] = mine, theirs
        out[f"{name}_ratio"] = mine / theirs if theirs else 0.0
    return out
