"""int3 / int2 / ternary codes (LowBitLinear) through the integer lowering (integer.py), as the codes' container
widths allow: 2-bit codes (int2, and ternary's -1 / 0 / +1 as 2-bit codes with zero point 2) as onnxruntime's
MatMulNBits (bits 2); 3-bit codes as blocked DequantizeLinear over int4 / uint4 (MatMulNBits has no 3-bit form),
and every code in the Q/DQ (TensorRT) form held in int4. The file thus holds 2 bits a code for int2 and ternary
(1.6 in the artifact for ternary) and 4 for int3 (3 in the artifact); the fp16 scales are written in the graph's
float type (exact)."""

from __future__ import annotations

from torch import nn

from specpress.export.context import Ctx
from specpress.export.quant.inputs import prepare_input
from specpress.export.quant.integer import lower_codes
from specpress.models.quantized.scheme import register_facet


@register_facet("onnx", "lowbit")
def lower(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    x = prepare_input(c, x, mod, hint, None)
    codes, zeros, bits = mod.container_codes()
    symmetric = mod.symmetric  # ternary: symmetric, its container's zero point 2 implicit
    return lower_codes(c, x, mod, hint, codes, mod.scales.float(), zeros.float(), bits, mod.group_size, symmetric)
