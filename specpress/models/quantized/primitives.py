"""Pure tensor functions: quantize / dequantize a weight matrix per scheme, and pack 4-bit codes.

Every function takes a float weight W [N, K] (N = out_features, K = in_features) and returns plain
tensors; nothing here knows about modules, files or bitsandbytes. Codes are unsigned integers with a
zero point: w ≈ (q - z) · s. Groups run along K (the input dimension), so one group is G consecutive
inputs of one output row; `group_size=None` means one group per row (per-output-channel).

Symmetric int-b: z = 2^(b-1) for every group (implicit, not stored), and
  - b = 8: s = absmax / 127, q - z in [-127, 127] (int8 per-channel, as everyone does it);
  - b <= 4: s = m / -2^(b-1) where m is the group's largest-magnitude value WITH its sign (llama.cpp
    Q4_0's rule, b = 4: m maps exactly to -8, so the biggest weight is never clipped, and the other side
    clips at +7; b = 3: [-4, 3]; b = 2: [-2, 1]).
Asymmetric int-b: s = (max - min) / (2^b - 1), z = round(-min / s) clamped to [0, 2^b - 1].
A group of zeros gets s = 1 (any s reproduces it exactly). With `scale_dtype` float16 (the low-bit
schemes store fp16 scales) s is rounded to it, its magnitude kept in fp16's normal range, before the
zero point and the codes are computed from it.

Codes of fewer than 8 bits pack densely, least significant bits first: element j of a row occupies bits
b·j .. b·j + b - 1 of the row's little-endian bit stream (pack_bits; int4 two per byte, int3 eight in
three bytes, int2 four per byte) — onnxruntime MatMulNBits' order within a byte and compressed-tensors'
pack-quantized order within its int32 words. Ternary codes 0..2 pack five per byte in base 3
(pack_trits: byte = sum c_i · 3^i, element 5j + i): 8/5 = 1.6 bits per code.

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


FP16_NORMAL_MIN, FP16_MAX = 2.0 ** -14, 65504.0


def round_scale(scale: Tensor, dtype: torch.dtype) -> Tensor:
    """float32 scales as `dtype` stores them, back in float32 (float16: magnitude clamped to its normal range,
    sign kept, then rounded to nearest); float32: unchanged."""
    if dtype == torch.float32:
        return scale.float()
    if dtype != torch.float16:
        raise ValueError(f"scales are stored as float32 or float16, not {dtype}")
    mag = scale.float().abs().clamp(FP16_NORMAL_MIN, FP16_MAX)
    return torch.where(scale < 0, -mag, mag).to(torch.float16).float()


def int_params(w: Tensor, bits: int, group_size: int | None, symmetric: bool,
               scale_dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Scales and zero points [N, K/G] (float32; the scales representable in `scale_dtype`) of W [N, K] for
    int-`bits` codes."""
    g = _grouped(w.float(), group_size)
    qmax = 2 ** bits - 1
    if symmetric:
        if bits <= 4:
            idx = g.abs().argmax(dim=-1, keepdim=True)
            scale = (g.gather(-1, idx) / -float(2 ** (bits - 1))).squeeze(-1)
        else:
            scale = g.abs().amax(dim=-1) / (2 ** (bits - 1) - 1)
        scale = round_scale(torch.where(scale == 0, torch.ones_like(scale), scale), scale_dtype)
        zero = torch.full_like(scale, 2 ** (bits - 1))
    else:
        lo = g.amin(dim=-1).clamp(max=0.0)
        hi = g.amax(dim=-1).clamp(min=0.0)
        scale = round_scale(torch.where(hi == lo, torch.ones_like(hi), (hi - lo) / qmax), scale_dtype)
        zero = torch.where(hi == lo, torch.zeros_like(hi), (-lo / scale).round().clamp(0, qmax))
    return scale, zero


def code_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """The unsigned codes int-`bits` uses: [1, 255] for symmetric int8 (-128 unused), else [0, 2^b - 1]."""
    return (1, 2 ** bits - 1) if symmetric and bits == 8 else (0, 2 ** bits - 1)


