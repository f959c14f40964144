"""Quantized Linears exported as stored: the same codes, scales and groups, no re-quantization.

| stored (compress/quantize/modules.py)   | --quant-format matmulnbits (default)   | --quant-format qdq (opset >= 21)     |
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

from typing import Callable

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from specpress.errors import UsageError
from specpress.export.blocks import Ctx
from specpress.export.graph import NP_TYPES

MS = "com.microsoft"
QDQ_OPSET = 21


def quantized_linear(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """x [..., K] -> x W^T for a quantized Linear (bias added by the caller)."""
    scheme = mod.scheme
    if scheme == "fp8":
        return _fp8(c, x, mod, hint)
    if scheme in ("nf4", "fp4"):
        if c.quant_format == "qdq":
            raise UsageError(f"{hint}: {scheme} has no standard ONNX form (Q/DQ holds integers and float8 only); "
                             f"export it with --quant-format matmulnbits (onnxruntime's MatMulBnb4)")
        return _bnb4(c, x, mod, hint)
    codes, scales, zeros, bits, group, symmetric = int_layout(mod)
    if c.quant_format == "matmulnbits" and bits == 8:
        # 8-bit codes take the Q/DQ form in both formats: onnxruntime's 8-bit MatMulNBits (accuracy_level 0)
        # ran 3-8x slower on the CPU than DequantizeLinear + MatMul, which the backend folds into an fp32
        # weight when the session loads (bytes on disk stay 8-bit; memory at run time is fp32)
        c.quant_notes.append(f"{hint}: {scheme} {_group_name(group)} -> Q/DQ (8-bit MatMulNBits is slower on CPU)")
        if getattr(mod, "row_scales", None) is None or c.g.ft != TensorProto.FLOAT:
            return _qdq_int(c, x, codes, scales, zeros, bits, group, symmetric, hint)
        # torch's per-row int8 path (IntLinear.forward): aten's int8 kernel on bf16-rounded activations
        # with bf16 scales, returning bf16; the same roundings here draft the same tokens
        sb = mod.row_scales.float()[:, None]
        return _bf16_kernel(c, x, "torch's int8 kernel",
                            lambda a: _qdq_int(c, a, codes, sb, zeros, bits, group, symmetric, hint))
    if c.quant_format == "matmulnbits":
        block = _nbits_block(mod.in_features, group)
        if block is not None:
            c.quant_notes.append(f"{hint}: {scheme} {_group_name(group)} -> MatMulNBits block {block}")
            if getattr(mod, "int4_packed", None) is None or c.g.ft != TensorProto.FLOAT:
                return _nbits(c, x, codes, scales, zeros, bits, group, symmetric, block, hint)
            # torch runs this Linear through aten's int4 CPU kernel (models/quantized/int4_cpu.py): bf16-rounded
            # activations and scales, fp32 accumulation, a bf16 result. The same roundings here draft the same
            # tokens; MatMulNBits at fp32 drafted another tree in 63 % of rounds on the medium zoo drafter.
            sb = scales.to(torch.bfloat16).float()
            return _bf16_kernel(c, x, "torch's int4 kernel",
                                lambda a: _nbits(c, a, codes, sb, zeros, bits, group, symmetric, block, hint))
        c.quant_notes.append(f"{hint}: {scheme} g{group} -> Q/DQ fallback (MatMulNBits needs a power-of-two "
                             f"block >= 16)")
    else:
        c.quant_notes.append(f"{hint}: {scheme} {_group_name(group)} -> Q/DQ")
    return _qdq_int(c, x, codes, scales, zeros, bits, group, symmetric, hint)


def _group_name(group: int | None) -> str:
    return f"g{group}" if group else "per-row"


def _bf16_kernel(c: Ctx, x: str, kernel: str, product: Callable[[str], str]) -> str:
    """`product` of x as torch's bf16 CPU `kernel` computes it: on bf16-rounded activations, the result rounded
    to bf16 (the caller passes the scales already rounded); noted on the Linear's quant note."""
    c.quant_notes[-1] += f" (bf16 activations, as {kernel})"
    return _round_bf16(c, product(_round_bf16(c, x)))


