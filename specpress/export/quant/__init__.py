"""Quantized Linears exported as stored: the same codes, scales and groups, no re-quantization.

Each scheme's lowering is one file here, registered as the scheme's "onnx" facet
(`register_facet("onnx", "<scheme>")`, specpress/models/quantized/scheme.py); every file of this package
is imported when it is, so adding a scheme's lowering is adding its file.

Quantized Linears exported as stored: the same codes, scales and groups, no re-quantization.

| stored (models/quantized/<scheme>.py)   | --quant-format matmulnbits (default)   | --quant-format qdq (opset >= 21)     |
|-----------------------------------------|----------------------------------------|--------------------------------------|
| int4 codes, groups G (IntLinear)        | com.microsoft MatMulNBits, block = G   | DequantizeLinear (blocked, int4/uint4|
| int8 codes per row (IntLinear), bnb     | DequantizeLinear (int8/uint8 [K, N],   | /int8/uint8 [K, N]; per-row: per-axis|
| int8 rows + SCB (Bnb8bitLinear)         | per-axis scale [N]) + MatMul           | scale [N], axis 1) + MatMul          |
| nf4 / fp4 (Bnb4bitLinear)               | com.microsoft MatMulBnb4               | refused: no standard ONNX 4-bit float|
| fp8 e4m3 (Fp8Linear)                    | DequantizeLinear(float8e4m3fn) + MatMul (per output channel; both formats)    |

8-bit codes take the Q/DQ form in both formats: onnxruntime 1.2x's 8-bit MatMulNBits at accuracy_level 0
measured 3-8x slower on the CPU than DequantizeLinear + MatMul, which the onnxruntime backend folds into
an fp32 weight at session load (8-bit bytes on disk, fp32 in memory).
MatMulNBits needs a power-of-two block >= 16. A per-row (per-output-channel) 4-bit layout uses the
largest such block <= K and repeats each row's scale over its blocks (codes past K padded with the zero point,
so they contribute 0): exact. A group the op cannot hold (e.g. int4 g24) falls back to Q/DQ, noted in
the manifest. accuracy_level defaults to 0 (fp32 activations: the torch reference's arithmetic, so the
export drafts what torch drafts); 4 quantizes activations to int8 per block for onnxruntime's int8
kernels (faster on CPU; an error the torch drafter never makes, validated at the quantized tolerance).
Where torch computes a Linear through a bf16 kernel on the CPU (per-row int8: aten's int8 kernel; int4
with groups of 32-256: aten's int4 kernel; nf4 / fp4: bitsandbytes' kernel), an fp32 graph rounds the
activations, the scales and the result to bf16 as that kernel does, so the export drafts what the torch
drafter drafts.
"""

from __future__ import annotations

import importlib
import pkgutil

from torch import nn

from specpress.errors import RequestError
from specpress.export.context import Ctx
from specpress.models.quantized.scheme import facet, scheme_of_module


def load_lowerings() -> None:
    """Import every lowering file of this package (each registers its scheme's facet)."""
    for info in pkgutil.iter_modules(__path__):
        if info.name not in ("common", "inputs", "minifloat"):
            importlib.import_module(f"{__name__}.{info.name}")


def quantized_linear(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """x [..., K] -> x W^T for a quantized Linear (bias added by the caller), by its scheme's lowering."""
    load_lowerings()
    scheme = scheme_of_module(mod)
    lower = facet("onnx", scheme)
    if lower is None:
        raise RequestError(f"{hint}: the {mod.scheme} scheme has no ONNX lowering; export the drafter written with "
                           f"--dequantize instead")
    y = lower(c, x, mod, hint)
    if getattr(mod, "act_mode", "none") != "none":
        c.quant_notes[-1] += f" (after {mod.act_mode} activation quantization)"
    return y
