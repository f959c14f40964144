"""`search:` — knob ranges that `sweep --find-smallest` searches beyond the grid, pruned by a cheap τ proxy.

    search:
      knobs:                             # grid entries (grid.py syntax): each list value is a range to search
        - chain: [{prune: {head_rank: [16, 32], recover_steps: [0, 200]}}, {quantize: {scheme: [int8, int4]}}]
        - quantize: {budget: [1MiB, 2MiB], candidates: [int8, int4:g64]}
      margin: 0.05                       # prune a candidate whose proxy retention < 1 - max_tau_loss - margin
      proxy_batches: 2                   # calibration windows ([8, 128] each) the proxy reads
      objective: bytes                   # bytes: the fewest bytes; speed: the highest measured speedup

The knobs expand like grid entries (the cartesian product of every list; at most MAX_CANDIDATES candidates)
and join the grid's points as candidates; each is sized exactly as a grid point is (driver.sizing_bytes).
Then, per target: every candidate is BUILT (as the point would be, reused by a later run) and its proxy taken
— teacher-forced top-1 agreement acc@k with the target on the recipe's calibration windows (agreement.py),
folded into a chain's expected accepted length 1 + Σ_k Π_{j≤k} acc@j and divided by the base drafter's: no
speculative decoding. Candidates whose proxy falls below the threshold minus `margin` are pruned (recorded
with their proxy, never benched); the rest are searched by real τ as search.py does, so the answer is always
a candidate whose real τ retention passed. With `objective: speed` every candidate the proxy keeps is benched
and the answer is the passing one with the highest speedup over plain decoding, as the bench measures it on
the recipe's first backend (emulated schemes on a CPU measure acceptance, not speed: use it on real kernels). search.json's `knobs` section holds every candidate's bytes,
proxy, and real τ / retention where evaluated, and the proxy's Spearman rank correlation with real retention
(over ≥ 3 evaluated candidates). A plain sweep (no --find-smallest) runs the grid only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specpress.errors import ConfigError
from specpress.sweep.grid import BASE_ID, Point, check_grid_size, expand_entry
from specpress.sweep.search import Candidate, SearchResult, Trial, find_smallest

SEARCH_KEYS = ("knobs", "margin", "proxy_batches", "objective")
OBJECTIVES = ("bytes", "speed")
MAX_CANDIDATES = 256  # every candidate is built for its proxy: more is days, or a typo
DEFAULT_MARGIN = 0.05
DEFAULT_PROXY_BATCHES = 2
PROXY = ("proxy retention = P(candidate) / P(base), P = 1 + sum_k prod_{j<=k} acc@j: teacher-forced top-1 "
         "agreement with the target on the recipe's calibration windows (no speculative decoding)")


@dataclass(frozen=True)
class SearchSpec:
    """The recipe's `search:` block: candidate points beyond the grid and how the proxy prunes them."""

    points: tuple[Point, ...]
    margin: float = DEFAULT_MARGIN
    proxy_batches: int = DEFAULT_PROXY_BATCHES
    knobs: tuple[Any, ...] = ()  # the entries as written (to_dict, so the hash sees them)
    objective: str = "bytes"  # the fewest bytes, or the highest speedup, among those keeping τ

    def to_dict(self) -> dict[str, Any]:
        return {"knobs": list(self.knobs), "margin": self.margin, "proxy_batches": self.proxy_batches,
                "objective": self.objective}


def parse_search(obj: Any, grid: tuple[Point, ...], where: str = "search") -> tuple[SearchSpec, tuple[str, ...]]:
    """(spec, skipped combinations): a validated `search:` block; its points leave out those the grid already
    holds (same id and steps)."""
    from collections.abc import Mapping

    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where} must be a mapping with {', '.join(SEARCH_KEYS)}, e.g. "
                          f"`search: {{knobs: [{{quantize: {{scheme: [int8, int4]}}}}]}}`; found {type(obj).__name__}")
    for k in obj:
        if k not in SEARCH_KEYS:
            raise ConfigError(f"unknown key {k!r} in {where}; allowed: {', '.join(SEARCH_KEYS)}")
    knobs = obj.get("knobs")
    if not isinstance(knobs, list) or not knobs:
        raise ConfigError(f"{where}.knobs must be a non-empty list of grid entries whose list values are the ranges "
                          f"to search, e.g. [{{prune: {{head_rank: [32, 64]}}}}]; found {knobs!r}")
    margin = obj.get("margin", DEFAULT_MARGIN)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ConfigError(f"{where}.margin must be a number in [0, 1) (a retention fraction: 0.05 prunes candidates "
                          f"whose proxy is 5 points under the threshold), found {margin!r}")
    batches = obj.get("proxy_batches", DEFAULT_PROXY_BATCHES)
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ConfigError(f"{where}.proxy_batches must be an integer >= 1, found {batches!r}")
    objective = obj.get("objective", "bytes")
    if objective not in OBJECTIVES:
        raise ConfigError(f"{where}.objective {objective!r}: choose bytes (the fewest) or speed (the highest measured "
                          f"speedup)")
    check_grid_size(knobs, f"{where}.knobs", MAX_CANDIDATES, "a search holds")
    seen = {p.id: p for p in grid}
    points: list[Point] = []
    skipped: list[str] = []
    for i, entry in enumerate(knobs):
        pts, sk = expand_entry(entry, f"{where}.knobs[{i}]")
        skipped += sk
        for p in pts:
            if p.id in seen:
                if seen[p.id].steps != p.steps or p.id == BASE_ID:
                    raise ConfigError(f"{where}.knobs[{i}]: point {p.id!r} has the id of another point with other "
                                      f"steps; give one of them an `id`")
                continue  # the grid (or an earlier knob) already holds it
            seen[p.id] = p
            points.append(p)
    return SearchSpec(tuple(points), float(margin), batches, tuple(knobs), objective), tuple(skipped)


