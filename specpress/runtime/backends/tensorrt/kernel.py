"""The math of the `specpress::TreeAttention` node (contract §3), in torch.

One function, `tree_attention`, is what the TensorRT plugin's `enqueue` calls on the GPU and what the
tests call on CPU against `models.layers.attention` with an explicit boolean mask. It decodes the
compact mask (committed length + LSB-first int32 words, TensorRT-LLM's `spec_decoding_packed_mask`
layout) with tensor ops only, so it never synchronises with the host (no `.item()`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specpress.models.layers import attention


def decode_tree_mask(committed: Tensor, tree_mask: Tensor, slots: int) -> Tensor:
    """committed int32 [1], tree_mask int32 [T, W] -> bool [T, slots] (True = may attend).

    Slot j < committed is visible to every query; slot committed + 32*w + b is visible to query t when
    bit b (LSB-first) of word w of row t is set.
    """
    j = torch.arange(slots, device=tree_mask.device, dtype=torch.int64)
    rel = j - committed.to(torch.int64).reshape(())  # [S]: position after the committed context
    off = rel.clamp(min=0)
    word_idx = (off // 32).clamp(max=tree_mask.shape[1] - 1)
    words = tree_mask.to(torch.int64)[:, word_idx]  # [T, S]
    bits = (words >> (off % 32)) & 1
    return (rel < 0) | bits.bool()


def tree_attention(q: Tensor, k: Tensor, v: Tensor, committed: Tensor, tree_mask: Tensor,
                   scale: float) -> Tensor:
    """q [B, Hq, T, D], k/v [B, Hkv, S, D], committed int32 [1], tree_mask int32 [T, ceil((S-c)/32)]
    -> out [B, Hq, T, D] = softmax(q k^T * scale + bias) v, GQA by head h -> kv head h // (Hq/Hkv).

    The attention itself is `models.layers.attention` (SDPA's default scale 1/sqrt(D)); another
    `scale` is folded into q first.
    """
    mask = decode_tree_mask(committed, tree_mask, k.shape[2])[None, None]
    default = 1.0 / math.sqrt(q.shape[-1])
    if not math.isclose(scale, default, rel_tol=1e-6):
        q = q * (scale / default)
    return attention(q, k, v, mask)
