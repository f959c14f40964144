"""Small-float decoding and rounding in standard ONNX ops, for the formats onnxruntime has no kernel for
(1.32 CPU: no FLOAT4E2M1 Cast or DequantizeLinear): the same arithmetic as models/quantized/minifloat.py.

    e2m1 decode   Gather over the 16 code values (weights: the packed bytes split into nibbles first)
    e2m1 round    index = number of midpoints below |v| + (|v| a midpoint whose even neighbour is above),
                  then Gather and the sign: round to nearest even, saturating at 6
    e8m0          2^(byte - 127), exact in float32; an exponent ceil(log2(amax / elem_max)) is found with
                  Log and corrected by one step either way, so a power of two never lands on the wrong side
    e4m3          Cast to FLOAT8E4M3FN and back (saturated by a Clip first)
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from specpress.export.context import Ctx
from specpress.models.quantized import minifloat as M

CODE_VALUES = np.array([*M.E2M1_VALUES.tolist(), *(-M.E2M1_VALUES).tolist()], dtype=np.float32)


def f32(c: Ctx, value: float | list[float]) -> str:
    return c.g.const(value, np.float32)


def decode_codes(c: Ctx, codes: np.ndarray, hint: str) -> str:
    """e2m1 codes [R, C] (uint8 0..15) -> float32 values, stored packed two per byte (the low nibble first)."""
    r, cols = codes.shape
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    p = c.g.init(packed, f"{hint}.e2m1_packed")
    lo = c.g.op("BitwiseAnd", p, c.g.const(15, np.uint8))
    hi = c.g.op("BitShift", p, c.g.const(4, np.uint8), direction="RIGHT")
    both = c.g.op("Concat", c.g.op("Unsqueeze", lo, c.g.const([-1])), c.g.op("Unsqueeze", hi, c.g.const([-1])), axis=-1)
    idx = c.g.op("Reshape", c.g.op("Cast", both, to=TensorProto.INT64), c.g.const([r, cols]))
    return c.g.op("Gather", f32(c, CODE_VALUES.tolist()), idx, axis=0)


def round_e2m1(c: Ctx, v: str) -> str:
    """float32 v -> v rounded to e2m1's values (nearest, ties to even, saturating)."""
    a = c.g.op("Abs", v)
    a1 = c.g.op("Unsqueeze", a, c.g.const([-1]))
    below = c.g.op("Cast", c.g.op("Greater", a1, f32(c, M._BOUNDS.tolist())), to=TensorProto.INT64)
    ties = c.g.op("Cast", c.g.op("Equal", a1, f32(c, M._TIES_UP.tolist())), to=TensorProto.INT64)
    idx = c.g.op("Add", c.g.op("ReduceSum", below, c.g.const([-1]), keepdims=0),
                 c.g.op("ReduceSum", ties, c.g.const([-1]), keepdims=0))
    mag = c.g.op("Gather", f32(c, M.E2M1_VALUES.tolist()), idx, axis=0)
    return c.g.op("Where", c.g.op("Less", v, f32(c, 0.0)), c.g.op("Neg", mag), mag)


def round_e4m3(c: Ctx, v: str) -> str:
    v = c.g.op("Clip", v, f32(c, -M.E4M3_MAX), f32(c, M.E4M3_MAX))
    return c.g.op("Cast", c.g.op("Cast", v, to=TensorProto.FLOAT8E4M3FN), to=TensorProto.FLOAT)


def blocks(c: Ctx, x: str, block: int) -> str:
    """[..., K] -> [..., K/block, block] (the last dim split; K a multiple of block)."""
    lead = c.g.op("Slice", c.g.op("Shape", x), c.g.const([0]), c.g.const([-1]))
    return c.g.op("Reshape", x, c.g.op("Concat", lead, c.g.const([-1, block]), axis=0))


def unblocks(c: Ctx, xb: str, like: str) -> str:
    return c.g.op("Reshape", xb, c.g.op("Shape", like))


def block_amax(c: Ctx, xb: str) -> str:
    return c.g.op("ReduceMax", c.g.op("Abs", xb), c.g.const([-1]), keepdims=1)


def e8m0_scale(c: Ctx, amax: str, elem_max: float) -> str:
    """2^e with e = ceil(log2(amax / elem_max)) clamped to [-127, 127]; 1 for an all-zero block (whose values are
    0 whatever the scale; torch stores e8m0 byte 0 there, a subnormal 2^-127 that a flush-to-zero would turn
    into 0/0)."""
    r = c.g.op("Div", amax, f32(c, elem_max))
    e = c.g.op("Ceil", c.g.op("Div", c.g.op("Log", r), f32(c, float(np.log(2.0)))))
    two = f32(c, 2.0)
    # exact correction: the smallest e with 2^e >= r
    e = c.g.op("Where", c.g.op("GreaterOrEqual", c.g.op("Pow", two, c.g.op("Sub", e, f32(c, 1.0))), r),
               c.g.op("Sub", e, f32(c, 1.0)), e)
    e = c.g.op("Where", c.g.op("Less", c.g.op("Pow", two, e), r), c.g.op("Add", e, f32(c, 1.0)), e)
    e = c.g.op("Where", c.g.op("Greater", amax, f32(c, 0.0)), e, f32(c, 0.0))
    e = c.g.op("Clip", e, f32(c, -127.0), f32(c, 127.0))
    return c.g.op("Pow", two, e)


def e8m0_decode(c: Ctx, exps: np.ndarray, hint: str) -> str:
    """Stored e8m0 bytes (uint8) -> float32 2^(byte - 127), computed in the graph (the bytes stay 8-bit)."""
    e = c.g.op("Cast", c.g.init(exps.astype(np.uint8), f"{hint}.e8m0"), to=TensorProto.FLOAT)
    return c.g.op("Pow", f32(c, 2.0), c.g.op("Sub", e, f32(c, 127.0)))
