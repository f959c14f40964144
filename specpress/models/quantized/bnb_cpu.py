"""bitsandbytes' fused CPU 4-bit kernel for Bnb4bitLinear (nf4 / fp4): repack once, multiply without
dequantizing.

    reason = kernel_unavailable(n, k, blocksize, device, dtype)   # None: the kernel applies
    packed, state = pack(bnb, packed, quant_state)                # once, at load / after a move
    y = matmul(bnb, x, packed, state)                             # x [..., K] -> [..., N] in x's dtype

bitsandbytes (0.50) ships a CPU kernel for 4-bit weights (`gemv_4bit`, a tiled GEMM for any number of
rows) built for AVX512-BF16: its own Linear4bit repacks the weight on the first CPU forward with
`functional._convert_weight_packed_for_cpu` (nibbles reordered in blocks of 32 output channels, absmax
transposed to bf16 [K/blocksize, N]) and then `matmul_4bit` routes bf16 activations to that kernel.
specpress keeps the stored layout (Linear4bit's keys, unchanged on disk) and holds the repacked copy
beside it: N·K/2 more bytes in memory. Activations are rounded to bf16 for the product and the result is
returned in the input's dtype (relative error ~3e-3 against the fp32 dequantize path, far below nf4's own
rounding). bench/int4_linear.py-style timings on this CPU (zoo drafter shapes, 1 thread): 1.2-6x faster
than dequantize-then-matmul at 1-8 rows, about even to 1.2x slower at 32.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

BLOCK_N = 32  # _convert_weight_packed_for_cpu's block of output channels
NAME = "bitsandbytes gemv_4bit CPU kernel (bf16 activations)"


def kernel_unavailable(bnb: Any, n: int, k: int, blocksize: int, device: torch.device,
                       dtype: torch.dtype) -> str | None:
    """Why a 4-bit [N, K] weight cannot use the fused CPU kernel, or None when it can."""
    functional = bnb.functional
    if not hasattr(functional, "_convert_weight_packed_for_cpu"):
        return f"bitsandbytes {bnb.__version__} has no CPU packing for its 4-bit kernel (0.49+)"
    if device.type != "cpu":
        return f"weights on {device.type}: this path is CPU-only (bitsandbytes' own kernels serve GPUs)"
    if not functional.has_avx512bf16():
        return "this CPU lacks AVX512-BF16, which bitsandbytes' fused 4-bit CPU kernel needs"
    if n % BLOCK_N:
        return f"out_features {n} is not a multiple of {BLOCK_N}, as the kernel's packing needs"
    if k % blocksize:
        return f"blocksize {blocksize} does not divide in_features {k}: blocks cross rows"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"{dtype} activations: the kernel computes in bf16 (fp32 / bf16 inputs only)"
    return None


def pack(bnb: Any, packed: Tensor, quant_state: Any) -> tuple[Tensor, Any]:
    """Stored nibbles [N·K/2, 1] + their QuantState -> (kernel layout uint8 [N, K/2], its QuantState)."""
    return bnb.functional._convert_weight_packed_for_cpu(packed.clone(), copy.copy(quant_state))


def matmul(bnb: Any, x: Tensor, packed: Tensor, quant_state: Any) -> Tensor:
    """x [..., K] -> [..., N] in x's dtype, computed on bf16-rounded x."""
    return bnb.matmul_4bit(x.to(torch.bfloat16), packed, quant_state=quant_state).to(x.dtype)
