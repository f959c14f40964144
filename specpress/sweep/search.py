"""`--find-smallest`: the smallest grid point whose tau retention stays above 1 - max loss, in few evaluations.

Criterion: the retention POINT ESTIMATE tau / tau_base >= 1 - loss (pooled tau over the prompts, the
first policy / temperature / backend of the recipe). The paired CI is reported beside each trial but is
not the criterion: with ~100 prompts its half-width (~0.04 tau) is comparable to a 1-3 % loss, so
requiring the CI's lower end to clear the threshold would reject points whose loss is unresolved.

Search: candidates are sorted by bytes (those of equal bytes form one bucket: a bucket passes when any of
its members does, tried in grid order). Retention is assumed to grow with bytes ("monotone-ish"), so a
lower-bound binary search over the buckets finds the first passing one in ~log2(buckets) + 1 steps; then
the next smaller bucket is verified to fail (evaluated if it was not), and while it passes — the order was
not monotone there — the search walks down until one fails. Every evaluation is a full point run
(build + bench), recorded in results.jsonl like any sweep point.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

Evaluate = Callable[[str], "Trial"]


@dataclass(frozen=True)
class Candidate:
    id: str
    bytes: int


@dataclass
class Trial:
    id: str
    bytes: int | None
    retention: float | None  # None: the run failed
    passed: bool = False
    tau: float | None = None
    delta_tau: float | None = None
    ci: list[float] | None = None
    error: str | None = None


@dataclass
class SearchResult:
    threshold: float
    candidates: list[Candidate]
    trials: list[Trial] = field(default_factory=list)  # in evaluation order
    found: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "found": self.found, "evaluated": len(self.trials),
                "grid": len(self.candidates), "candidates": [asdict(c) for c in self.candidates],
                "trials": [asdict(t) for t in self.trials]}


def buckets(candidates: list[Candidate]) -> list[list[Candidate]]:
    """Candidates grouped by equal bytes, smallest first (grid order kept within a bucket)."""
    out: dict[int, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: c.bytes):
        out.setdefault(c.bytes, []).append(c)
    return list(out.values())


def find_smallest(candidates: list[Candidate], evaluate: Evaluate, threshold: float) -> SearchResult:
    """The smallest candidate with retention >= threshold, evaluating as few as the order allows."""
    result = SearchResult(threshold, list(candidates))
    done: dict[str, Trial] = {}

    def trial(c: Candidate) -> Trial:
        if c.id not in done:
            t = evaluate(c.id)
            t.passed = t.retention is not None and t.retention >= threshold - 1e-12
            done[c.id] = t
            result.trials.append(t)
        return done[c.id]

    def passing(b: list[Candidate]) -> str | None:
        for c in b:
            if trial(c).passed:
                return c.id
        return None

    bs = buckets(candidates)
    lo, hi = 0, len(bs)  # invariant: every bucket >= hi is believed to pass; every one < lo fails
    hit: dict[int, str] = {}
    while lo < hi:
        mid = (lo + hi) // 2
        found = passing(bs[mid])
        if found is not None:
            hit[mid] = found
            hi = mid
        else:
            lo = mid + 1
    if lo == len(bs):
        return result  # nothing passes: the base drafter is the smallest that keeps tau
    while lo > 0:  # verify the neighbour below; walk down while the order proves non-monotone
        below = passing(bs[lo - 1])
        if below is None:
            break
        lo -= 1
        hit[lo] = below
    result.found = hit[lo]
    return result
