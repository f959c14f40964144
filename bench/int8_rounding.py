"""Why an int8 drafter's onnxruntime export and its torch module can draft different trees.

    python bench/int8_rounding.py [--rows 1,4,16,32,64,128]

torch runs a per-row int8 Linear through aten's weight-only int8 kernel: activations rounded to bf16,
the product returned in bf16 (IntLinear.forward). The export computes the same thing with the same
roundings (export/quant/integer.py: Cast to bf16 and back around DequantizeLinear + MatMul). Both products are
within fp32 rounding of the exact one; the final bf16 rounding then turns a product that lies within
that distance of a bf16 rounding boundary into two numbers one bf16 ulp (2^-8 relative) apart.

For each of the medium EAGLE-3 speed drafter's Linear shapes and each row count, this builds the Linear's
graph with the exporter itself, runs it in onnxruntime, and counts the outputs where torch and the
export differ, and the largest gap; the exact product (float64, then rounded to bf16) is the
referee. A drafter calls these Linears on 1-32 rows a step; a dynamic tree picks its top-k among
near-equal logits, where one such ulp can reorder two candidates.
"""

from __future__ import annotations

import argparse

import onnxruntime as ort
import torch
from torch import nn

from specpress.export.blocks import Ctx
from specpress.export.graph import Graph
from specpress.export.quant import quantized_linear
from specpress.models.quantized import primitives as P
from specpress.models.quantized.integer import IntLinear

SHAPES = [("q/k/v (2H -> H)", 1024, 512), ("gate/up", 512, 688), ("down", 688, 512), ("o_proj", 512, 512),
          ("lm_head (1024 draft tokens)", 512, 1024), ("fc (3 taps -> H)", 1536, 512)]


def session(mod: nn.Module) -> ort.InferenceSession:
    from onnx import TensorProto

    g = Graph("linear", 23)
    c = Ctx(g, "standard")
    x = g.input("x", TensorProto.FLOAT, ["rows", mod.in_features])
    g.output("y", quantized_linear(c, x, mod, "linear"), TensorProto.FLOAT, ["rows", mod.out_features])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.disable_quant_qdq", "1")  # as the onnxruntime backend loads it
    return ort.InferenceSession(g.model().SerializeToString(), opts, providers=["CPUExecutionProvider"])


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 steps between two bf16-valued tensors (0 where equal; large across a sign change)."""
    ia, ib = (t.to(torch.bfloat16).view(torch.int16).int() for t in (a, b))
    return (ia - ib).abs()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,16,32,64,128")
    a = ap.parse_args()
    torch.manual_seed(0)
    rows = [int(r) for r in a.rows.split(",")]
    print("outputs where torch's int8 kernel and the onnxruntime export differ (share; largest gap / largest |output|);"
          " in brackets: the share where each differs from the exact product rounded to bf16")
    print("| shape | " + " | ".join(f"{r} rows" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    with torch.inference_mode():
        for name, k, n in SHAPES:
            lin = nn.Linear(k, n, bias=False)
            q, s, z = P.quantize_int(lin.weight.detach(), 8, None, True)
            mod = IntLinear.from_codes(lin, q, s, z, bits=8, group_size=None, symmetric=True)
            sess = session(mod)
            w = (mod.codes().double() - 128) * mod.row_scales.double()[:, None]  # codes are stored unsigned
            cells = []
            for r in rows:
                x = torch.randn(r, k)
                yt = mod(x)
                yo = torch.from_numpy(sess.run(None, {"x": x.numpy()})[0])
                exact = (x.bfloat16().double() @ w.t()).bfloat16().float()
                d = ulps(yt, yo)
                gap = (yt - yo).abs().max().item() / exact.abs().max().item()
                cells.append(f"{(d > 0).float().mean().item():.1e}; {gap:.0e} "
                             f"[torch {(ulps(yt, exact) > 0).float().mean().item():.0e}, "
                             f"export {(ulps(yo, exact) > 0).float().mean().item():.0e}]")
            print(f"| {name} {k}->{n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
