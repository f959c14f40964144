"""Small float formats, bit-exact: e2m1 (FP4) values, e4m3 block scales, e8m0 shared exponents, and the NVFP4
and MX block layouts built from them. Pure tensor functions; the schemes (nvfp4.py, mx.py) store what
they return.

    e2m1     16 codes: sign << 3 | index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}; values are rounded to the nearest
             of them, ties to the even index (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
             5 -> 4), magnitudes above 6 saturate to 6; -0.0 and +0.0 both encode as code 0. Packed two per
             byte, element 2j in the low nibble (Model Optimizer, compressed-tensors, torchao all agree).
    NVFP4    blocks of 16 along the input: global g = amax / (6 · 448) (fp32, Model Optimizer's
             weight_scale_2 / input_scale); block scale s = e4m3(block_amax / (6 · g)), clamped to
             [2^-9, 448] before the cast, and 1.0 for an all-zero block (Model Optimizer's rule); value
             = e2m1(x / (s · g)) · s · g.
    MX       blocks of 32 (OCP MX): a shared power of two 2^(e - 127) stored as one e8m0 byte with
             e = ceil(log2(block_amax / elem_max)) + 127, clamped to [0, 254] (Model Optimizer's rule, which
             is torchao's RCEIL; the OCP spec's floor rule clips the block maximum instead of rounding it);
             an all-zero block gets e = 0. MXFP4 elements are e2m1 (elem_max 6), MXFP8 elements e4m3
             (elem_max 448, saturating cast, round to nearest even).

tests/compress/test_minifloat.py checks every function against Model Optimizer's and torchao's own
quantizers, which this file does not copy.
"""

from __future__ import annotations

import torch
from torch import Tensor

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # midpoints between neighbouring values
_TIES_UP = torch.tensor([0.75, 1.75, 3.5])  # midpoints whose even neighbour is the upper one
E4M3_SCALE_MIN = 2.0 ** -9  # the smallest e4m3 subnormal: block scales never underflow to 0
NVFP4_BLOCK = 16
MX_BLOCK = 32


def e2m1_codes(v: Tensor) -> Tensor:
    """float32 values (already divided by their scale) -> uint8 e2m1 codes 0..15 (round to nearest even,
    saturating)."""
    a = v.abs()
    idx = torch.searchsorted(_BOUNDS.to(a.device), a.contiguous()) + torch.isin(a, _TIES_UP.to(a.device))
    return ((v < 0).to(torch.uint8) << 3) | idx.clamp(max=7).to(torch.uint8)


def e2m1_values(codes: Tensor) -> Tensor:
    """uint8 codes 0..15 -> float32 values."""
    mag = E2M1_VALUES.to(codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def round_e2m1(v: Tensor) -> Tensor:
    """v rounded to e2m1's values (what a code decodes to)."""
    return e2m1_values(e2m1_codes(v))


def _blocks(x: Tensor, block: int) -> Tensor:
    """[..., K] -> [..., K/block, block]; K must be a multiple of block."""
    if x.shape[-1] % block:
        raise ValueError(f"the last dimension {x.shape[-1]} is not a multiple of the block size {block}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


# ---------------------------------------------------------------------------------------------- NVFP4


def nvfp4_global_scale(amax: Tensor) -> Tensor:
    """fp32 scalar g = amax / (6 · 448) (1.0 when amax is 0, so that nothing divides by zero)."""
    g = amax.float().reshape(()) / (E2M1_MAX * E4M3_MAX)
    return torch.where(g > 0, g, torch.ones_like(g))


def nvfp4_block_scales(x: Tensor, g: Tensor) -> Tensor:
    """x [..., K] float32, global g -> e4m3 block scales [..., K/16]."""
    s = _blocks(x, NVFP4_BLOCK).abs().amax(dim=-1) / (E2M1_MAX * g)
    s = torch.where(s == 0, torch.ones_like(s), s)
    return s.clamp(E4M3_SCALE_MIN, E4M3_MAX).to(torch.float8_e4m3fn)


def nvfp4_quantize(x: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., K] -> (e2m1 codes uint8 [..., K], e4m3 block scales [..., K/16]) under global scale g."""
    x = x.float()
    s = nvfp4_block_scales(x, g)
    codes = e2m1_codes(_blocks(x, NVFP4_BLOCK) / (s.float() * g)[..., None])
    return codes.reshape(x.shape), s


def nvfp4_dequantize(codes: Tensor, s: Tensor, g: Tensor) -> Tensor:
    """codes [..., K], e4m3 block scales [..., K/16], global g -> float32 [..., K]."""
    v = _blocks(e2m1_values(codes), NVFP4_BLOCK) * (s.float() * g.float())[..., None]
    return v.reshape(codes.shape)


def nvfp4_fake(x: Tensor, g: Tensor) -> Tensor:
    """x quantized to NVFP4 and back (the activation quantizer: block scales from x, the global g given)."""
    codes, s = nvfp4_quantize(x, g)
    return nvfp4_dequantize(codes, s, g)


# ---------------------------------------------------------------------------------------------- MX


def e8m0_exponents(block_amax: Tensor, elem_max: float) -> Tensor:
    """Per-block amax -> uint8 e8m0 bytes e = ceil(log2(amax / elem_max)) + 127 in [0, 254]; 0 for amax 0."""
    e = torch.ceil(torch.log2(block_amax.float() / elem_max)) + 127
    e = torch.where(block_amax > 0, e, torch.zeros_like(e))
    return e.clamp(0, 254).to(torch.uint8)


def e8m0_scale(e: Tensor) -> Tensor:
    """uint8 e8m0 bytes -> float32 2^(e - 127)."""
    return torch.exp2(e.float() - 127)


def mx_quantize(x: Tensor, elem: str) -> tuple[Tensor, Tensor]:
    """x [..., K] -> (elements: e2m1 codes uint8 or float8_e4m3fn [..., K], e8m0 bytes uint8 [..., K/32])."""
    x = x.float()
    emax = E2M1_MAX if elem == "e2m1" else E4M3_MAX
    xb = _blocks(x, MX_BLOCK)
    e = e8m0_exponents(xb.abs().amax(dim=-1), emax)
    v = xb / e8m0_scale(e)[..., None]
    q = e2m1_codes(v) if elem == "e2m1" else v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), e


def mx_dequantize(q: Tensor, e: Tensor, elem: str) -> Tensor:
    """mx_quantize's (elements, e8m0 bytes) -> float32 [..., K]."""
    v = e2m1_values(q) if elem == "e2m1" else q.float()
    return (_blocks(v, MX_BLOCK) * e8m0_scale(e)[..., None]).reshape(q.shape)


def mx_fake(x: Tensor, elem: str) -> Tensor:
    """x quantized to MX and back (the dynamic activation quantizer)."""
    return mx_dequantize(*mx_quantize(x, elem), elem)
