"""fp8 e4m3 weights (Fp8Linear): DequantizeLinear(float8e4m3fn; per output channel, or one scale) + MatMul in both
formats, after the e4m3 activation quantizer when the module quantizes its activations (inputs.py)."""

from __future__ import annotations

import torch
from onnx import TensorProto, helper
from torch import nn

from specpress.export.context import Ctx
from specpress.export.graph import NP_TYPES
from specpress.export.quant.inputs import fp8_input, prepare_input
from specpress.models.quantized.scheme import register_facet


@register_facet("onnx", "fp8")
def lower(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """float8e4m3fn W^T [K, N] with scales [N] (axis 1) or one scale -> DequantizeLinear + MatMul."""
    x = prepare_input(c, x, mod, hint, fp8_input)
    n, k = mod.out_features, mod.in_features
    raw = mod.weight_fp8.t().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    w = c.g.init(helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [k, n], raw, raw=True), f"{hint}.weight_fp8_t")
    scales = mod.scales.float().cpu().numpy().astype(NP_TYPES[c.g.ft])
    per_tensor = scales.size == 1 and n != 1
    s = c.g.init(scales.reshape(()) if per_tensor else scales, f"{hint}.scales")
    c.quant_notes.append(f"{hint}: fp8 -> DequantizeLinear(float8e4m3fn) + MatMul")
    return c.g.op("MatMul", x, c.g.op("DequantizeLinear", w, s, axis=None if per_tensor else 1))
