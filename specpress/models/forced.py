"""The teacher-forced forward: a drafter run the way the runtime drafts, on windows of the target's signals.

ONE function per draft kind, registered on each family's descriptor (`Family.teacher_forced`), used by
distillation (compress/losses.py), importance scoring (compress/importance.py) and quantization
calibration (compress/quantize/calibrate.py). All take the same arguments:

    teacher_forced(drafter, ids [B, T], feats [B, T, F] | None, *, steps=1, span=None, anchors=None) -> Forced

feats = the drafter's input features from the target (`input_features`: the fused taps, or the final
normed hidden for drafters without taps); Forced holds what the kind produces.

Alignment on a window x [B, T] (target logits z_j predict x_{j+1}):

  chain (eagle, eagle3, mtp): `steps` chained draft steps over positions j < n (n = `span`, default
    T - steps - 1, so every drafted token has a label). Step 0 at j reads (feats_j, x_{j+1}) at position j
    and drafts x_{j+2} ~ z_{j+1}; step i reads its own previous output g and x_{j+1+i} at position j + i
    and drafts x_{j+2+i} ~ z_{j+1+i}. Step i at j sees the step-0 entries at j' <= j (the accepted
    context) and its own chain (steps 1..i at j), through a cache that keeps gradients (TrainKV); a
    drafter with several draft modules (MTP) runs module i % modules at step i, and a query sees only its
    module's entries. Forced.steps = [(logits [B, n, V'], g [B, n, H])] per step.
  block (dflash): blocks [x_a, MASK x (B-1)] at anchors a (`anchors` [B, N], default every block_size
    tokens from 1) in one pass with the context features f_{<a} injected; block slot k >= 1 drafts x_{a+k}
    ~ z_{a+k-1}. Forced.features = final normed block hidden [B, N, Bk, H] (slot 0, the anchor, drafts
    nothing); Forced.inputs = the drafter's arguments (to run another drafter on the same blocks).
  lm: the drafter over x; position j drafts x_{j+1} ~ z_j. Forced.steps = [(logits [B, T, V], None)].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from specpress.errors import RequestError
from specpress.models.kv import KVCache

if TYPE_CHECKING:
    from specpress.models.drafter import Drafter


@dataclass
class Forced:
    """What one teacher-forced pass produced (see the module docstring for each kind)."""

    steps: list[tuple[Tensor, Tensor | None]] = field(default_factory=list)
    features: Tensor | None = None  # block: [B, N, Bk, H]
    inputs: tuple[Any, ...] = ()  # block: (ctx feats, block ids [B, N·Bk], positions, mask)
    anchors: Tensor | None = None  # block: [B, N]

    def draft_logits(self, d: "Drafter") -> Tensor:
        """Logits of every drafted token, shaped like its reference: chain [B, n, K, V'] (K steps), block
        [B, N, Bk-1, V], lm [B, T, V]."""
        if self.features is not None:
            return d.head(self.features)[:, :, 1:]
        if len(self.steps) == 1 and self.steps[0][1] is None:
            return self.steps[0][0]
        return torch.stack([lg for lg, _ in self.steps], dim=2)


TeacherForced = Callable[..., Forced]


def input_features(d: "Drafter", hidden: Tensor, taps: Mapping[int, Tensor]) -> Tensor:
    """The drafter's input features [B, T, F] from the target's signals: its fused taps, or the final normed
    hidden when it reads no taps (the same rule as the runtime's)."""
    return d.fuse_taps(taps) if d.taps else hidden


# ----------------------------------------------------------------------------------------------
# chain: training-time test with an autograd-friendly cache
# ----------------------------------------------------------------------------------------------


class TrainKV(KVCache):
    """A KVCache that grows by concatenation, so gradients flow through cached K/V of earlier steps.

    Same interface as KVCache for the drafter forwards (reserve / write / length); a layer that was
    not written during a call gets zero slots there (the unrolled mask never lets a query see them).
    """

    def __init__(self) -> None:  # noqa: D107 (no preallocation)
        self.length = 0
        self._k: dict[int, Tensor] = {}
        self._v: dict[int, Tensor] = {}

    @property
    def capacity(self) -> int:
        return 1 << 30

    def reserve(self, t: int) -> int:
        return self.length

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k/v [B, Hkv, T, D] appended at slots [length, length+T); returns slots [0, length+T)."""
        out = []
        for store, new in ((self._k, k), (self._v, v)):
            old = store.get(layer)
            have = 0 if old is None else old.shape[2]
            parts = [] if old is None else [old]
            if have < self.length:
                parts.append(new.new_zeros(*new.shape[:2], self.length - have, new.shape[3]))
            parts.append(new)
            store[layer] = torch.cat(parts, dim=2)
            out.append(store[layer])
        return out[0], out[1]

    def crop(self, length: int) -> None:
        raise NotImplementedError("TrainKV only grows (training-time test)")

    def compact(self, base: int, keep: Sequence[int]) -> None:
        raise NotImplementedError("TrainKV only grows (training-time test)")


def unrolled_mask(n: int, step: int, modules: Sequence[int], device: torch.device | str = "cpu") -> Tensor:
    """Bool [n, (step+1)·n]: what step `step` at index j sees among the slots of steps 0..step.

    modules[s] = the module (cache layer group) step s runs; a query sees only its own module's slots:
    the module's first step causally (j' <= j, the accepted context), its later steps on the diagonal
    (the query's own draft chain). One module for all steps = EAGLE-3's training-time test.
    """
    m = modules[step]
    first = modules.index(m)
    tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=device)
    zero = torch.zeros(n, n, dtype=torch.bool, device=device)
    blocks = [zero if modules[s] != m else (tril if s == first else eye) for s in range(step + 1)]
    return torch.cat(blocks, dim=1)


def unroll(drafter: "Drafter", first_in: Tensor, ids: Tensor, steps: int, n: int) -> list[tuple[Tensor, Tensor]]:
    """Run `steps` chained draft steps over indices 0..n-1 (see the module docstring for alignment).

    first_in [B, n, *]: step-0 hidden inputs; ids [B, T] with T >= n + steps.
    Returns [(logits [B, n, V or Vd], g [B, n, H])] per step.
    """
    modules = [s % drafter.draft_modules() for s in range(steps)]
    cache = TrainKV()
    h, outs = first_in, []
    base = torch.arange(n, device=ids.device)
    for i in range(steps):
        logits, g = drafter(h, ids[:, 1 + i:1 + i + n], cache=cache, positions=base + i,
                            mask=unrolled_mask(n, i, modules, ids.device), **drafter.step_kwargs(i))
        outs.append((logits, g))
        h = g
    return outs


def chain(d: "Drafter", ids: Tensor, feats: Tensor | None, *, steps: int = 1, span: int | None = None,
          anchors: Tensor | None = None) -> Forced:
    """eagle / eagle3 / mtp: `steps` chained steps from feats[:, :n] (n = span or T - steps - 1)."""
    assert feats is not None, "chained drafters read the target's features"
    t = ids.shape[1]
    n = t - steps - 1 if span is None else span
    if n < 1 or n + steps > t:
        raise RequestError(f"windows of {t} tokens are too short for {steps} chained draft steps; "
                           f"use --seq-len >= {steps + 2}")
    return Forced(steps=unroll(d, feats[:, :n], ids, steps, n))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# block: many anchors per window in one pass with a block-structured mask
# ----------------------------------------------------------------------------------------------


def block_inputs(d: "Drafter", ids: Tensor, anchors: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """(block ids [B, N·Bk], positions [B, T + N·Bk], mask bool [B, N·Bk, T + N·Bk]) for `features`."""
    b, t = ids.shape
    n = anchors.shape[1]
    dev = ids.device
    blocks = d.make_block(ids.gather(1, anchors).flatten(), block).view(b, n * block)  # type: ignore[operator]
    offs = torch.arange(block, device=dev)
    bpos = (anchors[..., None] + offs).view(b, n * block)
    pos = torch.cat([torch.arange(t, device=dev).expand(b, t), bpos], dim=1)
    qa = anchors.repeat_interleave(block, dim=1)  # [B, N·Bk] anchor of each query
    ctx_ok = torch.arange(t, device=dev)[None, None, :] < qa[..., None]  # context strictly before the anchor
    qb = torch.arange(n, device=dev).repeat_interleave(block)
    own = (qb[:, None] == qb[None, :]).expand(b, -1, -1)  # bidirectional within its own block
    return blocks, pos, torch.cat([ctx_ok, own], dim=2)


def spaced_anchors(batch: int, t: int, block: int, device: torch.device) -> Tensor:
    """[B, N] anchors every `block` tokens from 1 (non-overlapping blocks, every label inside the window)."""
    if t - block < 1:
        raise RequestError(f"windows of {t} tokens are too short for blocks of {block}; use --seq-len >= {block + 2}")
    return torch.arange(1, t - block + 1, block, device=device).expand(batch, -1)


def block(d: "Drafter", ids: Tensor, feats: Tensor | None, *, steps: int = 1, span: int | None = None,
          anchors: Tensor | None = None) -> Forced:
    """dflash: blocks at `anchors` (default spaced_anchors) with the context feats injected."""
    b, t = ids.shape
    bk = d.config.block_size
    if anchors is None:
        anchors = spaced_anchors(b, t, bk, ids.device)
    blocks, pos, mask = block_inputs(d, ids, anchors, bk)
    feats_out = d.features(feats, blocks, positions=pos, mask=mask)  # type: ignore[operator]
    return Forced(features=feats_out.view(b, -1, bk, feats_out.shape[-1]), inputs=(feats, blocks, pos, mask),
                  anchors=anchors)


# ----------------------------------------------------------------------------------------------
# lm: an independent LM over the tokens
# ----------------------------------------------------------------------------------------------


def lm(d: "Drafter", ids: Tensor, feats: Tensor | None = None, *, steps: int = 1, span: int | None = None,
       anchors: Tensor | None = None) -> Forced:
    """lm: the drafter's logits over the window."""
    return Forced(steps=[(d(ids).logits, None)])


__all__ = ["Forced", "TeacherForced", "input_features", "TrainKV", "unrolled_mask", "unroll", "chain", "block_inputs",
           "spaced_anchors", "block", "lm"]
