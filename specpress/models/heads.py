"""Draft heads a drafter may own in place of a dense `lm_head` Linear: the one home of their networks and math.

Which families own a head (models/family.py `draft_vocab`): eagle3 ("reduced": Vd draft tokens, mapped to
target ids by d2t) and lm ("own": the target's whole vocabulary, unless tied to its embeddings). eagle, mtp
and dflash draft through the target's own lm_head and store none. An owned head is, per its config:

  dense      nn.Linear(H, Vd): `lm_head.weight` [Vd, H] (the public layout)
  low rank   LowRankHead(H, Vd, R) = up(down(x)): `lm_head.down.weight` [R, H], `lm_head.up.weight` [Vd, R];
             R·(H + Vd) parameters instead of H·Vd. Both factors are ordinary Linears, so every quantization
             scheme handles them (`--include lm_head` selects both).
  shared     (eagle3 only) no tensor: the logits are the target's lm_head rows of the draft vocabulary
             (target id = draft id + d2t[draft id]) applied to the drafter's normed feature; the runtime
             borrows them from the target it is attached to, and they are counted as shared bytes.

`factorise` initialises a low-rank head by truncated SVD, optionally activation-aware: with the covariance
C = E[x xᵀ] of the head's inputs, the rank-R factors minimising E||(W - up·down) x||² are the truncated SVD
of W·L (C = L·Lᵀ) with L⁻¹ folded into `down` (SVD-LLM's whitening). The singular values are split evenly
(√S on each side), so the factors have similar ranges for quantization.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import ConfigError


class LowRankHead(nn.Module):
    """A Linear(in_features, out_features) factorised through `rank`: x [.., in] -> down [.., R] -> up [.., out]."""

    def __init__(self, in_features: int, out_features: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(in_features, rank, bias=False)
        self.up = nn.Linear(rank, out_features, bias=False)

    @property
    def in_features(self) -> int:
        return self.down.in_features

    @property
    def out_features(self) -> int:
        return self.up.out_features

    @property
    def rank(self) -> int:
        return self.down.out_features

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(x))


def make_head(in_features: int, out_features: int, rank: int | None) -> nn.Module:
    """The dense head, or its rank-`rank` factorisation."""
    return nn.Linear(in_features, out_features, bias=False) if rank is None else \
        LowRankHead(in_features, out_features, rank)


def check_rank(rank: int | None, in_features: int, out_features: int, family: str) -> None:
    """A rank must be a positive integer below min(in, out) (at or above it the product is merely dense)."""
    if rank is None:
        return
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank < min(in_features, out_features):
        top = min(in_features, out_features) - 1
        raise ConfigError(f"{family} config field 'head_rank' must be an integer in 1..{top} (below min(hidden "
                          f"{in_features}, head vocabulary {out_features})), found {rank!r}")


def dense_weight(head: nn.Module, dtype: torch.dtype = torch.float32) -> Tensor:
    """The head's weight [out, in] as it computes: a Linear's (a quantized one dequantised), or up · down."""
    if isinstance(head, LowRankHead):
        return dense_weight(head.up, torch.float32) @ dense_weight(head.down, torch.float32)
    return head.weight.detach().to(dtype)


def factorise(weight: Tensor, rank: int, cov: Tensor | None = None, damp: float = 1e-4) -> tuple[Tensor, Tensor]:
    """Rank-`rank` factors (down [R, in], up [out, R]) of weight [out, in], in float32, contiguous (the layout a
    saved head loads in, so a factorised drafter computes the same before and after a save: a transposed view
    takes another matmul kernel, which rounds differently).

    cov: the inputs' second moment E[x xᵀ] [in, in] (activation-aware), damped by `damp` x its mean diagonal;
    None: plain truncated SVD (the best rank-R approximation in Frobenius norm)."""
    w = weight.detach().double().cpu()
    if cov is None:
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        root = s[:rank].sqrt()
        return (root[:, None] * vh[:rank]).float().contiguous(), (u[:, :rank] * root).float().contiguous()
    c = cov.detach().double().cpu()
    c = c + damp * c.diagonal().mean().clamp_min(1e-12) * torch.eye(c.shape[0], dtype=c.dtype)
    chol = torch.linalg.cholesky(c)  # C = L Lᵀ
    u, s, vh = torch.linalg.svd(w @ chol, full_matrices=False)
    root = s[:rank].sqrt()
    down = torch.linalg.solve_triangular(chol, root[:, None] * vh[:rank], upper=False, left=False)  # √S·Vh·L⁻¹
    return down.float().contiguous(), (u[:, :rank] * root).float().contiguous()


def shared_head_logits(x: Tensor, target_head: Tensor, target_ids: Tensor) -> Tensor:
    """x [.., H] -> logits [.., Vd] through the target's head rows target_ids [Vd] (computed in x's dtype)."""
    return F.linear(x, target_head.index_select(0, target_ids).to(x.dtype))


__all__ = ["LowRankHead", "make_head", "check_rank", "dense_weight", "factorise", "shared_head_logits"]
