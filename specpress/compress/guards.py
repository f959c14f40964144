"""What the commands and their pipelines check on the options before any work starts, and what they say when
stopped.

`check_seq_len` refuses a window past the target's context or beyond memory (specpress.machine's figures).
"""

from __future__ import annotations

from pathlib import Path

from specpress.errors import Interrupted, RequestError

__all__ = ["check_seq_len", "interrupted", "distill_saved", "regen_saved", "check_not_quantized"]


def check_seq_len(target_dir: Path | str, seq_len: int, batch: int, *, training: bool = True,
                  what: str | None = None) -> None:
    """A window of `seq_len` tokens (`what` names the flags that set it) within the target's context, and one
    [batch, seq_len] step's estimated memory within what is free."""
    from specpress import machine
    from specpress.models.io import read_config
    from specpress.models.target import TargetConfig

    what = what or f"--seq-len {seq_len}"
    cfg = TargetConfig.from_hf(read_config(target_dir), source=str(Path(target_dir) / "config.json"))
    if seq_len > cfg.max_context:
        raise RequestError(f"{what} is longer than the target's context ({cfg.max_context} positions, "
                           f"{target_dir}/config.json): positions past it are ones the target never computes; "
                           f"use at most {cfg.max_context}")
    need, free = machine.step_bytes(cfg, batch, seq_len, training), machine.available_bytes()
    if free is not None and need > free:
        raise RequestError(f"one step of --batch {batch} x {what} needs at least {machine.fmt_bytes(need)} of "
                           f"memory on this target; {machine.fmt_bytes(free)} is available: use a smaller window or "
                           f"--batch")


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
