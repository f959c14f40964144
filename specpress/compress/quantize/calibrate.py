"""Calibration inputs: run the drafter the way the runtime does, on the target's hidden states.

`DrafterCalibration(target, drafter, sampler, batches)` runs the target once per window batch (taps =
drafter.taps, no logits) and keeps its hidden states; calling it with a model runs that model's
forward on every batch under no_grad, so forward hooks see the activations entering each Linear:

    eagle / eagle3   drafter(features[:, :-1], ids[:, 1:])  (eagle: final normed hidden; eagle3: fused taps)
    mtp              the chained pass: step k reads the previous step's output, for every MTP module
    dflash           blocks [anchor, MASK…] at anchors spaced every block_size tokens, context = fused taps
    lm               drafter(ids)

It is the `forward_loop` the calibrated methods take (ModelOpt's convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specpress.compress.data import WindowSampler
from specpress.models.drafter import Drafter
from specpress.models.target import TargetModel


@dataclass(frozen=True)
class _Batch:
    ids: Tensor  # [B, T]
    hidden: Tensor  # [B, T, H] final normed hidden
    taps: dict[int, Tensor]


class DrafterCalibration:
    """A forward loop over `batches` windows of `sampler` (target signals computed once, kept in memory:
    (1 + taps)·B·T·H floats per batch)."""

    def __init__(self, target: TargetModel, drafter: Drafter, sampler: WindowSampler, batches: int = 8,
                 first_step: int = 0) -> None:
        self.family = drafter.family
        self.taps = tuple(drafter.taps)
        self.windows = batches * sampler.batch
        self.tokens = self.windows * sampler.seq_len
        dev = target.lm_head.weight.device
        self.batches: list[_Batch] = []
        with torch.no_grad():
            for i in range(batches):
                ids = sampler.batch_at(first_step + i).to(dev)
                out = target(ids, taps=self.taps, logits="none")
                self.batches.append(_Batch(ids, out.hidden, dict(out.taps)))

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        for b in self.batches:
            drafter_forward(model, b.ids, b.hidden, b.taps)  # type: ignore[arg-type]


def drafter_forward(d: Drafter, ids: Tensor, hidden: Tensor, taps: dict[int, Tensor]) -> None:
    """One calibration forward of drafter `d` on windows ids [B, T] with the target's hidden / taps."""
    fam = d.family
    if fam == "lm":
        d(ids)
    elif fam in ("eagle", "eagle3"):
        feats = d.fuse_taps(taps) if fam == "eagle3" else hidden
        d(feats[:, :-1], ids[:, 1:])
    elif fam == "mtp":
        h = hidden[:, :-1]
        for k in range(d.config.num_nextn_predict_layers):
            n = ids.shape[1] - 1 - k
            if n < 1:
                break
            _, h = d(h[:, :n], ids[:, 1 + k:1 + k + n], step=k)
    elif fam == "dflash":
        from specpress.compress.losses import dflash_inputs

        bk = d.config.block_size
        b, t = ids.shape
        if t <= bk:
            raise ValueError(f"calibration windows of {t} tokens are too short for DFlash blocks of {bk}")
        anchors = torch.arange(1, t - bk + 1, bk, device=ids.device).expand(b, -1)
        blocks, pos, mask = dflash_inputs(d, ids, anchors, bk)
        d(d.fuse_taps(taps), blocks, positions=pos, mask=mask)
    else:
        raise ValueError(f"no calibration forward for drafter family {fam!r}")
