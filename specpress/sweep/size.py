"""How big a sweep is before it starts: its points, runs and target forwards, and a lower bound on their time.

`check_grid` is sweep_request's guard: a grid of more than LARGE_GRID points is refused (UsageError) without
--allow-large, saying how many benched runs and target forwards it expands to and how long those take at
least here; with the flag the same words are a note on stderr. The bound: decoding reads the target's weights
once per forward, so no forward is faster than the target's bytes at this machine's measured copy bandwidth
(building the points - calibration, training - and the drafter's own forwards add to it). `bench_work` is the
count `specpress plan RECIPE` uses too (plan/sweep.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from specpress.errors import SpecpressError, UsageError
from specpress.sweep.recipe import Recipe

LARGE_GRID = 64  # points (the base included) past which a sweep needs --allow-large; bundled recipes have <= 29
ES = {"fp32": 4, "bf16": 2, "fp16": 2}


def prompt_count(recipe: Recipe) -> int:
    path = recipe.prompts.path
    if recipe.prompts.heldout_n or path is None:
        return recipe.prompts.heldout_n or 0
    try:
        return sum(1 for line in Path(path).expanduser().read_text().splitlines() if line.strip())
    except OSError:
        return 0


def bench_work(recipe: Recipe) -> tuple[int, int]:
    """(bench runs of each point on one target, the target tokens they decode): each prompt decoded plainly and
    speculatively per policy x temperature x backend, one target forward a token at most."""
    runs = len(recipe.policies or (None,)) * len(recipe.temperatures) * len(recipe.backends)
    return runs, prompt_count(recipe) * recipe.max_new_tokens * runs * 2


def copy_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes per second this machine moves in a large tensor copy (read + write), measured now (~0.1 s)."""
    import torch

    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: pages mapped
    t0 = time.perf_counter()
    for _ in range(3):
        dst.copy_(src)
    return 2 * nbytes * 3 / max(time.perf_counter() - t0, 1e-9)


def target_bytes(recipe: Recipe) -> int:
    """The target's weight bytes as the sweep holds them (the recipe's dtype), from its files; 0 when it is a
    zoo target not built yet or has no weights."""
    from specpress.models.io import stored_float_dtype, weight_files

    if recipe.target.zoo is not None:
        from specpress.zoo import default_zoo_dir

        path = default_zoo_dir(recipe.target.zoo)
    else:
        path = Path(recipe.target.path)
    files = weight_files(path)
    stored = sum(f.stat().st_size for f in files)
    if not files or recipe.dtype not in ES:
        return stored
    return stored * ES[recipe.dtype] // stored_float_dtype(path).itemsize


def fmt_seconds(s: float) -> str:
    if s < 90:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def check_grid(r: Recipe, arg: str | Path, allow_large: bool) -> None:
    """The module docstring's guard (`arg`: the recipe as the user named it)."""
    n = len(r.points)
    if n <= LARGE_GRID:
        return
    per_point, tokens = bench_work(r)
    runs = per_point * len(r.targets)
    what = f"the recipe expands to {n} points x {runs} run(s) = {n * runs:,} benched runs"
    forwards = n * len(r.targets) * (r.agreement_batches + tokens)
    try:
        held = target_bytes(r)
    except SpecpressError as exc:  # an unreadable target: the count alone (the sweep's open says more)
        held, why = 0, str(exc)
    else:
        why = "the target is not there yet"
    if held:
        bw = copy_bandwidth()
        what += (f" ({forwards:,} target forwards: at least {fmt_seconds(forwards * held / bw)} here, each reading "
                 f"the target's {held:,} weight bytes at this machine's {bw / 1e9:.1f} GB/s; building the points "
                 f"takes longer)")
    else:
        what += f" ({forwards:,} target forwards; no time estimate: {why})"
    if not allow_large:
        raise UsageError(f"{what}; more than {LARGE_GRID} points needs --allow-large: check the grid first "
                         f"(`specpress plan {arg}` details each point), then pass --allow-large to run it")
    print(f"note: {what} (--allow-large)", file=sys.stderr)
