"""The input side of a quantized Linear in ONNX: its pre_quant_scale and its activation quantizer, the same
arithmetic as the torch module's `prepare_input` (models/quantized/activations.py), computed in float32.

    fp8 static     QuantizeLinear(x, input_scale, float8e4m3fn zero) -> DequantizeLinear (saturating, RNE)
    fp8 dynamic    scale = max(ReduceMax|x| over the last axis, tiny) / 448; Cast to float8e4m3fn and back
    int8 static    QuantizeLinear(x, input_scale, int8 zero) -> DequantizeLinear (RNE, saturating to +-127/-128)
    int8 dynamic   scale = max(ReduceMax|x|, tiny) / 127; Round, Clip [-128, 127], times scale

In the TensorRT form (--quant-format qdq) every float8 tensor must come out of a QuantizeLinear and every
scale must have the graph's float type (TensorRT for RTX 1.7.1 refuses a Cast to FP8, and its Myelin
compiler fails when a MatMul's two Q/DQ scales differ in type): the quantizers run in the graph's float
type there, and fp8 dynamic is QuantizeLinear(x / scale, 1) -> DequantizeLinear(1) times scale.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto, helper
from torch import nn

from specpress.export.context import Ctx
from specpress.models.quantized.activations import FP8_MAX, INT8_MAX

Quantizer = Callable[[Ctx, str, nn.Module, str], str]
TINY = float(np.finfo(np.float32).tiny)


def prepare_input(c: Ctx, x: str, mod: nn.Module, hint: str, quantize: Quantizer | None) -> str:
    """x times the module's pre_quant_scale, then its activation quantizer (in float32; the graph's float type
    in and out)."""
    if getattr(mod, "pre_quant_scale", None) is not None:
        x = c.g.op("Mul", x, c.g.init(mod.pre_quant_scale.float().cpu().numpy().astype(np.float32 if c.g.ft ==
                                                                                           TensorProto.FLOAT else
                                                                                           np.float16),
                                      f"{hint}.pre_quant_scale"))
    if mod.act_mode == "none":
        return x
    assert quantize is not None, f"{hint}: {mod.scheme} activations have no ONNX quantizer"
    if c.g.ft == TensorProto.FLOAT or c.quant_format == "qdq":
        return quantize(c, x, mod, hint)
    y = quantize(c, c.g.op("Cast", x, to=TensorProto.FLOAT), mod, hint)
    return c.g.op("Cast", y, to=c.g.ft)


def _np(c: Ctx) -> type:
    """The numpy type the quantizers compute in: float32, or the graph's float type in the TensorRT form."""
    return np.float16 if c.quant_format == "qdq" and c.g.ft == TensorProto.FLOAT16 else np.float32


def f32(c: Ctx, value: float) -> str:
    return c.g.const(value, _np(c))


def input_scale(c: Ctx, mod: nn.Module, hint: str) -> str:
    return c.g.init(np.asarray(float(mod.input_scale), dtype=_np(c)), f"{hint}.input_scale")


def token_scale(c: Ctx, x: str, qmax: float) -> str:
    """max(|x| over the last axis, tiny) / qmax, kept as [..., 1]."""
    amax = c.g.op("ReduceMax", c.g.op("Abs", x), c.g.const([-1]), keepdims=1)
    tiny = TINY if _np(c) is np.float32 else float(np.finfo(np.float16).tiny)
    return c.g.op("Div", c.g.op("Max", amax, f32(c, tiny)), f32(c, qmax))


def _qdq(c: Ctx, x: str, s: str, zero: str) -> str:
    return c.g.op("DequantizeLinear", c.g.op("QuantizeLinear", x, s, zero), s, zero)


def fp8_input(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    z = c.g.init(helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0]), f"{hint}.input_zero")
    if mod.act_mode == "static":
        return _qdq(c, x, input_scale(c, mod, hint), z)
    return _fp8_per_row(c, x, z)


def fp8_rows(c: Ctx, x: str) -> str:
    """x rounded to e4m3 with one scale per row of its last axis (the fp8 KV cache: models/kv.fp8_rows), in
    float32 (the graph's float type in and out)."""
    z = c.g.init(helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0]), "kv.fp8_zero")
    if c.g.ft == TensorProto.FLOAT or c.quant_format == "qdq":
        return _fp8_per_row(c, x, z)
    return c.g.op("Cast", _fp8_per_row(c, c.g.op("Cast", x, to=TensorProto.FLOAT), z), to=c.g.ft)


def _fp8_per_row(c: Ctx, x: str, z: str) -> str:
    s = token_scale(c, x, FP8_MAX)
    if c.quant_format == "qdq":  # TensorRT: FP8 only out of a QuantizeLinear (constant scale 1)
        return c.g.op("Mul", _qdq(c, c.g.op("Div", x, s), f32(c, 1.0), z), s)
    v = c.g.op("Clip", c.g.op("Div", x, s), f32(c, -FP8_MAX), f32(c, FP8_MAX))
    v = c.g.op("Cast", c.g.op("Cast", v, to=TensorProto.FLOAT8E4M3FN), to=TensorProto.FLOAT)
    return c.g.op("Mul", v, s)


def int8_input(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    if mod.act_mode == "static":
        return _qdq(c, x, input_scale(c, mod, hint), c.g.init(np.asarray(0, dtype=np.int8), f"{hint}.input_zero"))
    s = token_scale(c, x, INT8_MAX)
    v = c.g.op("Clip", c.g.op("Round", c.g.op("Div", x, s)), f32(c, -128.0), f32(c, 127.0))
    return c.g.op("Mul", v, s)
