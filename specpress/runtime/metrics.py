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
