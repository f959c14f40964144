"""Pure tensor functions: quantize / dequantize a weight matrix per scheme, and pack 4-bit codes.

Every function takes a float weight W [N, K] (N = out_features, K = in_features) and returns plain
tensors; nothing here knows about modules, files or bitsandbytes. Codes are unsigned integers with a
zero point: w ≈ (q - z) · s. Groups run along K (the input dimension), so one group is G consecutive
inputs of one output row; `group_size=None` means one group per row (per-output-channel).

Symmetric int-b: z = 2^(b-1) for every group (implicit, not stored), and
  - b = 8: s = absmax / 127, q - z in [-127, 127] (int8 per-channel, as everyone does it);
  - b = 4: s = m / -8 where m is the group's largest-magnitude value WITH its sign (llama.cpp Q4_0's
    rule): m maps exactly to -8, so the biggest weight is never clipped, and the other side clips at +7.
Asymmetric int-b: s = (max - min) / (2^b - 1), z = round(-min / s) clamped to [0, 2^b - 1].
A group of zeros gets s = 1 (any s reproduces it exactly).

fp8 e4m3: per-output-channel (or per-tensor) s = absmax / 448 (e4m3's largest finite value), w8 = (w / s)
cast to torch.float8_e4m3fn (round to nearest even), w ≈ w8 · s.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def num_groups(k: int, group_size: int | None) -> int:
    return 1 if group_size is None else k // group_size


def _grouped(w: Tensor, group_size: int | None) -> Tensor:
    """W [N, K] -> [N, K/G, G] (G = K when group_size is None); K must be divisible by G."""
    n, k = w.shape
    g = k if group_size is None else group_size
    if k % g:
        raise ValueError(f"group size {g} does not divide in_features {k}")
    return w.reshape(n, k // g, g)


def int_params(w: Tensor, bits: int, group_size: int | None, symmetric: bool) -> tuple[Tensor, Tensor]:
    """Scales and zero points [N, K/G] (float32) of W [N, K] for int-`bits` codes."""
    g = _grouped(w.float(), group_size)
    qmax = 2 ** bits - 1
    if symmetric:
        if bits == 4:
            idx = g.abs().argmax(dim=-1, keepdim=True)
            scale = (g.gather(-1, idx) / -8.0).squeeze(-1)
        else:
            scale = g.abs().amax(dim=-1) / (2 ** (bits - 1) - 1)
        zero = torch.full_like(scale, 2 ** (bits - 1))
    else:
        lo = g.amin(dim=-1).clamp(max=0.0)
        hi = g.amax(dim=-1).clamp(min=0.0)
        scale = (hi - lo) / qmax
        zero = torch.zeros_like(scale)
        nz = scale != 0
        zero[nz] = (-lo[nz] / scale[nz]).round().clamp(0, qmax)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale, zero


def quantize_with(w: Tensor, scale: Tensor, zero: Tensor, bits: int, symmetric: bool) -> Tensor:
    """Codes q [N, K] (int16, unsigned range) of W [N, K] under scales / zeros [N, K/G]."""
    n, k = w.shape
    ng = scale.shape[1]
    g = w.float().reshape(n, ng, k // ng)
    lo, hi = (1, 2 ** bits - 1) if symmetric and bits == 8 else (0, 2 ** bits - 1)
    q = (g / scale[..., None]).round() + zero[..., None]
    return q.clamp(lo, hi).to(torch.int16).reshape(n, k)


def dequantize_int(q: Tensor, scale: Tensor, zero: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Codes q [N, K] with scales / zeros [N, K/G] -> W [N, K] in `dtype` (computed in float32)."""
    n, k = q.shape
    ng = scale.shape[1]
    g = q.float().reshape(n, ng, k // ng)
    return ((g - zero.float()[..., None]) * scale.float()[..., None]).reshape(n, k).to(dtype)


def quantize_int(w: Tensor, bits: int, group_size: int | None, symmetric: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Round-to-nearest: W [N, K] -> (codes [N, K] int16, scales [N, K/G] f32, zeros [N, K/G] f32)."""
    scale, zero = int_params(w, bits, group_size, symmetric)
    return quantize_with(w, scale, zero, bits, symmetric), scale, zero


def pack_int4(q: Tensor) -> Tensor:
    """Codes [N, K] in 0..15 (K even) -> uint8 [N, K/2]; column 2j in the low nibble, 2j+1 in the high one
    (onnxruntime MatMulNBits' order)."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(p: Tensor) -> Tensor:
    """uint8 [N, K/2] -> codes [N, K] (uint8, 0..15); inverse of pack_int4."""
    lo, hi = p & 0x0F, p >> 4
    return torch.stack([lo, hi], dim=-1).reshape(p.shape[0], 2 * p.shape[1])


def quantize_fp8(w: Tensor, per_tensor: bool = False) -> tuple[Tensor, Tensor]:
    """W [N, K] -> (float8_e4m3fn [N, K], scales f32: per output channel [N], or [1] for the whole tensor)."""
    wf = w.float()
    scale = wf.abs().amax().reshape(1) / FP8_MAX if per_tensor else wf.abs().amax(dim=1) / FP8_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def dequantize_fp8(w8: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return (w8.float() * scale.float()[:, None]).to(dtype)


def sqnr(ref: Tensor, approx: Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10·log10(|ref|² / |ref - approx|²) (inf when equal)."""
    ref, approx = ref.double(), approx.double()
    noise = (ref - approx).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
