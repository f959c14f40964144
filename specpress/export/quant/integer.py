"""int8 / int4 codes (IntLinear), and int3 / int2 / ternary ones (LowBitLinear, through lower_codes): MatMulNBits
for the groups onnxruntime's op holds, Q/DQ otherwise; the input's pre_quant_scale (AWQ, SmoothQuant) and int8
activations (W8A8) first (inputs.py)."""

from __future__ import annotations

import torch
from onnx import TensorProto
from torch import nn

from specpress.export.context import Ctx
from specpress.export.quant.common import NBITS_BITS, bf16_kernel, group_name, nbits, nbits_block, qdq_int
from specpress.export.quant.inputs import int8_input, prepare_input
from specpress.models.quantized.scheme import register_facet


@register_facet("onnx", "integer")
def lower(c: Ctx, x: str, mod: nn.Module, hint: str) -> str:
    x = prepare_input(c, x, mod, hint, int8_input)
    return lower_codes(c, x, mod, hint, mod.codes(), mod.scales.float(), mod.zeros().float(), mod.bits,
                       mod.group_size, mod.symmetric)


def lower_codes(c: Ctx, x: str, mod: nn.Module, hint: str, codes: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor, bits: int, group: int | None, symmetric: bool) -> str:
    """Unsigned codes [N, K] (int16), scales / zeros [N, K/G] (f32) of `mod` -> x W^T."""
    if c.quant_format == "matmulnbits" and bits == 8:
        # 8-bit codes take the Q/DQ form in both formats: onnxruntime's 8-bit MatMulNBits (accuracy_level 0)
        # ran 3-8x slower on the CPU than DequantizeLinear + MatMul, which the backend folds into an fp32
        # weight when the session loads (bytes on disk stay 8-bit; memory at run time is fp32)
        c.quant_notes.append(f"{hint}: {mod.scheme} {group_name(group)} -> Q/DQ (8-bit MatMulNBits is slower on CPU)")
        if getattr(mod, "row_scales", None) is None or c.g.ft != TensorProto.FLOAT or mod.act_mode != "none":
            return qdq_int(c, x, codes, scales, zeros, bits, group, symmetric, hint)
        # torch's per-row int8 path (IntLinear.forward): aten's int8 kernel on bf16-rounded activations
        # with bf16 scales, returning bf16; the same roundings here draft the same tokens
        sb = mod.row_scales.float()[:, None]
        return bf16_kernel(c, x, "torch's int8 kernel",
                           lambda a: qdq_int(c, a, codes, sb, zeros, bits, group, symmetric, hint))
    if c.quant_format == "matmulnbits" and bits not in NBITS_BITS:
        c.quant_notes.append(f"{hint}: {mod.scheme} {group_name(group)} -> Q/DQ with the {bits}-bit codes held in "
                             f"int4 (MatMulNBits takes {', '.join(map(str, NBITS_BITS))}-bit codes): 4 bits a code in "
                             f"the ONNX file")
        if getattr(mod, "int4_packed", None) is not None and c.g.ft == TensorProto.FLOAT and mod.act_mode == "none":
            # int3 runs through aten's int4 CPU kernel in torch (lowbit.py): its roundings, as below
            sb = scales.to(torch.bfloat16).float()
            return bf16_kernel(c, x, "torch's int4 kernel",
                               lambda a: qdq_int(c, a, codes, sb, zeros, bits, group, symmetric, hint))
    elif c.quant_format == "matmulnbits":
        block = nbits_block(mod.in_features, group)
        if block is not None:
            c.quant_notes.append(f"{hint}: {mod.scheme} {group_name(group)} -> MatMulNBits block {block}"
                                 + ("" if bits == 4 else f" ({bits}-bit codes)"))
            if getattr(mod, "int4_packed", None) is None or c.g.ft != TensorProto.FLOAT or mod.act_mode != "none":
                return nbits(c, x, codes, scales, zeros, bits, group, symmetric, block, hint)
            # torch runs this Linear through aten's int4 CPU kernel (models/quantized/int4_cpu.py): bf16-rounded
            # activations and scales, fp32 accumulation, a bf16 result. The same roundings here draft the same
            # tokens; MatMulNBits at fp32 drafted another tree in 63 % of rounds on the medium zoo drafter.
            sb = scales.to(torch.bfloat16).float()
            return bf16_kernel(c, x, "torch's int4 kernel",
                               lambda a: nbits(c, a, codes, sb, zeros, bits, group, symmetric, block, hint))
        c.quant_notes.append(f"{hint}: {mod.scheme} g{group} -> Q/DQ fallback (MatMulNBits needs a power-of-two "
                             f"block >= 16)")
    else:
        held = f" (the {bits}-bit codes held in int4)" if bits < 4 else ""
        c.quant_notes.append(f"{hint}: {mod.scheme} {group_name(group)} -> Q/DQ{held}")
    return qdq_int(c, x, codes, scales, zeros, bits, group, symmetric, hint)


