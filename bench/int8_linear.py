"""What a per-row int8 Linear costs against float ones at a drafter's few rows, on this CPU.

    OMP_NUM_THREADS=2 python bench/int8_linear.py            # weights evicted before every call
    OMP_NUM_THREADS=2 python bench/int8_linear.py --warm     # weights left in cache between calls

For each of the medium-target EAGLE-3 speed drafter's Linear shapes (hidden 512, FFN 688, 1024 draft tokens,
2H-wide attention inputs, 3 taps) it times, interleaved, median of `--reps`: an fp32 nn.Linear (how the
runtime runs a drafter), a bf16 one, specpress's per-row int8 IntLinear on fp32 inputs (aten's weight-only
int8 kernel on bf16-rounded activations), the same module's dequantize-then-matmul fallback, and aten's
int8 kernel fed fp32 activations directly (the slow case IntLinear avoids). Ratios are against the fp32
Linear of the same run. By default a 64 MiB buffer is written before every call, evicting the weight from
the caches; `--warm` leaves it cached. Neither is the speculative loop, where a drafter's weights are read
by several drafter calls in a row between two target forwards: `specpress bench --compare-drafter` measures that.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from specpress.models.quantized import primitives as P
from specpress.models.quantized.integer import IntLinear
from specpress.models.quantized.modules import QuantizedLinear

SHAPES = [("q/k/v (2H -> H)", 1024, 512), ("gate/up", 512, 688), ("down", 688, 512), ("o_proj", 512, 512),
          ("lm_head (1024 draft tokens)", 512, 1024), ("fc (3 taps -> H)", 1536, 512)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warm", action="store_true", help="do not evict the weights between calls")
    a = ap.parse_args()
    torch.manual_seed(0)
    flush = torch.empty(64 << 20, dtype=torch.uint8)
    print(f"threads {torch.get_num_threads()}, rows {a.rows}, weights {'warm' if a.warm else 'evicted'}; "
          "us per call (x the fp32 Linear)")
    print("| shape | fp32 Linear | bf16 Linear | int8 IntLinear | int8 dequantize + matmul | int8 kernel on fp32 |")
    print("|---|---|---|---|---|---|")
    with torch.inference_mode():
        for name, k, n in SHAPES:
            lin = nn.Linear(k, n, bias=False)
            q, s, z = P.quantize_int(lin.weight.detach(), 8, None, True)
            qlin = IntLinear.from_codes(lin, q, s, z, bits=8, group_size=None, symmetric=True)
            x = torch.randn(a.rows, k)
            xb = x.bfloat16()
            lin_b = nn.Linear(k, n, bias=False).bfloat16()
            codes, scales = qlin.qweight, qlin.scales[:, 0].contiguous()
            calls = {"fp32": lambda: lin(x), "bf16": lambda: lin_b(xb), "int8": lambda: qlin(x),
                     "dequant": lambda: QuantizedLinear.forward(qlin, x),
                     "kernel fp32": lambda: torch.ops.aten._weight_int8pack_mm(x, codes, scales)}
            for f in calls.values():
                for _ in range(10):
                    f()
            times: dict[str, list[float]] = {key: [] for key in calls}
            for _ in range(a.reps):
                for key, f in calls.items():
                    if not a.warm:
                        flush.fill_(1)
                    t0 = time.perf_counter()
                    f()
                    times[key].append(time.perf_counter() - t0)
            med = {key: statistics.median(v) * 1e6 for key, v in times.items()}
            cells = [f"{med[key]:.0f} ({med[key] / med['fp32']:.2f}x)" for key in calls]
            print(f"| {name} {k}->{n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
