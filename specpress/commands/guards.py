"""Checks the commands run on their options before any work starts, and what they say when stopped.

`check_seq_len`: a window longer than the target's context, or a training step that cannot fit in
memory, is refused here rather than found by the kernel's OOM killer hours later. The memory figure
is a rough lower bound (logits, attention scores and activations of one step), so a refusal is
certain to be right while a pass promises nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpress.errors import Interrupted, UsageError


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def step_bytes(cfg: Any, batch: int, seq_len: int, training: bool) -> int:
    """A lower bound on the memory one [batch, seq_len] step of `cfg` (a TargetConfig) holds at its peak."""
    b, t, f = batch, seq_len, 4  # fp32 bytes
    logits = b * t * cfg.vocab_size * f * (4 if training else 2)  # target + drafter logits, softmax, grads
    scores = b * cfg.num_attention_heads * t * t * f * 2  # one layer's attention weights (+ its softmax)
    acts = b * t * cfg.hidden_size * f * (cfg.num_hidden_layers + 2) * (4 if training else 1)
    return logits + scores + acts


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_seq_len(target_dir: Path | str, seq_len: int, batch: int, *, training: bool = True,
                  what: str | None = None) -> None:
    """A window of `seq_len` tokens (`what` names the flags that set it) within the target's context, and one
    [batch, seq_len] step's estimated memory within what is free."""
    from specpress.models.io import read_config
    from specpress.models.target import TargetConfig

    what = what or f"--seq-len {seq_len}"
    cfg = TargetConfig.from_hf(read_config(target_dir), source=str(Path(target_dir) / "config.json"))
    if seq_len > cfg.max_context:
        raise UsageError(f"{what} is longer than the target's context ({cfg.max_context} positions, "
                         f"{target_dir}/config.json): positions past it are ones the target never computes; "
                         f"use at most {cfg.max_context}")
    need, free = step_bytes(cfg, batch, seq_len, training), available_bytes()
    if free is not None and need > free:
        raise UsageError(f"one step of --batch {batch} x {what} needs at least {_fmt(need)} of memory on this "
                         f"target; {_fmt(free)} is available: use a smaller window or --batch")


def interrupted(partial: Path, saved: str | None) -> Interrupted:
    """The Ctrl-C message: what was saved where and how to continue it (or that nothing was saved)."""
    if saved is None:
        return Interrupted(f"interrupted before anything was saved (no {partial}); run the command again to start")
    return Interrupted(f"interrupted: {saved} saved in {partial}; to continue, run the same command again "
                       f"with --resume")


def distill_saved(partial: Path) -> str | None:
    """'step N of M' of the distill checkpoint in `partial` (None when there is none)."""
    import torch

    from specpress.compress.training import STATE_FILE

    f = partial / STATE_FILE
    if not f.is_file():
        return None
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError):
        return "an unreadable checkpoint"
    return f"step {int(state['step'])} of {int(state['planned'])}"


def regen_saved(partial: Path) -> str | None:
    """'N of M sequences' of the regenerate run whose lines are in `partial` (None when there is none)."""
    import json

    f = partial.with_name(partial.name + ".state")
    try:
        state = json.loads(f.read_text())
        return f"{int(state['done'])} of {int(state['key']['sequences'])} sequences"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_not_quantized(drafter_dir: Path, flag: str) -> None:
    """Training needs float weights: a drafter whose weights are quantized codes is refused, saying why."""
    from specpress.models.drafter_io import active_quantize_step, read_drafter_config

    raw = read_drafter_config(drafter_dir)[2]
    step = active_quantize_step((raw.get("specpress") or {}).get("steps"))
    if step is not None:
        raise UsageError(f"{flag} {drafter_dir} is quantized ({step.get('scheme')}): its weights are integer codes "
                         f"that cannot be trained; give the float drafter it was made from (its provenance: "
                         f"`specpress inspect {drafter_dir}`), or one written with quantize --dequantize")
