"""The state every graph-side block (export/blocks.py, export/quant/) is written with: the graph, the attention
form, the quantized-weight format and what the blocks record on the way. Its own module so that the quantized
lowerings, which blocks.py calls, take it without importing blocks.py back."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from onnx import TensorProto

from specpress.export.graph import BF16, NP_TYPES, Graph


@dataclass
class Ctx:
    """What every block needs: the graph, the attention form, the quantized-weight format, and the
    graph inputs that carry the mask (per form) and cos/sin once computed."""

    g: Graph
    attention: str  # "standard" | "plugin"
    quant_format: str = "matmulnbits"  # "matmulnbits" | "qdq"
    accuracy_level: int = 0  # MatMulNBits: 0 = fp32 activations (torch's arithmetic); 4 = int8 activations
    mask: dict[str, str] = field(default_factory=dict)  # standard: {"mask"}; plugin: {"committed", "tree_mask"}
    quant_notes: list[str] = field(default_factory=list)  # what each quantized Linear became, for the manifest
    kv_cache: str = "none"  # "fp8": new K/V rounded to e4m3 per token and head before attention (models/kv.py)

    def weight(self, t: torch.Tensor, hint: str) -> str:
        """A float weight in the graph's float type.

        In an fp32 graph, a weight whose every value is a bf16 number (a quantized artifact keeps the
        floats it does not quantize, e.g. the draft head, in bf16) is stored as a bf16 initializer and
        Cast to float: half the bytes, the same values; onnxruntime folds the Cast when a session loads.
        fp16 graphs (TensorRT's) keep plain initializers."""
        t = t.detach().cpu()
        if self.g.ft == TensorProto.FLOAT and t.numel() >= BF16_MIN_NUMEL and _bf16_exact(t):
            return self.g.op("Cast", self.g.init_tensor(t, f"{hint}_bf16", BF16), to=TensorProto.FLOAT)
        return self.g.init_tensor(t, hint, NP_TYPES[self.g.ft])


BF16_MIN_NUMEL = 1024  # smaller weights (norms, biases) stay plain: a Cast node would save a few bytes
EXACT_BLOCK = 1 << 22  # elements compared at a time: a bounded temporary


def _bf16_exact(t: torch.Tensor) -> bool:
    """Every value a bf16 number (a bf16 tensor trivially; others checked a block at a time)."""
    if t.dtype == torch.bfloat16:
        return True
    flat = t.reshape(-1)
    for i in range(0, flat.numel(), EXACT_BLOCK):
        f = flat[i:i + EXACT_BLOCK].float()
        if not torch.equal(f.to(torch.bfloat16).float(), f):
            return False
    return True
