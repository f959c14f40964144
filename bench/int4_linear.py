"""What an int4 IntLinear (or an int3 / int2 / ternary LowBitLinear) costs against an fp32 Linear at a
drafter's few rows, on this CPU.

    OMP_NUM_THREADS=1 python bench/int4_linear.py                 # the zoo EAGLE-3 drafter's shapes, g64
    OMP_NUM_THREADS=1 python bench/int4_linear.py --rows 1 8 32 --group-size 128
    OMP_NUM_THREADS=1 python bench/int4_linear.py --scheme int2   # low-bit codes through the same kernel

For each Linear shape of the small zoo target's EAGLE-3 drafter (hidden 256, FFN 768, 4096 draft tokens,
2H-wide attention inputs, 3 taps) it times, interleaved, median of `--reps` (weights left warm in cache):
an fp32 nn.Linear (how the runtime runs a drafter), specpress's int4 IntLinear on fp32 inputs (aten's int4
kernel on bf16-rounded activations, int4_cpu.py), the same module's dequantize-then-matmul fallback (what
every int4 forward did before), and aten's int4 kernel fed fp32 activations and scales (its scalar loop:
the reason the module rounds to bf16; int4 only). With --scheme int3 / int2 / ternary the module is a
LowBitLinear, whose codes go through the same kernel shifted to zero point 8 (lowbit.py). Ratios are against the fp32 Linear of the same run. This is one
Linear, not the speculative loop: `specpress bench --compare-drafter` measures a whole drafter's rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from specpress.models.quantized import int4_cpu, primitives as P
from specpress.models.quantized.integer import IntLinear
from specpress.models.quantized.lowbit import LowBitLinear, quantize_lowbit
from specpress.models.quantized.modules import QuantizedLinear

SHAPES = [("q/k/v (2H -> H)", 512, 256), ("gate/up", 256, 768), ("down", 768, 256), ("o_proj", 256, 256),
          ("lm_head (4096 draft tokens)", 256, 4096), ("fc (3 taps -> H)", 768, 256)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--scheme", choices=["int4", "int3", "int2", "ternary"], default="int4")
    a = ap.parse_args()
    torch.manual_seed(0)
    w = a.scheme
    print(f"threads {torch.get_num_threads()}, {w} g{a.group_size}; us per call (x the fp32 Linear)")
    print(f"| shape | rows | fp32 Linear | {w} module (kernel) | {w} dequantize + matmul |"
          + (" kernel on fp32 |" if w == "int4" else ""))
    print("|---|---|---|---|---|" + ("---|" if w == "int4" else ""))
    with torch.inference_mode():
        for name, k, n in SHAPES:
            lin = nn.Linear(k, n, bias=False)
            if w == "int4":
                q, s, z = P.quantize_int(lin.weight.detach(), 4, a.group_size, True)
                qlin = IntLinear.from_codes(lin, q, s, z, bits=4, group_size=a.group_size, symmetric=True)
            else:
                q, s, z = quantize_lowbit(lin.weight.detach(), w, a.group_size, True)
                qlin = LowBitLinear.from_codes(lin, q, s, z, format=w, group_size=a.group_size, symmetric=True)
            if qlin.int4_packed is None:
                raise SystemExit(f"{name}: {qlin.kernel_note}")
            sz32 = int4_cpu.scales_and_zeros(qlin.scales, qlin.zeros(), torch.float32)
            for rows in a.rows:
                x = torch.randn(rows, k)
                calls = {"fp32": lambda: lin(x), "module": lambda: qlin(x),
                         "dequant": lambda: QuantizedLinear.forward(qlin, x)}
                if w == "int4":
                    calls["kernel fp32"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
                        x, qlin.int4_packed, a.group_size, sz32)
                for f in calls.values():
                    for _ in range(3):
                        f()
                times: dict[str, list[float]] = {key: [] for key in calls}
                for _ in range(a.reps):
                    for key, f in calls.items():
                        t0 = time.perf_counter()
                        f()
                        times[key].append(time.perf_counter() - t0)
                med = {key: statistics.median(v) * 1e6 for key, v in times.items()}
                cells = [f"{med[key]:.0f} ({med[key] / med['fp32']:.2f}x)" for key in calls]
                print(f"| {name} {k}->{n} | {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