def tau_proxy(acc: list[float]) -> float:
    """1 + Σ_k Π_{j≤k} acc[j]: the accepted length of a chain whose k-th draft is accepted with probability
    acc[k] once the ones before it were (acc: teacher-forced top-1 agreement per draft position)."""
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total


@dataclass
class KnobSearch:
    """A proxy-pruned search: every candidate's proxy, the pruned ones, and the real-τ search of the rest."""

    floor: float  # proxies below it are pruned
    proxies: dict[str, float]
    unbuilt: list[dict[str, str]]  # candidates whose proxy could not be taken (their build failed)
    result: SearchResult
    speeds: dict[str, float | None]  # measured speedup of each benched candidate (objective speed only)

    def to_dict(self, candidates: list[Candidate], margin: float) -> dict[str, Any]:
        from specpress.stats import spearman

        trials = {t.id: t for t in self.result.trials}
        rows = []
        for c in sorted(candidates, key=lambda c: c.bytes):
            t = trials.get(c.id)
            p = self.proxies.get(c.id)
            rows.append({"id": c.id, "bytes": c.bytes, "proxy": p, "pruned": p is not None and p < self.floor,
                         "tau": None if t is None else t.tau, "retention": None if t is None else t.retention,
                         "speedup": self.speeds.get(c.id)})
        pairs = [(r["proxy"], r["retention"]) for r in rows if r["proxy"] is not None and r["retention"] is not None]
        return {"proxy": PROXY, "margin": margin, "prune_below": self.floor, "candidates": rows,
                "pruned": [r["id"] for r in rows if r["pruned"]], "unbuilt": self.unbuilt,
                "spearman": spearman([a for a, _ in pairs], [b for _, b in pairs]), "spearman_n": len(pairs)}


def search_knobs(candidates: list[Candidate], proxy: Callable[[str], float], evaluate: Callable[[str], Trial],
                 threshold: float, margin: float, speed: Callable[[str], float | None] | None = None) -> KnobSearch:
    """Take every candidate's proxy; prune those below threshold - margin; search the rest by real τ (search.py:
    the fewest bytes), or, given `speed` (a benched candidate's speedup), bench them all and pick the fastest that
    passes. A candidate whose proxy raises is left out and recorded in `unbuilt`."""
    floor = threshold - margin
    proxies: dict[str, float] = {}
    unbuilt: list[dict[str, str]] = []
    for c in candidates:
        try:
            proxies[c.id] = float(proxy(c.id))
        except Exception as exc:  # noqa: BLE001 — recorded, as a failed point is; the search goes on
            unbuilt.append({"point": c.id, "error": f"{type(exc).__name__}: {exc}"})
    kept = [c for c in candidates if c.id in proxies and proxies[c.id] >= floor]
    if speed is None:
        return KnobSearch(floor, proxies, unbuilt, find_smallest(kept, evaluate, threshold), {})
    result = SearchResult(threshold, kept)
    for c in sorted(kept, key=lambda c: c.bytes):
        t = evaluate(c.id)
        t.passed = t.retention is not None and t.retention >= threshold - 1e-12
        result.trials.append(t)
    speeds = {t.id: speed(t.id) for t in result.trials}
    fast = [t for t in result.trials if t.passed and speeds[t.id] is not None]
    result.found = max(fast, key=lambda t: speeds[t.id]).id if fast else None  # ties: the fewer bytes
    return KnobSearch(floor, proxies, unbuilt, result, speeds)
