"""What a resumable training loop needs, shared by distill (compress/training.py) and the zoo's target
training (zoo/train.py): the warmup + cosine learning-rate schedule (a pure function of the step, so a
resumed run sets the same rates), a wall-clock timer for periodic checkpoints, and training state saved
atomically and read back checked.

A bottom-floor module: from specpress it imports only errors, artifacts and readback, and no torch at import.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specpress.artifacts import save_torch
from specpress.errors import CheckpointError
from specpress.readback import load_torch


def cosine_decay(frac: float, lr: float, min_lr_ratio: float) -> float:
    """Cosine decay from `lr` (frac 0) to `lr * min_lr_ratio` (frac >= 1)."""
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def warmup_cosine(step: int, warmup: int, total: int, lr: float, min_lr_ratio: float) -> float:
    """The rate of step `step` (from 0): linear warmup to `lr` over `warmup` steps, then cosine decay to
    `lr * min_lr_ratio` at step `total`, held there after it."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return cosine_decay((step - warmup) / max(1, total - warmup), lr, min_lr_ratio)


def warmup_cosine_at_progress(progress: float, warmup_ratio: float, lr: float, min_lr_ratio: float) -> float:
    """The same schedule over a fraction of a budget used (0..1, clamped): linear warmup over the first
    `warmup_ratio` of it (from lr / 1000 at the least), then cosine decay to `lr * min_lr_ratio` at 1."""
    p = min(max(progress, 0.0), 1.0)
    if p < warmup_ratio:
        return lr * max(p / warmup_ratio, 1e-3)
    return cosine_decay((p - warmup_ratio) / max(1e-9, 1 - warmup_ratio), lr, min_lr_ratio)


class Periodic:
    """A wall-clock timer for periodic checkpoints: `due()` is True (and restarts the timer) once
    `seconds` have passed since it was made or last due; with seconds 0, after every step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last = time.monotonic()

    def due(self) -> bool:
        if time.monotonic() - self.last < self.seconds:
            return False
        self.last = time.monotonic()
        return True


def save_state(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temp file beside `path`, then an atomic rename (a crash leaves the old state; a full disk
    leaves it too, and no temp file: `specpress.artifacts.save_torch`)."""
    save_torch(path, state)


def check_state(state: Any, path: Path, fields: Mapping[str, tuple[type, ...]], fix: str) -> dict[str, Any]:
    """`state` (what torch.load returned) as a dict holding `fields` with their types; else a CheckpointError
    saying what it holds instead."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a specpress checkpoint; {fix}")
    missing = [k for k in fields if k not in state]
    wrong = [k for k, types in fields.items() if k in state and not isinstance(state[k], types)
             or isinstance(state.get(k), bool)]
    if missing or wrong:
        found = ", ".join([f"no {k!r}" for k in missing] + [f"{k!r} is a {type(state[k]).__name__}" for k in wrong])
        raise CheckpointError(f"{path} is not a checkpoint of this kind ({found}); {fix}")
    return state


def read_state(path: Path, fields: Mapping[str, tuple[type, ...]], fix: str, what: str) -> dict[str, Any]:
    """The training state at `path`: read without running code (readback.load_torch) and holding `fields` with
    their types (`check_state`); else a CheckpointError naming the file, what is wrong and `fix`."""
    return check_state(load_torch(path, fix, what), path, fields, fix)
