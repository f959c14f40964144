"""Paired Δτ between two sweep points, from their results.jsonl files (the sweep's own bootstrap).

A sweep pairs every point with its base; this pairs any two points on the same prompts, also across runs
whose bases are identical prompt for prompt (checked), e.g. AWQ against GPTQ, or one calibration rule
against another:

    python bench/paired.py runs/awq/results.jsonl:int4-g64-gptq runs/awq/results.jsonl:int4-g64-awq
    python bench/paired.py runs/act-calibration/results.jsonl:nvfp4-static-max \\
        runs/act-calibration/results.jsonl:nvfp4-static

Prints Δτ = mean over prompts of τ(B) - τ(A), its 95 % bootstrap CI and whether it is resolved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specpress.sweep.stats import paired_comparison


def _point(spec: str) -> tuple[dict, dict]:
    path, sep, point = spec.rpartition(":")
    if not sep or not path:
        sys.exit(f"expected RESULTS.jsonl:POINT, got {spec!r}")
    rows = {r["point"]: r for r in map(json.loads, Path(path).read_text().splitlines()) if r.get("status", "ok") == "ok"}
    if point not in rows:
        sys.exit(f"{path}: no point {point!r} (has: {', '.join(sorted(rows))})")
    return rows[point], rows["base"]


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit(__doc__)
    (a, base_a), (b, base_b) = _point(argv[0]), _point(argv[1])
    if base_a["per_prompt_tau"] != base_b["per_prompt_tau"]:
        sys.exit("the two runs' bases differ prompt by prompt: their points cannot be paired")
    c = paired_comparison(b["per_prompt_tau"], a["per_prompt_tau"])
    lo, hi = c["ci"]
    print(f"{b['point']} - {a['point']}: Δτ {c['delta_tau']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {c['n']} prompts, "
          f"resolved: {'yes' if c['resolved'] else 'no'}")


if __name__ == "__main__":
    main(sys.argv[1:])