def quantize_with(w: Tensor, scale: Tensor, zero: Tensor, bits: int, symmetric: bool,
                  qrange: tuple[int, int] | None = None) -> Tensor:
    """Codes q [N, K] (int16, unsigned range) of W [N, K] under scales / zeros [N, K/G]: round(w / s) + z,
    clamped to `qrange` (default: code_range(bits, symmetric))."""
    n, k = w.shape
    ng = scale.shape[1]
    g = w.float().reshape(n, ng, k // ng)
    lo, hi = qrange or code_range(bits, symmetric)
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


def pack_bits(q: Tensor, bits: int) -> Tensor:
    """Codes [N, K] in 0..2^bits - 1 (K·bits a multiple of 8) -> uint8 [N, K·bits/8], dense, least significant
    bits first (element j at bits bits·j .. of the row's little-endian stream)."""
    n, k = q.shape
    if (k * bits) % 8:
        raise ValueError(f"{k} codes of {bits} bits do not fill whole bytes")
    shifts = torch.arange(bits, device=q.device)
    stream = ((q.to(torch.int32)[..., None] >> shifts) & 1).reshape(n, k * bits // 8, 8)
    return (stream << torch.arange(8, device=q.device)).sum(-1).to(torch.uint8)


def unpack_bits(p: Tensor, bits: int, k: int) -> Tensor:
    """pack_bits' inverse: uint8 [N, K·bits/8] -> codes [N, K] (uint8)."""
    n = p.shape[0]
    stream = ((p.to(torch.int32)[..., None] >> torch.arange(8, device=p.device)) & 1).reshape(n, -1)[:, :k * bits]
    return (stream.reshape(n, k, bits) << torch.arange(bits, device=p.device)).sum(-1).to(torch.uint8)


TRITS_PER_BYTE = 5  # 3^5 = 243 <= 256


def pack_trits(q: Tensor) -> Tensor:
    """Ternary codes [N, K] in 0..2 -> uint8 [N, ceil(K/5)]: element 5j + i is digit i (least significant
    first) of byte j in base 3; the last byte's missing digits are 0."""
    n, k = q.shape
    pad = -k % TRITS_PER_BYTE
    q = torch.cat([q.to(torch.int32), q.new_zeros(n, pad, dtype=torch.int32)], dim=1)
    weights = 3 ** torch.arange(TRITS_PER_BYTE, device=q.device, dtype=torch.int32)
    return (q.reshape(n, -1, TRITS_PER_BYTE) * weights).sum(-1).to(torch.uint8)


def unpack_trits(p: Tensor, k: int) -> Tensor:
    """pack_trits' inverse: uint8 [N, ceil(K/5)] -> codes [N, K] (uint8, 0..2)."""
    weights = 3 ** torch.arange(TRITS_PER_BYTE, device=p.device, dtype=torch.int32)
    digits = (p.to(torch.int32)[..., None] // weights) % 3
    return digits.reshape(p.shape[0], -1)[:, :k].to(torch.uint8)


def quantize_fp8(w: Tensor, per_tensor: bool = False) -> tuple[Tensor, Tensor]:
    """W [N, K] -> (float8_e4m3fn [N, K], scales f32: per output channel [N], or [1] for the whole tensor)."""
    wf = w.float()
    scale = wf.abs().amax().reshape(1) / FP8_MAX if per_tensor else wf.abs().amax(dim=1) / FP8_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def dequantize_fp8(w8: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return (w8.float() * scale.float()[:, None]).to(dtype)


def sqnr(ref: Tensor, approx: Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: 10·log10(|ref|² / |ref - approx|²) (inf when equal).

    Summed in float64 over blocks of about a million elements, so a large Linear never gets float64 copies
    of its whole weight (four of them were 0.5 GB at hidden 2048, FFN 8192)."""
    ref, approx = ref.reshape(-1), approx.reshape(-1)
    noise = signal = 0.0
    step = 1 << 20
    for i in range(0, ref.numel(), step):
        r, a = ref[i:i + step].double(), approx[i:i + step].double()
        noise += (r - a).pow(2).sum().item()
        signal += r.pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)
