"""Training plumbing of distill: fingerprints, per-step randomness, the lr schedule and checkpoints in
distill's terms (the shared schedule, timer and atomic save are specpress/checkpoint.py's), and
torch.distributed (torchrun) helpers."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from specpress.checkpoint import read_state, warmup_cosine, warmup_cosine_at_progress
from specpress.compress.config import DistillConfig
from specpress.errors import CheckpointError

STATE_FILE = "state.pt"


def data_fingerprint(stream: np.ndarray) -> dict[str, Any]:
    return {"tokens": int(len(stream)),
            "sha256": hashlib.sha256(np.ascontiguousarray(stream).tobytes()).hexdigest()[:16]}


def module_fingerprint(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()[:16]


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step `step`'s random draws (noise, anchors): a pure function of (seed, step)."""
    s = int(np.random.SeedSequence([seed, step, 0x5D15]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(s & ((1 << 63) - 1))


def lr_at(step: int, planned: int, cfg: DistillConfig) -> float:
    """Warmup over `warmup_ratio` of the `planned` steps (one at least), then cosine decay to `lr * min_lr_ratio`."""
    warm = max(1, int(math.ceil(cfg.warmup_ratio * planned)))
    return warmup_cosine(step, warm, planned, cfg.lr, cfg.min_lr_ratio)


def lr_at_progress(progress: float, cfg: DistillConfig) -> float:
    """The same warmup + cosine as `lr_at`, over the fraction of a wall-clock budget used (0..1).

    `--minutes` alone schedules by time: a plan in steps, sized up front, ran 11 % long when its timed
    passes were fast and ended at 40 % of the budget when they were slowed by another job (measured).
    """
    return warmup_cosine_at_progress(progress, cfg.warmup_ratio, cfg.lr, cfg.min_lr_ratio)


def first_difference(old: Any, new: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first leaf where two JSON-like values differ: (dotted path, old, new), or None."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in sorted(set(old) | set(new), key=str):
            d = first_difference(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
            if d:
                return d
        return None
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            d = first_difference(a, b, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if old == new else (path or "(root)", old, new)


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


# what a distill checkpoint holds: key -> the types its value may have
STATE_FIELDS: dict[str, tuple[type, ...]] = {"student": (dict,), "optimizer": (dict,), "step": (int,),
                                             "seconds": (int, float), "planned": (int,), "rng": (Tensor,),
                                             "recent": (list,), "key": (dict,)}
START_OVER = "to start over, run the same command with --force instead of --resume (it discards {partial})"


def load_state(path: Path, key: Mapping[str, Any]) -> dict[str, Any]:
    """The distill checkpoint at `path`, checked: readable without running code, the objects a checkpoint
    holds, and written by a run with the same `key` (config, student, target, data, world size)."""
    fix = START_OVER.format(partial=path.parent)
    state = read_state(path, STATE_FIELDS, fix, "distill checkpoint")
    diff = first_difference(state["key"], dict(key))
    if diff:
        where, old, new = diff
        raise CheckpointError(f"{path.parent} is from a different run: {where} is {old!r} there but {new!r} now; "
                              f"rerun with the original settings to continue it, or {fix}")
    return state


def world_info() -> tuple[int, int]:
    """(rank, world size); initialises torch.distributed under torchrun (WORLD_SIZE > 1)."""
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    if ws <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def all_reduce_mean(tensors: list[Tensor], world: int) -> None:
    if world <= 1:
        return
    import torch.distributed as dist

    for t in tensors:
        dist.all_reduce(t)
        t.div_(world)



def from_rank0(value: int, world: int, device: torch.device) -> int:
    """Rank 0's `value` on every rank (decisions that depend on a clock must agree across ranks)."""
    if world <= 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.broadcast(t, src=0)
    return int(t)
