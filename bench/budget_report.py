"""Report of bench/budget.yaml: does the budget allocation's predicted cost rank the measured tau, and does the
allocation beat the uniform scheme at equal bytes?

    python bench/budget_report.py runs/budget/results.jsonl [more/results.jsonl ...]

Points of further runs join when their base is the same prompt for prompt (the same drafter, prompts and policy).

Prints one row per point (bytes, tau, retention, predicted cost = the summed per-Linear KL sensitivity of its
schemes, read from any budget point's sensitivity table, so uniform points get one too when their scheme is a
candidate), Spearman's rank correlation of predicted cost with tau (over the allocations, and over every point
with a prediction; a good proxy is strongly negative), and the paired delta tau (the sweep's bootstrap) of each
allocation against the uniform point of the same or more bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specpress.stats import paired_comparison, spearman


def _rho(x: list[float], y: list[float]) -> str:
    r = spearman(x, y)  # None: fewer than 3 pairs, or one side constant
    return "n/a" if r is None else f"{r:+.3f}"


def _step(row: dict) -> dict | None:
    return next((s for s in reversed(row.get("provenance") or []) if s.get("step") == "quantize"), None)


def _rows(path: str) -> list[dict]:
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if r.get("status", "ok") == "ok"]


def main(paths: list[str]) -> None:
    rows = _rows(paths[0])
    base = next(r for r in rows if r["point"] == "base")
    for more in paths[1:]:
        extra = _rows(more)
        if next(r for r in extra if r["point"] == "base")["per_prompt_tau"] != base["per_prompt_tau"]:
            sys.exit(f"{more}: its base differs prompt by prompt from {paths[0]}'s: its points cannot be paired")
        rows += [r for r in extra if r["point"] != "base"]
    tables = [s["allocation"] for r in rows if (s := _step(r)) and s.get("allocation")]
    scores = tables[0]["scores"] if tables else {}
    if any(t["scores"] != scores for t in tables):
        print("note: the budget points' sensitivity tables differ (they should not for one seed)")
    preds: dict[str, float | None] = {}
    for r in rows:
        s = _step(r)
        if s is None:
            continue
        if s.get("allocation"):
            preds[r["point"]] = s["allocation"]["predicted_cost"]
            continue
        label = r["point"].split("-inc_")[0]
        ok = scores and all(label in v for v in scores.values()) and len(s["quantized"]) == len(scores)
        preds[r["point"]] = sum(v[label] for v in scores.values()) if ok else None
    print(f"{'point':<64} {'bytes':>10} {'tau':>6} {'ret%':>6} {'pred KL':>9}")
    for r in sorted(rows, key=lambda r: r["bytes"]):
        p = preds.get(r["point"])
        print(f"{r['point']:<64} {r['bytes']:>10,} {r['tau']:>6.3f} {100 * r['tau'] / base['tau']:>6.1f} "
              f"{'' if p is None else f'{p:.3g}':>9}")
    alloc = [r for r in rows if (s := _step(r)) and s.get("allocation")]
    if len(alloc) >= 3:
        print(f"Spearman(predicted cost, tau) over {len(alloc)} allocations: "
              f"{_rho([preds[r['point']] for r in alloc], [r['tau'] for r in alloc])}")
    known = [r for r in rows if preds.get(r["point"]) is not None]
    if len(known) > len(alloc):
        print(f"Spearman(predicted cost, tau) over {len(known)} points with a prediction: "
              f"{_rho([preds[r['point']] for r in known], [r['tau'] for r in known])}")
    uniform = [r for r in rows if r["point"] != "base" and not ((s := _step(r)) and s.get("allocation"))]
    for a in sorted(alloc, key=lambda r: r["bytes"]):
        budget = _step(a)["allocation"]["budget_bytes"]
        same = [u for u in uniform if u["bytes"] >= a["bytes"] and u["bytes"] <= budget]
        for u in same:
            c = paired_comparison(a["per_prompt_tau"], u["per_prompt_tau"])
            lo, hi = c["ci"]
            print(f"{a['point']} ({a['bytes']:,} B) - {u['point']} ({u['bytes']:,} B): dtau {c['delta_tau']:+.3f} "
                  f"[{lo:+.3f}, {hi:+.3f}] over {c['n']} prompts{' resolved' if c['resolved'] else ''}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
