"""NVFP4 (NVFP4Linear) for onnxruntime: the e2m1 codes stay packed two per byte and are decoded in the graph
(minifloat.py: onnxruntime 1.32 has no FLOAT4E2M1 kernel), times the e4m3 block scales (stored as
float8e4m3fn) and the fp32 global scale, then MatMul; W4A4's activation quantizer in standard ops: block
scales of 16 from the input, rounded to e4m3, the calibrated global input_scale, e2m1 rounding.

The TensorRT form (FLOAT4E2M1 DequantizeLinear, TRT_FP4DynamicQuantize for the activations) cannot be run by
onnxruntime, so no export of it could be validated against torch here: --quant-format qdq is refused."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto, helper
from torch import nn

from specpress.errors import RequestError
from specpress.export.context import Ctx
from specpress.export.quant import minifloat as F
from specpress.export.quant.inputs import prepare_input
from specpress.models.quantized import minifloat as M
from specpress.models.quantized.scheme import register_facet

QDQ_REFUSAL = ("has no form here that TensorRT parses and onnxruntime can check: TensorRT's FP4 form needs "
               "FLOAT4E2M1 DequantizeLinear, which onnxruntime 1.32 cannot run, so the export could not be validated "
               "against torch; export it with --quant-format matmulnbits (the onnxruntime form)")


def weight_values(c: Ctx, codes: torch.Tensor, scales: torch.Tensor, block: int, hint: str) -> str:
    """Decoded e2m1 codes [N, K] times per-block float32 scales [N, K/block] (a graph value) -> W^T [K, N]."""
    n, k = codes.shape
    v = F.decode_codes(c, codes.cpu().numpy().astype(np.uint8), hint)
    w = c.g.op("Mul", c.g.op("Reshape", v, c.g.const([n, k // block, block])), c.g.op("Unsqueeze", scales,
                                                                                       c.g.const([-1])))
    return c.g.op("Transpose", c.g.op("Reshape", w, c.g.const([n, k])), perm=[1, 0])


def nvfp4_input(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """x -> NVFP4 and back with the calibrated global scale g (models/quantized/minifloat.nvfp4_fake)."""
    g = np.float32(float(mod.input_scale))
    xb = F.blocks(c, x, M.NVFP4_BLOCK)
    s = c.g.op("Div", F.block_amax(c, xb), F.f32(c, float(np.float32(M.E2M1_MAX) * g)))
    s = c.g.op("Where", c.g.op("Equal", s, F.f32(c, 0.0)), F.f32(c, 1.0), s)
    s = F.round_e4m3(c, c.g.op("Clip", s, F.f32(c, M.E4M3_SCALE_MIN), F.f32(c, M.E4M3_MAX)))
    sg = c.g.op("Mul", s, F.f32(c, float(g)))
    return F.unblocks(c, c.g.op("Mul", F.round_e2m1(c, c.g.op("Div", xb, sg)), sg), x)


@register_facet("onnx", "nvfp4")
def lower(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    if c.quant_format == "qdq":
        raise RequestError(f"{hint}: nvfp4 {QDQ_REFUSAL}")
    x = prepare_input(c, x, mod, hint, nvfp4_input)
    n, k = mod.out_features, mod.in_features
    raw = mod.block_scales.contiguous().view(torch.uint8).cpu().numpy().tobytes()
    s8 = c.g.init(helper.make_tensor("s", TensorProto.FLOAT8E4M3FN, [n, k // M.NVFP4_BLOCK], raw, raw=True),
                  f"{hint}.weight_scale")
    scales = c.g.op("Mul", c.g.op("Cast", s8, to=TensorProto.FLOAT), F.f32(c, float(mod.global_scale)))
    wt = weight_values(c, mod.codes(), scales, M.NVFP4_BLOCK, hint)
    c.quant_notes.append(f"{hint}: nvfp4 -> e2m1 codes decoded (Gather) x e4m3 block scales + MatMul")
    if c.g.ft != TensorProto.FLOAT:
        wt = c.g.op("Cast", wt, to=c.g.ft)
    return c.g.op("MatMul", x, wt)
