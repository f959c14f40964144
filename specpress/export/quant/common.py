"""What every quantized Linear's ONNX lowering shares: bf16 mirroring of torch's CPU kernels, integer
codes as MatMulNBits or blocked Q/DQ, and raw-byte initializers."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from specpress.errors import RequestError
from specpress.export.context import Ctx
from specpress.export.graph import NP_TYPES

MS = "com.microsoft"
QDQ_OPSET = 21


def group_name(group: int | None) -> str:
    return f"g{group}" if group else "per-row"


def bf16_kernel(c: Ctx, x: str, kernel: str, product: Callable[[str], str]) -> str:
    """`product` of x as torch's bf16 CPU `kernel` computes it: on bf16-rounded activations, the result rounded
    to bf16 (the caller passes the scales already rounded); noted on the Linear's quant note."""
    c.quant_notes[-1] += f" (bf16 activations, as {kernel})"
    return round_bf16(c, product(round_bf16(c, x)))


def round_bf16(c: Ctx, x: str) -> str:
    """fp32 -> bf16 -> fp32 (round to nearest even, as torch's .to(torch.bfloat16))."""
    return c.g.op("Cast", c.g.op("Cast", x, to=TensorProto.BFLOAT16), to=TensorProto.FLOAT)


def nbits_block(k: int, group: int | None) -> int | None:
    if group is not None:
        return group if group >= 16 and group & (group - 1) == 0 else None
    if k < 16:
        return None
    return min(1 << (k.bit_length() - 1), 256) if k & (k - 1) else min(k, 256)


def nbits(c: Ctx, x: str, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
           group: int | None, symmetric: bool, block: int, hint: str) -> str:
    n, k = codes.shape
    nb = -(-k // block)
    if group is None:  # per-row: repeat the row's scale / zero over its blocks; pad codes with the zero
        scales, zeros = scales.expand(n, nb), zeros.expand(n, nb)
        codes = torch.cat([codes, zeros[:, :1].to(codes.dtype).expand(n, nb * block - k)], dim=1)
    q = _pack(codes.to(torch.uint8).numpy(), bits)
    b = c.g.init(q.reshape(n, nb, block * bits // 8), f"{hint}.qweight")
    s = c.g.init(scales.numpy().astype(NP_TYPES[c.g.ft]).reshape(-1), f"{hint}.scales")
    inputs = [x, b, s]
    if not symmetric:  # each row's zero points padded to whole bytes
        z = zeros.to(torch.uint8).numpy()
        per = 8 // bits
        inputs.append(c.g.init(_pack(np.pad(z, ((0, 0), (0, -nb % per))), bits).reshape(-1), f"{hint}.zero_points"))
    c.g.use_domain(MS, 1)
    return c.g.op("MatMulNBits", *inputs, domain=MS, K=k, N=n, bits=bits, block_size=block,
                  accuracy_level=c.accuracy_level)


NBITS_BITS = (2, 4, 8)  # the code widths onnxruntime's MatMulNBits takes (1.32: 2, 4, 8; not 3)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [R, C] -> 8/bits codes per byte, the first in the lowest bits (MatMulNBits' order)."""
    per = 8 // bits
    out = np.zeros((q.shape[0], q.shape[1] // per), np.uint8)
    for i in range(per):
        out |= (q[:, i::per] << (bits * i)).astype(np.uint8)
    return out


def qdq_int(c: Ctx, x: str, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
             group: int | None, symmetric: bool, hint: str) -> str:
    """Blocked DequantizeLinear over W^T [K, N] (block G along K), then MatMul."""
    if c.g.opset < QDQ_OPSET:
        raise RequestError(f"blocked Q/DQ needs opset >= {QDQ_OPSET} (found --opset {c.g.opset}); raise --opset")
    n, k = codes.shape
    g = group or k
    # codes of 2-4 bits are held in int4 / uint4 (2-bit ONNX types need opset 25, and onnxruntime 1.32's
    # fusion of an int2 DequantizeLinear into its MatMul computed wrong products when tried)
    if symmetric:  # signed codes, zero point 0 (implicit)
        elem = TensorProto.INT4 if bits <= 4 else TensorProto.INT8
        vals = (codes - zeros.repeat_interleave(g, dim=1).to(codes.dtype)).t().contiguous()
    else:
        elem = TensorProto.UINT4 if bits <= 4 else TensorProto.UINT8
        vals = codes.t().contiguous()
    w = c.g.init(int_tensor(vals, elem, [k, n]), f"{hint}.qweight_t")
    # one scale per output channel (per-row, or a group spanning all of K) is the per-axis form: scale [N] on
    # axis 1. The same numbers as a one-block blocked DQ (scale [1, N], block_size K), which TensorRT for
    # RTX 1.7's Myelin fails to compile (CHECK(is_value())) once such a MatMul feeds another one.
    per_axis = g >= k
    sdims, zdims = ([n], [n]) if per_axis else (None, [k // g, n])
    s_np = scales.t().contiguous().numpy().astype(NP_TYPES[c.g.ft])
    s = c.g.init(s_np.reshape(sdims) if sdims else s_np, f"{hint}.scales_t")
    inputs = [w, s]
    if not symmetric:
        ztype = TensorProto.UINT4 if bits <= 4 else TensorProto.UINT8
        inputs.append(c.g.init(int_tensor(zeros.t().contiguous(), ztype, zdims), f"{hint}.zero_points_t"))
    wt = (c.g.op("DequantizeLinear", *inputs, axis=1) if per_axis
          else c.g.op("DequantizeLinear", *inputs, axis=0, block_size=g))
    return c.g.op("MatMul", x, wt)


NP_INT = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT4: np.int8, TensorProto.UINT4: np.uint8}


def int_tensor(vals: torch.Tensor, elem: int, dims: list[int]) -> onnx.TensorProto:
    """Integer codes as raw bytes (int4 / uint4: two per byte, the first in the low nibble), as stored:
    a list of ints would land in int32_data at up to 10 bytes a value."""
    q = vals.reshape(-1).int().numpy().astype(NP_INT[elem])
    if elem in (TensorProto.INT4, TensorProto.UINT4):
        u = np.pad(q.view(np.uint8) & 0x0F, (0, q.size % 2))
        q = u[0::2] | (u[1::2] << 4)
    return helper.make_tensor("q", elem, dims, q.tobytes(), raw=True)


