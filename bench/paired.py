"""Paired Δτ between two sweep points, from their results.jsonl files (the sweep's own bootstrap).

A sweep pairs every point with its base; this pairs any two points on the same prompts, also across runs
whose bases are identical prompt for prompt (checked), e.g. AWQ against GPTQ, or one calibration rule
against another:

    python bench/paired.py runs/awq/results.jsonl:int4-g64-gptq runs/awq/results.jsonl:int4-g64-awq
    python bench/paired.py runs/act-calibration/results.jsonl:nvfp4-static-max \\
        runs/act-calibration/results.jsonl:nvfp4-static

A point on a compressed target (a recipe's `target_quant`) is POINT@TARGET (the target's label). Two sweeps
of different base drafters (a drafter re-aligned to a compressed target against the original) pair with
--same-prompts: their recipes must name the same prompts (checked in each recipe.json), not the same base:

    python bench/paired.py --same-prompts runs/tq/results.jsonl:base@nvfp4-static \\
        runs/tq-realigned/results.jsonl:base@nvfp4-static

Prints Δτ = mean over prompts of τ(B) - τ(A), its 95 % bootstrap CI and whether it is resolved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specpress.stats import paired_comparison


def _point(spec: str) -> tuple[dict, dict, dict]:
    """(the record, its base on the same target, the sweep's recipe) of RESULTS.jsonl:POINT[@TARGET]."""
    path, sep, point = spec.rpartition(":")
    if not sep or not path:
        sys.exit(f"expected RESULTS.jsonl:POINT[@TARGET], got {spec!r}")
    point, _, target = point.partition("@")
    target = target or "float"
    lines = Path(path).read_text().splitlines()
    rows = {(r["point"], r.get("target_quant", "float")): r for r in map(json.loads, lines)
            if r.get("status", "ok") == "ok"}
    if (point, target) not in rows:
        sys.exit(f"{path}: no point {point!r} on target {target!r} (has: "
                 f"{', '.join(sorted(p if t == 'float' else f'{p}@{t}' for p, t in rows))})")
    recipe = json.loads((Path(path).parent / "recipe.json").read_text())["recipe"]
    return rows[point, target], rows["base", target], recipe


def main(argv: list[str]) -> None:
    same_prompts = "--same-prompts" in argv
    argv = [a for a in argv if a != "--same-prompts"]
    if len(argv) != 2:
        sys.exit(__doc__)
    (a, base_a, recipe_a), (b, base_b, recipe_b) = _point(argv[0]), _point(argv[1])
    if same_prompts:
        if (recipe_a["prompts"], recipe_a["max_new_tokens"]) != (recipe_b["prompts"], recipe_b["max_new_tokens"]):
            sys.exit("the two sweeps decode different prompts (or token budgets): their points cannot be paired")
    elif base_a["per_prompt_tau"] != base_b["per_prompt_tau"]:
        sys.exit("the two runs' bases differ prompt by prompt: their points cannot be paired (sweeps of different "
                 "base drafters on the same prompts: --same-prompts)")
    c = paired_comparison(b["per_prompt_tau"], a["per_prompt_tau"])
    lo, hi = c["ci"]
    name = lambda r: r["point"] + ("" if r.get("target_quant", "float") == "float" else f"@{r['target_quant']}")  # noqa: E731
    print(f"{name(b)} - {name(a)}: Δτ {c['delta_tau']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {c['n']} prompts, "
          f"resolved: {'yes' if c['resolved'] else 'no'}")


if __name__ == "__main__":
    main(sys.argv[1:])
