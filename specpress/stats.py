"""Paired comparisons against a base drafter (a sweep's base, bench --compare's), the Pareto front over
(bytes, tau) and Spearman's rank correlation: plain numpy, under both runtime/ and sweep/, which use them.

Every point is decoded on the SAME prompts as the base, so its cost is measured per prompt:
delta_i = tau_i(point) - tau_i(base), and the mean delta gets a percentile bootstrap CI over prompts
(seeded, 2000 resamples). Pairing removes the prompt-to-prompt spread that dominates unpaired tau
(BENCHMARKS.md, "How noisy": paired 95 % CIs of +-0.01 to +-0.12 over 100 prompts). `resolved` = the
95 % CI excludes 0. Retention = pooled tau / pooled base tau (pooled: 1 + all accepted / all rounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def bootstrap_mean_ci(values: Sequence[float], *, resamples: int = RESAMPLES, level: float = LEVEL,
                      seed: int = 0) -> tuple[float, float, float] | None:
    """(mean, low, high): percentile bootstrap CI of the mean; None when fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(x.mean()), float(lo), float(hi)


def paired_comparison(point_tau: Sequence[float | None], base_tau: Sequence[float | None], *,
                      resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> dict[str, Any]:
    """Per-prompt delta tau against the base: mean, CI, resolved (CI excludes 0), n pairs."""
    if len(point_tau) != len(base_tau):
        raise ValueError(f"paired comparison needs the same prompts: {len(point_tau)} vs {len(base_tau)} values")
    deltas = [a - b for a, b in zip(point_tau, base_tau) if a is not None and b is not None]
    ci = bootstrap_mean_ci(deltas, resamples=resamples, level=level, seed=seed)
    mean = float(np.mean(deltas)) if deltas else None
    return {"delta_tau": mean, "ci": None if ci is None else [ci[1], ci[2]],
            "resolved": bool(ci is not None and (ci[1] > 0 or ci[2] < 0)), "n": len(deltas),
            "level": level, "resamples": resamples, "seed": seed}


def pareto_flags(items: Sequence[tuple[float, float]]) -> list[bool]:
    """For (bytes, tau) pairs: True where no other item has bytes <= and tau >= with one strictly better."""
    flags = []
    for i, (b, t) in enumerate(items):
        dominated = any((b2 <= b and t2 >= t) and (b2 < b or t2 > t) for j, (b2, t2) in enumerate(items) if j != i)
        flags.append(not dominated)
    return flags


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 0..n-1 of `values`, ties given their mean rank."""
    x = np.asarray(values, dtype=np.float64)
    ranks = np.empty(x.size)
    ranks[x.argsort(kind="stable")] = np.arange(x.size)
    for v in np.unique(x):
        ranks[x == v] = ranks[x == v].mean()
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman rank correlation of paired values (ties at mean rank); None with fewer than 3 pairs or when
    either side is constant (no ranking to compare)."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman needs paired values: {len(xs)} vs {len(ys)}")
    if len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])
