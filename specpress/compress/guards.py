"""What the commands and their pipelines check on the options before any work starts, and what they say when
stopped.

`check_seq_len` (specpress.machine) refuses a window past the target's context or beyond memory.
"""

from __future__ import annotations

from pathlib import Path

from specpress.errors import Interrupted, RequestError
from specpress.machine import check_seq_len

__all__ = ["check_seq_len", "interrupted", "distill_saved", "regen_saved", "check_not_quantized"]


def interrupted(partial: Path, saved: str | None) -> Interrupted:
    """The Ctrl-C message: what was saved where and how to continue it (or that nothing was saved)."""
    if saved is None:
        return Interrupted(f"interrupted before anything was saved (no {partial}); run the command again to start")
    return Interrupted(f"interrupted: {saved} saved in {partial}; to continue, run the same command again "
                       f"with --resume")


def distill_saved(partial: Path) -> str | None:
    """'step N of M' of the distill checkpoint in `partial` (None when there is none)."""
    from specpress.checkpoint import read_state
    from specpress.compress.training import STATE_FIELDS, STATE_FILE
    from specpress.errors import CheckpointError

    f = partial / STATE_FILE
    if not f.is_file():
        return None
    try:
        state = read_state(f, STATE_FIELDS, "", "checkpoint")
    except CheckpointError:
        return "an unreadable checkpoint"
    return f"step {state['step']} of {state['planned']}"


def regen_saved(partial: Path) -> str | None:
    """'N of M sequences' of the regenerate run whose lines are in `partial` (None when there is none)."""
    from specpress.errors import CheckpointError
    from specpress.readback import read_json

    try:
        state = read_json(partial.with_name(partial.name + ".state"))
        return f"{int(state['done'])} of {int(state['key']['sequences'])} sequences"
    except (CheckpointError, ValueError, KeyError, TypeError):
        return None


def check_not_quantized(drafter_dir: Path, flag: str) -> None:
    """Training needs float weights: a drafter whose weights are quantized codes is refused, saying why."""
    from specpress.models.drafter_io import active_quantize_step, read_drafter_config

    raw = read_drafter_config(drafter_dir)[2]
    step = active_quantize_step((raw.get("specpress") or {}).get("steps"))
    if step is not None:
        raise RequestError(f"{flag} {drafter_dir} is quantized ({step.get('scheme')}): its weights are integer codes "
                           f"that cannot be trained; give the float drafter it was made from (its provenance: "
                           f"`specpress inspect {drafter_dir}`), or one written with quantize --dequantize")
