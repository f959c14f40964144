"""The CLI's path for `specpress plan`: a parsed command (or a recipe) in, its plan out (and, with --json FILE,
written there), and the lines the command prints.

    p = plan_to("quantize", params)                  # params: the planned command's own parsed options
    print("\\n".join(plan_lines("specpress quantize", p)))
    plans = recipe_plans_to("recipes/quickstart.yaml", json_file="plan.json")
    print("\\n".join(recipe_lines("recipes/quickstart.yaml", plans)))

The JSON is the plan's to_dict() (recipe_json for a recipe); the lines say each phase's parts, the process's own
memory, what the command must hold, its work, and whether the peak fits in the memory available now.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any


def plan_to(name: str, params: dict[str, Any], json_file: str | Path | None = None, *,
            force: bool = False) -> Any:
    """plan_command(name, params), a Plan; with `json_file`, that file claimed before planning (force: replace
    it) and the plan's to_dict() written there."""
    from specpress.plan import plan_command

    with _claim(json_file, force):
        p = plan_command(name, params)
        _write(json_file, p.to_dict())
    return p


def recipe_plans_to(recipe: str, json_file: str | Path | None = None, *, force: bool = False) -> list[Any]:
    """plan_recipe(recipe), one Plan per sweep point; with `json_file`, that file claimed before planning
    (force: replace it) and recipe_json of the plans written there."""
    from specpress.plan import plan_recipe

    with _claim(json_file, force):
        plans = plan_recipe(recipe)
        _write(json_file, recipe_json(recipe, plans))
    return plans


def recipe_json(recipe: str, plans: list[Any]) -> dict[str, Any]:
    """A recipe's plans as one JSON object: the recipe, the largest peak, and every point's plan."""
    worst = max(plans, key=lambda p: p.peak_bytes)
    return {"recipe": recipe, "peak_bytes": worst.peak_bytes, "plans": [p.to_dict() for p in plans]}


def _claim(json_file: str | Path | None, force: bool) -> Any:
    """--json FILE claimed (artifacts.claim_output) before planning; nothing to claim without one."""
    from specpress.artifacts import claim_output

    if json_file is None:
        return nullcontext()
    return claim_output(json_file, force=force, kind="file", flag="--json")


def _write(json_file: str | Path | None, obj: dict[str, Any]) -> None:
    from specpress.artifacts import write_json

    if json_file is not None:
        write_json(json_file, obj)


def fmt_size(n: float) -> str:
    """GiB with two decimals from 1 GiB up, whole MiB below."""
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


def plan_lines(title: str, p: Any) -> list[str]:
    """What `plan COMMAND` prints of a Plan `p`: the peak and its phase, each phase's parts, the process's own
    memory, what the command must hold, its work and notes, and whether the peak fits in the memory available
    now (machine.available_bytes; nothing said where that is unknown)."""
    from specpress import machine

    lines = [f"{title}: peak about {fmt_size(p.peak_bytes)} (in the {p.peak_phase} phase)"]
    for phase, parts in p.phases.items():
        lines.append(f"  {phase:<24} {fmt_size(sum(parts.values())):>10}   "
                     + ", ".join(f"{k} {fmt_size(v)}" for k, v in parts.items() if v))
    lines.append(f"  {'process (imports)':<24} {fmt_size(p.base):>10}")
    lines.append(f"  must hold {fmt_size(p.holds_bytes)}: " + ", ".join(f"{k} {fmt_size(v)}" for k, v in p.holds.items()))
    work = ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v}"
                     for k, v in p.work.items() if v is not None)
    if work:
        lines.append(f"  work: {work}")
    lines += [f"  note: {note}" for note in p.notes]
    free = machine.available_bytes()
    if free is not None:
        verdict = "fits" if p.peak_bytes < free else "does NOT fit"
        lines.append(f"  {verdict} in the {fmt_size(free)} available now")
    return lines


def recipe_lines(recipe: str, plans: list[Any]) -> list[str]:
    """What `plan RECIPE` prints: every point's plan_lines, then the largest peak and how the points run."""
    worst = max(plans, key=lambda p: p.peak_bytes)
    lines = [line for p in plans for line in plan_lines(p.command, p)]
    lines.append(f"sweep {recipe}: {len(plans)} plans; the largest peak is {fmt_size(worst.peak_bytes)} "
                 f"({worst.command}); in-process and local workers run one point at a time, a Ray cluster one "
                 f"per worker")
    return lines
