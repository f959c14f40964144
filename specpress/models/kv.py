"""A preallocated KV cache shared by the target and the drafters.

Layout: k, v [L, B, Hkv, capacity, D]; slots [0, length) are valid. After a tree verify the
runtime keeps only the accepted path: `compact(base, keep)` moves slots base+keep[i] to base+i.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from specpress.errors import RequestError


class KVCache:
    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k/v [B, Hkv, T, D] at slots [length, length+T); return views of slots [0, length+T)."""
        start, end = self.length, self.length + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reserve(self, t: int) -> int:
        """Check that `t` more tokens fit; return the current length (the slot the first one takes)."""
        if self.length + t > self.capacity:
            raise RequestError(f"KV cache holds {self.capacity} tokens; {self.length + t} needed "
                               f"(allocate a larger cache with new_cache(max_len))")
        return self.length

    def crop(self, length: int) -> None:
        """Forget every slot at or after `length`."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def compact(self, base: int, keep: Sequence[int]) -> None:
        """Keep new-token slots base+keep[0], base+keep[1], … at base, base+1, …; drop the rest.

        `keep` indexes the tokens written since `base` (e.g. tree nodes), in the order to keep.
        """
        keep_t = torch.as_tensor(list(keep), dtype=torch.long, device=self.k.device)
        if keep_t.numel() and (int(keep_t.min()) < 0 or base + int(keep_t.max()) >= self.length):
            raise ValueError(f"compact: keep {list(keep)} outside the {self.length - base} slots after {base}")
        n = keep_t.numel()
        if n:
            src = base + keep_t
            self.k[:, :, :, base:base + n] = self.k.index_select(3, src)
            self.v[:, :, :, base:base + n] = self.v.index_select(3, src)
        self.length = base + n

    def clone(self) -> "KVCache":
        other = type(self).__new__(type(self))
        other.k, other.v, other.length = self.k.clone(), self.v.clone(), self.length
        return other


KV_FORMATS = ("none", "fp8")


class Fp8KVCache(KVCache):
    """A drafter's KV cache held in float8 e4m3 (Edge-LLM's and vLLM's fp8 KV cache): every K/V vector written
    is rounded to e4m3 with its own scale, amax over the head dimension / 448 (dynamic, per token and head),
    and kept dequantized, so attention reads exactly what an fp8 cache returns. Storage stays in the cache
    dtype here: this measures the acceptance cost, not the memory."""

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return super().write(layer, fp8_rows(k), fp8_rows(v))


def fp8_rows(x: Tensor) -> Tensor:
    """x [..., D] rounded to e4m3 with one scale per row (amax / 448), back in x's dtype."""
    from specpress.models.quantized.activations import FP8_MAX, fake_fp8, per_token_amax

    xf = x.float()
    return fake_fp8(xf, per_token_amax(xf) / FP8_MAX).to(x.dtype)
