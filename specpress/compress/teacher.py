"""Teacher signals: the target's logits, final hidden and taps on a batch, on the fly or from a disk cache.

On the fly (default) the target runs on each batch under no_grad; nothing outlives the step. With a
cache directory (`--cache-teacher DIR`) each step's final hidden and taps are written once as one
float32 .npy file [1 + taps, B, T, H] under DIR/<key>/ and memory-mapped when a later run (same
target weights, data, seed, batch, window length, taps) needs them; logits are recomputed through the
target's lm_head from the cached hidden (the same op on the same values, so cached and uncached runs
are bit-identical) — the vocabulary-sized tensors are never stored. Disk per step:
4·(1 + taps)·B·T·H bytes (e.g. 4 MB for the zoo target with 3 taps, B 8, T 128).

compile=True runs the target's forward through TorchInductor with fixed shapes (every step's windows
have the same [B, T]): on the zoo target's CPU teacher forward 42-45 -> 28-31 ms a step, after 15-25 s
of compiling on the first call (bench/teacher_forward.py). Its bf16 kernels round differently from eager
autocast (0.4 % of the teacher's top-1 tokens on a batch of random windows are near-ties that flip), so a
compiled run is deterministic for its seed but not equal to an eager one, and with a cache its hits
(logits through the eager head) match its misses only up to that rounding.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import Tensor

from specpress.artifacts import atomic_file, write_file
from specpress.compress.losses import TeacherBatch
from specpress.errors import CheckpointError
from specpress.models.drafter import Drafter
from specpress.models.target import TargetModel


@torch.no_grad()
def target_signals(target: TargetModel | Callable[..., Any], ids: Tensor, taps: tuple[int, ...]) -> TeacherBatch:
    """The target's logits, final hidden and taps on windows ids [B, T] (no graph kept), as float32 even
    when the forward ran under bf16 autocast, so cached and on-the-fly signals hand the student the same
    values in the same dtype. `target` may be a compiled wrapper of the target."""
    out = target(ids, taps=taps)
    assert out.logits is not None
    return TeacherBatch(ids, out.logits.float(), out.hidden.float(), {k: v.float() for k, v in out.taps.items()})


def needed_taps(*drafters: Drafter | None) -> tuple[int, ...]:
    """The union of the target taps the given drafters read (sorted)."""
    return tuple(sorted({i for d in drafters if d is not None for i in d.taps}))


class Teacher:
    """`signals(step, ids, rows)` -> TeacherBatch for the windows of training step `step`.

    cache_dir None: computed on the fly. Else cached per (step, rows) under cache_dir/<hash of key>/.
    """

    def __init__(self, target: TargetModel, taps: tuple[int, ...], cache_dir: str | Path | None = None,
                 key: Mapping[str, Any] | None = None, compile: bool = False) -> None:
        self.target, self.taps = target, tuple(taps)
        self.forward: TargetModel | Callable[..., Any] = torch.compile(target, dynamic=False) if compile else target
        self.dir: Path | None = None
        if cache_dir is not None:
            full = {**dict(key or {}), "taps": list(self.taps), "format": 1}
            blob = json.dumps(full, sort_keys=True, default=str).encode()
            self.dir = Path(cache_dir).expanduser() / hashlib.sha256(blob).hexdigest()[:16]
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = self.dir / "key.json"
            if not meta.exists():
                write_file(meta, json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
        self.hits = self.misses = 0

    def signals(self, step: int, ids: Tensor, rows: tuple[int, int] = (0, 0)) -> TeacherBatch:
        if self.dir is None:
            return target_signals(self.forward, ids, self.taps)
        f = self.dir / f"step-{step:08d}-rows-{rows[0]}-{rows[1]}.npy"
        if f.exists():
            try:
                arr = np.load(f, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise CheckpointError(f"{f} is not a readable teacher cache file ({exc}); delete it") from None
            if arr.shape[1:3] != tuple(ids.shape):
                raise CheckpointError(f"{f} holds windows of shape {arr.shape[1:3]}, expected {tuple(ids.shape)}; "
                                      f"delete {self.dir}")
            self.hits += 1
            stacked = torch.from_numpy(np.array(arr)).to(ids.device, self.target.lm_head.weight.dtype)
            hidden = stacked[0]
            with torch.no_grad():
                logits = self.target.lm_head(hidden).float()
            return TeacherBatch(ids, logits, hidden, {t: stacked[1 + i] for i, t in enumerate(self.taps)})
        self.misses += 1
        batch = target_signals(self.forward, ids, self.taps)
        stacked = torch.stack([batch.hidden] + [batch.taps[t] for t in self.taps]).float().cpu().numpy()
        with atomic_file(f) as tmp, open(tmp, "wb") as fh:
            np.save(fh, stacked)
        return batch
