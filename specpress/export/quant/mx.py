"""MXFP4 / MXFP8 (MXLinear) for onnxruntime: elements as stored (e2m1 codes packed two per byte, decoded in the
graph; e4m3 as float8e4m3fn) times 2^(e8m0 - 127) per block of 32, then MatMul; MX activations in standard
ops (minifloat.py). The TensorRT form is refused as for NVFP4 (nvfp4.QDQ_REFUSAL)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto, helper
from torch import nn

from specpress.errors import RequestError
from specpress.export.context import Ctx
from specpress.export.quant import minifloat as F
from specpress.export.quant.inputs import prepare_input
from specpress.export.quant.nvfp4 import QDQ_REFUSAL, weight_values
from specpress.models.quantized import minifloat as M
from specpress.models.quantized.scheme import register_facet


def mx_input(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """x -> MX and back, each block of 32 scaled by its own power of two (minifloat.mx_fake)."""
    emax = M.E2M1_MAX if mod.elements == "e2m1" else M.E4M3_MAX
    xb = F.blocks(c, x, M.MX_BLOCK)
    sc = F.e8m0_scale(c, F.block_amax(c, xb), emax)
    v = c.g.op("Div", xb, sc)
    v = F.round_e2m1(c, v) if mod.elements == "e2m1" else F.round_e4m3(c, v)
    return F.unblocks(c, c.g.op("Mul", v, sc), x)


@register_facet("onnx", "mx")
def lower(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    if c.quant_format == "qdq":
        raise RequestError(f"{hint}: {mod.scheme} {QDQ_REFUSAL}")
    x = prepare_input(c, x, mod, hint, mx_input)
    n, k = mod.out_features, mod.in_features
    scales = F.e8m0_decode(c, mod.exponents.cpu().numpy(), hint)
    if mod.elements == "e2m1":
        wt = weight_values(c, mod.element_values(), scales, M.MX_BLOCK, hint)
    else:
        raw = mod.elems.contiguous().view(torch.uint8).cpu().numpy().tobytes()
        e = c.g.init(helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [n, k], raw, raw=True), f"{hint}.weight")
        v = c.g.op("Reshape", c.g.op("Cast", e, to=TensorProto.FLOAT), c.g.const([n, k // M.MX_BLOCK, M.MX_BLOCK]))
        w = c.g.op("Mul", v, c.g.op("Unsqueeze", scales, c.g.const([-1])))
        wt = c.g.op("Transpose", c.g.op("Reshape", w, c.g.const([n, k])), perm=[1, 0])
    c.quant_notes.append(f"{hint}: {mod.scheme} -> elements x 2^(e8m0 - 127) per block of 32 + MatMul")
    if c.g.ft != TensorProto.FLOAT:
        wt = c.g.op("Cast", wt, to=c.g.ft)
    return c.g.op("MatMul", x, wt)
