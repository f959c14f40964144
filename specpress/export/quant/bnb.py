"""bitsandbytes formats: nf4 / fp4 (Bnb4bitLinear) as com.microsoft MatMulBnb4, the same packed bytes and
absmax; bnb int8 rows (Bnb8bitLinear) as the integer codes they are (w = q · SCB / 127)."""

from __future__ import annotations

import torch
from onnx import TensorProto
from torch import nn

from specpress.errors import RequestError
from specpress.export.context import Ctx
from specpress.export.graph import NP_TYPES
from specpress.export.quant import integer
from specpress.export.quant.common import MS, bf16_kernel
from specpress.models.quantized.scheme import register_facet


@register_facet("onnx", "bnb")
def lower(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    if mod.scheme == "int8":  # Bnb8bitLinear: q int8 -> unsigned q + 128 with zero point 128
        codes = mod.packed.to(torch.int16) + 128
        scales = (mod.scb.float() / 127.0)[:, None]
        return integer.lower_codes(c, x, mod, hint, codes, scales, torch.full_like(scales, 128.0), 8, None, True)
    if c.quant_format == "qdq":
        raise RequestError(f"{hint}: {mod.scheme} has no standard ONNX form (Q/DQ holds integers and float8 only); "
                           f"export it with --quant-format matmulnbits (onnxruntime's MatMulBnb4)")
    return _bnb4(c, x, mod, hint)


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

    return bf16_kernel(c, x, "bitsandbytes' CPU kernel", product) if kernel else product(x)
