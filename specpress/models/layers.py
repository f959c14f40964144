"""Building blocks shared by every network in specpress: norm, rotary, MLP, attention.

Masks, positions and caches are arguments, never module attributes. Shapes use
B = batch, T = new tokens, S = attended length (past + T), H = heads, D = head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specpress.errors import ConfigError


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, computed in fp32 like Llama (float64 stays float64)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# ----------------------------------------------------------------------------------------------
# Rotary embeddings
# ----------------------------------------------------------------------------------------------

# "dynamic" (NTK) is left out on purpose: its frequencies depend on the longest sequence seen so far,
# so cached keys and fresh queries disagree after the threshold; a clear error beats a silent drift.
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    """RoPE parameters in the HF sense (`rope_theta` + `rope_scaling` / `rope_parameters`)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3, yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn
    truncate: bool = True  # yarn

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(
                f"rope scaling type {self.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )
        if self.rope_type in ("llama3", "yarn") and self.original_max_position_embeddings is None:
            raise ConfigError(f"rope_scaling type {self.rope_type!r} needs 'original_max_position_embeddings'")

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> "RopeConfig":
        """Read `rope_theta` + `rope_scaling` (transformers 4.x) or `rope_parameters` (5.x)."""
        params = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or {})
        merged = {**scaling, **params}
        theta = float(merged.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
        kwargs: dict[str, Any] = {"theta": theta, "rope_type": rope_type}
        for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
            if merged.get(key) is not None:
                kwargs[key] = float(merged[key])
        if merged.get("original_max_position_embeddings") is not None:
            kwargs["original_max_position_embeddings"] = int(merged["original_max_position_embeddings"])
        elif rope_type == "yarn":
            kwargs["original_max_position_embeddings"] = int(cfg.get("max_position_embeddings", 2048))
        if "truncate" in merged:
            kwargs["truncate"] = bool(merged["truncate"])
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """The `rope_parameters` dict transformers 5 writes (4.x reads `rope_theta`/`rope_scaling`)."""
        out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.theta}
        if self.rope_type != "default":
            out["factor"] = self.factor
        if self.rope_type == "llama3":
            out.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor)
        if self.rope_type == "yarn":
            out.update(beta_fast=self.beta_fast, beta_slow=self.beta_slow)
            if self.attention_factor is not None:
                out["attention_factor"] = self.attention_factor
        if self.original_max_position_embeddings is not None:
            out["original_max_position_embeddings"] = self.original_max_position_embeddings
        return out


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[Tensor, float]:
    """Inverse frequencies [D/2] and the cos/sin scale for a rope config (static types)."""
    dim = head_dim
    base = rope.theta
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scale = 1.0
    if rope.rope_type == "linear":
        inv = inv / rope.factor
    elif rope.rope_type == "llama3":
        old = rope.original_max_position_embeddings
        assert old is not None
        low_wl, high_wl = old / rope.low_freq_factor, old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, scaled)
    elif rope.rope_type == "yarn":
        inv, scale = _yarn(rope, dim)
    return inv, scale


def _yarn(rope: RopeConfig, dim: int) -> tuple[Tensor, float]:
    base, factor = rope.theta, rope.factor
    omax = rope.original_max_position_embeddings
    assert omax is not None
    scale = rope.attention_factor if rope.attention_factor is not None else (
        1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0)

    def corr_dim(rot: float) -> float:
        return (dim * math.log(omax / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(rope.beta_fast), corr_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos = base ** (torch.arange(0, dim, 2).float() / dim)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    return inv, float(scale)


class Rotary(nn.Module):
    """cos/sin tables evaluated at explicit positions (tree nodes share positions by depth)."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.max_positions = max_positions
        inv, scale = rope_inv_freq(rope, head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.scale = scale

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D]."""
        inv = self.inv_freq.to(positions.device)
        freqs = positions.float()[..., None] * inv  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.scale).to(dtype)[:, None]
        sin = (emb.sin() * self.scale).to(dtype)[:, None]
        return cos, sin


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D] rotated by cos/sin [B, 1, T, D]."""
    return x * cos + rotate_half(x) * sin


# ----------------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------------


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Scaled dot-product attention with GQA.

    q [B, Hq, T, D], k/v [B, Hkv, S, D], mask bool [B|1, 1|Hq, T, S] (True = may attend) or None
    (no masking). Returns [B, Hq, T, D].
    """
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_mask(t: int, past: int, device: torch.device | str = "cpu") -> Tensor:
    """Bool [T, past+T]: new token i sees every cached slot and new tokens 0..i."""
    full = torch.ones(t, past + t, dtype=torch.bool, device=device)
    return torch.cat([full[:, :past], torch.tril(full[:, past:])], dim=1)


def resolve_positions(positions: Tensor | None, b: int, t: int, past: int, device: torch.device) -> Tensor:
    """positions [B, T] or [T] (default past..past+T-1) -> [B, T]."""
    if positions is None:
        positions = torch.arange(past, past + t, device=device)
    if positions.shape[-1] != t:
        raise ValueError(f"positions must cover the {t} new tokens, got shape {tuple(positions.shape)}")
    return positions[None].expand(b, t) if positions.dim() == 1 else positions


def resolve_mask(mask: Tensor | None, t: int, past: int, device: torch.device, *, causal: bool = True,
                 queries: int | None = None) -> Tensor | None:
    """An attention mask argument -> bool [B|1, 1, Q, past+T] for `attention`, or None (see all).

    mask: bool [Q, past+T] or [B, Q, past+T], True = may attend; Q = `queries` (default T).
    With no mask: causal over the new tokens when `causal` (None when T == 1), else None.
    """
    q = t if queries is None else queries
    if mask is None:
        return causal_mask(t, past, device)[None, None] if causal and t > 1 else None
    if mask.dim() not in (2, 3) or tuple(mask.shape[-2:]) != (q, past + t):
        raise ValueError(f"mask must be [{q}, {past + t}] or [B, {q}, {past + t}] (queries x (past + new)), "
                         f"got {tuple(mask.shape)}")
    return mask[None, None] if mask.dim() == 2 else mask[:, None]