def _round_bf16(c: Ctx, x: str) -> str:
    """fp32 -> bf16 -> fp32 (round to nearest even, as torch's .to(torch.bfloat16))."""
    return c.g.op("Cast", c.g.op("Cast", x, to=TensorProto.BFLOAT16), to=TensorProto.FLOAT)


def int_layout(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int | None, bool]:
    """(unsigned codes [N, K] int16, scales [N, K/G] f32, zeros [N, K/G] f32, bits, group | None, symmetric)."""
    if hasattr(mod, "codes"):  # IntLinear
        return mod.codes(), mod.scales.float(), mod.zeros().float(), mod.bits, mod.group_size, mod.symmetric
    # Bnb8bitLinear: w = q * SCB / 127, q int8 -> unsigned q + 128 with zero point 128
    codes = mod.packed.to(torch.int16) + 128
    scales = (mod.scb.float() / 127.0)[:, None]
    return codes, scales, torch.full_like(scales, 128.0), 8, None, True


def _nbits_block(k: int, group: int | None) -> int | None:
    if group is not None:
        return group if group >= 16 and group & (group - 1) == 0 else None
    if k < 16:
        return None
    return min(1 << (k.bit_length() - 1), 256) if k & (k - 1) else min(k, 256)


def _nbits(c: Ctx, x: str, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
           group: int | None, symmetric: bool, block: int, hint: str) -> str:
    n, k = codes.shape
    nb = -(-k // block)
    if group is None:  # per-row: repeat the row's scale / zero over its blocks; pad codes with the zero
        scales, zeros = scales.expand(n, nb), zeros.expand(n, nb)
        codes = torch.cat([codes, zeros[:, :1].to(codes.dtype).expand(n, nb * block - k)], dim=1)
    q = codes.to(torch.uint8).numpy()
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    b = c.g.init(q.reshape(n, nb, block * bits // 8), f"{hint}.qweight")
    s = c.g.init(scales.numpy().astype(NP_TYPES[c.g.ft]).reshape(-1), f"{hint}.scales")
    inputs = [x, b, s]
    if not symmetric:
        z = zeros.to(torch.uint8).numpy()
        if bits == 4:
            z = np.pad(z, ((0, 0), (0, nb % 2)))
            z = z[:, 0::2] | (z[:, 1::2] << 4)
        inputs.append(c.g.init(z.reshape(-1), f"{hint}.zero_points"))
    c.g.use_domain(MS, 1)
    return c.g.op("MatMulNBits", *inputs, domain=MS, K=k, N=n, bits=bits, block_size=block,
                  accuracy_level=c.accuracy_level)


def _qdq_int(c: Ctx, x: str, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
             group: int | None, symmetric: bool, hint: str) -> str:
    """Blocked DequantizeLinear over W^T [K, N] (block G along K), then MatMul."""
    if c.g.opset < QDQ_OPSET:
        raise UsageError(f"blocked Q/DQ needs opset >= {QDQ_OPSET} (found --opset {c.g.opset}); raise --opset")
    n, k = codes.shape
    g = group or k
    if symmetric:  # signed codes, zero point 0 (implicit)
        elem = TensorProto.INT4 if bits == 4 else TensorProto.INT8
        vals = (codes - zeros.repeat_interleave(g, dim=1).to(codes.dtype)).t().contiguous()
    else:
        elem = TensorProto.UINT4 if bits == 4 else TensorProto.UINT8
        vals = codes.t().contiguous()
    w = c.g.init(_int_tensor(vals, elem, [k, n]), f"{hint}.qweight_t")
    # one scale per output channel (per-row, or a group spanning all of K) is the per-axis form: scale [N] on
    # axis 1. The same numbers as a one-block blocked DQ (scale [1, N], block_size K), which TensorRT for
    # RTX 1.7's Myelin fails to compile (CHECK(is_value())) once such a MatMul feeds another one.
    per_axis = g >= k
    sdims, zdims = ([n], [n]) if per_axis else (None, [k // g, n])
    s_np = scales.t().contiguous().numpy().astype(NP_TYPES[c.g.ft])
    s = c.g.init(s_np.reshape(sdims) if sdims else s_np, f"{hint}.scales_t")
    inputs = [w, s]
    if not symmetric:
        ztype = TensorProto.UINT4 if bits == 4 else TensorProto.UINT8
        inputs.append(c.g.init(_int_tensor(zeros.t().contiguous(), ztype, zdims), f"{hint}.zero_points_t"))
    wt = (c.g.op("DequantizeLinear", *inputs, axis=1) if per_axis
          else c.g.op("DequantizeLinear", *inputs, axis=0, block_size=g))
    return c.g.op("MatMul", x, wt)


_NP_INT = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT4: np.int8, TensorProto.UINT4: np.uint8}


def _int_tensor(vals: torch.Tensor, elem: int, dims: list[int]) -> onnx.TensorProto:
    """Integer codes as raw bytes (int4 / uint4: two per byte, the first in the low nibble), as stored:
    a list of ints would land in int32_data at up to 10 bytes a value."""
    q = vals.reshape(-1).int().numpy().astype(_NP_INT[elem])
    if elem in (TensorProto.INT4, TensorProto.UINT4):
        u = np.pad(q.view(np.uint8) & 0x0F, (0, q.size % 2))
        q = u[0::2] | (u[1::2] << 4)
    return helper.make_tensor("q", elem, dims, q.tobytes(), raw=True)


def _fp8(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """float8e4m3fn W^T [K, N] with per-output-channel scales [N] -> DequantizeLinear (axis 1) + MatMul."""
    n, k = mod.out_features, mod.in_features
    raw = mod.weight_fp8.t().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    w = c.g.init(helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [k, n], raw, raw=True), f"{hint}.weight_fp8_t")
    s = c.g.init(mod.scales.float().cpu().numpy().astype(NP_TYPES[c.g.ft]), f"{hint}.scales")
    c.quant_notes.append(f"{hint}: fp8 -> DequantizeLinear(float8e4m3fn) + MatMul")
    return c.g.op("MatMul", x, c.g.op("DequantizeLinear", w, s, axis=1))


def _bnb4(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    """bitsandbytes nf4 / fp4 as stored -> com.microsoft MatMulBnb4 (same packed bytes and absmax)."""
    n, k = mod.out_features, mod.in_features
    c.quant_notes.append(f"{hint}: {mod.scheme} blocksize {mod.blocksize} -> MatMulBnb4")
    # torch runs this Linear through bitsandbytes' CPU kernel where it applies (models/quantized/bnb_cpu.py):
    # bf16-rounded activations and absmax, a bf16 result; an fp32 graph rounds the same way
    kernel = getattr(mod, "cpu_packed", None) is not None and c.g.ft == TensorProto.FLOAT
    absmax_t = mod.absmax.to(torch.bfloat16) if kernel else mod.absmax
    b = c.g.init(mod.packed.reshape(-1).cpu().numpy(), f"{hint}.packed")
    absmax = c.g.init(absmax_t.float().cpu().numpy().astype(NP_TYPES[c.g.ft]), f"{hint}.absmax")
    c.g.use_domain(MS, 1)

    def product(a: str) -> str:
        return c.g.op("MatMulBnb4", a, b, absmax, domain=MS, K=k, N=n, block_size=mod.blocksize,
                      quant_type=1 if mod.scheme == "nf4" else 0)

    return _bf16_kernel(c, x, "bitsandbytes' CPU kernel", product) if kernel else product(x)
