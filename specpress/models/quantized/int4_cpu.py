"""PyTorch's CPU int4 kernel for IntLinear: pack the stored codes once, multiply without dequantizing.

    reason = kernel_unavailable(n, k, group_size, symmetric, device, dtype)   # None: the kernel applies
    packed, sz = pack(codes, scales, zeros, group)     # once, at load / after a move (IntLinear._refresh)
    y = matmul(x, packed, group, sz)                   # x [M, K] (any float dtype) -> [M, N] in x's dtype

The kernel is aten's `_weight_int4pack_mm_for_cpu(A [M, K], B, G, SZ)` with B from
`_convert_weight_to_int4pack_for_cpu(codes int32 [N, K], 1)` (uint8 [N, K/2] in a tiled order that depends
on the CPU's vector width, so it is made in the process that uses it and never stored) and SZ
[K/G, N, 2] holding (scale, zero) per group and output channel in A's dtype. It dequantizes on the fly as

    w = (q - 8) · scale + zero        (q the unsigned code 0..15)

while specpress stores w = (q - z) · s (primitives.py; symmetric int4: z = 8). Since
(q - z) · s = (q - 8) · s + (8 - z) · s, the kernel's operands are scale = s and zero = (8 - z) · s
(0 for symmetric codes): the same weight, up to rounding of the two products.

Numerics and speed (torch 2.13, AVX-512 here; bench/int4_linear.py): only the bf16 instantiation is
vectorized — given fp32 or fp16 activations the kernel runs a scalar loop 25-100x slower than an fp32
Linear. So, as IntLinear's int8 path does, fp32 activations are rounded to bf16 for this product, the
scales and zeros are held in bf16, the kernel accumulates in fp32 and writes bf16, and the result is
returned in the input's dtype: relative error 2-4e-3 against the fp32 dequantize-then-matmul path,
far below int4's own rounding (SQNR ~20 dB). fp16 activations keep the dequantize path.
"""

from __future__ import annotations

import torch
from torch import Tensor


GROUP_SIZES = (32, 64, 128, 256)  # the kernel's TORCH_CHECK on qGroupSize
N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu: N divisible by 16
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)  # fed as bf16 (see the module docstring)
KERNEL_DTYPE = torch.bfloat16
NAME = "aten._weight_int4pack_mm_for_cpu (bf16 activations)"


def kernel_unavailable(n: int, k: int, group_size: int | None, device: torch.device,
                       dtype: torch.dtype) -> str | None:
    """Why an int4 [N, K] weight with `group_size` inputs per scale (None: one group per row) cannot use the
    kernel on `device` for `dtype` activations, or None when it can."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return f"torch {torch.__version__} has no aten._weight_int4pack_mm_for_cpu (added in 2.6)"
    if device.type != "cpu":
        return f"weights on {device.type}: the kernel is CPU-only"
    g = k if group_size is None else group_size
    if g not in GROUP_SIZES:
        what = f"per-row scales over K={k}" if group_size is None else f"group size {g}"
        return f"{what}: the kernel takes groups of {', '.join(map(str, GROUP_SIZES))}"
    if n % N_MULTIPLE:
        return f"out_features {n} is not a multiple of {N_MULTIPLE}, as the kernel's packing needs"
    if dtype not in ACTIVATION_DTYPES:
        return f"{dtype} activations: the kernel is vectorized for bf16 only (its {dtype} loop is scalar)"
    return None


def pack(codes: Tensor, scales: Tensor, zeros: Tensor) -> tuple[Tensor, Tensor]:
    """Codes [N, K] (0..15), scales / zero points [N, K/G] -> (packed uint8 [N, K/2], SZ bf16 [K/G, N, 2])."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    return packed, scales_and_zeros(scales, zeros, KERNEL_DTYPE)


def scales_and_zeros(scales: Tensor, zeros: Tensor, dtype: torch.dtype) -> Tensor:
    """Our (s, z) [N, K/G] -> the kernel's [K/G, N, 2] of (s, (8 - z)·s) in `dtype` (computed in fp32)."""
    s = scales.float()
    sz = torch.stack([s, (8.0 - zeros.float()) * s], dim=-1)  # [N, K/G, 2]
    return sz.transpose(0, 1).contiguous().to(dtype)


def matmul(x: Tensor, packed: Tensor, group: int, sz: Tensor) -> Tensor:
    """x [..., K] -> [..., N] in x's dtype, computed on bf16-rounded x with fp32 accumulation."""
    k = 2 * packed.shape[1]
    a = x.reshape(-1, k).to(sz.dtype).contiguous()
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(a, packed, group, sz)
    return y.reshape(*x.shape[:-1], packed.shape[0]).to(x.dtype)


def reference(x: Tensor, codes: Tensor, scales: Tensor, zeros: Tensor, dtype: torch.dtype) -> Tensor:
    """What `matmul` computes, with plain ops (for tests): x and the kernel's (scale, zero) rounded to
    `dtype`, the weight rebuilt as (q - 8)·scale + zero in fp32, the product in fp32 -> [..., N] fp32."""
    n, k = codes.shape
    sz = scales_and_zeros(scales, zeros, dtype).float().transpose(0, 1)  # [N, K/G, 2]
    q = codes.float().reshape(n, sz.shape[1], -1) - 8.0
    w = (q * sz[..., :1] + sz[..., 1:]).reshape(n, k)
    return x.to(dtype).float() @ w.t()


def group_of(k: int, group_size: int | None) -> int:
    """The kernel's qGroupSize for a weight with K inputs (per-row scales: one group of K)."""
    return k if group_size is None else group_size

